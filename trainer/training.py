"""Training under a `tf.distribute` strategy: the custom loop (every strategy) and Keras `model.fit`.

Both report through one `writers.MetricWriter` and checkpoint through one `CheckpointKeeper`. The custom loop
is `loop.run` over a source of steps: a `tf.function` running up to `--steps_per_loop` steps per call under
sync strategies, or, under ParameterServerStrategy, closures of up to `--steps_per_loop` steps that the chief
schedules on the workers through a `ClusterCoordinator`. Each replica averages its loss over the GLOBAL batch
(`tf.nn.compute_average_loss`), so the cross-replica gradient sum is the gradient of the mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from typing import Any, Callable

from absl import logging

from trainer import checkpoints
from trainer import cluster as cluster_lib
from trainer import config as config_lib
from trainer import input_pipeline
from trainer import evaluation
from trainer import formats
from trainer import loop as loop_lib
from trainer import models
from trainer import objective as objective_lib
from trainer import preemption
from trainer import progress as progress_lib
from trainer import recipe
from trainer import schema as schema_lib
from trainer import strategy as strategy_lib
from trainer import writers
from trainer.errors import EXIT_EXTERNAL_FAILURE
from trainer.errors import ExternalFailure
from trainer.errors import UserError
from trainer.errors import first_line


@dataclasses.dataclass(frozen=True)
class Job:
  """Everything a training run needs, resolved and validated by the runner."""

  config: config_lib.Config
  schema: schema_lib.Schema
  strategy: Any
  choice: strategy_lib.StrategyChoice
  role: cluster_lib.ClusterRole
  train_files: list[str]
  eval_files: list[str]
  sources: dict[str, formats.Source]  # "train"/"eval" -> format, compression, CSV columns
  train_steps: int
  interactive: bool
  build_model: Callable[..., Any]
  peer_watchdog: Any = None  # peers.PeerWatchdog in a multi-process job: fed after every chunk
  class_weights: tuple[float, ...] | None = None  # by class id (--class_weights), resolved by the runner
  report_eval: Callable[[dict, int], None] | None = None  # each periodic evaluation to hyperparameter tuning

  def peers_moved(self, next_wait: str) -> None:
    """The job moved past a wait on peers; `next_wait` names the next one (for the watchdog's message)."""
    if self.peer_watchdog is not None:
      self.peer_watchdog.feed(next_wait)

  @property
  def is_chief(self) -> bool:
    return self.role.is_chief

  def dataset_fn(self, split: str, *, select: list[str] | None = None) -> Callable:
    """`dataset_fn(input_context)` for `split`: training data repeats; eval data is one pass (or --eval_steps
    batches) with the last batch partial. `select` keeps only the model's inputs (Keras `fit` wants that)."""
    cfg = self.config
    training = split == "train"
    files = self.train_files if training else self.eval_files
    return input_pipeline.make_dataset_fn(
        files, self.schema, source=self.sources[split], global_batch_size=cfg.train.global_batch_size,
        training=training, shuffle_buffer=cfg.data.shuffle_buffer,
        # Under parameter servers every worker reads all files: distinct seeds keep their orders apart.
        seed=None if self.choice.parameter_server else cfg.train.seed,
        select=select, deterministic=cfg.data.deterministic,
        max_batches=None if training else cfg.train.eval_steps)


@dataclasses.dataclass
class TrainResult:
  final_step: int
  resumed_from_step: int
  train_loss: float | None
  examples_per_sec: float | None
  eval_metrics: dict[str, float]
  model: Any = None


def _build_model_and_optimizer(job: Job):
  """The model and its optimizer, both under the strategy's scope and the --precision policy. A plug-in that
  arrived compiled keeps its own optimizer (and, in `_train_objective`, its loss)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  cfg = job.config.train
  recipe.set_precision(cfg.precision)
  with job.strategy.scope():
    model = job.build_model()
    compiled = getattr(model, "user_compile", None)
    if compiled is not None:
      optimizer = compiled.optimizer
      logging.info("The plug-in model arrived compiled (%s): its own loss and optimizer train it; --optimizer, "
                   "--learning_rate, --lr_schedule, --weight_decay and --clip_norm do not apply",
                   compiled.describe())
      if models.keras_version().startswith("3."):
        recipe.sum_in_replica_context(optimizer)  # Keras 3.4 would not sum the replicas' gradients at all
      if cfg.precision == "mixed_float16" and not isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    else:
      optimizer = recipe.make_optimizer(cfg, job.train_steps, keras_version=models.keras_version())
    # Built inside the scope: an optimizer built later keeps non-mirrored slot variables.
    optimizer.build(model.trainable_variables)
  return model, optimizer


def _train_objective(job: Job, model) -> objective_lib.Objective:
  """The training loss: the task's, or a compiled plug-in's own; weighted by --class_weights."""
  return objective_lib.Objective(job.schema, class_weights=job.class_weights,
                                 user_loss=getattr(model, "user_compile", None))


def _periodic_evaluation(job: Job, model, objective: objective_lib.Objective,
                         writer: writers.MetricWriter) -> evaluation.PeriodicEvaluation | None:
  if not job.config.train.eval_every_steps:
    return None
  periodic = evaluation.PeriodicEvaluation(job, model, objective, writer,
                                           report=job.report_eval if job.is_chief else None)
  if periodic.stopped:
    logging.info("This run stopped early at step %d (%s): it trains no further; evaluating and exporting",
                 periodic.best.stopped_at, evaluation.BEST_FILE)
  return periodic


def _final_evaluation(job: Job, model, objective: objective_lib.Objective, writer: writers.MetricWriter,
                      periodic: evaluation.PeriodicEvaluation | None, final_step: int) -> dict[str, float]:
  """The metrics of the weights that will be exported: the best evaluation's under --export=best, the
  periodic evaluation of the final step when there was one, else one more pass."""
  if periodic is not None:
    best = periodic.restore_best(final_step)
    if best is not None:
      return best
    if periodic.last_step == final_step:
      return periodic.last_metrics
  job.peers_moved("the evaluation pass")
  metrics = evaluation.evaluate(job, model, objective)
  if metrics:
    writer.write("eval", final_step, metrics)
  return metrics


def _keeper(job: Job, model, optimizer) -> checkpoints.CheckpointKeeper:
  """All workers save (MultiWorkerMirroredStrategy needs every one to); the chief's land in the checkpoint dir."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return checkpoints.CheckpointKeeper(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                      directory=job.config.output.checkpoint_dir, is_chief=job.is_chief)


def _writer(job: Job, start_step: int) -> writers.MetricWriter:
  """Progress from `start_step` on every process; TensorBoard files from the chief only."""
  progress = progress_lib.ProgressReporter(job.train_steps, start_step=start_step, interactive=job.interactive)
  return writers.MetricWriter(job.config.output.tensorboard_dir, enabled=job.is_chief, progress=progress)


class _TrainLog:
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


def _resume(job: Job, keeper: checkpoints.CheckpointKeeper, optimizer) -> int:
  """Restores the latest checkpoint and returns its step; one at --train_steps means a finished run."""
  keeper.restore_latest()
  start_step = int(optimizer.iterations.numpy())
  checkpoints.check_resume_step(start_step, job.train_steps, directory=job.config.output.checkpoint_dir)
  if start_step == job.train_steps:
    logging.info("The checkpoint in %s is at the final step %d: training is done, evaluating and exporting it",
                 job.config.output.checkpoint_dir, start_step)
  elif start_step:
    logging.info("Resuming at step %d of %d", start_step, job.train_steps)
  return start_step


def _replica_step(model, optimizer, objective: objective_lib.Objective, *, names, global_batch_size: int,
                  jit_compile: bool = False):
  """One replica's forward, loss over the global batch, and update.

  Under mixed_float16 the loss is scaled before the gradient and the gradients unscaled (a LossScaleOptimizer:
  Keras 3 unscales inside `apply_gradients`, tf_keras through `get_unscaled_gradients`). With --jit_compile the
  forward and backward pass are one XLA cluster; the update stays outside it, because the cross-replica
  all-reduce inside the optimizer is not an XLA op on every device (CPU collectives are not).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  loss_scaling = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
  legacy_scaling = loss_scaling and hasattr(optimizer, "get_scaled_loss")  # tf_keras

  def loss_and_gradients(features, labels):
    with tf.GradientTape() as tape:
      outputs = model(models.select_inputs(features, names), training=True)
      per_example = objective.per_example_loss(labels, outputs)
      loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(tf.cast(tf.add_n(model.losses), tf.float32))
      scaled = (optimizer.get_scaled_loss(loss) if legacy_scaling else optimizer.scale_loss(loss)
                if loss_scaling else loss)
    gradients = tape.gradient(scaled, model.trainable_variables)
    if legacy_scaling:
      gradients = optimizer.get_unscaled_gradients(gradients)
    return loss, gradients

  if jit_compile:
    loss_and_gradients = tf.function(loss_and_gradients, jit_compile=True)

  def replica_step(features, labels):
    loss, gradients = loss_and_gradients(features, labels)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss

  return replica_step


def _steps_fn(strategy, replica_step):
  """A `tf.function(iterator, num_steps)` running `num_steps` distributed steps; returns the summed loss."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def train_steps(iterator, num_steps):
    total = tf.constant(0.0)
    for _ in tf.range(num_steps):
      features, labels = next(iterator)
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(features, labels)),
                               axis=None)
    return total

  return train_steps


