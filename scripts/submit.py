"""Build the trainer sdist, stage it to a bucket and submit a Vertex AI job from a cloud_configs/ file.

    python -m scripts.submit --config=cloud_configs/multi_worker_gpu.yaml \\
        --project=my-project --region=us-central1 --bucket=my-bucket [--args=--train_steps=5000] [--env=K=V]
    python -m scripts.submit --config=... --dry_run     # print the request and the gcloud command; send nothing

The config is validated (scripts/vertex_config.py) before anything is built or uploaded. A custom-job config
becomes a CustomJob, an hp-tuning config a HyperparameterTuningJob, submitted through google-cloud-aiplatform's
JobService; the command then follows the job's state until it ends (--no_follow returns at once).
Values not given as flags come from the environment (PROJECT, REGION, BUCKET).
"""

from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from scripts import vertex_config
from trainer import paths

TERMINAL_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


class SubmitError(RuntimeError):
  """A one-line reason the submission cannot go ahead."""


def build_sdist(out_dir: str) -> str:
  """`python setup.py sdist` of the trainer; returns the archive path."""
  result = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--formats=gztar", "--dist-dir", out_dir],
                          cwd=REPO, capture_output=True, text=True, check=False)
  if result.returncode:
    raise SubmitError(f"building the sdist failed: {result.stderr.strip().splitlines()[-1:]}")
  (archive,) = glob.glob(os.path.join(out_dir, "*.tar.gz"))
  return archive


PACKAGE_ARCHIVES = (".tar.gz", ".zip", ".whl")


def build_extra_package(path: str, out_dir: str) -> str:
  """--extra_package: a built sdist/wheel as it is, or a project directory (pyproject.toml or setup.py) built
  into a wheel with the local toolchain (no build isolation: nothing is fetched). Returns the archive."""
  if os.path.isfile(path):
    if not path.endswith(PACKAGE_ARCHIVES):
      raise SubmitError(f"--extra_package={path}: not a package archive; expected a directory with pyproject.toml "
                        f"or setup.py, or a built {', '.join(PACKAGE_ARCHIVES)}")
    return path
  if not os.path.isdir(path):
    raise SubmitError(f"--extra_package={path}: no such file or directory")
  if not any(os.path.exists(os.path.join(path, name)) for name in ("pyproject.toml", "setup.py")):
    raise SubmitError(f"--extra_package={path}: the directory has no pyproject.toml or setup.py to build it from")
  wheel_dir = tempfile.mkdtemp(prefix="wheel-", dir=out_dir)
  result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", wheel_dir, path], capture_output=True, text=True, check=False)
  if result.returncode:
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    raise SubmitError(f"--extra_package={path}: building it failed ({lines[-1].strip() if lines else 'pip wheel'})")
  (archive,) = glob.glob(os.path.join(wheel_dir, "*.whl"))
  return archive


def add_package_uris(body: dict, uris: list[str]) -> None:
  """Lists `uris` after the trainer's in every Python-package pool's packageUris (Vertex installs them all)."""
  for pool in body.get("workerPoolSpecs", []):
    spec = (pool or {}).get("pythonPackageSpec")
    if spec is not None:
      spec["packageUris"] = list(spec.get("packageUris", [])) + [u for u in uris if u not in spec.get("packageUris", [])]


def stage_extra_packages(paths_given: list[str], bucket: str, out_dir: str) -> list[tuple[str, str]]:
  """(archive, gs:// URI) for each --extra_package, built and named by content like the trainer's sdist."""
  return [(archive, package_uri(bucket, archive, suffix=_archive_suffix(archive)))
          for archive in (build_extra_package(p, out_dir) for p in paths_given)]


def _archive_suffix(archive: str) -> str:
  return next(s for s in PACKAGE_ARCHIVES if archive.endswith(s))


def package_uri(bucket: str, archive: str, *, suffix: str = ".tar.gz") -> str:
  """Content-addressed staging path, so a job always runs exactly the code it was submitted with."""
  with open(archive, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:12]
  base = os.path.basename(archive)
  if suffix == ".whl":  # a wheel's file name is parsed by pip: the digest goes in a directory instead
    return f"gs://{bucket}/staging/{digest}/{base}"
  name = base[:-len(suffix)] + f"-{digest}{suffix}"
  return f"gs://{bucket}/staging/{name}"


