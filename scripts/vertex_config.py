"""Vertex AI job configs (cloud_configs/*.yaml): load, fill placeholders, validate strictly.

A config is a CustomJobSpec in camelCase, as `gcloud ai custom-jobs create --config` takes it, or a
hyperparameter-tuning spec (`studySpec` + `trialJobSpec`) as `gcloud ai hp-tuning-jobs create --config`
takes it. Placeholders `${NAME}` are filled from a mapping (flags or environment):

    PROJECT, REGION, BUCKET, PACKAGE_URI, RUN_ID, CPU_IMAGE, GPU_IMAGE, TRAINER_IMAGE

Validation = the real API types (`json_format.ParseDict` into aiplatform_v1 protos rejects unknown fields,
misspelled keys and bad enums) + what the types cannot see: required fields, the trainer image and command of
containerSpec pools, pool order and sizes, machine and accelerator pairs. Every error is one line naming the file
and the field. A prebuilt TF training image past its end of availability (scripts/vertex_images.py: every TF one,
since 2026-07-11) is an error naming the image, its date and the trainer image to use instead; a machine family
the table below does not know is a warning (`JobConfig.warnings`): Vertex decides.

    python -m scripts.vertex_config cloud_configs/*.yaml      # validates, prints one line per file
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import string
import sys
from typing import Mapping

import yaml

from scripts import vertex_images

DEFAULT_IMAGES = {
    # Vertex AI's newest prebuilt TensorFlow training images (Python 3.10), kept so that a config of one's own
    # naming ${CPU_IMAGE}/${GPU_IMAGE} is told why it cannot run (scripts/vertex_images.py), not "no value".
    "CPU_IMAGE": "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest",
    "GPU_IMAGE": "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest",
}
PLACEHOLDERS = ("PROJECT", "REGION", "BUCKET", "PACKAGE_URI", "RUN_ID", "CPU_IMAGE", "GPU_IMAGE", "TRAINER_IMAGE")

# The trainer image this project builds (Dockerfile): its TF is the one requirements-dev.txt pins and CI tests.
TRAINER_IMAGE_TF = "2.21"
# What a containerSpec may run: the trainer, as the Dockerfile's ENTRYPOINT runs it (or the console script).
TRAINER_COMMANDS = (["python3", "-m", "trainer.task"], ["python", "-m", "trainer.task"], ["vertex-tf-trainer"])
PREBUILT_TF_IMAGE = re.compile(
    r"^(?:(?:us|europe|asia)-docker\.pkg\.dev/vertex-ai/training|gcr\.io/cloud-aiplatform/training)/"
    r"tf-(cpu|gpu)\.2-(\d+)(?:\.py3\d+)?:[\w.-]+$")
REDUCTION_SERVER_IMAGE = re.compile(r"^us-docker\.pkg\.dev/vertex-ai-restricted/training/reductionserver:[\w.-]+$")
POOL_ROLES = ("chief (workerpool0)", "workers (workerpool1)", "parameter servers or Reduction Server (workerpool2)",
              "evaluators (workerpool3)")

# Machine types and the accelerators they carry, from Vertex's "configure compute resources" page (read
# 2026-12-06). n1 machines take attachable GPUs in these counts; the accelerator-optimized families come with a
# fixed GPU model and count. A family not listed here is a warning, not an error: Vertex adds machines faster than
# this table, and it judges the request itself.
_N1_GPUS = {"NVIDIA_TESLA_T4": (1, 2, 4), "NVIDIA_TESLA_V100": (1, 2, 4, 8), "NVIDIA_TESLA_P100": (1, 2, 4),
            "NVIDIA_TESLA_P4": (1, 2, 4)}
_FIXED_GPUS = {  # machine type -> (accelerator, count)
    **{f"a2-highgpu-{n}g": ("NVIDIA_TESLA_A100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("NVIDIA_TESLA_A100", 16),
    **{f"a2-ultragpu-{n}g": ("NVIDIA_A100_80GB", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("NVIDIA_H100_80GB", n) for n in (1, 2, 4, 8)},
    "a3-edgegpu-8g": ("NVIDIA_H100_80GB", 8),  # A3 Edge
    "a3-megagpu-8g": ("NVIDIA_H100_MEGA_80GB", 8),  # A3 Mega
    "a3-ultragpu-8g": ("NVIDIA_H200_141GB", 8),  # A3 Ultra
    "a4-highgpu-8g": ("NVIDIA_B200", 8),  # A4
    "a4x-highgpu-4g": ("NVIDIA_GB200", 4),  # A4X (Arm hosts)
    **{f"g2-standard-{n}": ("NVIDIA_L4", 1) for n in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("NVIDIA_L4", 2), "g2-standard-48": ("NVIDIA_L4", 4), "g2-standard-96": ("NVIDIA_L4", 8),
    "g4-standard-48": ("NVIDIA_RTX_PRO_6000", 1), "g4-standard-96": ("NVIDIA_RTX_PRO_6000", 2),  # G4
    "g4-standard-192": ("NVIDIA_RTX_PRO_6000", 4), "g4-standard-384": ("NVIDIA_RTX_PRO_6000", 8),
}
_TPUS = {  # machine type prefix -> (accelerator, counts); TPU v6e's accelerator is not in aiplatform_v1 1.165's enum
    "cloud-tpu": ("TPU_V2 or TPU_V3", (8,)),
    "ct4p-hightpu-": ("TPU_V4_POD", (4,)),
    "ct5lp-hightpu-": ("TPU_V5_LITEPOD", (1, 4, 8)),
    "ct6e-standard-": ("TPU_V6E", (1, 4, 8)),
}
# Families whose hosts are Arm (aarch64): NVIDIA Grace (A4X), Google Axion (C4A), Ampere Altra (T2A). An x86-64
# image does not start on them ("exec format error"), after the job has waited for its machines.
ARM_FAMILIES = ("a4x-", "c4a-", "t2a-")


def arm_pools(job_spec: dict) -> list[tuple[int, str]]:
  """(pool index, machine type) of every trainer pool on an Arm host (Reduction Server pools run Google's image)."""
  found = []
  for index, pool in enumerate(job_spec.get("workerPoolSpecs") or []):
    machine = ((pool or {}).get("machineSpec") or {}).get("machineType", "")
    image = ((pool or {}).get("containerSpec") or {}).get("imageUri", "")
    if machine.startswith(ARM_FAMILIES) and not REDUCTION_SERVER_IMAGE.match(image):
      found.append((index, machine))
  return found


# Families that carry no accelerator of their own: a GPU asked for on one of them is surely wrong.
_CPU_ONLY_FAMILIES = ("e2-", "n2-", "n2d-", "c2-", "c2d-", "c3-", "c3d-", "c4-", "m1-", "m2-", "m3-", "t2d-")


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
  warnings: tuple[str, ...] = ()  # one line each: things Vertex accepts today that will stop working

  @property
  def job_spec(self) -> dict:
    return self.body["trialJobSpec"] if self.kind == "hp_tuning" else self.body


def load(path: str, values: Mapping[str, str], *, today: datetime.date | None = None) -> JobConfig:
  """Reads, fills and validates a config file (images' availability judged on `today`, default the real date)."""
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
  return dataclasses.replace(config, warnings=tuple(validate(config, today=today)))


def fill(text: str, values: Mapping[str, str], path: str) -> str:
  # Comments may mention ${...} too; fill only the YAML body.
  body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
  merged = {**DEFAULT_IMAGES, **{k: v for k, v in values.items() if v}}
  if "TRAINER_IMAGE" not in merged and merged.get("PROJECT") and merged.get("REGION"):
    merged["TRAINER_IMAGE"] = default_trainer_image(merged["PROJECT"], merged["REGION"])
  missing = sorted({m.group(1) for m in re.finditer(r"\$\{(\w+)\}", body)} - set(merged))
  unknown = [m for m in missing if m not in PLACEHOLDERS]
  if unknown:
    raise ConfigError(f"{path}: unknown placeholder(s) {', '.join('${' + u + '}' for u in unknown)}; "
                      f"known: {', '.join(PLACEHOLDERS)}")
  if missing:
    raise ConfigError(f"{path}: no value for {', '.join('${' + m + '}' for m in missing)} "
                      "(pass --project/--region/--bucket or set the environment variable of that name)")
  return string.Template(body).substitute(merged)


def default_trainer_image(project: str, region: str, *, tag: str | None = None) -> str:
  """The trainer image in the project's Artifact Registry repository `vertex-tf-trainer` in the job's region:
  `submit` tags it by the source it is built from (`src-<digest>`); the version tag names it before that."""
  from trainer import __version__  # pylint: disable=g-import-not-at-top

  return f"{region}-docker.pkg.dev/{project}/vertex-tf-trainer/trainer:{tag or __version__}"


def validate(config: JobConfig, *, today: datetime.date | None = None) -> list[str]:
  """Raises ConfigError for what Vertex would reject or what cannot run the trainer; returns the warnings."""
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
  _check_accelerator_names(config.job_spec, path)  # before the proto's own, less helpful, enum error
  try:
    json_format.ParseDict(body, proto)
  except json_format.ParseError as e:
    raise ConfigError(f"{path}: {_one_line(str(e))}") from None
  if config.kind == "hp_tuning":
    if not body["studySpec"].get("metrics") or not body["studySpec"].get("parameters"):
      raise ConfigError(f"{path}: studySpec needs 'metrics' and 'parameters'")
    metric_ids = [m.get("metricId") for m in body["studySpec"]["metrics"]]
    reported = [a.split("=", 1)[1] for pool in config.job_spec["workerPoolSpecs"]
                for a in _trainer_args(pool) if a.startswith("--hypertune_metric=")]
    if metric_ids and reported and metric_ids[0] not in reported:
      raise ConfigError(f"{path}: studySpec metric {metric_ids[0]!r} is not what the trainer reports "
                        f"(--hypertune_metric={reported[0]})")
  return _validate_job_spec(config.job_spec, path, prefix="trialJobSpec." if config.kind == "hp_tuning" else "",
                            today=today or datetime.date.today())


def _check_accelerator_names(spec: dict, path: str) -> None:
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  known = [e.name for e in aiplatform_v1.AcceleratorType if e.name != "ACCELERATOR_TYPE_UNSPECIFIED"]
  for index, pool in enumerate(spec.get("workerPoolSpecs") or []):
    kind = ((pool or {}).get("machineSpec") or {}).get("acceleratorType")
    if kind and kind != "ACCELERATOR_TYPE_UNSPECIFIED" and kind not in known:
      raise ConfigError(f"{path}: workerPoolSpecs[{index}].machineSpec.acceleratorType {kind!r} is not an "
                        f"accelerator Vertex names; expected one of {', '.join(known)}")


def _check_scheduling(spec: dict, path: str, prefix: str) -> None:
  """Dynamic Workload Scheduler (FLEX_START) rules from Vertex's docs: the same machine in every pool, a timeout
  of at most 7 days; maxWaitDuration only means something with it."""
  scheduling = spec.get("scheduling") or {}
  strategy = scheduling.get("strategy")
  if "maxWaitDuration" in scheduling and strategy != "FLEX_START":
    raise ConfigError(f"{path}: {prefix}scheduling.maxWaitDuration applies to strategy FLEX_START (Dynamic "
                      f"Workload Scheduler), got strategy {strategy or 'unset'}")
  if strategy != "FLEX_START":
    return
  machines = {json.dumps(p.get("machineSpec"), sort_keys=True) for p in spec["workerPoolSpecs"]
              if p and not _is_reduction_server(p)}
  if len(machines) > 1:
    raise ConfigError(f"{path}: {prefix}scheduling.strategy FLEX_START needs the same machineSpec in every worker "
                      "pool (Dynamic Workload Scheduler provisions one shape)")
  timeout = scheduling.get("timeout")
  if timeout and float(str(timeout).rstrip("s")) > 7 * 24 * 3600:
    raise ConfigError(f"{path}: {prefix}scheduling.timeout {timeout} is over FLEX_START's 7 days (604800s)")


def _validate_job_spec(spec: dict, path: str, *, prefix: str, today: datetime.date) -> list[str]:
  warnings: list[str] = []
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
    warning = check_machine(machine, f"{path}: {where}.machineSpec")
    if warning and warning not in warnings:
      warnings.append(warning)
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
    if package and container:
      raise ConfigError(f"{path}: {where} has both pythonPackageSpec and containerSpec; Vertex takes one")
    if container:
      _check_trainer_container(container, machine, f"{path}: {where}.containerSpec")
      continue
    if not package:
      raise ConfigError(f"{path}: {where} needs a pythonPackageSpec running trainer.task, or a containerSpec "
                        "running the trainer image (or, in pool 2, a Reduction Server containerSpec)")
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
    warning = _check_availability(image, f"{path}: {where}.pythonPackageSpec.executorImageUri", today)
    if warning and warning not in warnings:
      warnings.append(warning)
  kinds = {"container" if (p or {}).get("containerSpec") else "package" for p in pools
           if p and not _is_reduction_server(p)}
  if len(kinds) > 1:
    raise ConfigError(f"{path}: {prefix}workerPoolSpecs mix pythonPackageSpec and containerSpec trainer pools; every "
                      "replica must run the same TensorFlow (collectives and checkpoints cross replicas): use one "
                      "kind for every trainer pool")
  _check_scheduling(spec, path, prefix)
  has = [bool(p) for p in pools] + [False] * (4 - len(pools))
  if has[2] and not has[1] and not _is_reduction_server(pools[2]):
    raise ConfigError(f"{path}: {prefix}workerPoolSpecs[2] (parameter servers) needs workers in "
                      "workerPoolSpecs[1]: ParameterServerStrategy schedules steps on workers")
  return warnings


def prebuilt_image_info(image: str) -> vertex_images.PrebuiltImage | None:
  """The table's entry for a prebuilt TF training image, or None if it is not one."""
  match = PREBUILT_TF_IMAGE.match(image)
  return vertex_images.TRAINING.get(f"2-{match.group(2)}") if match else None


def _check_availability(image: str, where: str, today: datetime.date) -> str | None:
  """Refuses a prebuilt training image past its end of availability (a job on it fails on Vertex after staging);
  warns in the last days before it."""
  info = prebuilt_image_info(image)
  name = image.rsplit("/", 1)[-1]
  if info is None:
    raise ConfigError(f"{where}: {name} is not a prebuilt TF training image Vertex lists ({vertex_images.SOURCE}: "
                      f"{', '.join(f'tf-*.{k}' for k in vertex_images.TRAINING)}); {vertex_images.TRAINER_IMAGE_INSTEAD}")
  ends = info.end_of_availability
  if ends < today:
    raise ConfigError(f"{where}: {name} (TF {info.tf_version}) reached its end of availability on {ends.isoformat()} "
                      f"({vertex_images.SOURCE}) and Vertex no longer runs it; {vertex_images.TRAINER_IMAGE_INSTEAD}")
  if (ends - today).days <= vertex_images.WARN_DAYS:
    return (f"{where}: {name} (TF {info.tf_version}) reaches its end of availability on {ends.isoformat()}; "
            "move to the trainer image (containerSpec, ${TRAINER_IMAGE})")
  return None


def _check_trainer_container(container: dict, machine: dict, where: str) -> None:
  image = container.get("imageUri")
  if not image:
    raise ConfigError(f"{where}.imageUri is required: the trainer image (build it from the Dockerfile, or "
                      "python -m scripts.submit --build_image)")
  if PREBUILT_TF_IMAGE.match(image):
    raise ConfigError(f"{where}.imageUri {image!r} is a prebuilt training image, which does not hold the trainer; "
                      "run it as pythonPackageSpec.executorImageUri, or use the trainer image in containerSpec")
  command = container.get("command")
  if command is not None and list(command) not in TRAINER_COMMANDS:
    raise ConfigError(f"{where}.command {list(command)!r} is not the trainer; expected "
                      f"{' or '.join(json.dumps(c) for c in TRAINER_COMMANDS)}, or no command (the image's "
                      "ENTRYPOINT, which the Dockerfile sets to the trainer); put trainer flags in args")
  del machine  # GPU or not, the trainer image is the same (TensorFlow's GPU build runs on CPU-only machines)


def trainer_command(pool: dict) -> list[str] | None:
  """What a trainer pool runs: `python -m trainer.task` for a package pool or a container without a command
  (the Dockerfile's ENTRYPOINT), the container's command otherwise; None for a pool that is not the trainer."""
  if not pool or _is_reduction_server(pool):
    return None
  container = pool.get("containerSpec")
  if container is not None:
    return list(container.get("command") or TRAINER_COMMANDS[0])
  package = pool.get("pythonPackageSpec")
  return ["python3", "-m", package["pythonModule"]] if package else None


def trainer_spec(pool: dict) -> dict | None:
  """The part of a trainer pool that holds its args and env (pythonPackageSpec or containerSpec)."""
  if not pool or _is_reduction_server(pool):
    return None
  return pool.get("pythonPackageSpec") or pool.get("containerSpec")


def _is_reduction_server(pool: dict) -> bool:
  return bool(REDUCTION_SERVER_IMAGE.match(pool.get("containerSpec", {}).get("imageUri", "")))


def _trainer_args(pool: dict) -> list[str]:
  return list((trainer_spec(pool) or {}).get("args", []))


def check_machine(machine: dict, where: str) -> str | None:
  """Raises ConfigError for a machine/accelerator pair Vertex surely refuses; returns a warning for a machine
  family this table does not know (Vertex decides). The accelerator's name was checked before."""
  kind = machine.get("acceleratorType")
  count = machine.get("acceleratorCount", 0)
  machine_type = machine["machineType"]
  if not kind or kind == "ACCELERATOR_TYPE_UNSPECIFIED":
    if count:
      raise ConfigError(f"{where}: acceleratorCount {count} without an acceleratorType")
    fixed = _FIXED_GPUS.get(machine_type)
    if fixed:
      raise ConfigError(f"{where}: {machine_type} comes with {fixed[1]} x {fixed[0]}; give acceleratorType "
                        f"{fixed[0]} and acceleratorCount {fixed[1]}")
    return None
  if kind.startswith("TPU"):
    for prefix, (tpu, counts) in _TPUS.items():
      if machine_type.startswith(prefix):
        if kind not in tpu.split(" or "):
          raise ConfigError(f"{where}: {machine_type} carries {tpu}, got {kind}")
        return None
    if machine_type.startswith(("n1-", "a2-", "a3-", "a4", "g2-", "g4-") + _CPU_ONLY_FAMILIES):
      raise ConfigError(f"{where}: {kind} needs a TPU machine type ({', '.join(p.rstrip('-') + '...' for p in _TPUS)}"
                        f"), got {machine_type}")
    return f"{where}: {machine_type} is not a TPU machine type this project knows; Vertex will judge {kind} on it"
  if machine_type.startswith("n1-"):
    allowed = _N1_GPUS.get(kind)
    if allowed is None:
      raise ConfigError(f"{where}: {kind} cannot attach to {machine_type}; n1 machines take "
                        f"{', '.join(_N1_GPUS)} (an {kind} comes with its own machine type: "
                        f"{', '.join(m for m, (a, _) in _FIXED_GPUS.items() if a == kind) or 'see Vertex'})")
    if count not in allowed:
      raise ConfigError(f"{where}: acceleratorCount {count} is not valid for {kind} on {machine_type}; "
                        f"allowed: {', '.join(map(str, allowed))}")
    return None
  fixed = _FIXED_GPUS.get(machine_type)
  if fixed:
    if (kind, count) != fixed:
      raise ConfigError(f"{where}: {machine_type} comes with {fixed[1]} x {fixed[0]}; got {count} x {kind}")
    return None
  if machine_type.startswith(_CPU_ONLY_FAMILIES) or machine_type.startswith(("cloud-tpu", "ct")):
    raise ConfigError(f"{where}: {machine_type} takes no GPUs ({count} x {kind} requested); GPUs come on n1 "
                      "(attached) and the accelerator-optimized a2, a3, a4, a4x, g2 and g4 machine types")
  family = machine_type.split("-")[0]
  if family in {m.split("-")[0] for m in _FIXED_GPUS}:
    sizes = sorted(m for m, (a, _) in _FIXED_GPUS.items() if m.startswith(family + "-"))
    raise ConfigError(f"{where}: {machine_type} is not a machine type Vertex lists in the {family} family, which "
                      f"has {', '.join(sizes)}")
  return (f"{where}: {machine_type} is a machine family this project's table (scripts/vertex_config.py, read "
          f"2026-12-06) does not know; Vertex will judge {count} x {kind} on it")


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
      for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    except ConfigError as e:
      failed += 1
      print(f"error: {e}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
