"""One typed entry, `run(config, env)`: plan -> pre-flight -> strategy -> train -> export -> metrics.

Order matters. Everything that can be checked without devices or peers is checked first, each check where
its inputs first exist: flag values alone in `config.validate`; their combination with the cluster role and
devices in `plan.make_plan` (pure, what --dry_run prints); everything that needs the data or the schema in
`preflight` (files, first records, the model against the schema, --epochs against the record count). So bad
input fails in one line with nothing written. Then logical devices are configured and the strategy is built
before any other TensorFlow op runs (collective ops and device layout are fixed at start-up). Only then does
training touch the data for real; a bad record met there is named where it is read (`data_errors`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
from typing import Any, TextIO

from absl import logging

from trainer import __version__ as trainer_version
from trainer.core import config as config_lib
from trainer.core import hypertune
from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import DataError
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.distribute import cluster as cluster_lib
from trainer.distribute import ownership
from trainer.distribute import peers
from trainer.distribute import plan as plan_lib
from trainer.distribute import preemption
from trainer.distribute import servers
from trainer.distribute import strategy as strategy_lib
from trainer.modeling import export
from trainer.modeling import model_registry
from trainer.modeling import models
from trainer.planning import preflight
from trainer.training import actions
from trainer.training import checkpoints



def run(config: config_lib.Config, env: config_lib.Environment, *, dry_run: bool = False,
        interactive: bool = False, stdout: TextIO = sys.stdout) -> dict[str, Any]:
  """Runs this process's part of the job; returns the final metrics (empty for servers and dry runs)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  num_gpus = len(tf.config.list_physical_devices("GPU"))
  plan = plan_lib.make_plan(config, env, num_gpus=num_gpus, keras_version=models.keras_version())
  if dry_run:
    stdout.write(json.dumps(plan.to_dict(config), sort_keys=True) + "\n")
    stdout.flush()
    return {}
  if not plan.choice.multi_process:
    # No coordination service, so no library handler to outlast: SIGTERM ends this process at once from here on.
    preemption.release_sigterm("before pre-flight")
  role = plan.role
  logging.info("Trainer %s from %s", trainer_version, os.path.dirname(os.path.abspath(__file__)))
  logging.info("Role: %s:%d of %s (chief=%s, %d training process(es), %d ps; from %s)", role.task_type,
               role.task_index, role.tf_cluster_dict() or "no cluster", role.is_chief, role.num_workers,
               role.num_ps, role.source)
  logging.info("Devices: %d GPU(s), %d logical CPU device(s), TPU=%s; Keras %s", plan.devices.num_gpus,
               plan.devices.num_cpu_devices, plan.devices.tpu, plan.keras_version)
  logging.info("Strategy: %s (%s)", plan.choice.class_name, plan.choice.reason)
  logging.info("Config: %s", json.dumps(json.loads(config.to_json()), sort_keys=True))

  if plan.choice.parameter_server and role.task_type in (cluster_lib.WORKER, cluster_lib.PS):
    servers.serve_forever(role)
    return {}

  inputs = preflight.check_inputs(config)
  formats.check_strategy(inputs.sources, parameter_server=plan.choice.parameter_server)
  if role.is_chief:
    for flag, path in (("--model_dir", config.output.model_dir), ("--checkpoint_dir", config.output.checkpoint_dir),
                       ("--tensorboard_dir", config.output.tensorboard_dir)):
      storage.check_writable(path, flag=flag)
    export.check_model_dir(config.output.model_dir, checkpoint_dir=config.output.checkpoint_dir)
  model_registry.resolve_builder(config.model.name)  # a --model that does not import fails here, before any wait
  preemption.honour_pending_sigterm("during pre-flight")
  plan = _when_training_is_done(plan, config)
  if plan is None:
    return {}

  # Dirs this run creates are removed again if it fails on bad input found only now (a record deep in the
  # data, a plug-in model, a checkpoint of another model): what is left must not look like a result. A bad record
  # met after the run saved checkpoints keeps them instead (`_kept_for_rerun`): a rerun on fixed data resumes.
  created = storage.new_dirs((config.output.tensorboard_dir, config.output.checkpoint_dir,
                               config.output.model_dir)) if role.is_chief else []
  with _peer_watchdog(plan, config) as watchdog, _claim_run_dir(plan, env, config):
    return _build_and_train(config, env, plan, inputs, interactive, watchdog, created)