def upload(archive: str, uri: str, *, client=None) -> None:
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  bucket_name, blob_name = paths.split_gcs_uri(uri)
  client = client or storage.Client(project=os.environ.get("PROJECT", "local-project"))
  client.bucket(bucket_name).blob(blob_name).upload_from_filename(archive)


def apply_overrides(config: vertex_config.JobConfig, extra_args: list[str], env: dict[str, str]) -> dict:
  """The job body with extra trainer args and env appended to every trainer pool."""
  body = copy.deepcopy(config.body)
  spec = body["trialJobSpec"] if config.kind == "hp_tuning" else body
  for pool in spec["workerPoolSpecs"]:
    package = (pool or {}).get("pythonPackageSpec")
    if not package:
      continue
    package["args"] = list(package.get("args", [])) + list(extra_args)
    existing = [e for e in package.get("env", []) if e["name"] not in env]
    package["env"] = existing + [{"name": k, "value": v} for k, v in env.items()]
    if not package["env"]:
      del package["env"]
  return body


def check_trainer_args(body: dict, kind: str) -> None:
  """Every trainer pool's args, checked as the trainer will check them, before anything is built or sent."""
  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top

  spec = body["trialJobSpec"] if kind == "hp_tuning" else body
  for index, pool in enumerate(spec["workerPoolSpecs"]):
    package = (pool or {}).get("pythonPackageSpec")
    if package:
      try:
        trainer_flags.check_args(list(package.get("args", [])), where=f"workerpool{index}")
      except UserError as e:
        raise SubmitError(str(e)) from None


def request_for(kind: str, body: dict, display_name: str) -> dict:
  """The JSON body of the create request, as the REST API takes it."""
  if kind == "hp_tuning":
    return {"displayName": display_name, **body}
  return {"displayName": display_name, "jobSpec": body}


def gcloud_command(kind: str, *, project: str, region: str, display_name: str, config_file: str) -> str:
  group = "hp-tuning-jobs" if kind == "hp_tuning" else "custom-jobs"
  return (f"gcloud ai {group} create --project={shlex.quote(project)} --region={shlex.quote(region)} "
          f"--display-name={shlex.quote(display_name)} --config={shlex.quote(config_file)}")


def client_kwargs(region: str, api_endpoint: str | None) -> dict[str, Any]:
  """Keyword arguments for any aiplatform_v1 service client: the regional endpoint, or a local one (tests,
  fakes), which is reached anonymously over plain HTTP REST."""
  kwargs: dict[str, Any] = {"client_options": {"api_endpoint": api_endpoint or f"{region}-aiplatform.googleapis.com"}}
  if api_endpoint and api_endpoint.startswith("http://"):
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
    kwargs.update(credentials=AnonymousCredentials(), transport="rest")
  return kwargs


def job_client(region: str, api_endpoint: str | None):
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  return aiplatform_v1.JobServiceClient(**client_kwargs(region, api_endpoint))


def create_job(client, kind: str, parent: str, request: dict):
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  if kind == "hp_tuning":
    job = aiplatform_v1.HyperparameterTuningJob()
    json_format.ParseDict(request, job._pb)  # pylint: disable=protected-access
    return client.create_hyperparameter_tuning_job(parent=parent, hyperparameter_tuning_job=job)
  job = aiplatform_v1.CustomJob()
  json_format.ParseDict(request, job._pb)  # pylint: disable=protected-access
  return client.create_custom_job(parent=parent, custom_job=job)


def follow(client, kind: str, name: str, *, poll_secs: float, timeout_secs: float) -> str:
  get = client.get_hyperparameter_tuning_job if kind == "hp_tuning" else client.get_custom_job
  deadline = time.monotonic() + timeout_secs
  last = None
  while True:
    state = get(name=name).state.name
    if state != last:
      print(f"{time.strftime('%H:%M:%S')} {name}: {state}", flush=True)
      last = state
    if state in TERMINAL_STATES or time.monotonic() > deadline:
      return state
    time.sleep(poll_secs)


