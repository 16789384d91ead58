"""A Vertex AI Pipelines (Kubeflow) pipeline whose training step is a cloud_configs/ job, and its schedule.

    python -m scripts.pipeline compile  --config=cloud_configs/multi_worker_gpu.yaml --bucket=B --output=pipeline.yaml
    python -m scripts.pipeline submit   --config=... --project=P --region=R --bucket=B [--param=train_steps=2000]
    python -m scripts.pipeline schedule --config=... --project=P --region=R --bucket=B \\
        --cron='0 3 * * *' --time_zone=Europe/Paris --max_concurrent_runs=1 [--start_time=... --end_time=...]
    python -m scripts.pipeline local    --config=... --bucket=B     # every step on this machine, emulated storage

The run trains exactly what the config says: its pools, its trainer args and its baseOutputDirectory. Nothing is
added by default. `--param NAME=VALUE` overrides one trainer flag (any of them: `--param=model=pkg.mod:build_fn`,
`--param=train_data=gs://...`, `--param=train_steps=2000`) in every trainer pool, replacing the config's value where
it has one; `--param=base_output_dir=gs://...` replaces the output directory. On Vertex both are the pipeline's
run-time parameters `trainer_flags` (a JSON object) and `base_output_dir`, so a run in the console can change them too.
`${RUN_ID}` in the config's outputs becomes each pipeline run's own job name, so scheduled runs never share (and
never silently resume) one another's output directory.

Steps: `training-spec` (the config's pools and output directory with this run's overrides and run name) ->
`check-data` (the training and eval patterns the trainer will read match objects) -> `custom-training-job`
(google-cloud-pipeline-components' CustomTrainingJobOp: differing pools and Python packages, as the config has them)
-> `read-metrics` (the eval_metrics.json the trainer wrote, logged as pipeline metrics) -> with --upload_model,
`model-upload` (google-cloud-pipeline-components' ModelUploadOp: the SavedModel into Model Registry with the
project's serving image for the training TF (Dockerfile.serving; --serving_image=prebuilt for Vertex's prebuilt
one), its predict schemata, and the pipeline run as a label).
submit and schedule take --dry_run to print the request instead of sending it; `local` runs the same steps with the
same parameters (kfp's local runner, training through scripts.local_vertex).

`--tuning_config=cloud_configs/hp_tuning.yaml` puts a tuning step first: `tuning-spec` (the study's trial pools with
the run's trainer flags) -> `check-tuning-data` -> `hyperparameter-tuning-job` (google-cloud-pipeline-components'
HyperparameterTuningJobRunOp) -> `tuning-trials` (the finished job's trials, read through the API) ->
`best-trial-flags` (the run's trainer flags with the best succeeded trial's parameters put in) -> the training
steps above with those flags. `local` runs the study with scripts.local_vertex and picks the best trial with the
same `best-trial-flags` step. A --param naming a tuned parameter is refused (it would fix it in every trial).
"""

# No `from __future__ import annotations`: kfp reads component signatures at runtime.

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
from typing import Any, NamedTuple

import yaml


from kfp import dsl

from scripts import artifact_registry
from scripts import clients
from scripts import gcp_context
from scripts import registry
from scripts import submit as submit_lib
from scripts import vertex_config

PIPELINE_NAME = "vertex-tf-trainer"
# The one run parameter that is not a trainer flag; every other --param NAME is a trainer flag.
BASE_OUTPUT_DIR = "base_output_dir"
# What ${RUN_ID} stays as in the compiled pipeline: the training-spec step puts each run's job name there.
RUN_ID_MARK = "${RUN_ID}"


class PipelineError(ValueError):
  """A one-line reason nothing was compiled or sent."""


