"""Storage helpers over `tf.io.gfile`, so local paths and `gs://` take one code path.

On Vertex, `gs://` goes to Cloud Storage with the job's service account; in tests and local runs the same
calls reach an emulator (see scripts/gcs_emulator.py). Nothing here knows which.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import uuid
from typing import Any, MutableMapping

from trainer.core import paths
from trainer.core.errors import ExternalFailure
from trainer.core.errors import first_line
from trainer.core.errors import UserError


# TensorFlow's gs:// reader holds one read-ahead buffer per open file, GCS_READ_CACHE_BLOCK_SIZE_MB large
# (64 MiB by default), and zero-fills all of it at every file open. With 8-16 files read in parallel that is
# 0.5-1 GiB of RAM and a 64 MiB memset per file. With 8 MiB the trainer read the benchmark's shards through
# the emulator 1.18x faster than with the default, at 896 instead of 2157 MiB peak RSS
# (scripts/bench/input.py). Smaller blocks measured a little faster still against the emulator, but every
# block is one request, and a request to real Cloud Storage takes tens of milliseconds; 8 MiB keeps a
# 100 MiB shard to 13 requests.
GCS_READ_BLOCK_MB = 8


# TensorFlow retries a failed gs:// request 10 times, waiting 1, 2, 4 ... up to 32 s between tries (plus up to 1 s
# of jitter each), about 3.5 minutes per operation; a checkpoint save is several operations, and an outage was
# measured to take about 10 minutes to end in a 53-line traceback. 6 retries of at most 16 s each bound one
# operation to about 40 s (1+2+4+8+16+16 s, plus jitter) and still ride out a transient error: the emulator's
# fault tests pass at 20 % injected failures. The first operation that fails ends the run with one line
# (`storage_failure`): measured with TensorFlow's own 1 s first delay, 112 s after the storage went away (two
# requests in flight each ran out their retries), so an outage ends a run within about two minutes.
GCS_RETRY_DEFAULTS = {
    "GCS_RETRY_CONFIG_MAX_RETRIES": "6",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": str(16_000_000),
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "20",
}


def configure_gcs(environ: MutableMapping[str, str]) -> None:
  """Sets TensorFlow's gs:// read-ahead block size and retry bound, unless the user set them.

  Call before TensorFlow is imported: TF reads these variables once, when it registers its gs:// filesystem at
  import time, so setting them later changes nothing.
  """
  environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", str(GCS_READ_BLOCK_MB))
  for name, value in GCS_RETRY_DEFAULTS.items():
    environ.setdefault(name, value)


_UNREACHABLE = re.compile(r"retry attempts failed|Error executing an HTTP request|Couldn't (?:connect|resolve)|"
                          r"Could not resolve|Connection refused|Timeout was reached", re.I)


def storage_failure(error: BaseException, *, fallback_uri: str | None = None) -> ExternalFailure | None:
  """A Cloud Storage outage as one line naming the bucket (None when `error` is something else).

  TensorFlow's message names the object (`gs://bucket/...`) or the request URL (`.../b/bucket/o/...`); when it
  names neither, `fallback_uri` (the run's output dir) says which bucket the run was writing.
  """
  text = str(getattr(error, "message", None) or error)
  about_storage = "retry attempts failed" in text or re.search(r"gs://|googleapis\.com|/b/[^/\s]+/o\b", text)
  if not (about_storage and _UNREACHABLE.search(text)):
    return None  # e.g. a peer's "Connection refused": not storage
  found = (re.search(r"gs://([a-z0-9][-a-z0-9_.]*)", text) or re.search(r"/b/([a-z0-9][-a-z0-9_.]*)/o\b", text) or
           re.search(r"gs://([a-z0-9][-a-z0-9_.]*)", fallback_uri or ""))
  bucket = f"gs://{found.group(1)}" if found else "Cloud Storage"
  detail = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", first_line(error, limit=400))[:200]
  return ExternalFailure(f"{bucket} is unreachable ({detail}); the run stops here, and a restart resumes from its "
                         "last complete checkpoint")


def is_remote(path: str) -> bool:
  return "://" in path


def check_writable(path: str, *, flag: str) -> None:
  """Fails with a UserError unless `path` can be written. Leaves nothing behind."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not is_remote(path):
    if not _local_writable(path):
      raise UserError(f"{flag}: {path} is not writable (no permission, or a file is in the way); "
                      "pass a directory you can write")
    return
  probe = path.rstrip("/") + f"/.write-probe-{uuid.uuid4().hex}"
  try:
    with tf.io.gfile.GFile(probe, "w") as f:
      f.write("")
    tf.io.gfile.remove(probe)
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot write to {path}: {e.message.splitlines()[0]}") from None


def _local_writable(path: str) -> bool:
  """True when a local directory exists and is writable, or could be created under a writable ancestor.

  Tried, not asked: `os.access` says yes to root everywhere (Vertex containers run as root), also on a
  read-only file system. The probe is a temporary directory in the nearest existing ancestor, removed again.
  """
  probe = os.path.abspath(path)
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      return False
    probe = parent
  if not os.path.isdir(probe):
    return False
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=probe))
  except OSError:
    return False
  return True