def _synchronous_steps(job: Job, replica_step: Callable) -> Callable[[int], tuple[int, float]]:
  """The loop's source under sync strategies: `num` steps in one `tf.function` call."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  iterator = iter(job.strategy.distribute_datasets_from_function(job.dataset_fn("train")))
  train_steps = _steps_fn(job.strategy, replica_step)

  def advance(num: int) -> tuple[int, float]:
    return num, float(train_steps(iterator, tf.constant(num))) / num

  return advance


def closure_sizes(num: int, *, steps_per_loop: int, num_workers: int) -> list[int]:
  """How `num` steps are split into closures for the parameter-server workers: at most `--steps_per_loop`
  steps each, and enough closures to keep every worker busy."""
  per_closure = min(steps_per_loop, max(1, math.ceil(num / max(1, num_workers))))
  sizes = [per_closure] * (num // per_closure)
  return sizes + [num % per_closure] if num % per_closure else sizes


def _coordinated_steps(job: Job, replica_step: Callable, optimizer,
                       start_step: int) -> Callable[[int], tuple[int, float]]:
  """The loop's source under ParameterServerStrategy: the chief schedules closures of several steps on the
  workers (`closure_sizes`) and waits for them all, so checkpoints hold every step before them.

  The optimizer's step counter on the parameter servers is not the count of steps run: a worker lost in the
  middle of a closure has applied some of its steps when the coordinator runs the whole closure again on another
  worker (a step counted twice), and Keras 3 increments the counter as a read then a write, so workers updating
  it at once lose increments (measured: 584 of 600 steps counted with 2 workers). The updates themselves cannot
  be taken back (asynchronous training tolerates them), but the count can: after each chunk it is set to the
  steps scheduled, so the run ends at exactly --train_steps and checkpoints are named for the steps they hold.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  strategy = job.strategy
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  num_workers = len(job.role.cluster.get(cluster_lib.WORKER, ()))
  dataset_fn = job.dataset_fn("train")

  @tf.function
  def per_worker_dataset():
    return strategy.distribute_datasets_from_function(dataset_fn)

  iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))
  train_steps = _steps_fn(strategy, replica_step)
  steps_per_loop = job.config.train.steps_per_loop
  logging.info("Parameter servers: each chunk is scheduled as closures of up to %d steps (--steps_per_loop) over "
               "%d worker(s)", steps_per_loop, num_workers)

  scheduled = start_step

  def advance(num: int) -> tuple[int, float]:
    nonlocal scheduled
    sizes = closure_sizes(num, steps_per_loop=steps_per_loop, num_workers=num_workers)
    results = [coordinator.schedule(train_steps, args=(iterator, tf.constant(size))) for size in sizes]
    try:
      coordinator.join()
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as e:
      # The coordinator survives lost workers by itself; what reaches here is a lost parameter server, whose
      # variables are gone: only a restart of the job (from the last checkpoint) can go on.
      raise ExternalFailure(f"{_lost_peers(e, job.role)} was lost after step {scheduled} ({_error_detail(e)}); "
                            f"this chief exits {EXIT_EXTERNAL_FAILURE} so that Vertex restarts the job, which "
                            f"resumes from the last checkpoint in {job.config.output.checkpoint_dir}") from None
    scheduled += num
    counted = int(optimizer.iterations.numpy())
    if counted > scheduled:
      logging.warning("A worker was lost during a closure: %d step(s) it had applied ran again on another worker; "
                      "the step count is set back from %d to %d", counted - scheduled, counted, scheduled)
    elif counted < scheduled:
      logging.info("The parameter servers counted %d of %d steps (workers' increments interleaved); the step "
                   "count is set to %d", counted, scheduled, scheduled)
    if counted != scheduled:
      optimizer.iterations.assign(scheduled)
    return num, sum(float(r.fetch()) for r in results) / num

  return advance