@dsl.component(base_image="python:3.10")
def training_spec(job_spec: str, run_name: str, trainer_flags: dict, base_output_dir: str, boolean_flags: list
                  ) -> NamedTuple("TrainingSpec", worker_pool_specs=list, base_output_dir=str, train_data=str,
                                  eval_data=str):
  """The config's worker pools and output directory for this run.

  Each trainer flag in `trainer_flags` replaces the config's value for it (in any of absl's spellings: --name=v,
  --name v, --name, --noname) in every trainer pool, or is added where the config has none; nothing else changes.
  ${RUN_ID} becomes `run_name`. Also returns the --train_data / --eval_data the chief will read ('' when the
  config leaves them to Vertex's AIP_* variables), for the data check.
  """
  import json as json_lib  # pylint: disable=import-outside-toplevel
  from collections import namedtuple  # pylint: disable=import-outside-toplevel

  spec = json_lib.loads(job_spec.replace("${RUN_ID}", run_name))
  if base_output_dir:
    spec["baseOutputDirectory"] = {"outputUriPrefix": base_output_dir.replace("${RUN_ID}", run_name)}
  booleans = set(boolean_flags)

  def text(value) -> str:
    if isinstance(value, bool):
      return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():  # kfp carries numbers as floats
      return str(int(value))
    return str(value)

  def flag_name(arg: str):
    if not arg.startswith("-") or arg in ("-", "--"):
      return None, False
    name = arg.lstrip("-").split("=", 1)[0]
    if name not in trainer_flags and name.startswith("no") and name[2:] in booleans:
      return name[2:], True
    return name, False

  def merged(args: list) -> list:
    out, placed, i = [], set(), 0
    while i < len(args):
      name, negated = flag_name(args[i])
      if name in trainer_flags:
        takes_next = ("=" not in args[i] and not negated and name not in booleans and i + 1 < len(args))
        i += 2 if takes_next else 1
        if name not in placed:  # the override stands where the config had the flag
          out.append(f"--{name}={text(trainer_flags[name])}")
          placed.add(name)
        continue
      out.append(args[i])
      i += 1
    return out + [f"--{n}={text(v)}" for n, v in trainer_flags.items() if n not in placed]

  def value_of(args: list, wanted: str) -> str:
    found = ""
    for i, arg in enumerate(args):
      name, _ = flag_name(arg)
      if name == wanted:
        found = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
    return found

  chief_args = None
  for pool in spec["workerPoolSpecs"]:
    container = (pool or {}).get("containerSpec") or {}
    # The trainer's args live in its pythonPackageSpec or containerSpec (not a Reduction Server's container).
    trainer = (pool or {}).get("pythonPackageSpec") or (
        container if container and "/reductionserver:" not in container.get("imageUri", "") else None)
    if trainer is not None:
      trainer["args"] = merged(list(trainer.get("args", [])))
      chief_args = trainer["args"] if chief_args is None else chief_args
  output = namedtuple("TrainingSpec", ["worker_pool_specs", "base_output_dir", "train_data", "eval_data"])
  return output(spec["workerPoolSpecs"], spec.get("baseOutputDirectory", {}).get("outputUriPrefix", ""),
                value_of(chief_args or [], "train_data"), value_of(chief_args or [], "eval_data"))


@dsl.component(base_image="python:3.10", packages_to_install=["google-cloud-aiplatform>=1.40"])
def tuning_trials(gcp_resources: str, api_endpoint: str = "") -> list:
  """The finished tuning job's trials, as the API returns them (id, state, parameters, finalMeasurement), read
  from the job the tuning step ran (its gcp_resources)."""
  import json as json_lib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel

  from google.cloud import aiplatform_v1  # pylint: disable=import-outside-toplevel
  from google.protobuf import json_format  # pylint: disable=import-outside-toplevel

  uri = json_lib.loads(gcp_resources)["resources"][0]["resourceUri"]
  host, name = re.match(r"^https://([^/]+)/v1/(projects/.+)$", uri).groups()
  kwargs = {"client_options": {"api_endpoint": api_endpoint or host}}
  if api_endpoint.startswith("http://"):  # the tests' stand-in for Vertex
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=import-outside-toplevel
    kwargs.update(credentials=AnonymousCredentials(), transport="rest")
  job = aiplatform_v1.JobServiceClient(**kwargs).get_hyperparameter_tuning_job(name=name)
  return [json_format.MessageToDict(trial._pb) for trial in job.trials]  # pylint: disable=protected-access


@dsl.component(base_image="python:3.10")
def best_trial_flags(trials: list, metric_id: str, goal: str, trainer_flags: dict) -> dict:
  """The run's trainer flags with the best succeeded trial's parameters put in (the study chose them): what the
  training step then runs. Trials in the API's shape, from Vertex (tuning_trials) or a local study (study.json)."""
  best = None
  for trial in trials:
    if trial.get("state") != "SUCCEEDED":
      continue
    final = {m.get("metricId"): m.get("value") for m in trial.get("finalMeasurement", {}).get("metrics", [])}
    if final.get(metric_id) is None:
      continue
    value = float(final[metric_id])
    if best is None or (value > best[0] if goal == "MAXIMIZE" else value < best[0]):
      best = (value, trial)
  if best is None:
    raise RuntimeError(f"no succeeded trial reported {metric_id!r}: nothing to train with "
                       f"({len(trials)} trial(s): {sorted({t.get('state', '?') for t in trials})})")
  print(f"best trial {best[1].get('id')}: {metric_id}={best[0]} with {best[1].get('parameters')}")
  return {**trainer_flags, **{p["parameterId"]: p["value"] for p in best[1].get("parameters", [])}}