def write_json(path: str, value: Any) -> None:
  """Writes `value` as JSON whole: a reader (another job checking the run dir's owner, say) never sees it half
  written. A Cloud Storage object appears only once its upload completes; a local file is written beside and
  renamed over the old one, which POSIX makes atomic."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  directory = path.rsplit("/", 1)[0]
  tf.io.gfile.makedirs(directory)
  text = json.dumps(value, indent=2, sort_keys=True) + "\n"
  if is_remote(path):
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(text)
    return
  partial = f"{path}.partial-{os.getpid()}-{threading.get_ident()}"  # the run's heartbeat thread writes too
  with open(partial, "w") as f:
    f.write(text)
  os.replace(partial, path)


def read_json(path: str) -> Any:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with tf.io.gfile.GFile(path, "r") as f:
    return json.loads(f.read())


def new_dirs(directories) -> list[str]:
  """The outermost of each directory and its ancestors that does not exist yet: what a run that fails must remove
  to leave the file system (or bucket) as it found it (`--output_dir` and its parents included, not only the
  subdirectories it holds)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  outermost = []
  for directory in directories:
    if tf.io.gfile.exists(directory):
      continue
    if not is_remote(directory):  # local: the topmost missing ancestor
      directory = os.path.abspath(directory)
      while not os.path.exists(os.path.dirname(directory)):
        directory = os.path.dirname(directory)
    else:
      # gs://: TensorFlow's makedirs writes a 0-byte "folder/" object for every missing ancestor too; the
      # topmost one that holds nothing yet is removed with the rest (`remove_tree` of it deletes those markers).
      directory = directory.rstrip("/")
      bucket_root = directory.split("://", 1)[0] + "://" + directory.split("://", 1)[1].split("/", 1)[0]
      while directory.rsplit("/", 1)[0] != bucket_root and not tf.io.gfile.exists(directory.rsplit("/", 1)[0]):
        directory = directory.rsplit("/", 1)[0]
    if directory not in outermost:
      outermost.append(directory)
  return outermost


def remove_tree(path: str) -> None:
  """Removes a directory if it exists (best effort: used to clean up after a failure)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    if tf.io.gfile.exists(path):
      tf.io.gfile.rmtree(path)
  except tf.errors.OpError:
    pass


def _walk_files(directory: str):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  for root, subdirs, names in tf.io.gfile.walk(directory):
    subdirs[:] = [d for d in subdirs if not d.rstrip("/").startswith(("_", "."))]
    for name in names:
      yield f"{root.rstrip('/')}/{name}"


def _hidden(path: str) -> bool:
  return path.rsplit("/", 1)[-1].startswith(("_", "."))


# Files beside the data that are not data: a schema written by hand or by TFX/TFDV.
NOT_DATA = (paths.SCHEMA_FILE, "schema.pbtxt")
# URIs that name a table, not files: listed as they are (the data format that claims them reads them).
TABLE_SCHEMES = ("bq://",)


def list_files(pattern: str, *, flag: str) -> list[str]:
  """Expands a file pattern, or lists a folder (`gs://b/export/`, or a path that is a directory) and the folders
  under it. Files whose names start with "_" or "." are not data (Spark's `_SUCCESS`, Hadoop's `.crc`, Beam's
  temporaries), as Hadoop and Spark readers skip them. A pattern that matches nothing is a UserError naming the
  flag and pattern. A table's URI (bq://...) is its own listing."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if pattern.startswith(TABLE_SCHEMES):
    return [pattern]
  try:
    if pattern.endswith("/") or (not any(c in pattern for c in "*?[") and tf.io.gfile.isdir(pattern)):
      files = sorted(_walk_files(pattern.rstrip("/")))
    else:
      files = sorted(tf.io.gfile.glob(pattern))
  except tf.errors.NotFoundError:
    files = []
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot list {pattern}: {e.message.splitlines()[0]}") from None
  files = [f for f in files if not f.endswith("/") and not _hidden(f) and f.rsplit("/", 1)[-1] not in NOT_DATA]
  if not files:
    raise UserError(f"{flag}: no files match {pattern!r}; expected a file pattern such as "
                    "gs://bucket/data/train-*.tfrecord")
  return files
