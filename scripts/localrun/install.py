"""Installing the staged trainer package from the bucket, as Vertex's Python package executor does."""

from __future__ import annotations

import os
import subprocess
import sys

from scripts.localrun.planning import LocalRunError
from trainer.core import paths


def install_package(uri: str, target: str, *, client) -> str:
  """Downloads the sdist from the bucket and installs it into `target`, as Vertex's executor does."""
  bucket, blob = paths.split_gcs_uri(uri)
  archive = os.path.join(os.path.dirname(target), os.path.basename(blob))
  client.bucket(bucket).blob(blob).download_to_filename(archive)
  pip_install(archive, target, what=uri)
  return target


def pip_install(archive: str, target: str, *, what: str) -> None:
  """Installs a package archive into `target` as Vertex's executor installs packageUris: no dependencies, no
  index. A failure is one line, `installing WHAT failed: ` and pip's last line."""
  result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", target, archive], capture_output=True, text=True, check=False)
  if result.returncode:
    raise LocalRunError(f"installing {what} failed: {result.stderr.strip().splitlines()[-1:]}")