def parse_env(pairs: list[str]) -> dict[str, str]:
  env = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
      raise SubmitError(f"--env expects KEY=VALUE, got {pair!r}")
    env[key] = value
  return env


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="a file in cloud_configs/")
  parser.add_argument("--project", default=os.environ.get("PROJECT"))
  parser.add_argument("--region", default=os.environ.get("REGION", "us-central1"))
  parser.add_argument("--bucket", default=os.environ.get("BUCKET"), help="staging and output bucket (no gs://)")
  parser.add_argument("--display_name", default=None)
  parser.add_argument("--run_id", default=None, help="fills ${RUN_ID} (default: time stamp)")
  parser.add_argument("--args", action="append", default=[], help="extra trainer arg (repeatable)")
  parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every trainer replica")
  parser.add_argument("--image", default=None, help="override both CPU and GPU executor images")
  parser.add_argument("--extra_package", action="append", default=[], metavar="PATH",
                      help="your own package for every replica (repeatable): a directory with pyproject.toml or "
                           "setup.py, or a built sdist/wheel; staged next to the trainer, listed in packageUris")
  parser.add_argument("--dry_run", action="store_true", help="print the request and gcloud command; send nothing")
  parser.add_argument("--no_follow", action="store_true")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  parser.add_argument("--poll_secs", type=float, default=30.0)
  parser.add_argument("--timeout_secs", type=float, default=7 * 24 * 3600)
  args = parser.parse_args(argv)
  try:
    return _submit(args)
  except (SubmitError, vertex_config.ConfigError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _submit(args) -> int:
  if not args.project:
    raise SubmitError("--project is required (or set PROJECT)")
  if not args.bucket:
    raise SubmitError("--bucket is required (or set BUCKET): the sdist is staged there")
  args.bucket = vertex_config.bucket_name(args.bucket)
  run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
  display_name = args.display_name or f"{os.path.splitext(os.path.basename(args.config))[0]}-{run_id}"
  env = parse_env(args.env)
  with tempfile.TemporaryDirectory(prefix="submit-") as scratch:
    # Validate with a placeholder package first: a bad config fails before anything is built or uploaded.
    values = vertex_config.values_from(os.environ, project=args.project, region=args.region, bucket=args.bucket,
                                       run_id=run_id, cpu_image=args.image, gpu_image=args.image)
    pending = vertex_config.load(args.config, {**values, "PACKAGE_URI": f"gs://{args.bucket}/staging/pending.tar.gz"})
    check_trainer_args(apply_overrides(pending, args.args, env), pending.kind)
    archive = build_sdist(scratch)
    uri = package_uri(args.bucket, archive)
    extras = stage_extra_packages(args.extra_package, args.bucket, scratch)
    config = vertex_config.load(args.config, {**values, "PACKAGE_URI": uri})
    body = apply_overrides(config, args.args, env)
    add_package_uris(body, [u for _, u in extras])
    request = request_for(config.kind, body, display_name)
    parent = f"projects/{args.project}/locations/{args.region}"
    if args.dry_run:
      rendered = os.path.join(tempfile.gettempdir(), f"{display_name}.yaml")
      import yaml  # pylint: disable=g-import-not-at-top
      with open(rendered, "w") as f:
        yaml.safe_dump(body, f, sort_keys=False)
      print(json.dumps({"parent": parent, "package": {"local": "(built at submit time)", "uri": uri},
                        "extra_packages": [{"local": a, "uri": u} for a, u in extras],
                        "request": request}, indent=2))
      print(f"# config written to {rendered}; upload the sdist to {uri}, then:")
      print(gcloud_command(config.kind, project=args.project, region=args.region, display_name=display_name,
                           config_file=rendered))
      return 0
    for local, remote in [(archive, uri), *extras]:
      upload(local, remote)
      print(f"staged {os.path.basename(local)} -> {remote}", flush=True)
    client = job_client(args.region, args.api_endpoint)
    job = create_job(client, config.kind, parent, request)
    print(f"submitted {job.name}", flush=True)
    if args.no_follow:
      return 0
    state = follow(client, config.kind, job.name, poll_secs=args.poll_secs, timeout_secs=args.timeout_secs)
    return 0 if state == "JOB_STATE_SUCCEEDED" else 1


if __name__ == "__main__":
  sys.exit(main())
