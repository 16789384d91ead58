"""Training under a `tf.distribute` strategy: a custom loop (every strategy) and Keras `model.fit`.

The custom loop runs `steps_per_loop` steps per `tf.function` call; each replica averages its loss over the
GLOBAL batch (`tf.nn.compute_average_loss`), so the cross-replica gradient sum is the gradient of the mean.
Under ParameterServerStrategy the chief schedules the same step on workers through a `ClusterCoordinator`.
"""

from __future__ import annotations

import dataclasses
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
  eval_batches: int | None = None  # resolved once by eval_steps_for (counting the eval data is a full pass)

  def dataset_fn(self, split: str, *, select: list[str] | None = None) -> Callable:
    cfg = self.config
    files = self.train_files if split == "train" else self.eval_files
    return data_lib.make_dataset_fn(
        files, self.schema, data_format=cfg.data.format, global_batch_size=cfg.train.global_batch_size,
        training=split == "train", shuffle_buffer=cfg.data.shuffle_buffer,
        # Under parameter servers every worker reads all files: distinct seeds keep their orders apart.
        seed=None if self.strategy_name == "parameter_server" else cfg.train.seed,
        csv_header=self.csv_headers.get(split), select=select, deterministic=cfg.data.deterministic)


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
    keeper.restore_latest()
    start_step = int(optimizer.iterations.numpy())

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
    eval_metrics = evaluate(job, model, objective) if job.eval_files else {}
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


def eval_steps_for(job: Job) -> int:
  """--eval_steps, or one pass over the eval data; counted once per job (the side-car evaluates many times)."""
  if job.eval_batches is None:
    cfg = job.config.train
    if cfg.eval_steps is not None:
      job.eval_batches = cfg.eval_steps
    else:
      count = data_lib.count_records(job.eval_files, job.config.data.format)
      job.eval_batches = max(1, count // cfg.global_batch_size)
  return job.eval_batches


def evaluate(job: Job, model, objective: Objective) -> dict[str, float]:
  """Loss and accuracy (or MAE) over `eval_steps` global batches of the eval data."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  num_steps = eval_steps_for(job)
  if num_steps == 0:
    return {}
  names = models.input_names(model)
  strategy = job.strategy
  if job.strategy_name == "parameter_server":
    # Inline evaluation on the coordinator: variables are read from the parameter servers.
    dataset = job.dataset_fn("eval")(None)

    @tf.function
    def eval_batch(features, labels):
      return objective.batch_sums(labels, model(models.select_inputs(features, names), training=False))

    sums = tf.zeros([3])
    for features, labels in dataset.take(num_steps):
      sums += eval_batch(features, labels)
  else:
    iterator = iter(strategy.distribute_datasets_from_function(job.dataset_fn("eval")))

    @tf.function
    def eval_steps(iterator, num_steps):
      total = tf.zeros([3])
      for _ in tf.range(num_steps):
        features, labels = next(iterator)
        outputs = strategy.run(
            lambda f, l: objective.batch_sums(l, model(models.select_inputs(f, names), training=False)),
            args=(features, labels))
        total += strategy.reduce(tf.distribute.ReduceOp.SUM, outputs, axis=None)
      return total

    sums = eval_steps(iterator, tf.constant(num_steps))
  metrics = objective.finalize(sums.numpy())
  logging.info("Eval over %d batches: %s", num_steps, metrics)
  return metrics


class _CheckpointEveryEpoch:
  """Keras callback (built lazily, so this module imports without TensorFlow) that saves each epoch."""

  @staticmethod
  def create(keeper: checkpoints.CheckpointKeeper, optimizer, reporter, summaries, global_batch_size: int):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    class Callback(tf.keras.callbacks.Callback):

      def on_epoch_begin(self, epoch, logs=None):
        self._start = time.monotonic()

      def on_epoch_end(self, epoch, logs=None):
        step = int(optimizer.iterations.numpy())
        keeper.save(step)
        values = {k: float(v) for k, v in (logs or {}).items()}
        elapsed = time.monotonic() - self._start
        if elapsed > 0:
          values["examples_per_sec"] = self.params["steps"] * global_batch_size / elapsed
        reporter.update(step, values)
        summaries.scalars("train", step, values)

    return Callback()


def fit_loop(job: Job) -> TrainResult:
  """Keras `model.fit` inside `strategy.scope()`; one Keras epoch is one checkpoint period."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  cfg = job.config.train
  strategy = job.strategy
  objective = Objective(job.schema)
  steps_per_execution = cfg.steps_per_loop
  if strategy.num_replicas_in_sync > 1 and models.keras_version().startswith("3."):
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
    keeper.restore_latest()
    start_step = int(optimizer.iterations.numpy())
    steps_per_epoch = cfg.checkpoint_every_steps
    reporter = progress_lib.ProgressReporter(job.train_steps, start_step=start_step, interactive=job.interactive)
    callback = _CheckpointEveryEpoch.create(keeper, optimizer, reporter, summaries, cfg.global_batch_size)
    if job.strategy_name == "parameter_server":
      train_data = tf.keras.utils.experimental.DatasetCreator(job.dataset_fn("train", select=names))
    else:
      train_data = strategy.distribute_datasets_from_function(job.dataset_fn("train", select=names))
    history = model.fit(train_data, epochs=job.train_steps // steps_per_epoch,
                        initial_epoch=start_step // steps_per_epoch, steps_per_epoch=steps_per_epoch,
                        callbacks=[callback], verbose=0)
    losses = history.history.get("loss") or [None]
    final_step = int(optimizer.iterations.numpy())
    eval_metrics = {}
    if job.eval_files:
      num_steps = eval_steps_for(job)
      if num_steps:
        eval_data = strategy.distribute_datasets_from_function(job.dataset_fn("eval", select=names))
        results = model.evaluate(eval_data, steps=num_steps, return_dict=True, verbose=0)
        eval_metrics = {k: float(v) for k, v in results.items()}
        eval_metrics["examples"] = num_steps * cfg.global_batch_size
        logging.info("Eval over %d batches: %s", num_steps, eval_metrics)
        summaries.scalars("eval", final_step, eval_metrics)
    return TrainResult(final_step=final_step, resumed_from_step=start_step, train_loss=losses[-1],
                       examples_per_sec=None, eval_metrics=eval_metrics, model=model)
  finally:
    summaries.close()
    keeper.close()
