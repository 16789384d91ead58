"""A Vertex AI Pipelines (Kubeflow) pipeline whose training step is a cloud_configs/ job, and its schedule.

    python -m scripts.pipeline compile  --config=cloud_configs/multi_worker_gpu.yaml --bucket=B --output=pipeline.yaml
    python -m scripts.pipeline submit   --config=... --project=P --region=R --bucket=B --param=train_steps=2000
    python -m scripts.pipeline schedule --config=... --project=P --region=R --bucket=B \\
        --cron='0 3 * * *' --time_zone=Europe/Paris --max_concurrent_runs=1 [--start_time=... --end_time=...]
    python -m scripts.pipeline local    --config=... --bucket=B     # every step on this machine, emulated storage

Steps: `check-data` (the training and eval patterns match objects) -> `worker-pool-specs` (the config's pools with
the run's parameters appended to the trainer args) -> `custom-training-job` (google-cloud-pipeline-components'
CustomTrainingJobOp: differing pools and Python packages, as the config has them) -> `read-metrics` (the
eval_metrics.json the trainer wrote, logged as pipeline metrics) -> with --upload_model, `model-upload`
(google-cloud-pipeline-components' ModelUploadOp: the SavedModel into Model Registry with the prebuilt TF
prediction image matching the training TF, its predict schemata, and the pipeline run as a label). The pools
come from the config file, never re-typed. submit and schedule take --dry_run to print the request instead of sending it.
"""

# No `from __future__ import annotations`: kfp reads component signatures at runtime.

import argparse
import datetime
import json
import os
import sys
import tempfile
from typing import Any

import yaml


from kfp import dsl

from scripts import registry
from scripts import submit as submit_lib
from scripts import vertex_config

PIPELINE_NAME = "vertex-tf-trainer"
# Run parameters and their defaults; anything else passed with --param is an error.
PARAMETERS: dict[str, Any] = {"train_data": "", "eval_data": "", "base_output_dir": "", "train_steps": 1000,
                              "learning_rate": 0.001, "global_batch_size": 256}


class PipelineError(ValueError):
  """A one-line reason nothing was compiled or sent."""


@dsl.component(base_image="python:3.10", packages_to_install=["google-cloud-storage>=2"])
def check_data(train_data: str, eval_data: str) -> int:
  """Fails the run early unless both patterns match objects; returns how many training files there are."""
  import fnmatch  # pylint: disable=import-outside-toplevel
  import glob  # pylint: disable=import-outside-toplevel

  def matches(pattern: str) -> list:
    if not pattern.startswith("gs://"):
      return sorted(glob.glob(pattern))
    from google.cloud import storage  # pylint: disable=import-outside-toplevel
    bucket, _, name_pattern = pattern[len("gs://"):].partition("/")
    prefix = name_pattern.split("*")[0].split("?")[0].split("[")[0]
    names = [b.name for b in storage.Client().list_blobs(bucket, prefix=prefix)]
    return [n for n in names if fnmatch.fnmatchcase(n, name_pattern)]

  counts = {}
  for label, pattern in (("train_data", train_data), ("eval_data", eval_data)):
    found = matches(pattern)
    if not found:
      raise ValueError(f"{label}: no objects match {pattern!r}")
    counts[label] = len(found)
  print(f"check-data: {counts}")
  return counts["train_data"]


@dsl.component(base_image="python:3.10")
def worker_pool_specs(base_specs: str, train_data: str, eval_data: str, train_steps: int, learning_rate: float,
                      global_batch_size: int) -> list:
  """The config's worker pools with this run's parameters appended to every trainer's args (last flag wins)."""
  import json as json_lib  # pylint: disable=import-outside-toplevel

  specs = json_lib.loads(base_specs)
  extra = [f"--train_data={train_data}", f"--eval_data={eval_data}", f"--train_steps={train_steps}",
           f"--learning_rate={learning_rate}", f"--global_batch_size={global_batch_size}"]
  for pool in specs:
    container = (pool or {}).get("containerSpec") or {}
    # The trainer's args live in its pythonPackageSpec or containerSpec (not a Reduction Server's container).
    package = (pool or {}).get("pythonPackageSpec") or (
        container if container and "/reductionserver:" not in container.get("imageUri", "") else None)
    if package:
      package["args"] = list(package.get("args", [])) + extra
  return specs