@dsl.component(base_image="python:3.10", packages_to_install=["google-cloud-storage>=2"])
def check_data(train_data: str, eval_data: str) -> int:
  """Fails the run early unless each pattern the trainer will read matches objects; returns how many training
  files there are (0 when the config leaves the data to Vertex's AIP_* variables: nothing to check here)."""
  import fnmatch  # pylint: disable=import-outside-toplevel
  import glob  # pylint: disable=import-outside-toplevel

  def matches(pattern: str) -> list:
    if pattern.startswith("/gcs/"):  # Vertex's Cloud Storage mount; a pipeline step reads the bucket directly
      pattern = "gs://" + pattern[len("/gcs/"):]
    if not pattern.startswith("gs://"):
      return sorted(glob.glob(pattern))
    from google.cloud import storage  # pylint: disable=import-outside-toplevel
    bucket, _, name_pattern = pattern[len("gs://"):].partition("/")
    prefix = name_pattern.split("*")[0].split("?")[0].split("[")[0]
    names = [b.name for b in storage.Client().list_blobs(bucket, prefix=prefix)]
    return [n for n in names if fnmatch.fnmatchcase(n, name_pattern)]

  counts = {}
  for flag, pattern in (("--train_data", train_data), ("--eval_data", eval_data)):
    if not pattern:
      print(f"check-data: {flag} not in the trainer args (Vertex's AIP_* variables or no evaluation): not checked")
      continue
    found = matches(pattern)
    if not found:
      raise ValueError(f"{flag}: no objects match {pattern!r}")
    counts[flag] = len(found)
  print(f"check-data: {counts}")
  return counts.get("--train_data", 0)


@dsl.component(base_image="python:3.10")
def model_artifact(base_output_dir: str, container_spec: dict, model: dsl.Output[dsl.Artifact]):
  """The exported SavedModel (<base_output_dir>/model/) as the unmanaged container model ModelUploadOp takes:
  its serving container and the predict schemata the export wrote beside it."""
  model_dir = base_output_dir.rstrip("/") + "/model/"
  model.uri = model_dir
  model.metadata["containerSpec"] = container_spec
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


def load_config(path: str, values: dict[str, str], *, service_account: str | None = None,
                tensorboard: str | None = None) -> vertex_config.JobConfig:
  """The training step's config, with the run's service account and TensorBoard instance set and checked as
  scripts.submit checks them."""
  config = vertex_config.load(path, {**values, "RUN_ID": RUN_ID_MARK})  # ${RUN_ID}: each run's own, at run time
  if config.kind != "custom_job":
    raise PipelineError(f"{path}: the pipeline's training step takes a custom-job config, not {config.kind}")
  submit_lib.set_service_account(config.body, config.kind, service_account)
  submit_lib.set_tensorboard(config.body, config.kind, tensorboard, region=values["REGION"])
  return config


def load_tuning_config(path: str, values: dict[str, str]) -> vertex_config.JobConfig:
  config = vertex_config.load(path, {**values, "RUN_ID": RUN_ID_MARK})
  if config.kind != "hp_tuning":
    raise PipelineError(f"--tuning_config={path}: expected a hyperparameter-tuning config (studySpec + "
                        "trialJobSpec, like cloud_configs/hp_tuning.yaml), got a custom-job config")
  return config


def tuning_spec_json(tuning: vertex_config.JobConfig, *, bucket: str) -> str:
  """The tuning study's trial pools and output directory, as the training-spec step takes a job spec."""
  trial = tuning.body["trialJobSpec"]
  base = trial.get("baseOutputDirectory") or {"outputUriPrefix": f"gs://{bucket}/pipeline-tuning/{RUN_ID_MARK}"}
  return json.dumps({"workerPoolSpecs": trial["workerPoolSpecs"], "baseOutputDirectory": base})


def boolean_flags() -> list[str]:
  """The trainer's boolean flags (absl spells them --name, --noname or --name=true|false)."""
  return sorted(name for name, flag in _trainer_flag_values().items() if flag.boolean)


def _trainer_flag_values():
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top

  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top

  values = absl_flags.FlagValues()
  trainer_flags.define_flags(values)
  return values._flags()  # pylint: disable=protected-access  (absl's one way to list a FlagValues' flags)


def job_spec_json(config: vertex_config.JobConfig, *, bucket: str) -> str:
  """What the training-spec step starts from: the config's pools and output directory (with ${RUN_ID} kept for
  the step to fill); a config without baseOutputDirectory writes to gs://BUCKET/pipeline-runs/<run>."""
  base = config.body.get("baseOutputDirectory") or {"outputUriPrefix": f"gs://{bucket}/pipeline-runs/{RUN_ID_MARK}"}
  return json.dumps({"workerPoolSpecs": config.body["workerPoolSpecs"], "baseOutputDirectory": base})


