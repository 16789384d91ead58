"""Vertex AI job configs (cloud_configs/*.yaml): load, fill placeholders, validate strictly.

A config is a CustomJobSpec in camelCase, as `gcloud ai custom-jobs create --config` takes it, or a
hyperparameter-tuning spec (`studySpec` + `trialJobSpec`) as `gcloud ai hp-tuning-jobs create --config`
takes it. Placeholders `${NAME}` are filled from a mapping (flags or environment):

    PROJECT, REGION, BUCKET, PACKAGE_URI, RUN_ID, CPU_IMAGE, GPU_IMAGE

Validation = the real API types (`json_format.ParseDict` into aiplatform_v1 protos rejects unknown fields,
misspelled keys and bad enums) + what the types cannot see: required fields, prebuilt TF executor images,
pool order and sizes, accelerator plausibility. Every error is one line naming the file and the field.

    python -m scripts.vertex_config cloud_configs/*.yaml      # validates, prints one line per file
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import string
import sys
from typing import Mapping

import yaml

DEFAULT_IMAGES = {
    # Vertex AI prebuilt TensorFlow training images (Python 3.10); the trainer must not reinstall TF there.
    "CPU_IMAGE": "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest",
    "GPU_IMAGE": "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest",
}
PLACEHOLDERS = ("PROJECT", "REGION", "BUCKET", "PACKAGE_URI", "RUN_ID", "CPU_IMAGE", "GPU_IMAGE")
PREBUILT_TF_IMAGE = re.compile(
    r"^(?:(?:us|europe|asia)-docker\.pkg\.dev/vertex-ai/training|gcr\.io/cloud-aiplatform/training)/"
    r"tf-(cpu|gpu)\.2-(\d+)(?:\.py3\d+)?:[\w.-]+$")
REDUCTION_SERVER_IMAGE = re.compile(r"^us-docker\.pkg\.dev/vertex-ai-restricted/training/reductionserver:[\w.-]+$")
POOL_ROLES = ("chief (workerpool0)", "workers (workerpool1)", "parameter servers or Reduction Server (workerpool2)",
              "evaluators (workerpool3)")

# Machine-type family -> accelerators it can carry and the counts allowed (Vertex AI's published matrix, reduced).
_N1_GPUS = {"NVIDIA_TESLA_T4": (1, 2, 4), "NVIDIA_TESLA_V100": (1, 2, 4, 8), "NVIDIA_TESLA_P100": (1, 2, 4),
            "NVIDIA_TESLA_P4": (1, 2, 4)}
_FIXED_GPUS = [  # (machine type pattern, accelerator, count from the name)
    (re.compile(r"^a2-highgpu-(\d+)g$"), "NVIDIA_TESLA_A100"),
    (re.compile(r"^a2-ultragpu-(\d+)g$"), "NVIDIA_A100_80GB"),
    (re.compile(r"^a3-highgpu-(\d+)g$"), "NVIDIA_H100_80GB"),
    (re.compile(r"^a3-megagpu-(\d+)g$"), "NVIDIA_H100_MEGA_80GB"),
]
_G2_GPUS = {"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-32": 1,
            "g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8}


class ConfigError(ValueError):
  """A config that Vertex would reject or that cannot run the trainer; the message is one line."""


# Cloud Storage bucket names: 3-63 characters of lowercase letters, digits, '-', '_' and '.', starting and
# ending with a letter or digit (dotted names may be longer; they are rare and not accepted here).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def bucket_name(value: str, *, flag: str = "--bucket") -> str:
  """The bare bucket name from `value` (`name` or `gs://name`); a ConfigError names what is wrong."""
  name = value[len("gs://"):].rstrip("/") if value.startswith("gs://") else value
  if "/" in name or not _BUCKET_NAME.match(name):
    raise ConfigError(f"{flag}={value!r} is not a Cloud Storage bucket name: expected 3-63 lowercase letters, "
                      "digits, '-', '_' or '.', starting and ending with a letter or digit (gs:// optional, no path)")
  return name


@dataclasses.dataclass(frozen=True)
class JobConfig:
  path: str
  kind: str  # "custom_job" or "hp_tuning"
  body: dict  # the filled config (camelCase)

  @property
  def job_spec(self) -> dict:
    return self.body["trialJobSpec"] if self.kind == "hp_tuning" else self.body


def load(path: str, values: Mapping[str, str]) -> JobConfig:
  """Reads, fills and validates a config file."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError as e:
    raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
  filled = fill(text, values, path)
  try:
    body = yaml.safe_load(filled)
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
  if not isinstance(body, dict):
    raise ConfigError(f"{path}: expected a YAML mapping (a CustomJobSpec), got {type(body).__name__}")
  # A JSON round trip unshares YAML anchors (&trainer / *trainer), so editing one pool never edits another.
  body = json.loads(json.dumps(body))
  kind = "hp_tuning" if "trialJobSpec" in body or "studySpec" in body else "custom_job"
  config = JobConfig(path=path, kind=kind, body=body)
  validate(config)
  return config