@dsl.component(base_image="python:3.10")
def model_artifact(base_output_dir: str, serving_image: str, model: dsl.Output[dsl.Artifact]):
  """The exported SavedModel (<base_output_dir>/model/) as the unmanaged container model ModelUploadOp takes:
  its serving container and the predict schemata the export wrote beside it."""
  model_dir = base_output_dir.rstrip("/") + "/model/"
  model.uri = model_dir
  model.metadata["containerSpec"] = {"imageUri": serving_image}
  model.metadata["predictSchemata"] = {"instanceSchemaUri": model_dir + "instance_schema.yaml",
                                       "predictionSchemaUri": model_dir + "prediction_schema.yaml"}


@dsl.component(base_image="python:3.10", packages_to_install=["google-cloud-storage>=2"])
def read_metrics(base_output_dir: str, metrics: dsl.Output[dsl.Metrics]) -> float:
  """Reads <base_output_dir>/model/eval_metrics.json, logs its eval metrics, returns eval_accuracy (or -loss)."""
  import json as json_lib  # pylint: disable=import-outside-toplevel

  path = base_output_dir.rstrip("/") + "/model/eval_metrics.json"
  if path.startswith("gs://"):
    from google.cloud import storage  # pylint: disable=import-outside-toplevel
    bucket, _, name = path[len("gs://"):].partition("/")
    text = storage.Client().bucket(bucket).blob(name).download_as_text()
  else:
    with open(path) as f:
      text = f.read()
  values = json_lib.loads(text)
  for key, value in values.items():
    if key.startswith("eval_") and isinstance(value, (int, float)):
      metrics.log_metric(key, float(value))
  print(f"read-metrics: {values}")
  return float(values.get("eval_accuracy", -values.get("eval_loss", 0.0)))


def load_config(path: str, values: dict[str, str]) -> vertex_config.JobConfig:
  config = vertex_config.load(path, values)
  if config.kind != "custom_job":
    raise PipelineError(f"{path}: the pipeline's training step takes a custom-job config, not {config.kind}")
  return config


def build_pipeline(config: vertex_config.JobConfig, *, serving_image: str | None = None):
  """The pipeline function for one config: its pools, scheduling and output layout are baked in; with a
  `serving_image`, a model-upload step registers the model after training."""
  from google_cloud_pipeline_components.v1.custom_job import CustomTrainingJobOp  # pylint: disable=g-import-not-at-top
  from google_cloud_pipeline_components.v1.model import ModelUploadOp  # pylint: disable=g-import-not-at-top

  pools_json = json.dumps(config.body["workerPoolSpecs"])
  scheduling = config.body.get("scheduling", {})

  @dsl.pipeline(name=PIPELINE_NAME, description=f"Trains with {os.path.basename(config.path)}")
  def training_pipeline(project: str, location: str, train_data: str, eval_data: str, base_output_dir: str,
                        train_steps: int = 1000, learning_rate: float = 0.001, global_batch_size: int = 256):
    checked = check_data(train_data=train_data, eval_data=eval_data)
    specs = worker_pool_specs(base_specs=pools_json, train_data=train_data, eval_data=eval_data,
                              train_steps=train_steps, learning_rate=learning_rate,
                              global_batch_size=global_batch_size).after(checked)
    optional = {}
    if scheduling.get("timeout"):
      optional["timeout"] = scheduling["timeout"]
    if scheduling.get("restartJobOnWorkerRestart"):
      optional["restart_job_on_worker_restart"] = True
    if scheduling.get("strategy"):
      optional["strategy"] = scheduling["strategy"]
    trained = CustomTrainingJobOp(project=project, location=location, display_name="vertex-tf-trainer-train",
                                  worker_pool_specs=specs.output, base_output_directory=base_output_dir, **optional)
    metrics = read_metrics(base_output_dir=base_output_dir).after(trained)
    if serving_image:
      model = model_artifact(base_output_dir=base_output_dir, serving_image=serving_image).after(metrics)
      ModelUploadOp(project=project, location=location, display_name="vertex-tf-trainer-model",
                    unmanaged_container_model=model.outputs["model"],
                    labels={"vertex-tf-trainer-run": dsl.PIPELINE_JOB_ID_PLACEHOLDER})

  return training_pipeline