def _lost_peers(error: Exception, role: cluster_lib.ClusterRole) -> str:
  """The parameter servers an error names by address or task, e.g. "parameter server ps:0 (127.0.0.1:2222)"."""
  text = str(getattr(error, "message", "") or error)
  named = [f"{cluster_lib.PS}:{index} ({address})" for index, address in enumerate(role.cluster.get(cluster_lib.PS, ()))
           if address in text or f"/job:{cluster_lib.PS}/replica:0/task:{index}" in text]
  return "parameter server " + ", ".join(named) if named else "a parameter server"


def _error_detail(error: Exception) -> str:
  """The line of a TensorFlow error that says what failed (its first line is often "Graph execution error:")."""
  text = str(getattr(error, "message", "") or error)
  found = re.search(r"\b(UNAVAILABLE|ABORTED|CANCELLED|DEADLINE_EXCEEDED):\s*(.+)", text)
  return f"{found.group(1)}: {found.group(2).strip()[:200]}" if found else first_line(error)


def custom_loop(job: Job) -> TrainResult:
  """Trains with `strategy.run` steps driven by `loop.run`: progress and summaries every --log_every_steps,
  a checkpoint every --checkpoint_every_steps, both at the final step; then one evaluation pass."""
  cfg = job.config.train
  model, optimizer = _build_model_and_optimizer(job)
  objective = objective_lib.Objective(job.schema)
  keeper = _keeper(job, model, optimizer)
  writer = periodic = None
  try:
    start_step = _resume(job, keeper, optimizer)
    writer = _writer(job, start_step)
    periodic = _periodic_evaluation(job, model, objective, writer)
    replica_step = _replica_step(model, optimizer, _train_objective(job, model), names=models.input_names(model),
                                 global_batch_size=cfg.global_batch_size, jit_compile=cfg.jit_compile)
    parameter_server = job.choice.parameter_server
    if parameter_server:
      advance = _coordinated_steps(job, replica_step, optimizer, start_step)
    else:
      advance = _synchronous_steps(job, replica_step)
    log = _TrainLog(writer, optimizer, global_batch_size=cfg.global_batch_size, start_step=start_step)
    with preemption.SigtermWatcher() as watcher:
      # In this order after every chunk: a non-finite loss stops before anything is saved; the preemption check
      # comes last, so a chunk that ends on a checkpoint step is saved once.
      actions = [
          loop_lib.PeriodicAction("peers moved", lambda state: job.peers_moved("the next training chunk"),
                                  every_secs=0),
          loop_lib.PeriodicAction("loss guard", _LossGuard(start_step), every_secs=0),
          loop_lib.PeriodicAction("log", log, every_steps=cfg.log_every_steps),
      ]
      if periodic is not None:
        actions.append(loop_lib.PeriodicAction("evaluate", periodic, every_steps=cfg.eval_every_steps))
      actions.append(loop_lib.PeriodicAction("checkpoint", lambda state: keeper.save(state.step),
                                             every_steps=cfg.checkpoint_every_steps,
                                             every_secs=cfg.checkpoint_every_secs))
      if watcher is not None:
        actions.append(_preemption_action(watcher, keeper))
      # A run that stopped early before a restart is done: it trains no further.
      total_steps = start_step if periodic is not None and periodic.stopped else job.train_steps
      # Under parameter servers a chunk spans closures on every worker; each stays within steps_per_loop.
      state = loop_lib.run(start_step=start_step, total_steps=total_steps, advance=advance, actions=actions,
                           max_steps_per_call=None if parameter_server else cfg.steps_per_loop,
                           agree=_agreement(job), stop=(lambda: periodic.stopped) if periodic is not None else None)
    return _finish(job, model, optimizer, objective, keeper, writer, periodic, start_step=start_step,
                   train_loss=state.loss, examples_per_sec=log.examples_per_sec)
  finally:
    _close(keeper, writer, periodic)