def build_pipeline(config: vertex_config.JobConfig, *, bucket: str, params: dict[str, Any] | None = None,
                   serving: dict | None = None, tuning: vertex_config.JobConfig | None = None):
  """The pipeline function for one config: its pools, args, scheduling and output layout are baked in and run as
  written unless a run's `trainer_flags` / `base_output_dir` say otherwise (`params`, from --param, are their
  defaults); with a `serving` containerSpec, a model-upload step registers the model after training; with a `tuning`
  config, its study runs first and training gets the best trial's parameters."""
  from google_cloud_pipeline_components.v1.custom_job import CustomTrainingJobOp  # pylint: disable=g-import-not-at-top
  from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import \
      HyperparameterTuningJobRunOp  # pylint: disable=g-import-not-at-top
  from google_cloud_pipeline_components.v1.model import ModelUploadOp  # pylint: disable=g-import-not-at-top

  spec_json = job_spec_json(config, bucket=bucket)
  booleans = boolean_flags()
  scheduling = config.body.get("scheduling", {})
  default_flags = dict((params or {}).get("trainer_flags", {}))
  default_output_dir = (params or {}).get(BASE_OUTPUT_DIR, "")

  @dsl.pipeline(name=PIPELINE_NAME, description=f"Trains with {os.path.basename(config.path)}")
  def training_pipeline(project: str, location: str, trainer_flags: dict = default_flags,
                        base_output_dir: str = default_output_dir):
    training_flags = trainer_flags
    if tuning is not None:
      study = tuning.body["studySpec"]
      trials_spec = training_spec(job_spec=tuning_spec_json(tuning, bucket=bucket),
                                  run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, trainer_flags=trainer_flags,
                                  base_output_dir="", boolean_flags=booleans).set_display_name("tuning-spec")
      trials_checked = check_data(train_data=trials_spec.outputs["train_data"],
                                  eval_data=trials_spec.outputs["eval_data"]).set_display_name("check-tuning-data")
      tuned = HyperparameterTuningJobRunOp(
          project=project, location=location, display_name="vertex-tf-trainer-tuning",
          base_output_directory=trials_spec.outputs["base_output_dir"],
          worker_pool_specs=trials_spec.outputs["worker_pool_specs"], study_spec_metrics=study["metrics"],
          study_spec_parameters=study["parameters"], max_trial_count=int(tuning.body["maxTrialCount"]),
          parallel_trial_count=int(tuning.body.get("parallelTrialCount", 1)),
          max_failed_trial_count=int(tuning.body.get("maxFailedTrialCount", 0)),
          study_spec_algorithm=study.get("algorithm", "ALGORITHM_UNSPECIFIED"),
          study_spec_measurement_selection_type=study.get("measurementSelectionType", "BEST_MEASUREMENT"),
      ).after(trials_checked)
      trials = tuning_trials(gcp_resources=tuned.outputs["gcp_resources"])
      training_flags = best_trial_flags(trials=trials.output, metric_id=study["metrics"][0]["metricId"],
                                        goal=study["metrics"][0]["goal"], trainer_flags=trainer_flags).output
    # (With a tuning step first, kfp keys these tasks training-spec-2 and check-data-2; the console shows these names.)
    spec = training_spec(job_spec=spec_json, run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, trainer_flags=training_flags,
                         base_output_dir=base_output_dir, boolean_flags=booleans).set_display_name("training-spec")
    checked = check_data(train_data=spec.outputs["train_data"],
                         eval_data=spec.outputs["eval_data"]).set_display_name("check-data")
    optional = {}
    if scheduling.get("timeout"):
      optional["timeout"] = scheduling["timeout"]
    if scheduling.get("restartJobOnWorkerRestart"):
      optional["restart_job_on_worker_restart"] = True
    if scheduling.get("strategy"):
      optional["strategy"] = scheduling["strategy"]
    # The job's identity and TensorBoard instance, as scripts.submit sets them on a CustomJob.
    if config.body.get("serviceAccount"):
      optional["service_account"] = config.body["serviceAccount"]
    if config.body.get("tensorboard"):
      optional["tensorboard"] = config.body["tensorboard"]
    output_dir = spec.outputs["base_output_dir"]
    trained = CustomTrainingJobOp(project=project, location=location, display_name="vertex-tf-trainer-train",
                                  worker_pool_specs=spec.outputs["worker_pool_specs"],
                                  base_output_directory=output_dir, **optional).after(checked)
    metrics = read_metrics(base_output_dir=output_dir).after(trained)
    if serving:
      model = model_artifact(base_output_dir=output_dir, container_spec=serving).after(metrics)
      ModelUploadOp(project=project, location=location, display_name="vertex-tf-trainer-model",
                    unmanaged_container_model=model.outputs["model"],
                    labels={"vertex-tf-trainer-run": dsl.PIPELINE_JOB_ID_PLACEHOLDER})

  return training_pipeline


