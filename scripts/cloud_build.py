"""Building and pushing the trainer image (the Dockerfile, `submit.py --build_image`) and the serving image
(Dockerfile.serving, `--build_serving_image`) through Cloud Build.

The build context is the Dockerfile and the trainer sdist in dist/ (the serving image: also the serving package),
as a tarball staged in the job's bucket;
the build runs `docker build` with the pinned TF version and pushes the image, which Cloud Build lists in the
build's results. Nothing is built here: no Docker daemon or registry is needed on this machine.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile

from scripts import clients

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO, "Dockerfile")
SERVING_DOCKERFILE = os.path.join(REPO, "Dockerfile.serving")
SERVING_FILES = ("serving/__init__.py", "serving/predict.py", "serving/serve.py")  # what it COPYs besides the sdist
DOCKER_BUILDER = "gcr.io/cloud-builders/docker"


def dockerfile_tf_version(path: str = DOCKERFILE) -> str:
  """The TF version the Dockerfile's base image is pinned to (its `ARG TF_VERSION=`)."""
  with open(path) as f:
    match = re.search(r"^ARG TF_VERSION=(\S+)$", f.read(), re.M)
  if not match:
    raise ValueError(f"{path}: no 'ARG TF_VERSION=' line")
  return match.group(1)


def build_context(sdist: str, out_dir: str, *, serving: bool = False, extras: tuple[str, ...] = ()) -> str:
  """A gzipped tarball of the Dockerfile (as `Dockerfile`), dist/<sdist>, the --extra_package archives in
  dist/extra/ (the trainer image installs them beside the trainer) and, for the serving image, the serving
  package; returns its path (named by content)."""
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    tar.add(SERVING_DOCKERFILE if serving else DOCKERFILE, arcname="Dockerfile")
    tar.add(sdist, arcname=f"dist/{os.path.basename(sdist)}")
    for extra in extras:
      tar.add(extra, arcname=f"dist/extra/{os.path.basename(extra)}")
    for name in SERVING_FILES if serving else ():
      tar.add(os.path.join(REPO, name), arcname=name)
  digest = hashlib.sha256(buffer.getvalue()).hexdigest()[:12]
  path = os.path.join(out_dir, f"{'serving' if serving else 'trainer'}-image-context-{digest}.tar.gz")
  with open(path, "wb") as f:
    f.write(buffer.getvalue())
  return path


def _archive_members(path: str) -> list[tuple[str, str]]:
  """(member name, sha256 of its bytes) of a .tar.gz or a wheel/zip: what it holds, not when it was packed."""
  import zipfile  # pylint: disable=g-import-not-at-top

  members = []
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as archive:
      for info in archive.infolist():
        if not info.is_dir():
          members.append((info.filename, hashlib.sha256(archive.read(info)).hexdigest()))
  else:
    with tarfile.open(path) as archive:
      for member in archive.getmembers():
        if member.isfile():
          members.append((member.name, hashlib.sha256(archive.extractfile(member).read()).hexdigest()))
  return sorted(members)


def source_digest(sdist: str, *, extras: tuple[str, ...] = (), serving: bool = False,
                  tf_version: str | None = None) -> str:
  """A digest of what the image is built from: the Dockerfile, the TF version, and the files inside the sdist and
  each extra package. setuptools stamps build times into the archive (never into the files), so two builds of the
  same code have the same digest and an image built from it can be found again by its tag."""
  digest = hashlib.sha256()
  with open(SERVING_DOCKERFILE if serving else DOCKERFILE, "rb") as f:
    digest.update(f.read())
  digest.update(f"TF_VERSION={tf_version or dockerfile_tf_version()}".encode())
  for archive in (sdist, *extras):
    digest.update(os.path.basename(archive).encode())
    for name, member in _archive_members(archive):
      digest.update(f"{name}\0{member}\n".encode())
  for name in SERVING_FILES if serving else ():
    with open(os.path.join(REPO, name), "rb") as f:
      digest.update(name.encode() + f.read())
  return digest.hexdigest()[:16]


def build_request(*, project: str, region: str, image: str, context_uri: str, tf_version: str | None = None) -> dict:
  """The CreateBuildRequest body (REST JSON): docker build + push of `image` from the staged context, on TF
  `tf_version` (default: the Dockerfile's pin)."""
  bucket, _, name = context_uri[len("gs://"):].partition("/")
  return {
      "parent": f"projects/{project}/locations/{region}",
      "build": {
          "source": {"storageSource": {"bucket": bucket, "object": name}},
          "steps": [{"name": DOCKER_BUILDER,
                     "args": ["build", "--build-arg", f"TF_VERSION={tf_version or dockerfile_tf_version()}", "-t", image,
                              "."]}],
          "images": [image],
          "timeout": "3600s",
          "tags": ["vertex-tf-trainer"],
      },
  }


def build_client(api_endpoint: str | None):
  from google.cloud.devtools import cloudbuild_v1  # pylint: disable=g-import-not-at-top

  return cloudbuild_v1.CloudBuildClient(**clients.client_kwargs(api_endpoint))


def run_build(client, request: dict, *, timeout_secs: float = 3600) -> str:
  """Sends the build (parsed into cloudbuild_v1 types), waits for it; returns the pushed image's digest URI."""
  from google.cloud.devtools import cloudbuild_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  parsed = cloudbuild_v1.CreateBuildRequest()
  json_format.ParseDict(request, parsed._pb)  # pylint: disable=protected-access
  build = client.create_build(request=parsed).result(timeout=timeout_secs)
  if build.status != cloudbuild_v1.Build.Status.SUCCESS:
    raise RuntimeError(f"Cloud Build {build.id} ended {build.status.name}: {build.log_url or ''}".strip())
  pushed = [i for i in build.results.images if i.name == request["build"]["images"][0]]
  return f"{pushed[0].name.split(':')[0]}@{pushed[0].digest}" if pushed and pushed[0].digest else \
      request["build"]["images"][0]


def build_and_say(request: dict, api_endpoint: str | None) -> str:
  """Runs one Cloud Build request to its end, saying so on stdout; returns the pushed image by digest. A failed
  build is a RuntimeError naming the build and its log."""
  print(f"building {request['build']['images'][0]} with Cloud Build ...", flush=True)
  built = run_build(build_client(api_endpoint), request)
  print(f"built {built}", flush=True)
  return built