def _finish(job: Job, model, optimizer, objective: objective_lib.Objective, keeper: checkpoints.CheckpointKeeper,
            writer, periodic, *, start_step: int, train_loss, examples_per_sec) -> TrainResult:
  """After either loop: the early stop's checkpoint, the final evaluation, the result."""
  final_step = int(optimizer.iterations.numpy())
  if final_step < job.train_steps:
    keeper.save(final_step)  # stopped early: a restart finds the run done at this step
  eval_metrics = _final_evaluation(job, model, objective, writer, periodic, final_step)
  return TrainResult(final_step=final_step, resumed_from_step=start_step, train_loss=train_loss,
                     examples_per_sec=examples_per_sec, eval_metrics=eval_metrics, model=model)


def _close(keeper: checkpoints.CheckpointKeeper, writer, periodic) -> None:
  if periodic is not None:
    periodic.close()
  if writer is not None:
    writer.close()
  keeper.close()


class _LossGuard:
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


def _preemption_action(watcher: preemption.SigtermWatcher,
                       keeper: checkpoints.CheckpointKeeper) -> loop_lib.PeriodicAction:
  """Saves at the step reached and stops with `Preempted` once SIGTERM arrived, here or (agreed) on a peer."""

  def save_and_stop(state: loop_lib.LoopState) -> None:
    saved = keeper.save(state.step)
    preemption.exit_within()  # the save is done; the exit must not wait on peers that already stopped
    raise preemption.Preempted(state.step, saved, on_peer=not watcher.requested)

  return loop_lib.PeriodicAction("preemption", save_and_stop, when=lambda: watcher.requested, at_end=False)


