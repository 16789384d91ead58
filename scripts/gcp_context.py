"""The Google Cloud project and region a command works in, found where a gcloud user already keeps them.

Project, first found wins:
  1. the command's --project flag;
  2. GOOGLE_CLOUD_PROJECT, then CLOUDSDK_CORE_PROJECT (what gcloud itself reads as `core/project`);
  3. PROJECT (this project's older name for it);
  4. gcloud's active configuration: `[core] project` in CLOUDSDK_CONFIG (default ~/.config/gcloud)
     /configurations/config_<name>, the name from CLOUDSDK_ACTIVE_CONFIG_NAME or the `active_config` file;
  5. the Application Default Credentials' project (`google.auth.default()`), asked only when a credentials file is
     there (GOOGLE_APPLICATION_CREDENTIALS or gcloud's application_default_credentials.json), so nothing probes a
     metadata server.
Region: --region, CLOUDSDK_AI_REGION, REGION, gcloud's `[ai] region`, else us-central1 (Vertex's default region).

Every value says where it came from, so a command can print it (`project my-proj (gcloud configuration 'dev')`).
"""

from __future__ import annotations

import configparser
import dataclasses
import os
from typing import Mapping

DEFAULT_REGION = "us-central1"


@dataclasses.dataclass(frozen=True)
class Setting:
  value: str
  source: str  # e.g. "--project", "GOOGLE_CLOUD_PROJECT", "gcloud configuration 'default'"

  def __str__(self) -> str:
    return f"{self.value} (from {self.source})"


def gcloud_config_dir(environ: Mapping[str, str]) -> str:
  return environ.get("CLOUDSDK_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "gcloud")


def active_configuration(environ: Mapping[str, str]) -> tuple[str, configparser.ConfigParser] | None:
  """The name and contents of gcloud's active configuration, or None when there is no such file."""
  directory = gcloud_config_dir(environ)
  name = environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
  if not name:
    try:
      with open(os.path.join(directory, "active_config")) as f:
        name = f.read().strip() or "default"
    except OSError:
      name = "default"
  parser = configparser.ConfigParser()
  try:
    if not parser.read(os.path.join(directory, "configurations", f"config_{name}")):
      return None
  except configparser.Error:
    return None
  return name, parser


def _from_gcloud(environ: Mapping[str, str], section: str, key: str) -> Setting | None:
  found = active_configuration(environ)
  if found is None:
    return None
  name, parser = found
  value = parser.get(section, key, fallback="").strip()
  return Setting(value, f"gcloud configuration '{name}' {section}/{key}") if value else None


def _from_adc(environ: Mapping[str, str]) -> Setting | None:
  adc_file = environ.get("GOOGLE_APPLICATION_CREDENTIALS") or os.path.join(
      gcloud_config_dir(environ), "application_default_credentials.json")
  if not os.path.isfile(adc_file):
    return None
  import google.auth  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions  # pylint: disable=g-import-not-at-top

  try:
    _, project = google.auth.default()
  except (exceptions.GoogleAuthError, ValueError, OSError):
    return None
  return Setting(project, f"Application Default Credentials ({adc_file})") if project else None


def project(flag_value: str | None, environ: Mapping[str, str] = os.environ) -> Setting | None:
  """The project to use, or None when none is set anywhere."""
  if flag_value:
    return Setting(flag_value, "--project")
  for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "PROJECT"):
    if environ.get(name):
      return Setting(environ[name], name)
  return _from_gcloud(environ, "core", "project") or _from_adc(environ)


def region(flag_value: str | None, environ: Mapping[str, str] = os.environ) -> Setting:
  """The region to use (Vertex's default region when none is set)."""
  if flag_value:
    return Setting(flag_value, "--region")
  for name in ("CLOUDSDK_AI_REGION", "REGION"):
    if environ.get(name):
      return Setting(environ[name], name)
  return _from_gcloud(environ, "ai", "region") or Setting(DEFAULT_REGION, "the default region")


PROJECT_HELP = ("the Google Cloud project (default: GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT, PROJECT, gcloud's "
                "active configuration, then the Application Default Credentials' project)")
REGION_HELP = f"the Vertex AI region (default: CLOUDSDK_AI_REGION, REGION, gcloud's ai/region, else {DEFAULT_REGION})"
MISSING_PROJECT = ("no Google Cloud project: pass --project, set GOOGLE_CLOUD_PROJECT, or run "
                   "`gcloud config set project PROJECT_ID`")
