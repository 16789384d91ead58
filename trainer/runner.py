"""One typed entry, `run(config, env)`: role -> strategy -> checks -> train -> export -> metrics.

Order matters. Everything that can be checked without devices or peers is checked first (config, role,
strategy, data, schema, output dirs), so bad input fails in one line with nothing written. Then logical devices
are configured and the strategy is built before any other TensorFlow op runs (collective ops and device
layout are fixed at start-up). Only then does training touch the data for real.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
from typing import Any, TextIO

from absl import logging

from trainer import __version__ as trainer_version
from trainer import cluster as cluster_lib
from trainer import config as config_lib
from trainer import data as data_lib
from trainer import hypertune
from trainer import models
from trainer import schema as schema_lib
from trainer import storage
from trainer import strategy as strategy_lib
from trainer.errors import UserError
from trainer.errors import first_line

METRICS_FILE = "eval_metrics.json"
CONFIG_FILE = "trainer_config.json"


@dataclasses.dataclass(frozen=True)
class Plan:
  """What this process will do, as --dry_run reports it."""

  role: cluster_lib.ClusterRole
  devices: strategy_lib.Devices
  choice: strategy_lib.StrategyChoice
  keras_version: str

  def to_dict(self, config: config_lib.Config) -> dict[str, Any]:
    return {
        "task_type": self.role.task_type,
        "task_index": self.role.task_index,
        "is_chief": self.role.is_chief,
        "num_workers": self.role.num_workers,
        "num_ps": self.role.num_ps,
        "cluster_source": self.role.source,
        "strategy": self.choice.class_name,
        "strategy_reason": self.choice.reason,
        "num_replicas": replicas(self),
        "loop": config.train.loop,
        "keras_version": self.keras_version,
        "model_dir": config.output.model_dir,
        "checkpoint_dir": config.output.checkpoint_dir,
        "tensorboard_dir": config.output.tensorboard_dir,
        "train_data": config.data.train_pattern,
        "eval_data": config.data.eval_pattern,
    }


def replicas(plan: Plan) -> int:
  """Replicas that share one global batch step."""
  name = plan.choice.name
  if name == "multi_worker_mirrored":
    # MultiWorkerMirroredStrategy uses each worker's GPUs, or one CPU device: logical CPUs do not count.
    return plan.role.num_workers * max(1, plan.devices.num_gpus)
  if name in ("mirrored", "parameter_server"):
    return plan.devices.local_replicas
  return 1


def make_plan(config: config_lib.Config, env: config_lib.Environment, *, num_gpus: int,
              keras_version: str) -> Plan:
  """Pure: resolves role and strategy and checks the combinations that cannot work."""
  role = cluster_lib.resolve_role(tf_config=env.tf_config, cluster_spec=env.cluster_spec)
  if config.distribution.reduction_server:
    role = cluster_lib.without_parameter_servers(role)
  devices = strategy_lib.Devices(num_gpus=num_gpus, num_cpu_devices=config.distribution.num_cpu_devices,
                                 tpu=config.distribution.tpu)
  choice = strategy_lib.choose_strategy(role, config.distribution.strategy, devices)
  plan = Plan(role=role, devices=devices, choice=choice, keras_version=keras_version)
  train = config.train
  num_replicas = replicas(plan)
  if train.global_batch_size % num_replicas:
    raise UserError(f"--global_batch_size={train.global_batch_size} is not divisible by the {num_replicas} "
                    f"replicas of {choice.class_name}; use a multiple of {num_replicas}")
  multi_process = choice.name in ("multi_worker_mirrored", "parameter_server")
  if train.loop == "fit" and multi_process and keras_version.startswith("3."):
    issue = "keras-team/keras#20585" if choice.name == "multi_worker_mirrored" else "keras-team/keras#18624"
    raise UserError(f"--loop=fit does not work under {choice.class_name} with Keras {keras_version} ({issue}); "
                    "use --loop=custom, or install tf_keras and set TF_USE_LEGACY_KERAS=1")
  if choice.name == "parameter_server" and not role.cluster.get(cluster_lib.CHIEF):
    raise UserError("a cluster with parameter servers needs a chief (Vertex workerpool0) to coordinate "
                    f"training; got {', '.join(role.cluster)}")
  if train.hypertune_metric and (not config.data.eval_pattern or train.eval_steps == 0):
    # Checked here, not after training: a tuning trial must not train for nothing and fail at the end.
    raise UserError(f"--hypertune_metric={train.hypertune_metric} needs evaluation: set --eval_data (or "
                    "AIP_VALIDATION_DATA_URI) and leave --eval_steps above 0")
  if train.run_eagerly and choice.name == "parameter_server":
    raise UserError("--run_eagerly cannot run under ParameterServerStrategy (ClusterCoordinator schedules only "
                    "tf.functions); debug eagerly with --strategy=default on one process")
  return plan


def run(config: config_lib.Config, env: config_lib.Environment, *, dry_run: bool = False,
        interactive: bool = False, stdout: TextIO = sys.stdout) -> dict[str, Any]:
  """Runs this process's part of the job; returns the final metrics (empty for servers and dry runs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  num_gpus = len(tf.config.list_physical_devices("GPU"))
  plan = make_plan(config, env, num_gpus=num_gpus, keras_version=models.keras_version())
  if dry_run:
    stdout.write(json.dumps(plan.to_dict(config), sort_keys=True) + "\n")
    stdout.flush()
    return {}
  role = plan.role
  logging.info("Trainer %s from %s", trainer_version, os.path.dirname(os.path.abspath(__file__)))
  logging.info("Role: %s:%d of %s (chief=%s, %d training process(es), %d ps; from %s)", role.task_type,
               role.task_index, role.tf_cluster_dict() or "no cluster", role.is_chief, role.num_workers,
               role.num_ps, role.source)
  logging.info("Devices: %d GPU(s), %d logical CPU device(s), TPU=%s; Keras %s", plan.devices.num_gpus,
               plan.devices.num_cpu_devices, plan.devices.tpu, plan.keras_version)
  logging.info("Strategy: %s (%s)", plan.choice.class_name, plan.choice.reason)
  logging.info("Config: %s", json.dumps(json.loads(config.to_json()), sort_keys=True))

  if plan.choice.name == "parameter_server" and role.task_type in (cluster_lib.WORKER, cluster_lib.PS):
    _serve_forever(role)
    return {}

  schema, train_files, eval_files, csv_headers = _check_inputs(config)
  if role.is_chief:
    for flag, path in (("--model_dir", config.output.model_dir), ("--checkpoint_dir", config.output.checkpoint_dir),
                       ("--tensorboard_dir", config.output.tensorboard_dir)):
      storage.check_writable(path, flag=flag)
  build = models.resolve_builder(config.model.name)
  if config.model.name == "cnn" and not any(f.type == "image" for f in schema.features):
    raise UserError("--model=cnn needs an image feature in the schema (type 'image'); use --model=tabular")

  devices = strategy_lib.configure_devices(config.distribution.num_cpu_devices)
  strategy = strategy_lib.build_strategy(plan.choice, role, devices)
  tf.keras.utils.set_random_seed(config.train.seed)
  if config.train.run_eagerly:
    tf.config.run_functions_eagerly(True)
    logging.info("Running eagerly (--run_eagerly): same strategy, no tf.function compilation")

  from trainer import training  # pylint: disable=g-import-not-at-top

  job = training.Job(
      config=config, schema=schema, strategy=strategy, strategy_name=plan.choice.name, is_chief=role.is_chief,
      train_files=train_files, eval_files=eval_files, csv_headers=csv_headers,
      train_steps=_total_steps(config, train_files), interactive=interactive,
      build_model=lambda: build(schema, config.model, config.hparams))

  if role.is_evaluator:
    from trainer import evaluator  # pylint: disable=g-import-not-at-top

    return evaluator.run_sidecar(job)

  # Dirs this run creates are removed again if it fails on bad input found only now (a record deep in the
  # data, a plug-in model, a checkpoint of another model): what is left must not look like a result.
  created = [d for d in (config.output.tensorboard_dir, config.output.checkpoint_dir)
             if role.is_chief and not tf.io.gfile.exists(d)]
  try:
    try:
      result = (training.fit_loop if config.train.loop == "fit" else training.custom_loop)(job)
    except tf.errors.DataLossError as e:
      raise _corrupt_file_error(e, train_files + eval_files, config) from None
    except tf.errors.InvalidArgumentError as e:
      raise _data_error(e, config) from None
  except UserError:
    for directory in created:
      storage.remove_tree(directory)
    raise

  from trainer import export  # pylint: disable=g-import-not-at-top

  exported = export.export_for_role(result.model, schema, config.output.model_dir, is_chief=role.is_chief)
  metrics = {
      "final_step": result.final_step,
      "resumed_from_step": result.resumed_from_step,
      "train_loss": result.train_loss,
      "examples_per_sec": result.examples_per_sec,
      "strategy": plan.choice.class_name,
      "num_replicas": strategy.num_replicas_in_sync,
      "weights_sha256": weights_digest(result.model),
      **{f"eval_{k}": v for k, v in result.eval_metrics.items()},
  }
  if exported:
    # Written last: a metrics file next to the model means the export is complete.
    storage.write_json(config_lib.join_path(exported, CONFIG_FILE),
                       {"config": json.loads(config.to_json()), "schema": schema.to_dict(),
                        "plan": plan.to_dict(config)})
    storage.write_json(config_lib.join_path(exported, METRICS_FILE), metrics)
    logging.info("Exported SavedModel to %s", exported)
  if role.is_chief and config.train.hypertune_metric:
    hypertune.report(metrics, metric=config.train.hypertune_metric, trial=role.trial, step=result.final_step,
                     path=env.hp_metric_file or hypertune.DEFAULT_PATH)
  logging.info("Final metrics: %s", json.dumps(metrics, sort_keys=True))
  return metrics


