"""Local files and folders into a bucket as they are, byte for byte: `python -m scripts.gcs_emulator cp`.

Plain google-cloud-storage, so the same copy reaches the emulator (STORAGE_EMULATOR_HOST set, anonymous) and a
real bucket (Application Default Credentials). Names follow `gcloud storage cp -r`, so a command rehearsed here
reads the same against Cloud Storage:
- a folder lands under the destination with its own name (`data/` to gs://b/x: gs://b/x/data/...), its files
  recursively, with `/` between path parts;
- one file lands at the destination's exact name, or under it with its own name when the destination ends in `/`
  (or is a bucket root, or there are several sources).
Nothing is converted: no re-sharding (that is `scripts.stage_data`), no compression or content encoding (a `.gz`
reads back as the same gzip bytes, not decompressed). Uploads run on threads (google-cloud-storage's
transfer_manager): for many small files the round trips, not the bytes, take the time.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

# Cloud Storage's bucket names (a dotted name may be longer; such names are rare and the server judges them).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_EXPECTED_URI = "expected gs://BUCKET[/PATH] as the last argument"


class CopyError(RuntimeError):
  """A one-line reason nothing (or not everything) was copied."""


@dataclasses.dataclass(frozen=True)
class Planned:
  """What one source becomes: its files (local path, object name) and where it lands (a gs:// URI)."""

  source: str
  lands_at: str
  files: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Copied:
  planned: tuple[Planned, ...]
  destination: str  # where the copy landed: the one source's place, or the folder every source went into
  files: int
  bytes: int


def parse_destination(uri: str) -> tuple[str, str]:
  """`gs://bucket/some/path` -> ("bucket", "some/path"); a CopyError naming the value for anything else."""
  if not uri.startswith("gs://"):
    raise CopyError(f"DESTINATION {uri!r}: {_EXPECTED_URI} (cp copies into a bucket)")
  bucket, _, name = uri[len("gs://"):].partition("/")
  if not _BUCKET_NAME.match(bucket):
    raise CopyError(f"DESTINATION {uri!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, '-', "
                    "'_' or '.', starting and ending with a letter or digit); " + _EXPECTED_URI)
  if name.startswith("/") or "//" in name or any(part in (".", "..") for part in name.split("/")):
    raise CopyError(f"DESTINATION {uri!r}: an object path has no empty, '.' or '..' parts; {_EXPECTED_URI}")
  return bucket, name


def _folder_files(folder: str) -> list[tuple[str, str]]:
  """(path, relative name with `/`) for every file under `folder`, sorted; symlinked folders are followed once."""
  found, seen = [], set()
  for root, dirs, files in os.walk(folder, followlinks=True):
    real = os.path.realpath(root)
    if real in seen:  # a link back up the tree
      dirs[:] = []
      continue
    seen.add(real)
    dirs.sort()
    for name in files:
      path = os.path.join(root, name)
      if os.path.isfile(path):  # not a socket, fifo or dangling link
        found.append((path, os.path.relpath(path, folder).replace(os.sep, "/")))
  return sorted(found, key=lambda f: f[1])


def plan(sources: Sequence[str], destination: str) -> tuple[str, list[Planned]]:
  """The bucket and, per source, its files' object names (nothing is read or sent; a CopyError names the first bad
  argument)."""
  bucket, name = parse_destination(destination)
  if not sources:
    raise CopyError("no LOCAL file or folder to copy")
  for source in sources:
    if not os.path.exists(source):
      raise CopyError(f"LOCAL {source!r}: no such file or folder")
    if not (os.path.isfile(source) or os.path.isdir(source)):
      raise CopyError(f"LOCAL {source!r}: not a file or a folder")
  into = len(sources) > 1 or name == "" or name.endswith("/") or os.path.isdir(sources[0])
  prefix = name if name == "" or name.endswith("/") else f"{name}/"
  planned, owners = [], {}
  for source in sources:
    own = os.path.basename(os.path.normpath(os.path.abspath(source)))
    if os.path.isdir(source):
      files = tuple((path, f"{prefix}{own}/{relative}") for path, relative in _folder_files(source))
      lands_at = f"gs://{bucket}/{prefix}{own}/"
    else:
      files = ((source, f"{prefix}{own}" if into else name),)
      lands_at = f"gs://{bucket}/{files[0][1]}"
    for path, object_name in files:
      if object_name in owners:
        raise CopyError(f"LOCAL {owners[object_name]!r} and {path!r} would both be copied to "
                        f"gs://{bucket}/{object_name}: copy them in separate commands")
      owners[object_name] = path
    planned.append(Planned(source=source, lands_at=lands_at, files=files))
  return bucket, planned


def storage_client(environ=os.environ, *, buckets: tuple[str, ...] = ()):
  """google-cloud-storage's client as it sets itself up: the emulator (anonymous) when STORAGE_EMULATOR_HOST is
  set, after checking it answers; Cloud Storage with the Application Default Credentials otherwise."""
  from scripts.emulator import process  # pylint: disable=g-import-not-at-top

  host = environ.get("STORAGE_EMULATOR_HOST")
  if host:
    problem = process.unanswered(host, buckets=buckets)
    if problem:
      raise CopyError(problem)
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  try:
    return storage.Client()
  except google.auth.exceptions.DefaultCredentialsError:
    raise CopyError("no Google credentials for Cloud Storage (STORAGE_EMULATOR_HOST is not set): run `gcloud auth "
                    'application-default login`, or start the emulator (eval "$(python -m scripts.gcs_emulator '
                    'start --bucket BUCKET)")') from None


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return (text[0][:300] if text else type(error).__name__)


def copy(sources: Sequence[str], destination: str, *, client=None, workers: int = 8) -> Copied:
  """Copies `sources` (files and folders) to `destination` (gs://BUCKET[/PATH]) as they are; a CopyError says which
  file, bucket or argument stopped it."""
  from google.api_core import exceptions as api_exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import retry as storage_retry  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import transfer_manager  # pylint: disable=g-import-not-at-top

  bucket_name, planned = plan(sources, destination)
  client = client or storage_client(buckets=(bucket_name,))
  bucket = client.bucket(bucket_name)
  try:
    bucket.reload()
  except api_exceptions.NotFound:
    make = (f"the emulator makes buckets at start: python -m scripts.gcs_emulator start --bucket {bucket_name}"
            if os.environ.get("STORAGE_EMULATOR_HOST") else f"gcloud storage buckets create gs://{bucket_name}")
    raise CopyError(f"DESTINATION {destination!r}: there is no bucket {bucket_name!r} ({make})") from None
  except api_exceptions.Forbidden:
    pass  # allowed to write objects but not to read the bucket's metadata: the uploads will say if not
  except api_exceptions.GoogleAPICallError as e:
    raise CopyError(f"DESTINATION {destination!r}: reading bucket {bucket_name!r} failed: {_first_line(e)}") from None
  files = [f for p in planned for f in p.files]
  # An upload of the same bytes to the same name is idempotent, so it is retried on transient errors (the
  # client's default retries an upload only under a generation precondition).
  results = transfer_manager.upload_many(
      [(path, bucket.blob(name)) for path, name in files], upload_kwargs={"retry": storage_retry.DEFAULT_RETRY},
      max_workers=workers, worker_type=transfer_manager.THREAD, raise_exception=False)
  for (path, name), result in zip(files, results):
    if isinstance(result, BaseException):
      raise CopyError(f"LOCAL {path!r}: copying to gs://{bucket_name}/{name} failed: {_first_line(result)}")
  if len(planned) == 1:
    landed = planned[0].lands_at
  else:
    _, name = parse_destination(destination)
    landed = f"gs://{bucket_name}/{name if name == '' or name.endswith('/') else name + '/'}"
  return Copied(planned=tuple(planned), destination=landed, files=len(files),
                bytes=sum(os.path.getsize(path) for path, _ in files))


def files_count(count: int) -> str:
  return f"{count} file{'' if count == 1 else 's'}"


def human_size(count: int) -> str:
  """Bytes as a person reads them: `512 bytes`, `12.3 kB`, `4.1 MB`, `1.2 GB` (powers of 1000, as gcloud)."""
  if count < 1000:
    return f"{count} byte{'' if count == 1 else 's'}"
  unit, size = next((u, s) for u, s in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)) if count < s * 1000 or u == "GB")
  return f"{count / size:.1f} {unit}"