def compile_pipeline(config: vertex_config.JobConfig, output: str, *, bucket: str, params: dict[str, Any] | None = None,
                     serving: dict | None = None, tuning: vertex_config.JobConfig | None = None) -> str:
  from kfp import compiler  # pylint: disable=g-import-not-at-top

  compiler.Compiler().compile(build_pipeline(config, bucket=bucket, params=params, serving=serving,
                                             tuning=tuning), output)
  return output


def parse_params(pairs: list[str]) -> dict[str, Any]:
  """--param NAME=VALUE pairs -> the run's parameter values: {"trainer_flags": {flag: value}} plus
  base_output_dir when given. NAME is base_output_dir or any trainer flag; values are checked with the config."""
  known = _trainer_flag_values()
  trainer_flags: dict[str, str] = {}
  params: dict[str, Any] = {}
  for pair in pairs:
    name, sep, value = pair.partition("=")
    name = name.strip().lstrip("-")
    if not sep or not name:
      raise PipelineError(f"--param {pair!r}: expected NAME=VALUE, NAME a trainer flag (e.g. train_steps=2000, "
                          f"model=pkg.module:build_fn) or {BASE_OUTPUT_DIR}")
    if name == BASE_OUTPUT_DIR:
      if not value.startswith(("gs://", "/")):
        raise PipelineError(f"--param {BASE_OUTPUT_DIR}={value!r}: expected a gs:// URI (${{RUN_ID}} in it becomes "
                            "each run's job name)")
      params[BASE_OUTPUT_DIR] = value
    elif name in known:
      trainer_flags[name] = value
    else:
      raise PipelineError(f"--param {name}={value!r}: {name!r} is not a trainer flag (python -m trainer.task "
                          f"--helpfull lists them) nor {BASE_OUTPUT_DIR}")
  return {"trainer_flags": trainer_flags, **params}


def resolve_run(config: vertex_config.JobConfig, params: dict[str, Any], *, bucket: str, run_name: str):
  """What one run of the pipeline trains: the training-spec step's own function, run here."""
  return training_spec.python_func(job_spec=job_spec_json(config, bucket=bucket), run_name=run_name,
                                   trainer_flags=params["trainer_flags"],
                                   base_output_dir=params.get(BASE_OUTPUT_DIR, ""), boolean_flags=boolean_flags())


def check_run(config: vertex_config.JobConfig, params: dict[str, Any], *, bucket: str, scheduled: bool) -> None:
  """Before anything is compiled or sent: the run's trainer args pass the trainer's own checks, and scheduled runs
  do not share one output directory (a later run would find the earlier run's final checkpoint and not train)."""
  run = resolve_run(config, params, bucket=bucket, run_name="check")
  submit_lib.check_trainer_args({"workerPoolSpecs": run.worker_pool_specs}, "custom_job")
  base = params.get(BASE_OUTPUT_DIR) or json.loads(job_spec_json(config, bucket=bucket))[
      "baseOutputDirectory"].get("outputUriPrefix", "")
  if scheduled and RUN_ID_MARK not in base:
    raise PipelineError(f"every scheduled run would write to {base}, and a later run would find the earlier run's "
                        f"final checkpoint and not train; put ${{RUN_ID}} in {config.path}'s "
                        f"baseOutputDirectory.outputUriPrefix or pass --param={BASE_OUTPUT_DIR}=gs://.../${{RUN_ID}}")


def check_tuning(tuning: vertex_config.JobConfig, params: dict[str, Any], *, bucket: str, scheduled: bool) -> None:
  """The tuning step's trials as the run would start them: their trainer args and every value the study can give
  them pass the trainer's checks, no run parameter fixes a tuned name, and scheduled runs' studies stay apart."""
  from scripts import study_spec  # pylint: disable=g-import-not-at-top

  run = training_spec.python_func(job_spec=tuning_spec_json(tuning, bucket=bucket), run_name="check",
                                  trainer_flags=params["trainer_flags"], base_output_dir="",
                                  boolean_flags=boolean_flags())
  body = {**tuning.body, "trialJobSpec": {**tuning.body["trialJobSpec"], "workerPoolSpecs": run.worker_pool_specs}}
  submit_lib.check_trainer_args(body, "hp_tuning")
  try:
    tuned = [p.id for p in study_spec.parse(body, tuning.path).all_parameters()]
  except study_spec.StudyError as e:
    raise PipelineError(str(e)) from None
  fixed = sorted(set(tuned) & set(params["trainer_flags"]))
  if fixed:
    raise PipelineError(f"--param {fixed[0]}=...: {tuning.path}'s study tunes {fixed[0]!r}; a run parameter would fix "
                        "it in every trial (drop the --param, or the parameter from the study)")
  submit_lib.check_study(body, tuning.path)
  base = json.loads(tuning_spec_json(tuning, bucket=bucket))["baseOutputDirectory"]["outputUriPrefix"]
  if scheduled and RUN_ID_MARK not in base:
    raise PipelineError(f"every scheduled run's study would write to {base}; put ${{RUN_ID}} in "
                        f"{tuning.path}'s trialJobSpec.baseOutputDirectory.outputUriPrefix")


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

  kwargs = clients.vertex_kwargs(region, api_endpoint)
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


