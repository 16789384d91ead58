"""The project's Docker repository in Artifact Registry, where the trainer and serving images live.

    REGION-docker.pkg.dev/PROJECT/vertex-tf-trainer/trainer:src-<source digest>

`submit` asks here whether an image of the same source (cloud_build.source_digest) was already pushed, to reuse it
instead of building again, and makes the repository on first use. Nothing else is managed here.
"""

from __future__ import annotations

import dataclasses
import re

from scripts import clients

REPOSITORY = "vertex-tf-trainer"
_IMAGE = re.compile(r"^(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/(?P<repository>[^/]+)/"
                    r"(?P<package>[^:@]+)(?::(?P<tag>[\w.-]+))?$")


class RepositoryError(RuntimeError):
  """A one-line reason the image cannot be found or pushed."""


@dataclasses.dataclass(frozen=True)
class ImageName:
  location: str
  project: str
  repository: str
  package: str
  tag: str | None

  @classmethod
  def parse(cls, image: str) -> "ImageName | None":
    """The parts of an Artifact Registry image name; None for an image elsewhere (Docker Hub, gcr.io...)."""
    match = _IMAGE.match(image)
    return cls(**match.groupdict()) if match else None

  @property
  def repository_name(self) -> str:
    return f"projects/{self.project}/locations/{self.location}/repositories/{self.repository}"

  @property
  def uri(self) -> str:
    return f"{self.location}-docker.pkg.dev/{self.project}/{self.repository}/{self.package}"

  def create_command(self) -> str:
    return (f"gcloud artifacts repositories create {self.repository} --repository-format=docker "
            f"--location={self.location} --project={self.project}")


def client(api_endpoint: str | None):
  from google.cloud import artifactregistry_v1  # pylint: disable=g-import-not-at-top

  return artifactregistry_v1.ArtifactRegistryClient(**clients.client_kwargs(api_endpoint))


def ensure_repository(registry, image: ImageName, *, timeout_secs: float = 300) -> bool:
  """Makes the image's Docker repository unless it exists; True when it was created. A repository that cannot be
  read or made (no permission, API off) is refused with the command that makes it."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud import artifactregistry_v1  # pylint: disable=g-import-not-at-top

  try:
    registry.get_repository(name=image.repository_name)
    return False
  except exceptions.NotFound:
    pass
  except exceptions.GoogleAPICallError as e:
    raise RepositoryError(f"cannot read the Artifact Registry repository {image.repository_name} ({_reason(e)}); "
                          f"create it with: {image.create_command()}") from None
  repository = artifactregistry_v1.Repository(
      format_=artifactregistry_v1.Repository.Format.DOCKER,
      description="Trainer and serving images of vertex-tf-trainer (python -m scripts.submit)")
  try:
    registry.create_repository(parent=f"projects/{image.project}/locations/{image.location}",
                               repository_id=image.repository, repository=repository).result(timeout=timeout_secs)
  except exceptions.GoogleAPICallError as e:
    raise RepositoryError(f"cannot create the Artifact Registry repository {image.repository_name} ({_reason(e)}); "
                          f"create it with: {image.create_command()}") from None
  return True


def find_tag(registry, image: ImageName, tag: str) -> str | None:
  """The image pushed under `tag`, by digest (`URI@sha256:...`), or None when there is none."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

  name = f"{image.repository_name}/packages/{image.package.replace('/', '%2F')}/tags/{tag}"
  try:
    found = registry.get_tag(name=name)
  except exceptions.NotFound:
    return None
  except exceptions.GoogleAPICallError as e:
    raise RepositoryError(f"cannot look up {image.uri}:{tag} in Artifact Registry ({_reason(e)})") from None
  digest = found.version.rsplit("/", 1)[-1]
  return f"{image.uri}@{digest}" if digest.startswith("sha256:") else None


def _reason(error) -> str:
  return " ".join(str(getattr(error, "message", error) or type(error).__name__).split())[:200]