def _agreement(job: Job) -> loop_lib.Agreement | None:
  """Under MultiWorkerMirroredStrategy every worker must save the same step together (a checkpoint of mirrored
  variables is written by all of them), but a clock (--checkpoint_every_secs) or a SIGTERM decides on one
  process. So after every chunk the workers all-reduce their due flags: one small collective per chunk, next
  to the chunk's own per-step all-reduces. Other strategies run the loop in one process: nothing to agree."""
  if job.choice.name != "multi_worker_mirrored":
    return None
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  strategy = job.strategy

  @tf.function
  def any_process(flags):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: flags), axis=None) > 0

  def agree(due):
    return [bool(v) for v in any_process(tf.constant([float(d) for d in due])).numpy()]

  return agree


class _FitReporting:
  """Keras callback (built lazily, so this module imports without TensorFlow).

  Saves a checkpoint at the end of each Keras epoch (one checkpoint period), reports progress through the same
  log action as the custom loop every --log_every_steps, and with `batch_level` stops `fit` exactly at the
  final step and fires the custom loop's other per-chunk actions after every execution, agreed across workers
  like the custom loop's: the loss guard, the time-based checkpoint and the SIGTERM save. Without `batch_level`
  (Keras rejects batch-level callbacks under ParameterServerStrategy) it reports and guards once per checkpoint
  period.
  """

  @staticmethod
  def create(keeper: checkpoints.CheckpointKeeper, optimizer, log: _TrainLog, *, log_every_steps: int,
             train_steps: int, batch_level: bool, guard: _LossGuard, checkpoint_every_secs: float | None,
             watcher: preemption.SigtermWatcher | None, agree: loop_lib.Agreement | None,
             peers_moved: Callable[[str], None], periodic: evaluation.PeriodicEvaluation | None = None,
             eval_every_steps: int | None = None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    log_action = loop_lib.PeriodicAction("log", log, every_steps=log_every_steps)
    after_batch = [loop_lib.PeriodicAction("peers moved", lambda state: peers_moved("the next training step"),
                                           every_secs=0),
                   loop_lib.PeriodicAction("loss guard", guard, every_secs=0), log_action]
    if periodic is not None and batch_level:
      after_batch.append(loop_lib.PeriodicAction("evaluate", periodic, every_steps=eval_every_steps))
    evaluated = {"step": None}
    if checkpoint_every_secs:
      after_batch.append(loop_lib.PeriodicAction("checkpoint", lambda state: keeper.save(state.step),
                                                 every_secs=checkpoint_every_secs, at_end=False))
    if watcher is not None:
      after_batch.append(_preemption_action(watcher, keeper))

    class Reporting(tf.keras.callbacks.Callback):

      def on_epoch_end(self, epoch, logs=None):
        step = int(optimizer.iterations.numpy())
        state = loop_lib.LoopState(step, metrics=dict(logs or {}))
        peers_moved("the next training epoch")
        guard(state)
        if periodic is not None and not batch_level and (evaluated["step"] is None or step // eval_every_steps >
                                                         evaluated["step"] // eval_every_steps or step >= train_steps):
          periodic(state)  # no batch-level callbacks under parameter servers: at the first epoch end past each
          evaluated["step"] = step
          self.model.stop_training = periodic.stopped
        keeper.save(step)
        if batch_level:
          log_action(state, final=step >= train_steps)
        else:
          log(state)

    class BatchReporting(Reporting):

      def on_train_batch_end(self, batch, logs=None):
        state = loop_lib.LoopState(int(optimizer.iterations.numpy()), metrics=dict(logs or {}))
        loop_lib.fire_due(after_batch, state, agree=agree)
        if state.step >= train_steps or (periodic is not None and periodic.stopped):
          self.model.stop_training = True  # Keras checks it after every batch, then still ends the epoch

    return BatchReporting() if batch_level else Reporting()


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
                            log_every_steps: int | None = None, eval_every_steps: int | None = None) -> int:
  """Steps per Keras execution that land exactly on every checkpoint, log line, evaluation and the final step."""
  return math.gcd(steps_per_loop, checkpoint_every_steps, train_steps, log_every_steps or 0, eval_every_steps or 0)


def fit_loop(job: Job) -> TrainResult:
  """Keras `model.fit` inside `strategy.scope()`; one Keras epoch is one checkpoint period, and training
  stops at exactly `job.train_steps` (so `--epochs` means passes over the data under both loops)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  cfg = job.config.train
  strategy = job.strategy
  objective = objective_lib.Objective(job.schema)
  parameter_server = job.choice.parameter_server
  steps_per_execution = fit_steps_per_execution(
      steps_per_loop=cfg.steps_per_loop, checkpoint_every_steps=cfg.checkpoint_every_steps,
      train_steps=job.train_steps, log_every_steps=None if parameter_server else cfg.log_every_steps,
      eval_every_steps=None if parameter_server else cfg.eval_every_steps)
  if steps_per_execution != cfg.steps_per_loop:
    logging.info("fit: steps_per_execution=%d, so that executions end on every checkpoint (every %d steps), "
                 "log line and the final step %d", steps_per_execution, cfg.checkpoint_every_steps, job.train_steps)
  if parameter_server:
    logging.info("fit under ParameterServerStrategy reports once per checkpoint period (every %d steps): Keras runs "
                 "no batch-level callbacks there, so --log_every_steps does not apply", cfg.checkpoint_every_steps)
  if strategy.num_replicas_in_sync > 1 and models.keras_version().startswith("3.") and steps_per_execution > 1:
    # Keras 3 fails under mirrored strategies with steps_per_execution > 1 ("You must feed a value for
    # placeholder tensor ... while/cond"), measured with Keras 3.15.1 / TF 2.21.
    logging.info("fit: steps_per_execution=1 (Keras %s cannot run several steps per call under %d replicas)",
                 models.keras_version(), strategy.num_replicas_in_sync)
    steps_per_execution = 1
  jit_compile = cfg.jit_compile
  if jit_compile and strategy.num_replicas_in_sync > 1 and not tf.config.list_logical_devices("GPU"):
    # Keras 3 compiles its whole step, the cross-device update included; over logical CPU devices XLA fails
    # with "Trying to access resource ... located in device CPU:1 from device CPU:0" (TF 2.21, Keras 3.15).
    logging.info("--jit_compile: not under fit with %d CPU replicas (XLA cannot compile Keras' cross-device "
                 "step there); --loop=custom compiles the forward and backward pass instead",
                 strategy.num_replicas_in_sync)
    jit_compile = False
  model, optimizer = _build_model_and_optimizer(job)
  compiled = getattr(model, "user_compile", None)
  user_metrics = []
  if compiled is not None and compiled.activation is None and not compiled.binary_unit:
    user_metrics = list(compiled.metrics)  # the model's outputs are as the user wrote them: their metrics fit them
  elif compiled is not None and compiled.metrics:
    logging.info("The plug-in's own %d metric(s) are not computed: they were written for its %s outputs, which "
                 "the trainer turns into logits; eval reports %s", len(compiled.metrics),
                 compiled.activation or "one-unit", ", ".join(recipe.metric_names(job.schema)))
  with strategy.scope():  # metrics too: tf_keras refuses metric objects made outside the model's strategy scope
    metrics = objective.keras_metrics() + user_metrics
    model.compile(optimizer=optimizer, loss=_train_objective(job, model).keras_loss(), metrics=metrics,
                  steps_per_execution=steps_per_execution, run_eagerly=cfg.run_eagerly, jit_compile=jit_compile)
  names = models.input_names(model)
  keeper = _keeper(job, model, optimizer)
  writer = periodic = None
  try:
    start_step = _resume(job, keeper, optimizer)
    writer = _writer(job, start_step)
    periodic = _periodic_evaluation(job, model, objective, writer)
    total_steps = start_step if periodic is not None and periodic.stopped else job.train_steps
    log = _TrainLog(writer, optimizer, global_batch_size=cfg.global_batch_size, start_step=start_step)
    losses = [None]
    # Keras runs no batch-level callbacks under parameter servers, so there is no point to save at on SIGTERM
    # there: the process ends as it always did, losing at most one checkpoint period.
    with preemption.SigtermWatcher() if not parameter_server else contextlib.nullcontext(None) as watcher:
      callback = _FitReporting.create(keeper, optimizer, log, log_every_steps=cfg.log_every_steps,
                                      train_steps=job.train_steps, batch_level=not parameter_server,
                                      guard=_LossGuard(start_step), checkpoint_every_secs=cfg.checkpoint_every_secs,
                                      watcher=watcher, agree=_agreement(job), peers_moved=job.peers_moved,
                                      periodic=periodic, eval_every_steps=cfg.eval_every_steps)
      for initial_epoch, epochs, epoch_steps in fit_calls(start_step, total_steps, cfg.checkpoint_every_steps,
                                                          stop_at_final_step=not parameter_server):
        if periodic is not None and periodic.stopped:
          break
        if parameter_server:
          train_data = tf.keras.utils.experimental.DatasetCreator(job.dataset_fn("train", select=names))
        else:
          train_data = strategy.distribute_datasets_from_function(job.dataset_fn("train", select=names))
        history = model.fit(train_data, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=epoch_steps,
                            callbacks=[callback], verbose=0)
        losses = history.history.get("loss") or losses
    return _finish(job, model, optimizer, objective, keeper, writer, periodic, start_step=start_step,
                   train_loss=losses[-1], examples_per_sec=log.examples_per_sec)
  finally:
    _close(keeper, writer, periodic)
