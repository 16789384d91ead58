"""The periodic actions of training, one list for every loop (`standard_actions`): the custom loop fires them after
each chunk of steps, Keras `fit` after each execution (or each epoch under parameter servers), both through
`loop.fire_due` with the same cadences and the same agreement across workers.

In this order after every chunk: the peers' watchdog is fed; a non-finite loss stops before anything is saved;
progress and TensorBoard scalars (--log_every_steps); the periodic evaluation (--eval_every_steps); the checkpoint
(--checkpoint_every_steps and --checkpoint_every_secs); last the save before a preemption, so a chunk that ends on a
checkpoint step is saved once. No TensorFlow at import time.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from trainer.core import writers
from trainer.core.errors import UserError
from trainer.distribute import preemption
from trainer.modeling import recipe
from trainer.planning.job import Job
from trainer.training import checkpoints
from trainer.training import evaluation
from trainer.training import loop as loop_lib


def standard_actions(job: Job, *, model, keeper: checkpoints.CheckpointKeeper, log: "TrainLog", guard: "LossGuard",
                     periodic: evaluation.PeriodicEvaluation | None,
                     watcher: preemption.SigtermWatcher | None) -> list[loop_lib.PeriodicAction]:
  """The actions every loop fires, in the order above, with the cadences the flags name."""
  cfg = job.config.train
  actions = [
      loop_lib.PeriodicAction("peers moved", lambda state: job.peers_moved("the next training chunk"), every_secs=0),
      loop_lib.PeriodicAction("loss guard", guard, every_secs=0),
      loop_lib.PeriodicAction("log", log, every_steps=cfg.log_every_steps),
  ]
  if periodic is not None:
    actions.append(loop_lib.PeriodicAction("evaluate", periodic, every_steps=cfg.eval_every_steps))
  actions.append(loop_lib.PeriodicAction("checkpoint", lambda state: guarded_save(keeper, model, state.step),
                                         every_steps=cfg.checkpoint_every_steps, every_secs=cfg.checkpoint_every_secs))
  if watcher is not None:
    actions.append(preemption_action(watcher, keeper, model))
  return actions


def check_finite_weights(model, *, step: int, what: str = "checkpointed or exported") -> None:
  """Refuses weights holding a NaN or infinity (`UserError`): the loss can stay finite while they are not (a NaN
  input row makes kernel rows NaN and ReLU hides them), so the loss guard alone would let them be saved."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  weights = [(w, tf.convert_to_tensor(w)) for w in model.weights]
  weights = [(w, value) for w, value in weights if value.dtype.is_floating]
  if not weights or bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for _, v in weights])):
    return  # one read back to the host for the whole model: this runs before every checkpoint
  bad = []
  for weight, value in weights:
    count = int(tf.size(value)) - int(tf.math.count_nonzero(tf.math.is_finite(value)))
    if count:
      bad.append(f"{getattr(weight, 'path', None) or weight.name}: {count} of {int(tf.size(value))} values")
  if bad:
    raise UserError(f"the model's weights hold NaN or infinite values at step {step} ({'; '.join(bad[:3])}"
                    f"{'; ...' if len(bad) > 3 else ''}); nothing from this run since its last checkpoint is {what}; "
                    "look for NaN or inf in the data (features or labels), or lower --learning_rate")


def guarded_save(keeper: checkpoints.CheckpointKeeper, model, step: int) -> str | None:
  """The checkpoint at `step`, never of non-finite weights."""
  check_finite_weights(model, step=step)
  return keeper.save(step)


class TrainLog:
  """The log action: the given values plus learning rate and examples/s since the previous report."""

  def __init__(self, writer: writers.MetricWriter, optimizer, *, global_batch_size: int, start_step: int,
               clock: Callable[[], float] = time.monotonic):
    self._writer, self._optimizer, self._batch, self._clock = writer, optimizer, global_batch_size, clock
    self._last_step, self._last_time = start_step, clock()
    self.examples_per_sec: float | None = None

  def __call__(self, state: loop_lib.LoopState) -> None:
    now = self._clock()
    elapsed = now - self._last_time
    values = {"loss": state.loss, **(state.metrics or {})}
    shown = {k: float(v) for k, v in values.items() if v is not None}
    shown["learning_rate"] = recipe.current_learning_rate(self._optimizer)
    if elapsed > 0 and state.step > self._last_step:
      self.examples_per_sec = (state.step - self._last_step) * self._batch / elapsed
      shown["examples_per_sec"] = self.examples_per_sec
    self._writer.write_train(state.step, shown)
    self._last_step, self._last_time = state.step, now


class LossGuard:
  """Stops training on a non-finite loss, before anything from those steps is checkpointed or exported."""

  def __init__(self, start_step: int):
    self._checked_step = start_step

  def __call__(self, state: loop_lib.LoopState) -> None:
    loss = state.loss if state.loss is not None else (state.metrics or {}).get("loss")
    if loss is not None and not math.isfinite(float(loss)):
      raise UserError(f"the training loss became {float(loss)} within steps {self._checked_step + 1}-{state.step}; "
                      "nothing from those steps is checkpointed or exported; look for NaN or inf in the data "
                      "(features or labels), or lower --learning_rate")
    self._checked_step = state.step


def preemption_action(watcher: preemption.SigtermWatcher, keeper: checkpoints.CheckpointKeeper,
                      model) -> loop_lib.PeriodicAction:
  """Saves at the step reached and stops with `Preempted` once SIGTERM arrived, here or (agreed) on a peer."""

  def save_and_stop(state: loop_lib.LoopState) -> None:
    saved = guarded_save(keeper, model, state.step)
    preemption.exit_within()  # the save is done; the exit must not wait on peers that already stopped
    raise preemption.Preempted(state.step, saved, on_peer=not watcher.requested)

  return loop_lib.PeriodicAction("preemption", save_and_stop, when=lambda: watcher.requested, at_end=False)


def agreement(job: Job) -> loop_lib.Agreement | None:
  """Under MultiWorkerMirroredStrategy every worker must save the same step together (a checkpoint of mirrored
  variables is written by all of them), but a clock (--checkpoint_every_secs) or a SIGTERM decides on one
  process. So after every chunk the workers all-reduce their due flags: one small collective per chunk, next
  to the chunk's own per-step all-reduces. Other strategies run the loop in one process: nothing to agree."""
  if not job.choice.kind.lockstep_peers:
    return None
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  strategy = job.strategy

  @tf.function
  def any_process(flags):
    # tf.identity: a value per replica (a captured tensor returned as is is one plain value, which a worker with
    # several local replicas refuses to reduce); each process's flags count once per replica, hence "> 0".
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(flags)), axis=None) > 0

  def agree(due):
    return [bool(v) for v in any_process(tf.constant([float(d) for d in due])).numpy()]

  return agree