def weights_digest(model) -> str:
  """SHA-256 over the model's weights: every worker logs it, so a user can see replicas stayed in sync."""
  digest = hashlib.sha256()
  for weight in model.weights:
    digest.update(weight.numpy().tobytes())
  return digest.hexdigest()


def _check_inputs(config: config_lib.Config):
  """Schema, file lists and first records: all checked in plain Python before any device is touched."""
  data_cfg = config.data
  splits = {"train": ("--train_data", data_cfg.train_pattern)}
  if data_cfg.eval_pattern and config.train.eval_steps != 0:
    splits["eval"] = ("--eval_data", data_cfg.eval_pattern)
  files, headers = {}, {}
  for split, (flag, pattern) in splits.items():
    files[split] = data_lib.list_files(pattern, flag=flag)
  schema = schema_lib.load_schema(data_cfg.schema_path)
  data_lib.validate_schema_for_format(schema, data_cfg.format)
  for split, (flag, _) in splits.items():
    data_lib.check_first_record(files[split][0], schema, data_cfg.format, flag=flag)
    if data_cfg.format == "csv":
      headers[split] = data_lib.read_csv_header(files[split][0], flag=flag)
  return schema, files["train"], files.get("eval", []), headers


def _total_steps(config: config_lib.Config, train_files: list[str]) -> int:
  if config.train.train_steps is not None:
    return config.train.train_steps
  examples = data_lib.count_records(train_files, config.data.format)
  steps = config.train.epochs * examples // config.train.global_batch_size
  if steps < 1:
    raise UserError(f"--epochs={config.train.epochs} over {examples} examples is less than one batch of "
                    f"--global_batch_size={config.train.global_batch_size}")
  logging.info("%d epoch(s) of %d examples = %d steps", config.train.epochs, examples, steps)
  return steps