def _run_local_vertex(body: dict, config_path: str, args: list[str], *, step: str) -> None:
  """local_vertex.py on `body`, written beside the config it came from (so relative paths in it still hold), as a
  hidden file: while the step runs it is not one of the directory's configs (`cloud_configs/*` does not list it)."""
  from scripts import local_vertex  # pylint: disable=g-import-not-at-top

  with tempfile.NamedTemporaryFile("w", prefix=".pipeline-step-", suffix=".yaml", delete=False,
                                   dir=os.path.dirname(config_path)) as f:
    yaml.safe_dump(body, f)
    step_config = f.name
  try:
    code = local_vertex.main([f"--config={step_config}", *args])
  finally:
    os.remove(step_config)
  if code:
    raise PipelineError(f"{step} step failed (local_vertex exit code {code})")


def run_local(config: vertex_config.JobConfig, params: dict[str, Any], *, bucket: str, run_id: str,
              extra: list[str], tuning: vertex_config.JobConfig | None = None) -> dict:
  """Every step on this machine with the run's parameters, as submit sends them: kfp's local runner for the Python
  steps, local_vertex.py for the study and for training (`run_id` stands in for the pipeline job's name)."""
  from kfp import local  # pylint: disable=g-import-not-at-top

  local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=tempfile.mkdtemp(prefix="kfp-local-"))
  trainer_flags = params["trainer_flags"]
  result: dict[str, Any] = {}
  if tuning is not None:
    # The tuning step: the study's trial pools with this run's flags, run as a local study; then the best
    # succeeded trial's parameters, picked by the same component the compiled pipeline runs.
    trials_spec = training_spec(job_spec=tuning_spec_json(tuning, bucket=bucket), run_name=run_id,
                                trainer_flags=trainer_flags, base_output_dir="", boolean_flags=boolean_flags())
    check_data(train_data=trials_spec.outputs["train_data"], eval_data=trials_spec.outputs["eval_data"])
    study_dir = tempfile.mkdtemp(prefix=f"{run_id}-tuning-")
    trial_job = {**tuning.body["trialJobSpec"], "workerPoolSpecs": _whole_numbers(trials_spec.outputs["worker_pool_specs"]),
                 "baseOutputDirectory": {"outputUriPrefix": trials_spec.outputs["base_output_dir"]}}
    _run_local_vertex({**tuning.body, "trialJobSpec": trial_job}, tuning.path,
                      [f"--bucket={bucket}", f"--run_id={run_id}-tuning", *extra, f"--job_dir={study_dir}"],
                      step="tuning")
    with open(os.path.join(study_dir, "study.json")) as f:
      trials = json.load(f)["trials"]
    metric = tuning.body["studySpec"]["metrics"][0]
    best = best_trial_flags(trials=trials, metric_id=metric["metricId"], goal=metric["goal"],
                            trainer_flags=trainer_flags)
    trainer_flags = best.output
    result["tuning"] = {"study": os.path.join(study_dir, "study.json"), "trainer_flags": trainer_flags}
  spec = training_spec(job_spec=job_spec_json(config, bucket=bucket), run_name=run_id,
                       trainer_flags=trainer_flags, base_output_dir=params.get(BASE_OUTPUT_DIR, ""),
                       boolean_flags=boolean_flags())
  output_dir = spec.outputs["base_output_dir"]
  checked = check_data(train_data=spec.outputs["train_data"], eval_data=spec.outputs["eval_data"])
  # The training step: the same pools, run replica by replica as Vertex would run them.
  body = {**config.body, "workerPoolSpecs": _whole_numbers(spec.outputs["worker_pool_specs"]),
          "baseOutputDirectory": {"outputUriPrefix": output_dir}}
  _run_local_vertex(body, config.path, [f"--bucket={bucket}", f"--run_id={run_id}", *extra], step="training")
  metrics = read_metrics(base_output_dir=output_dir)
  return {**result, "base_output_dir": output_dir, "check_data": checked.output, "metric": metrics.outputs["Output"],
          "metrics": dict(metrics.outputs["metrics"].metadata)}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("command", choices=("compile", "submit", "schedule", "local"))
  parser.add_argument("--config", required=True)
  parser.add_argument("--project", default=None, help=gcp_context.PROJECT_HELP)
  parser.add_argument("--region", default=None, help=gcp_context.REGION_HELP)
  parser.add_argument("--bucket", default=os.environ.get("BUCKET"))
  parser.add_argument("--output", default="training_pipeline.yaml",
                      help="compile: where the YAML goes (the packages it runs are kept beside it, in "
                           "<output>.packages/, to be copied to the bucket)")
  parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                      help="override one trainer flag for this run (repeatable; NAME any trainer flag, e.g. "
                           f"train_steps, model, train_data) or {BASE_OUTPUT_DIR}; the config's args otherwise")
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
  parser.add_argument("--serving_image", default=None,  # as scripts.submit takes it
                      help="the model's serving container: default the project's serving image (Dockerfile.serving, "
                      "built with scripts.submit --build_serving_image); 'prebuilt' for Vertex's prebuilt TF "
                      "prediction image; or a URI")
  parser.add_argument("--service_account", default=None,
                      help="the training step's service account (the config's serviceAccount otherwise)")
  parser.add_argument("--tensorboard", default=None, metavar="projects/P/locations/L/tensorboards/ID",
                      help="the training step's Vertex AI TensorBoard instance (the config's tensorboard otherwise); "
                      "needs a service account")
  parser.add_argument("--tuning_config", default=None, metavar="PATH",
                      help="a hyperparameter-tuning config (cloud_configs/hp_tuning.yaml): its study runs first and "
                      "the training step gets the best trial's parameters")
  parser.add_argument("--dry_run", action="store_true")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  try:
    return _main(args)
  except (PipelineError, vertex_config.ConfigError, submit_lib.SubmitError, registry.RegistryError,
          artifact_registry.RepositoryError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _main(args) -> int:
  import time  # pylint: disable=g-import-not-at-top

  found = gcp_context.project(args.project)
  args.project = found.value if found else None
  args.region = gcp_context.region(args.region).value
  if not args.bucket:
    raise PipelineError("--bucket is required (or set BUCKET): package, data and outputs live there")
  args.bucket = vertex_config.bucket_name(args.bucket)
  run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
  params = parse_params(args.param)
  if args.command == "schedule":
    if not args.cron:
      raise PipelineError("schedule needs --cron (e.g. --cron='0 3 * * *')")
    check_schedule(args.cron, args.time_zone, args.start_time, args.end_time, args.max_concurrent_runs)
  values = vertex_config.values_from(os.environ, project=args.project or "local-project", region=args.region,
                                     bucket=args.bucket)
  identity = {"service_account": args.service_account, "tensorboard": args.tensorboard}
  # Validate before anything is built, compiled or sent.
  pending_uri = {"PACKAGE_URI": f"gs://{args.bucket}/staging/pending.tar.gz"}
  pending = load_config(args.config, {**values, **pending_uri}, **identity)
  check_run(pending, params, bucket=args.bucket, scheduled=args.command == "schedule")
  if args.tuning_config:
    pending_tuning = load_tuning_config(args.tuning_config, {**values, **pending_uri})
    check_tuning(pending_tuning, params, bucket=args.bucket, scheduled=args.command == "schedule")
    stopping = next((k for k in pending_tuning.body["studySpec"] if k.endswith("StoppingSpec")), None)
    if stopping and args.command != "local":
      print(f"warning: {args.tuning_config}: {stopping} is not passed on by the tuning step "
            "(google-cloud-pipeline-components' HyperparameterTuningJobRunOp takes metrics, parameters, algorithm "
            "and measurement selection only): the pipeline's trials run to their end", file=sys.stderr)
  if args.command in ("submit", "schedule") and not args.project:
    raise PipelineError("--project is required (or set PROJECT)")
  if args.command == "local" and args.upload_model:
    raise PipelineError("--upload_model: ModelUploadOp runs only on Vertex AI Pipelines; after a local run, "
                        "register the model with python -m scripts.submit --upload_model")
  if args.command == "local":
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
      # The data check reads the bucket before the training step (which could start an emulator of its own).
      raise PipelineError("local runs every step against the emulated bucket: start it first with "
                          f'eval "$(python -m scripts.gcs_emulator start --bucket {args.bucket})" and stage the data '
                          "there (python -m scripts.stage_data)")
    local_uri = {"PACKAGE_URI": f"gs://{args.bucket}/staging/local.tar.gz"}
    config = load_config(args.config, {**values, **local_uri}, **identity)
    tuning = load_tuning_config(args.tuning_config, {**values, **local_uri}) if args.tuning_config else None
    result = run_local(config, params, bucket=args.bucket, run_id=run_id, tuning=tuning,
                       extra=args.local_arg + [f"--extra_package={p}" for p in args.extra_package])
    print(json.dumps(result, default=str))
    return 0
  with tempfile.TemporaryDirectory(prefix="pipeline-") as scratch:
    archive = submit_lib.build_sdist(tempfile.mkdtemp(dir=scratch))
    uri = submit_lib.package_uri(args.bucket, archive)
    extras = submit_lib.stage_extra_packages(args.extra_package, args.bucket, tempfile.mkdtemp(dir=scratch))
    image = None
    if pending.job_spec["workerPoolSpecs"][0].get("containerSpec"):
      # The training step (and every trial) runs the trainer image holding this sdist and the extra packages,
      # named by that source as scripts.submit names it: submit and schedule reuse or build it first.
      image = submit_lib.plan_trainer_image(trainer_image=values.get("TRAINER_IMAGE"), build_image=False,
                                            project=values["PROJECT"], region=args.region, archive=archive,
                                            extras=[a for a, _ in extras])
      values = {**values, "TRAINER_IMAGE": image.target}
    config = load_config(args.config, {**values, "PACKAGE_URI": uri}, **identity)
    submit_lib.add_package_uris(config.body, [u for _, u in extras])  # compiled into the training step
    tuning = None
    if args.tuning_config:
      tuning = load_tuning_config(args.tuning_config, {**values, "PACKAGE_URI": uri})
      submit_lib.add_package_uris(tuning.body["trialJobSpec"], [u for _, u in extras])  # and into every trial
    output = args.output if args.command == "compile" else os.path.join(scratch, "pipeline.yaml")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    serving = None
    if args.upload_model:
      if not args.project and not args.serving_image:
        raise PipelineError("--upload_model registers the model with the project's serving image, in the project's "
                            "Artifact Registry: pass --project (or --serving_image=prebuilt|URI)")
      serving, warnings = registry.serving_container(
          args.serving_image, training_tf=submit_lib.training_tf_of(config.body["workerPoolSpecs"][0]),
          project=args.project, region=args.region)
      for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    compile_pipeline(config, output, bucket=args.bucket, params=params, serving=serving, tuning=tuning)
    if args.command == "compile":
      # The packages it names are kept beside it (the run needs them in the bucket); submit and schedule upload them.
      packages = args.output + ".packages"
      os.makedirs(packages, exist_ok=True)
      kept = []
      for local_path, remote in [(archive, uri), *extras]:
        kept.append((shutil.copy(local_path, os.path.join(packages, os.path.basename(local_path))), remote))
      copies = "; ".join(f"gcloud storage cp {local_path} {remote}" for local_path, remote in kept)
      if image and image.reuse_if_tagged:
        copies = (f"it runs the trainer image {image.target}, which python -m scripts.submit --config={args.config}"
                  f"{''.join(' --extra_package=' + p for p in args.extra_package)} builds (or finds) under that tag")
      elif image:
        copies = f"it runs the trainer image {image.target}, as given"
      overrides = " ".join(f"--{k}={v}" for k, v in params["trainer_flags"].items())
      tuned = f"; a tuning study from {args.tuning_config} first, its best trial's parameters to training" \
          if tuning else ""
      print(f"compiled {output} (training pools and args from {args.config}{tuned}"
            f"{'; run parameters default to ' + overrides if overrides else ''}); before running it, copy its "
            f"packages to the bucket: {copies}")
      return 0
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
      # Not fields of this request: the compiled template's training step carries them (CustomTrainingJobOp).
      step = [f"{label} {config.body[key]}" for key, label in (("serviceAccount", "runs as"),
                                                               ("tensorboard", "logs to TensorBoard"))
              if config.body.get(key)]
      if step:
        print(f"the pipeline's training step {' and '.join(step)}", file=sys.stderr)
      return 0
    if image and image.build:
      context, context_uri, build = submit_lib.trainer_image_build(
          image, archive, [a for a, _ in extras], project=args.project, region=args.region, bucket=args.bucket,
          scratch=scratch)
      built = submit_lib.existing_or_built(image, build, context, context_uri, api_endpoint=args.api_endpoint)
      if built != image.target:  # the run names exactly that image, by digest: compiled again with it
        config = load_config(args.config, {**values, "TRAINER_IMAGE": built, "PACKAGE_URI": uri}, **identity)
        if args.tuning_config:
          tuning = load_tuning_config(args.tuning_config, {**values, "TRAINER_IMAGE": built, "PACKAGE_URI": uri})
        compile_pipeline(config, output, bucket=args.bucket, params=params, serving=serving, tuning=tuning)
    for local, remote in [] if image else [(archive, uri), *extras]:
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