def compile_pipeline(config: vertex_config.JobConfig, output: str, *, serving_image: str | None = None) -> str:
  from kfp import compiler  # pylint: disable=g-import-not-at-top

  compiler.Compiler().compile(build_pipeline(config, serving_image=serving_image), output)
  return output


def parse_params(pairs: list[str], *, bucket: str, run_id: str) -> dict[str, Any]:
  params = dict(PARAMETERS)
  params.update(train_data=f"gs://{bucket}/data/train/*.tfrecord", eval_data=f"gs://{bucket}/data/eval/*.tfrecord",
                base_output_dir=f"gs://{bucket}/pipeline-runs/{run_id}")
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or key not in PARAMETERS:
      raise PipelineError(f"--param {pair!r}: unknown parameter; expected NAME=VALUE with NAME one of "
                          f"{', '.join(PARAMETERS)}")
    kind = type(PARAMETERS[key])
    try:
      params[key] = kind(value)
    except ValueError:
      raise PipelineError(f"--param {key}={value!r}: expected a {kind.__name__}") from None
  return params


def check_schedule(cron: str, time_zone: str, start_time: str | None, end_time: str | None,
                   max_concurrent_runs: int) -> None:
  from croniter import croniter  # pylint: disable=g-import-not-at-top
  import zoneinfo  # pylint: disable=g-import-not-at-top

  if len(cron.split()) != 5 or not croniter.is_valid(cron):
    raise PipelineError(f"--cron={cron!r} is not a 5-field cron expression (minute hour day month weekday), "
                        "e.g. '0 3 * * *'")
  try:
    zoneinfo.ZoneInfo(time_zone)
  except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise PipelineError(f"--time_zone={time_zone!r} is not an IANA time zone (e.g. UTC, Europe/Paris)") from None
  parsed = {}
  for flag, value in (("--start_time", start_time), ("--end_time", end_time)):
    if value:
      try:
        parsed[flag] = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
      except ValueError:
        raise PipelineError(f"{flag}={value!r} is not an RFC 3339 time (e.g. 2027-01-01T00:00:00Z)") from None
  if len(parsed) == 2 and parsed["--end_time"] <= parsed["--start_time"]:
    raise PipelineError(f"--end_time={end_time} is not after --start_time={start_time}")
  if max_concurrent_runs < 1:
    raise PipelineError(f"--max_concurrent_runs must be >= 1, got {max_concurrent_runs}")


def pipeline_job(template: dict, *, display_name: str, pipeline_root: str, parameter_values: dict):
  """The PipelineJob resource (aiplatform_v1) for a compiled template."""
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  job = aiplatform_v1.PipelineJob()
  json_format.ParseDict({"displayName": display_name, "pipelineSpec": template,
                         "runtimeConfig": {"gcsOutputDirectory": pipeline_root, "parameterValues": parameter_values}},
                        job._pb)  # pylint: disable=protected-access
  return job


def _clients(region: str, api_endpoint: str | None):
  """PipelineService and ScheduleService clients (plain REST and anonymous for a local endpoint).

  The low-level clients, not aiplatform.PipelineJob: its submit() checks bucket ownership through Resource
  Manager, an extra call to a Google host that this tool has no need for.
  """
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  kwargs = submit_lib.client_kwargs(region, api_endpoint)
  return aiplatform_v1.PipelineServiceClient(**kwargs), aiplatform_v1.ScheduleServiceClient(**kwargs)