def _data_error(error, config: config_lib.Config) -> Exception:
  """Turns a parse failure deep in tf.data into one line; other errors pass through unchanged."""
  for line in (error.message or "").splitlines():
    match = re.search(r"(Feature: .*|Field \d+ .*|Expect(?:ed)? \d+ fields.*|Could not parse .*|"
                      r"Unable to parse .*|Key: .*)$", line)
    if match:
      detail = match.group(1).split(" [[")[0].strip()
      return UserError(f"a record in --train_data/--eval_data does not match the schema "
                       f"{config.data.schema_path}: {detail}")
  return error


def _corrupt_file_error(error, files: list[str], config: config_lib.Config) -> Exception:
  """A truncated or corrupted TFRecord: names the file (TF's message does not), found by reading them."""
  if config.data.format != "tfrecord":
    return error
  found = data_lib.find_corrupt_file(files)
  if found is None:
    return UserError(f"--train_data/--eval_data: a file is corrupted or truncated ({first_line(error)}); reading "
                     f"the {len(files)} files again did not find which (or took over 2 minutes)")
  path, reason = found
  return UserError(f"--train_data/--eval_data: {path} is corrupted or truncated ({reason}); write it again "
                   "or leave it out of the pattern")


def _serve_forever(role: cluster_lib.ClusterRole) -> None:
  """A parameter-server job's worker or ps: host variables and run what the chief schedules until stopped."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  server = tf.distribute.Server(tf.train.ClusterSpec(role.tf_cluster_dict()), job_name=role.task_type,
                                task_index=role.task_index, protocol="grpc", start=True)
  logging.info("Serving %s:%d at %s until the job ends", role.task_type, role.task_index, server.target)
  server.join()
