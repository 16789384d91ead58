"""Training under a `tf.distribute` strategy: a custom loop (every strategy) and Keras `model.fit`.

The custom loop runs `steps_per_loop` steps per `tf.function` call; each replica averages its loss over the
GLOBAL batch (`tf.nn.compute_average_loss`), so the cross-replica gradient sum is the gradient of the mean.
Under ParameterServerStrategy the chief schedules the same step on workers through a `ClusterCoordinator`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

from absl import logging

from trainer import checkpoints
from trainer import config as config_lib
from trainer import data as data_lib
from trainer import models
from trainer import progress as progress_lib
from trainer import schema as schema_lib
from trainer import summaries as summaries_lib


@dataclasses.dataclass
class Job:
  """Everything a training run needs, resolved and validated by the runner."""

  config: config_lib.Config
  schema: schema_lib.Schema
  strategy: Any
  strategy_name: str
  is_chief: bool
  train_files: list[str]
  eval_files: list[str]
  csv_headers: dict[str, list[str]]  # "train"/"eval" -> header, CSV only
  train_steps: int
  interactive: bool
  build_model: Callable[..., Any]

  def dataset_fn(self, split: str, *, select: list[str] | None = None) -> Callable:
    """Training data repeats; eval data is one pass (or --eval_steps batches) with the last batch partial."""
    cfg = self.config
    training = split == "train"
    files = self.train_files if training else self.eval_files
    return data_lib.make_dataset_fn(
        files, self.schema, data_format=cfg.data.format, global_batch_size=cfg.train.global_batch_size,
        training=training, shuffle_buffer=cfg.data.shuffle_buffer,
        # Under parameter servers every worker reads all files: distinct seeds keep their orders apart.
        seed=None if self.strategy_name == "parameter_server" else cfg.train.seed,
        csv_header=self.csv_headers.get(split), select=select, deterministic=cfg.data.deterministic,
        max_batches=None if training else cfg.train.eval_steps)


@dataclasses.dataclass
class TrainResult:
  final_step: int
  resumed_from_step: int
  train_loss: float | None
  examples_per_sec: float | None
  eval_metrics: dict[str, float]
  model: Any = None


class Objective:
  """Loss and metrics for the schema's task, as per-example values and batch sums."""

  def __init__(self, schema: schema_lib.Schema):
    self.task = schema.task

  def per_example_loss(self, labels, outputs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.task == "classification":
      return tf.keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    return tf.square(tf.reshape(outputs, [-1]) - tf.cast(labels, tf.float32))

  def batch_sums(self, labels, outputs):
    """[loss sum, metric sum, example count] for one batch."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    loss = tf.reduce_sum(self.per_example_loss(labels, outputs))
    if self.task == "classification":
      hits = tf.cast(tf.equal(tf.argmax(outputs, axis=-1), tf.cast(labels, tf.int64)), tf.float32)
      metric = tf.reduce_sum(hits)
    else:
      metric = tf.reduce_sum(tf.abs(tf.reshape(outputs, [-1]) - tf.cast(labels, tf.float32)))
    count = tf.cast(tf.shape(outputs)[0], tf.float32)
    return tf.stack([loss, metric, count])

  def finalize(self, sums) -> dict[str, float]:
    loss, metric, count = (float(v) for v in sums)
    count = max(count, 1.0)
    name = "accuracy" if self.task == "classification" else "mae"
    return {"loss": loss / count, name: metric / count, "examples": int(count)}

  def keras_loss(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.task == "classification":
      return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return tf.keras.losses.MeanSquaredError()

  def keras_metrics(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.task == "classification":
      return [tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    return [tf.keras.metrics.MeanAbsoluteError(name="mae")]


def make_optimizer(train: config_lib.TrainConfig):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  classes = {"adam": tf.keras.optimizers.Adam, "sgd": tf.keras.optimizers.SGD,
             "adagrad": tf.keras.optimizers.Adagrad, "rmsprop": tf.keras.optimizers.RMSprop}
  return classes[train.optimizer](learning_rate=train.learning_rate)


def _build_model_and_optimizer(job: Job):
  with job.strategy.scope():
    model = job.build_model()
    optimizer = make_optimizer(job.config.train)
    # Built inside the scope: an optimizer built later keeps non-mirrored slot variables.
    optimizer.build(model.trainable_variables)
  return model, optimizer


def _checkpoints_and_summaries(job: Job, model, optimizer):
  """The checkpoint keeper (all workers save, the chief's count) and TensorBoard writers (chief only)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  keeper = checkpoints.CheckpointKeeper(checkpoint, directory=job.config.output.checkpoint_dir,
                                        is_chief=job.is_chief)
  return keeper, summaries_lib.Summaries(job.config.output.tensorboard_dir, enabled=job.is_chief)


def _boundaries(current: int, total: int, *every: int) -> int:
  """Steps until the next log/checkpoint boundary or the end."""
  nxt = total
  for period in every:
    nxt = min(nxt, (current // period + 1) * period)
  return nxt - current


def custom_loop(job: Job) -> TrainResult:
  """Trains with `strategy.run` inside a `tf.function` step, checkpointing and logging as configured."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  cfg = job.config.train
  strategy = job.strategy
  parameter_server = job.strategy_name == "parameter_server"
  model, optimizer = _build_model_and_optimizer(job)
  names = models.input_names(model)
  objective = Objective(job.schema)
  keeper, summaries = _checkpoints_and_summaries(job, model, optimizer)
  try:
    start_step = _resume(job, keeper, optimizer)

    def replica_step(features, labels):
      with tf.GradientTape() as tape:
        outputs = model(models.select_inputs(features, names), training=True)
        per_example = objective.per_example_loss(labels, outputs)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=cfg.global_batch_size)
        if model.losses:
          loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      return loss

    if parameter_server:
      run_steps = _coordinated_steps(job, replica_step)
    else:
      iterator = iter(strategy.distribute_datasets_from_function(job.dataset_fn("train")))

      @tf.function
      def train_steps(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
          features, labels = next(iterator)
          per_replica_loss = strategy.run(replica_step, args=(features, labels))
          total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        return total / tf.cast(num_steps, tf.float32)

      def run_steps(num_steps: int) -> float:
        return float(train_steps(iterator, tf.constant(num_steps)))

    reporter = progress_lib.ProgressReporter(job.train_steps, start_step=start_step, interactive=job.interactive)
    if start_step:
      logging.info("Resuming at step %d of %d", start_step, job.train_steps)
    current, loss, examples_per_sec = start_step, None, None
    window_start, window_steps = time.monotonic(), 0
    while current < job.train_steps:
      num = min(cfg.steps_per_loop, _boundaries(current, job.train_steps, cfg.log_every_steps,
                                                cfg.checkpoint_every_steps))
      loss = run_steps(num)
      current += num
      window_steps += num
      if current % cfg.log_every_steps == 0 or current == job.train_steps:
        elapsed = time.monotonic() - window_start
        examples_per_sec = window_steps * cfg.global_batch_size / elapsed if elapsed > 0 else None
        values = {"loss": loss, "learning_rate": float(optimizer.learning_rate.numpy())}
        if examples_per_sec:
          values["examples_per_sec"] = examples_per_sec
        reporter.update(current, values)
        summaries.scalars("train", current, values)
        window_start, window_steps = time.monotonic(), 0
      if current % cfg.checkpoint_every_steps == 0 or current == job.train_steps:
        keeper.save(current)
    final_step = int(optimizer.iterations.numpy())
    eval_metrics = evaluate(job, model, objective)
    if eval_metrics:
      summaries.scalars("eval", final_step, eval_metrics)
    return TrainResult(final_step=final_step, resumed_from_step=start_step, train_loss=loss,
                       examples_per_sec=examples_per_sec, eval_metrics=eval_metrics, model=model)
  finally:
    summaries.close()
    keeper.close()


def _coordinated_steps(job: Job, replica_step: Callable) -> Callable[[int], float]:
  """ParameterServerStrategy: the chief schedules single steps on the workers and waits for them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  strategy = job.strategy
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  dataset_fn = job.dataset_fn("train")

  @tf.function
  def per_worker_dataset():
    return strategy.distribute_datasets_from_function(dataset_fn)

  iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))

  @tf.function
  def worker_step(iterator):
    features, labels = next(iterator)
    per_replica_loss = strategy.run(replica_step, args=(features, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

  def run_steps(num_steps: int) -> float:
    results = [coordinator.schedule(worker_step, args=(iterator,)) for _ in range(num_steps)]
    coordinator.join()
    return sum(float(r.fetch()) for r in results) / num_steps

  return run_steps


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


def evaluate(job: Job, model, objective: Objective) -> dict[str, float]:
  """Loss and accuracy (or MAE) over one pass of the eval data (or --eval_steps batches); {} when skipped.

  Every example counts once, the partial last batch included, under every strategy: `examples` is the true
  count. The sums are reduced across replicas (and workers) before dividing, so the metrics are exact means.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not job.eval_files or job.config.train.eval_steps == 0:
    return {}
  names = models.input_names(model)
  strategy = job.strategy

  def batch_sums(features, labels):
    return objective.batch_sums(labels, model(models.select_inputs(features, names), training=False))

  if job.strategy_name == "parameter_server":
    # Inline evaluation on the coordinator: variables are read from the parameter servers.
    eval_batch = tf.function(batch_sums)
    sums, batches = tf.zeros([3]), 0
    for features, labels in job.dataset_fn("eval")(None):
      sums += eval_batch(features, labels)
      batches += 1
  else:

    @tf.function
    def eval_pass(dataset):
      total, steps = tf.zeros([3]), tf.constant(0)
      for features, labels in dataset:  # ends together on every worker (empty batches pad the short ones)
        total += strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(batch_sums, args=(features, labels)),
                                 axis=None)
        steps += 1
      return total, steps

    sums, batches = eval_pass(strategy.distribute_datasets_from_function(job.dataset_fn("eval")))
    batches = int(batches)
  metrics = objective.finalize(sums.numpy())
  logging.info("Eval over %d batches: %s", batches, metrics)
  return metrics


class _CheckpointEveryEpoch:
  """Keras callback (built lazily, so this module imports without TensorFlow): saves each epoch and, with
  `stop_at_final_step`, stops `fit` exactly at the final step (the last Keras epoch may be shorter than a
  checkpoint period)."""

  @staticmethod
  def create(keeper: checkpoints.CheckpointKeeper, optimizer, reporter, summaries, *, global_batch_size: int,
             train_steps: int, stop_at_final_step: bool):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    class Callback(tf.keras.callbacks.Callback):

      def on_epoch_begin(self, epoch, logs=None):
        self._start = time.monotonic()
        self._start_step = int(optimizer.iterations.numpy())

      def on_epoch_end(self, epoch, logs=None):
        step = int(optimizer.iterations.numpy())
        keeper.save(step)
        values = {k: float(v) for k, v in (logs or {}).items()}
        elapsed = time.monotonic() - self._start
        if elapsed > 0:
          values["examples_per_sec"] = (step - self._start_step) * global_batch_size / elapsed
        reporter.update(step, values)
        summaries.scalars("train", step, values)

    class StoppingCallback(Callback):

      def on_train_batch_end(self, batch, logs=None):
        if int(optimizer.iterations.numpy()) >= train_steps:
          self.model.stop_training = True  # Keras checks it after every batch, then still ends the epoch

    return StoppingCallback() if stop_at_final_step else Callback()


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


def fit_steps_per_execution(*, steps_per_loop: int, checkpoint_every_steps: int, train_steps: int) -> int:
  """Steps per Keras execution that land exactly on every checkpoint and on the final step."""
  return math.gcd(steps_per_loop, checkpoint_every_steps, train_steps)


def fit_loop(job: Job) -> TrainResult:
  """Keras `model.fit` inside `strategy.scope()`; one Keras epoch is one checkpoint period, and training
  stops at exactly `job.train_steps` (so `--epochs` means passes over the data under both loops)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  cfg = job.config.train
  strategy = job.strategy
  objective = Objective(job.schema)
  steps_per_execution = fit_steps_per_execution(steps_per_loop=cfg.steps_per_loop,
                                                checkpoint_every_steps=cfg.checkpoint_every_steps,
                                                train_steps=job.train_steps)
  if steps_per_execution != cfg.steps_per_loop:
    logging.info("fit: steps_per_execution=%d, so that executions end on every checkpoint (every %d steps) "
                 "and on the final step %d", steps_per_execution, cfg.checkpoint_every_steps, job.train_steps)
  if strategy.num_replicas_in_sync > 1 and models.keras_version().startswith("3.") and steps_per_execution > 1:
    # Keras 3 fails under mirrored strategies with steps_per_execution > 1 ("You must feed a value for
    # placeholder tensor ... while/cond"), measured with Keras 3.15.1 / TF 2.21.
    logging.info("fit: steps_per_execution=1 (Keras %s cannot run several steps per call under %d replicas)",
                 models.keras_version(), strategy.num_replicas_in_sync)
    steps_per_execution = 1
  model, optimizer = _build_model_and_optimizer(job)
  with strategy.scope():
    model.compile(optimizer=optimizer, loss=objective.keras_loss(), metrics=objective.keras_metrics(),
                  steps_per_execution=steps_per_execution, run_eagerly=cfg.run_eagerly)
  names = models.input_names(model)
  keeper, summaries = _checkpoints_and_summaries(job, model, optimizer)
  try:
    start_step = _resume(job, keeper, optimizer)
    steps_per_epoch = cfg.checkpoint_every_steps
    reporter = progress_lib.ProgressReporter(job.train_steps, start_step=start_step, interactive=job.interactive)
    parameter_server = job.strategy_name == "parameter_server"
    callback = _CheckpointEveryEpoch.create(keeper, optimizer, reporter, summaries,
                                            global_batch_size=cfg.global_batch_size, train_steps=job.train_steps,
                                            stop_at_final_step=not parameter_server)
    losses = [None]
    for initial_epoch, epochs, epoch_steps in fit_calls(start_step, job.train_steps, steps_per_epoch,
                                                        stop_at_final_step=not parameter_server):
      if parameter_server:
        train_data = tf.keras.utils.experimental.DatasetCreator(job.dataset_fn("train", select=names))
      else:
        train_data = strategy.distribute_datasets_from_function(job.dataset_fn("train", select=names))
      history = model.fit(train_data, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=epoch_steps,
                          callbacks=[callback], verbose=0)
      losses = history.history.get("loss") or losses
    final_step = int(optimizer.iterations.numpy())
    eval_metrics = evaluate(job, model, objective)
    if eval_metrics:
      summaries.scalars("eval", final_step, eval_metrics)
    return TrainResult(final_step=final_step, resumed_from_step=start_step, train_loss=losses[-1],
                       examples_per_sec=None, eval_metrics=eval_metrics, model=model)
  finally:
    summaries.close()
    keeper.close()
