"""Keras `model.fit` inside `strategy.scope()`, as an adapter onto the same actions as the custom loop.

A Keras callback fires `TrainingSession.actions` through `loop.fire_due`, after every execution of
`steps_per_execution` steps, or, under ParameterServerStrategy (where Keras runs no batch-level callbacks), after
every epoch. Executions and epochs are sized so that they end on every step a cadence names (checkpoint, log line,
evaluation) and on the final step, so each action fires at exactly the steps it fires at under the custom loop, and
`--checkpoint_every_secs` and a SIGTERM are looked at after each of them. No TensorFlow at import time.
"""

from __future__ import annotations

import math
from typing import Any

from absl import logging

from trainer.core import config as config_lib
from trainer.distribute import preemption
from trainer.modeling import models
from trainer.modeling import objective as objective_lib
from trainer.planning.job import Job
from trainer.planning.job import TrainResult
from trainer.training import actions as actions_lib
from trainer.training import loop as loop_lib
from trainer.training import steps
from trainer.training.training_session import TrainingSession


def fit_calls(start_step: int, train_steps: int, steps_per_epoch: int, *,
              stop_at_final_step: bool) -> list[tuple[int, int, int]]:
  """The `model.fit` calls, as (initial_epoch, epochs, steps_per_epoch), that end exactly at `train_steps`.

  With a batch-level stop, one call whose last epoch is cut short. Without (Keras rejects batch-level
  callbacks under ParameterServerStrategy), the whole epochs first and the remainder as one shorter epoch.
  """
  if start_step >= train_steps:
    return []
  if stop_at_final_step:
    return [(start_step // steps_per_epoch, -(-train_steps // steps_per_epoch), steps_per_epoch)]
  whole, remainder = divmod(train_steps - start_step, steps_per_epoch)
  first_epoch = start_step // steps_per_epoch
  calls = [(first_epoch, first_epoch + whole, steps_per_epoch)] if whole else []
  if remainder:
    calls.append((first_epoch + whole, first_epoch + whole + 1, remainder))
  return calls


def fit_steps_per_execution(*, steps_per_loop: int, checkpoint_every_steps: int, train_steps: int,
                            log_every_steps: int | None = None, eval_every_steps: int | None = None,
                            profile_steps: tuple[int, ...] | None = None) -> int:
  """Steps per Keras execution that land exactly on every checkpoint, log line, evaluation, each edge of the
  profiler's window (--profile_steps) and the final step."""
  return math.gcd(steps_per_loop, checkpoint_every_steps, train_steps, log_every_steps or 0, eval_every_steps or 0,
                  *(profile_steps or ()))


def fit_epoch_steps(train: config_lib.TrainConfig, *, batch_level: bool) -> int:
  """Steps per Keras epoch. With batch-level callbacks the actions fire after every execution, so an epoch is one
  checkpoint period; without (parameter servers) they fire at epoch ends, so an epoch ends on every step a cadence
  names: the greatest common divisor of the checkpoint, log and evaluation periods."""
  if batch_level:
    return train.checkpoint_every_steps
  return math.gcd(train.checkpoint_every_steps, train.log_every_steps, train.eval_every_steps or 0,
                  *(train.profile_steps or ()))


class WindowMeans:
  """Keras reports each metric as its running mean since the epoch began; the actions (log lines, TensorBoard,
  the loss guard) report the mean over the steps since the previous report, as the custom loop does."""

  def __init__(self):
    self._epoch_start = self._last_step = 0
    self._last: dict[str, float] = {}

  def epoch_began(self, step: int) -> None:
    self._epoch_start, self._last_step, self._last = step, step, {}

  def __call__(self, step: int, logs: dict) -> dict[str, float]:
    done, before = step - self._epoch_start, self._last_step - self._epoch_start
    running = {name: float(value) for name, value in logs.items()}
    means = {name: (value * done - self._last[name] * before) / (done - before)
             if name in self._last and done > before else value for name, value in running.items()}
    self._last_step, self._last = step, running
    return means


def _callback(session: TrainingSession, actions: list[loop_lib.PeriodicAction], *, batch_level: bool,
              agree: loop_lib.Agreement | None):
  """The Keras callback that fires `actions` (built lazily, so this module imports without TensorFlow)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  optimizer, train_steps = session.optimizer, session.job.train_steps
  window = WindowMeans()

  def fire(callback, logs) -> None:
    step = int(optimizer.iterations.numpy())
    state = loop_lib.LoopState(step, metrics=window(step, dict(logs or {})))
    loop_lib.fire_due(actions, state, final=state.step >= train_steps, agree=agree)
    if state.step >= train_steps or session.stopped_early():
      callback.model.stop_training = True  # Keras checks it after every batch, then still ends the epoch

  class EpochActions(tf.keras.callbacks.Callback):

    def on_epoch_begin(self, epoch, logs=None):
      window.epoch_began(int(optimizer.iterations.numpy()))

    def on_epoch_end(self, epoch, logs=None):
      fire(self, logs)

  class BatchActions(EpochActions):

    def on_epoch_end(self, epoch, logs=None):
      pass  # the last batch of the epoch fired them

    def on_train_batch_end(self, batch, logs=None):
      fire(self, logs)

  return BatchActions() if batch_level else EpochActions()


def _steps_per_execution(job: Job) -> int:
  cfg = job.config.train
  steps_per_execution = fit_steps_per_execution(
      steps_per_loop=cfg.steps_per_loop, checkpoint_every_steps=cfg.checkpoint_every_steps,
      train_steps=job.train_steps, log_every_steps=cfg.log_every_steps, eval_every_steps=cfg.eval_every_steps,
      profile_steps=cfg.profile_steps)
  if steps_per_execution != cfg.steps_per_loop:
    logging.info("fit: steps_per_execution=%d, so that executions end on every checkpoint (every %d steps), "
                 "log line, profiled step and the final step %d", steps_per_execution, cfg.checkpoint_every_steps,
                 job.train_steps)
  if job.strategy.num_replicas_in_sync > 1 and models.keras_version().startswith("3.") and steps_per_execution > 1:
    # Keras 3 fails under mirrored strategies with steps_per_execution > 1 ("You must feed a value for
    # placeholder tensor ... while/cond"), measured with Keras 3.15.1 / TF 2.21. --steps_per_loop's help says so.
    logging.info("fit: steps_per_execution=1 (Keras %s cannot run several steps per call under %d replicas)",
                 models.keras_version(), job.strategy.num_replicas_in_sync)
    steps_per_execution = 1
  return steps_per_execution


def _compile(job: Job, model: Any, optimizer: Any, objective: objective_lib.Objective) -> None:
  """`model.compile` with the trainer's loss (or a compiled plug-in's), metrics and execution settings."""
  cfg = job.config.train
  compiled = getattr(model, "user_compile", None)
  user_metrics = []
  if compiled is not None and compiled.activation is None and not compiled.binary_unit:
    user_metrics = list(compiled.metrics)  # the model's outputs are as the user wrote them: their metrics fit them
  elif compiled is not None and compiled.metrics:
    logging.info("The plug-in's own %d metric(s) are not computed: they were written for its %s outputs, which "
                 "the trainer turns into logits; eval reports %s", len(compiled.metrics),
                 compiled.activation or "one-unit", ", ".join(objective_lib.metric_names(job.schema)))
  with job.strategy.scope():  # metrics too: tf_keras refuses metric objects made outside the model's strategy scope
    model.compile(optimizer=optimizer, loss=steps.train_objective(job, model).keras_loss(),
                  metrics=objective.keras_metrics() + user_metrics, steps_per_execution=_steps_per_execution(job),
                  run_eagerly=cfg.run_eagerly, jit_compile=cfg.jit_compile)  # the plan refuses it over CPU replicas


def _build_before_fit(job: Job, model: Any, names: list[str]) -> None:
  """Builds the model, its metrics, loss and optimizer from the input's spec when Keras' own build would fail.

  Keras 3 (3.15 here; not 3.4) starts `fit` under a strategy by averaging the first distributed batch across
  replicas (`_maybe_symbolic_build`: a cross-replica MEAN of every input) only to learn shapes and dtypes; a batch
  holding strings (free text, which every model takes raw) cannot be averaged ("attr 'T' of string ... AddN").
  So under several replicas with a string input the trainer builds the same state from the dataset's element
  spec, as that method would from the batch, and that model's averaging step is skipped."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if job.strategy.num_replicas_in_sync < 2 or not hasattr(model, "_maybe_symbolic_build"):
    return
  spec = job.dataset_fn("train", select=names)(tf.distribute.InputContext()).element_spec
  if not any(s.dtype == tf.string for s in tf.nest.flatten(spec)):
    return
  with job.strategy.scope():
    model._symbolic_build(data_batch=spec)  # pylint: disable=protected-access  (shapes and dtypes are all it reads)
  model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None  # pylint: disable=protected-access


def fit_loop(job: Job) -> TrainResult:
  """Keras `model.fit` from the last checkpoint (or step 0) to exactly `job.train_steps` (so `--epochs` means
  passes over the data under both loops), then one evaluation (`TrainingSession`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  cfg = job.config.train
  strategy = job.strategy
  parameter_server = job.choice.parameter_server
  model, optimizer = steps.build_model_and_optimizer(job)
  _compile(job, model, optimizer, objective_lib.Objective(job.schema))  # before the restore, as Keras expects
  with TrainingSession(job, model, optimizer) as session:
    names = models.input_names(model)
    _build_before_fit(job, model, names)
    losses = [None]
    batch_level = not parameter_server  # Keras rejects batch-level callbacks under parameter servers
    epoch_steps = fit_epoch_steps(cfg, batch_level=batch_level)
    with preemption.SigtermWatcher() as watcher:
      callback = _callback(session, session.actions(watcher), batch_level=batch_level,
                           agree=actions_lib.agreement(job))
      for initial_epoch, epochs, steps_in_epoch in fit_calls(session.start_step, session.total_steps, epoch_steps,
                                                             stop_at_final_step=batch_level):
        if session.stopped_early():
          break
        if parameter_server:
          train_data = tf.keras.utils.experimental.DatasetCreator(job.dataset_fn("train", select=names))
        else:
          train_data = strategy.distribute_datasets_from_function(job.dataset_fn("train", select=names))
        with job.reading_data():
          history = model.fit(train_data, epochs=epochs, initial_epoch=initial_epoch,
                              steps_per_epoch=steps_in_epoch, callbacks=[callback], verbose=0,
                              shuffle=False)  # the input pipeline shuffles (--shuffle_buffer); Keras cannot
        losses = history.history.get("loss") or losses
    return session.finish(train_loss=losses[-1])