def fill(text: str, values: Mapping[str, str], path: str) -> str:
  # Comments may mention ${...} too; fill only the YAML body.
  body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
  merged = {**DEFAULT_IMAGES, **{k: v for k, v in values.items() if v}}
  missing = sorted({m.group(1) for m in re.finditer(r"\$\{(\w+)\}", body)} - set(merged))
  unknown = [m for m in missing if m not in PLACEHOLDERS]
  if unknown:
    raise ConfigError(f"{path}: unknown placeholder(s) {', '.join('${' + u + '}' for u in unknown)}; "
                      f"known: {', '.join(PLACEHOLDERS)}")
  if missing:
    raise ConfigError(f"{path}: no value for {', '.join('${' + m + '}' for m in missing)} "
                      "(pass --project/--region/--bucket or set the environment variable of that name)")
  return string.Template(body).substitute(merged)


def validate(config: JobConfig) -> None:
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  path = config.path
  proto = aiplatform_v1.HyperparameterTuningJob()._pb if config.kind == "hp_tuning" \
      else aiplatform_v1.CustomJobSpec()._pb
  body = dict(config.body)
  if config.kind == "hp_tuning":
    body.setdefault("displayName", "validation")
    for required in ("studySpec", "trialJobSpec", "maxTrialCount"):
      if required not in body:
        raise ConfigError(f"{path}: hyperparameter-tuning config needs '{required}'")
  try:
    json_format.ParseDict(body, proto)
  except json_format.ParseError as e:
    raise ConfigError(f"{path}: {_one_line(str(e))}") from None
  if config.kind == "hp_tuning":
    if not body["studySpec"].get("metrics") or not body["studySpec"].get("parameters"):
      raise ConfigError(f"{path}: studySpec needs 'metrics' and 'parameters'")
    metric_ids = [m.get("metricId") for m in body["studySpec"]["metrics"]]
    reported = [a.split("=", 1)[1] for pool in config.job_spec["workerPoolSpecs"]
                for a in pool.get("pythonPackageSpec", {}).get("args", []) if a.startswith("--hypertune_metric=")]
    if metric_ids and reported and metric_ids[0] not in reported:
      raise ConfigError(f"{path}: studySpec metric {metric_ids[0]!r} is not what the trainer reports "
                        f"(--hypertune_metric={reported[0]})")
  _validate_job_spec(config.job_spec, path, prefix="trialJobSpec." if config.kind == "hp_tuning" else "")


def _validate_job_spec(spec: dict, path: str, *, prefix: str) -> None:
  pools = spec.get("workerPoolSpecs")
  if not isinstance(pools, list) or not pools:
    raise ConfigError(f"{path}: {prefix}workerPoolSpecs must list at least the chief pool")
  if len(pools) > 4:
    raise ConfigError(f"{path}: {prefix}workerPoolSpecs has {len(pools)} pools; Vertex takes at most 4 "
                      f"({'; '.join(POOL_ROLES)})")
  for index, pool in enumerate(pools):
    where = f"{prefix}workerPoolSpecs[{index}]"
    if not pool:  # an empty pool keeps later pools in their positions
      if index == 0:
        raise ConfigError(f"{path}: {where} (the chief) cannot be empty")
      continue
    count = pool.get("replicaCount", 0)
    if index == 0 and count != 1:
      raise ConfigError(f"{path}: {where}.replicaCount is {count}; the chief pool must have exactly 1 replica")
    if count < 1:
      raise ConfigError(f"{path}: {where}.replicaCount must be >= 1, got {count}")
    machine = pool.get("machineSpec", {})
    if not machine.get("machineType"):
      raise ConfigError(f"{path}: {where}.machineSpec.machineType is required")
    _check_accelerator(machine, f"{path}: {where}.machineSpec")
    package = pool.get("pythonPackageSpec")
    container = pool.get("containerSpec")
    if container and _is_reduction_server(pool) and index != 2:
      raise ConfigError(f"{path}: {where} runs the Reduction Server, which Vertex expects in workerPoolSpecs[2]; "
                        f"pools keep Vertex's order ({'; '.join(POOL_ROLES)})")
    if index == 2 and container and _is_reduction_server(pool):
      if not _trainer_args(pools[0]).count("--reduction_server"):
        raise ConfigError(f"{path}: {where} runs the Reduction Server; add --reduction_server to the trainer args "
                          "so pool 2 is not taken for parameter servers")
      continue
    if not package:
      raise ConfigError(f"{path}: {where} needs a pythonPackageSpec running trainer.task (or, in pool 2, a "
                        "Reduction Server containerSpec)")
    for field in ("executorImageUri", "pythonModule"):
      if not package.get(field):
        raise ConfigError(f"{path}: {where}.pythonPackageSpec.{field} is required")
    if not package.get("packageUris"):
      raise ConfigError(f"{path}: {where}.pythonPackageSpec.packageUris must list the trainer sdist (gs://...)")
    for uri in package["packageUris"]:
      if not str(uri).startswith("gs://") or not str(uri).endswith((".tar.gz", ".whl")):
        raise ConfigError(f"{path}: {where}.pythonPackageSpec.packageUris has {uri!r}; expected "
                          "gs://BUCKET/...tar.gz")
    image = package["executorImageUri"]
    match = PREBUILT_TF_IMAGE.match(image)
    if not match:
      raise ConfigError(f"{path}: {where}.pythonPackageSpec.executorImageUri {image!r} is not a Vertex prebuilt "
                        "TensorFlow training image (e.g. us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest)")
    if int(match.group(2)) < 16:
      raise ConfigError(f"{path}: {where} uses TF 2.{match.group(2)}; the trainer needs TF >= 2.16")
    has_gpu = bool(machine.get("acceleratorType")) and str(machine.get("acceleratorType")).startswith("NVIDIA")
    if has_gpu and match.group(1) != "gpu":
      raise ConfigError(f"{path}: {where} has {machine['acceleratorType']} but the CPU image {image!r}; use a "
                        "tf-gpu image")
    if package["pythonModule"] != "trainer.task":
      raise ConfigError(f"{path}: {where}.pythonPackageSpec.pythonModule is {package['pythonModule']!r}; the "
                        "package provides trainer.task")
  has = [bool(p) for p in pools] + [False] * (4 - len(pools))
  if has[2] and not has[1] and not _is_reduction_server(pools[2]):
    raise ConfigError(f"{path}: {prefix}workerPoolSpecs[2] (parameter servers) needs workers in "
                      "workerPoolSpecs[1]: ParameterServerStrategy schedules steps on workers")


