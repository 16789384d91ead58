"""Path helpers shared by local paths, `gs://` URIs and Cloud Storage FUSE paths (`/gcs/`). Pure."""

from __future__ import annotations

import os

# The schema file written beside the data, the checkpoints and the export (trainer/data/schema.py reads it);
# here because storage, below the data layer, must not list it as data.
SCHEMA_FILE = "schema.json"


def normalize_path(path: str) -> str:
  """Rewrites a Cloud Storage FUSE path `/gcs/<bucket>/...` to `gs://<bucket>/...`.

  Why: TensorFlow's native `gs://` client streams and reads in parallel, which the FUSE mount cannot match,
  and the rewrite lets the same flags run off Vertex (where nothing is mounted at /gcs). This is the only
  place the rewrite happens.
  """
  if path.startswith("/gcs/") and len(path) > len("/gcs/"):
    return "gs://" + path[len("/gcs/"):]
  return path


def join_path(base: str, *parts: str) -> str:
  """Joins path segments for local and `gs://` paths alike (os.path.join would mangle `gs://` on Windows)."""
  return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts])


def same_location(a: str, b: str) -> bool:
  """Whether two paths name the same place as they may be written: `/gcs/b/x` and `gs://b/x/`, `out/` and
  `./out` (local paths made absolute, links resolved)."""
  def canonical(path: str) -> str:
    path = normalize_path(path)
    if "://" in path:
      return path.rstrip("/")
    return os.path.realpath(path)

  return canonical(a) == canonical(b)


def split_gcs_uri(uri: str) -> tuple[str, str]:
  """`gs://bucket/some/name` -> ("bucket", "some/name"); ValueError for anything that is not a gs:// URI."""
  if not uri.startswith("gs://") or len(uri) <= len("gs://"):
    raise ValueError(f"not a gs://BUCKET/... URI: {uri!r}")
  bucket, _, name = uri[len("gs://"):].partition("/")
  return bucket, name