def _whole_numbers(value):
  """kfp hands list outputs back through protobuf Struct, where every number is a float; restore the ints."""
  if isinstance(value, dict):
    return {k: _whole_numbers(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_whole_numbers(v) for v in value]
  if isinstance(value, float) and value.is_integer():
    return int(value)
  return value


def run_local(config: vertex_config.JobConfig, params: dict[str, Any], *, bucket: str, run_id: str,
              extra: list[str]) -> dict:
  """Every step on this machine: kfp's local runner for the Python steps, local_vertex.py for training."""
  from kfp import local  # pylint: disable=g-import-not-at-top

  from scripts import local_vertex  # pylint: disable=g-import-not-at-top

  local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=tempfile.mkdtemp(prefix="kfp-local-"))
  checked = check_data(train_data=params["train_data"], eval_data=params["eval_data"])
  specs = worker_pool_specs(base_specs=json.dumps(config.body["workerPoolSpecs"]), train_data=params["train_data"],
                            eval_data=params["eval_data"], train_steps=params["train_steps"],
                            learning_rate=params["learning_rate"], global_batch_size=params["global_batch_size"])
  # The training step: the same pools, run replica by replica as Vertex would run them.
  with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=os.path.dirname(config.path)) as f:
    body = {**config.body, "workerPoolSpecs": _whole_numbers(specs.output),
            "baseOutputDirectory": {"outputUriPrefix": params["base_output_dir"]}}
    yaml.safe_dump(body, f)
    step_config = f.name
  try:
    code = local_vertex.main([f"--config={step_config}", f"--bucket={bucket}", f"--run_id={run_id}", *extra])
  finally:
    os.remove(step_config)
  if code:
    raise PipelineError(f"training step failed (local_vertex exit code {code})")
  metrics = read_metrics(base_output_dir=params["base_output_dir"])
  return {"check_data": checked.output, "metric": metrics.outputs["Output"],
          "metrics": dict(metrics.outputs["metrics"].metadata)}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("command", choices=("compile", "submit", "schedule", "local"))
  parser.add_argument("--config", required=True)
  parser.add_argument("--project", default=os.environ.get("PROJECT"))
  parser.add_argument("--region", default=os.environ.get("REGION", "us-central1"))
  parser.add_argument("--bucket", default=os.environ.get("BUCKET"))
  parser.add_argument("--output", default="training_pipeline.yaml", help="compile: where the YAML goes")
  parser.add_argument("--param", action="append", default=[], help=f"NAME=VALUE, NAME in {', '.join(PARAMETERS)}")
  parser.add_argument("--run_id", default=None)
  parser.add_argument("--cron", default=None)
  parser.add_argument("--time_zone", default="UTC")
  parser.add_argument("--start_time", default=None)
  parser.add_argument("--end_time", default=None)
  parser.add_argument("--max_concurrent_runs", type=int, default=1)
  parser.add_argument("--max_runs", type=int, default=None)
  parser.add_argument("--local_arg", action="append", default=[], help="local: extra local_vertex.py flag")
  parser.add_argument("--extra_package", action="append", default=[], metavar="PATH",
                      help="your own package for the training step's replicas (repeatable): a directory with "
                           "pyproject.toml or setup.py, or a built sdist/wheel; staged and listed in packageUris")
  parser.add_argument("--upload_model", action="store_true",
                      help="add a model-upload step after training: the SavedModel into Model Registry")
  parser.add_argument("--serving_image", default=None,
                      help="the model's serving container (default: the prebuilt TF prediction image for its TF)")
  parser.add_argument("--dry_run", action="store_true")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  try:
    return _main(args)
  except (PipelineError, vertex_config.ConfigError, submit_lib.SubmitError, registry.RegistryError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _main(args) -> int:
  import time  # pylint: disable=g-import-not-at-top

  if not args.bucket:
    raise PipelineError("--bucket is required (or set BUCKET): package, data and outputs live there")
  run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
  params = parse_params(args.param, bucket=args.bucket, run_id=run_id)
  if args.command == "schedule":
    if not args.cron:
      raise PipelineError("schedule needs --cron (e.g. --cron='0 3 * * *')")
    check_schedule(args.cron, args.time_zone, args.start_time, args.end_time, args.max_concurrent_runs)
  values = vertex_config.values_from(os.environ, project=args.project or "local-project", region=args.region,
                                     bucket=args.bucket, run_id=run_id)
  # Validate before anything is built, compiled or sent.
  load_config(args.config, {**values, "PACKAGE_URI": f"gs://{args.bucket}/staging/pending.tar.gz"})
  if args.command == "local" and args.upload_model:
    raise PipelineError("--upload_model: ModelUploadOp runs only on Vertex AI Pipelines; after a local run, "
                        "register the model with python -m scripts.submit --upload_model")
  if args.command == "local":
    config = load_config(args.config, {**values, "PACKAGE_URI": f"gs://{args.bucket}/staging/local.tar.gz"})
    result = run_local(config, params, bucket=args.bucket, run_id=run_id,
                       extra=args.local_arg + [f"--extra_package={p}" for p in args.extra_package])
    print(json.dumps(result, default=str))
    return 0
  with tempfile.TemporaryDirectory(prefix="pipeline-") as scratch:
    archive = submit_lib.build_sdist(scratch)
    uri = submit_lib.package_uri(args.bucket, archive)
    extras = submit_lib.stage_extra_packages(args.extra_package, args.bucket, scratch)
    config = load_config(args.config, {**values, "PACKAGE_URI": uri})
    submit_lib.add_package_uris(config.body, [u for _, u in extras])  # compiled into the training step
    output = args.output if args.command == "compile" else os.path.join(scratch, "pipeline.yaml")
    serving_image = None
    if args.upload_model:
      serving_image = args.serving_image or registry.serving_image(
          submit_lib.training_tf_of(config.body["workerPoolSpecs"][0]), args.region)
    compile_pipeline(config, output, serving_image=serving_image)
    if args.command == "compile":
      staging = "; ".join(f"{local} to {remote}" for local, remote in [(archive, uri), *extras])
      print(f"compiled {output} (training pools from {args.config}; stage {staging} before running)")
      return 0
    if not args.project:
      raise PipelineError("--project is required (or set PROJECT)")
    parameter_values = {"project": args.project, "location": args.region, **params}
    display_name = f"{PIPELINE_NAME}-{run_id}"
    request = {"displayName": display_name, "pipelineRoot": f"gs://{args.bucket}/pipeline-root",
               "parameterValues": parameter_values, "package": uri,
               "extraPackages": [u for _, u in extras]}
    if args.command == "schedule":
      request["schedule"] = {"cron": f"TZ={args.time_zone} {args.cron}", "maxConcurrentRunCount": args.max_concurrent_runs,
                             "startTime": args.start_time, "endTime": args.end_time, "maxRunCount": args.max_runs}
    if args.dry_run:
      print(json.dumps(request, indent=2))
      return 0
    for local, remote in [(archive, uri), *extras]:
      submit_lib.upload(local, remote)
    with open(output) as f:
      template = yaml.safe_load(f)
    job = pipeline_job(template, display_name=display_name, pipeline_root=request["pipelineRoot"],
                       parameter_values=parameter_values)
    pipelines, schedules = _clients(args.region, args.api_endpoint)
    parent = f"projects/{args.project}/locations/{args.region}"
    if args.command == "submit":
      created = pipelines.create_pipeline_job(parent=parent, pipeline_job=job)
      print(f"submitted {created.name}")
      return 0
    from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
    from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

    schedule = aiplatform_v1.Schedule()
    spec = {"displayName": f"{display_name}-schedule", "cron": request["schedule"]["cron"],
            "maxConcurrentRunCount": str(args.max_concurrent_runs),
            "createPipelineJobRequest": {"parent": parent}}
    for key, value in (("startTime", args.start_time), ("endTime", args.end_time), ("maxRunCount", args.max_runs)):
      if value is not None:
        spec[key] = str(value)
    json_format.ParseDict(spec, schedule._pb)  # pylint: disable=protected-access
    schedule.create_pipeline_job_request.pipeline_job = job
    created = schedules.create_schedule(parent=parent, schedule=schedule)
    print(f"created schedule {created.name}")
    return 0


if __name__ == "__main__":
  sys.exit(main())