def _is_reduction_server(pool: dict) -> bool:
  return bool(REDUCTION_SERVER_IMAGE.match(pool.get("containerSpec", {}).get("imageUri", "")))


def _trainer_args(pool: dict) -> list[str]:
  return list(pool.get("pythonPackageSpec", {}).get("args", []))


def _check_accelerator(machine: dict, where: str) -> None:
  kind = machine.get("acceleratorType")
  count = machine.get("acceleratorCount", 0)
  machine_type = machine["machineType"]
  if not kind or kind == "ACCELERATOR_TYPE_UNSPECIFIED":
    if count:
      raise ConfigError(f"{where}: acceleratorCount {count} without an acceleratorType")
    return
  if kind.startswith("TPU"):
    if not machine_type.startswith("cloud-tpu") and not machine_type.startswith("ct"):
      raise ConfigError(f"{where}: {kind} needs a TPU machine type (cloud-tpu, ct5lp-...), got {machine_type}")
    return
  if machine_type.startswith("n1-"):
    allowed = _N1_GPUS.get(kind)
    if allowed is None:
      raise ConfigError(f"{where}: {kind} cannot attach to {machine_type}; n1 machines take "
                        f"{', '.join(_N1_GPUS)}")
    if count not in allowed:
      raise ConfigError(f"{where}: acceleratorCount {count} is not valid for {kind} on {machine_type}; "
                        f"allowed: {', '.join(map(str, allowed))}")
    return
  for pattern, accelerator in _FIXED_GPUS:
    match = pattern.match(machine_type)
    if match:
      if kind != accelerator or count != int(match.group(1)):
        raise ConfigError(f"{where}: {machine_type} comes with {match.group(1)} x {accelerator}; got {count} x {kind}")
      return
  if machine_type in _G2_GPUS:
    if kind != "NVIDIA_L4" or count != _G2_GPUS[machine_type]:
      raise ConfigError(f"{where}: {machine_type} comes with {_G2_GPUS[machine_type]} x NVIDIA_L4; "
                        f"got {count} x {kind}")
    return
  raise ConfigError(f"{where}: {machine_type} takes no GPUs ({count} x {kind} requested); use an n1, a2, a3 or g2 "
                    "machine type")


def _one_line(message: str) -> str:
  return " ".join(message.split())


def values_from(environ: Mapping[str, str], **overrides: str | None) -> dict[str, str]:
  """Placeholder values: explicit overrides first, then environment variables of the same names."""
  values = {name: environ[name] for name in PLACEHOLDERS if environ.get(name)}
  values.update({k.upper(): v for k, v in overrides.items() if v})
  return values


def main(argv: list[str]) -> int:
  values = values_from(os.environ)
  values = {"PROJECT": "my-project", "REGION": "us-central1", "BUCKET": "my-bucket",
            "PACKAGE_URI": "gs://my-bucket/staging/trainer.tar.gz", "RUN_ID": "validate", **values}
  failed = 0
  for path in argv:
    try:
      config = load(path, values)
      pools = config.job_spec["workerPoolSpecs"]
      print(f"ok  {path}: {config.kind}, pools {[p.get('replicaCount', 0) if p else 0 for p in pools]}")
    except ConfigError as e:
      failed += 1
      print(f"error: {e}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