def _claim_run_dir(plan: plan_lib.Plan, env: config_lib.Environment, config: config_lib.Config):
  """The chief holds the checkpoint dir for this job while it runs (`ownership`); other roles write none."""
  if not plan.role.is_chief:
    return contextlib.nullcontext()
  return ownership.Claim(config.output.checkpoint_dir, job_id=env.job_id)


@contextlib.contextmanager
def _peers_may_vanish(plan: plan_lib.Plan, where: str):
  """Under MultiWorkerMirroredStrategy a collective fails when a peer is gone (its chief preempted during the
  final evaluation): this replica then stops as a preempted peer (`preemption.PeerLost`, exit 143), not with a
  traceback. Parameter-server chiefs name a lost server themselves (`ps_source`); one process has no peers."""
  if not plan.choice.kind.lockstep_peers:
    yield
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    yield
  except tf.errors.OpError as error:
    lost = None if storage.storage_failure(error) else preemption.peer_lost(error, where=where)
    if lost is None:
      raise  # a storage outage is told by `task` (one line naming the bucket); anything else unchanged
    raise lost from None


def _peer_watchdog(plan: plan_lib.Plan, config: config_lib.Config):
  """Bounds the waits for peers (start-up, every chunk, the evaluation) in a multi-process job's chief and
  workers; the side-car evaluator only reads checkpoints."""
  if not plan.choice.multi_process or plan.role.is_evaluator:
    return contextlib.nullcontext(None)
  return peers.PeerWatchdog(plan.role, config.distribution.peer_timeout_secs)


def _build_and_train(config: config_lib.Config, env: config_lib.Environment, plan: plan_lib.Plan,
                     inputs: preflight.Inputs, interactive: bool,
                     watchdog: peers.PeerWatchdog | None, created: list[str]) -> dict[str, Any]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  role, schema = plan.role, inputs.schema
  devices = strategy_lib.configure_devices(config.distribution.num_cpu_devices)
  strategy = strategy_lib.build_strategy(plan.choice, role, devices)
  preemption.release_sigterm("while the strategy started")  # TensorFlow's own SIGTERM handler replaced here
  if watchdog is not None:
    watchdog.feed("the first training chunk")
  tf.keras.utils.set_random_seed(config.train.seed)
  # Set every time, as the dtype policy is (`recipe.set_precision`): a run in this process after an eager one
  # (tests run the command in-process) must not inherit it.
  tf.config.run_functions_eagerly(config.train.run_eagerly)
  if config.train.run_eagerly:
    logging.info("Running eagerly (--run_eagerly): same strategy, no tf.function compilation")

  from trainer.planning import job as job_lib  # pylint: disable=g-import-not-at-top
  from trainer.training import dispatch as training  # pylint: disable=g-import-not-at-top

  job = job_lib.build_job(config, plan, inputs, strategy, env=env, interactive=interactive, peer_watchdog=watchdog)

  if role.is_evaluator:
    from trainer.training import evaluation  # pylint: disable=g-import-not-at-top

    return evaluation.run_sidecar(job)

  # The resolved run, written beside the checkpoints from the start (a preempted or failed run says what it
  # was) and beside the export at the end.
  run_record = {"config": json.loads(config.to_json()), "schema": schema.to_dict(),
                "schema_origin": inputs.schema_origin, "plan": plan.to_dict(config), "train_steps": job.train_steps}
  if role.is_chief:
    storage.write_json(paths.join_path(config.output.checkpoint_dir, export.RUN_RECORD_FILE), run_record)
  try:
    with _peers_may_vanish(plan, "training or evaluation"):
      result = training.train(job)  # data errors are named where the data is read (trainer/planning/data_errors.py)
  except DataError as error:
    kept = _kept_for_rerun(config, error, is_chief=role.is_chief)
    if kept is not None:
      raise kept from error.__cause__
    for directory in created:
      storage.remove_tree(directory)
    raise
  except UserError:
    for directory in created:
      storage.remove_tree(directory)
    raise

  if watchdog is not None:
    watchdog.close()  # the export waits on storage, not on peers

  metrics = {
      "final_step": result.final_step,
      "resumed_from_step": result.resumed_from_step,
      "train_loss": result.train_loss,
      "examples_per_sec": result.examples_per_sec,
      "strategy": plan.choice.class_name,
      "tensorflow_version": tf.__version__,
      "num_replicas": strategy.num_replicas_in_sync,
      "weights_sha256": weights_digest(result.model),
      **{f"eval_{k}": v for k, v in result.eval_metrics.items()},
      **{f"test_{k}": v for k, v in result.test_metrics.items()},
  }
  actions.check_finite_weights(result.model, step=result.final_step, what="exported")
  with _peers_may_vanish(plan, "the export"):
    exported = export.publish(result.model, schema, config.output.model_dir, is_chief=role.is_chief,
                              run_record=run_record, metrics=metrics)
  if exported:
    logging.info("Exported SavedModel to %s", exported)
  if role.is_chief and config.train.hypertune_metric and not config.train.eval_every_steps:
    hypertune.report(metrics, metric=config.train.hypertune_metric, trial=role.trial, step=result.final_step,
                     path=env.hp_metric_file or hypertune.DEFAULT_PATH)
  logging.info("Final metrics: %s", json.dumps(metrics, sort_keys=True))
  return metrics


def _kept_for_rerun(config: config_lib.Config, error: DataError, *, is_chief: bool) -> DataError | None:
  """A bad record found only while training or evaluating (past pre-flight's sample) after checkpoints were
  written: they are kept, and the message says that a rerun on fixed data resumes from them (a run of hours is not
  thrown away for one bad eval file). None when there is no checkpoint, and the run leaves nothing behind."""
  step = checkpoints.latest_step(config.output.checkpoint_dir) if is_chief else None
  if step is None:
    return None
  return DataError(f"{error}; the checkpoints in {config.output.checkpoint_dir} are kept (the latest at step {step}):"
                   " fix the data and rerun the same command, which resumes from there")


def _when_training_is_done(plan: plan_lib.Plan, config: config_lib.Config) -> plan_lib.Plan | None:
  """A multi-process job restarted after its final checkpoint (Vertex restarts a replica that died during the
  export, or a whole job): peers that finished are gone, and waiting for them in the strategy's start-up would
  hang until the job's timeout. So the chief evaluates and exports alone under the default strategy, and any
  other training process has nothing left to do (None). The final step is --train_steps, or under --epochs the
  step count the run recorded when it started (counting the records here would run TensorFlow ops before the
  strategy exists)."""
  role = plan.role
  if not plan.choice.multi_process or role.is_evaluator:
    return plan
  step = checkpoints.latest_step(config.output.checkpoint_dir)
  if step is None:
    return plan
  final_step = _final_step(config)
  if final_step is None or step < final_step:
    return plan
  checkpoints.check_resume_step(step, final_step, directory=config.output.checkpoint_dir)
  if not role.is_chief:
    logging.info("The checkpoint in %s is at the final step %d: training is done, %s:%d has nothing left to do",
                 config.output.checkpoint_dir, step, role.task_type, role.task_index)
    return None
  reason = (f"training finished at step {step} (checkpoint in {config.output.checkpoint_dir}): evaluating and "
            f"exporting alone, without waiting for the {plan.choice.class_name} peers")
  logging.info("Strategy: default (%s)", reason)
  return dataclasses.replace(plan, choice=strategy_lib.StrategyChoice("default", reason))


def _final_step(config: config_lib.Config) -> int | None:
  """--train_steps, or the steps --epochs came to when this run started (its run record beside the checkpoints,
  if that record is of this same configuration); None when unknown."""
  if config.train.train_steps is not None:
    return config.train.train_steps
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  path = paths.join_path(config.output.checkpoint_dir, export.RUN_RECORD_FILE)
  if not tf.io.gfile.exists(path):
    return None
  try:
    record = storage.read_json(path)
  except ValueError:  # not JSON, not ours: the run takes its usual path
    return None
  if not isinstance(record, dict) or record.get("config") != json.loads(config.to_json()):
    return None
  steps = record.get("train_steps")
  return steps if isinstance(steps, int) and steps > 0 else None


def weights_digest(model) -> str:
  """SHA-256 over the model's weights: every worker logs it, so a user can see replicas stayed in sync."""
  digest = hashlib.sha256()
  for weight in model.weights:
    digest.update(weight.numpy().tobytes())
  return digest.hexdigest()
