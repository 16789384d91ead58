"""The distributed step: the model and optimizer built under the strategy, one replica's forward and update,
and the loop's source under synchronous strategies (several steps per `tf.function` call).

Each replica averages its loss over the GLOBAL batch (`tf.nn.compute_average_loss`), so the cross-replica gradient
sum is the gradient of the mean. No TensorFlow at import time.
"""

from __future__ import annotations

from typing import Callable

from absl import logging

from trainer.modeling import models
from trainer.modeling import objective as objective_lib
from trainer.modeling import recipe
from trainer.planning.job import Job


def build_model_and_optimizer(job: Job):
  """The model and its optimizer, both under the strategy's scope and the --precision policy. A plug-in that
  arrived compiled keeps its own optimizer (and, in `train_objective`, its loss)."""
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
      optimizer = recipe.make_optimizer(cfg, job.train_steps, keras_version=models.keras_version(),
                                        fine_tune=job.fine_tune)
    # Built inside the scope: an optimizer built later keeps non-mirrored slot variables.
    optimizer.build(model.trainable_variables)
  return model, optimizer


def train_objective(job: Job, model) -> objective_lib.Objective:
  """The training loss: the task's, or a compiled plug-in's own; weighted by --class_weights."""
  return objective_lib.Objective(job.schema, class_weights=job.class_weights,
                                 user_loss=getattr(model, "user_compile", None))


def replica_step(model, optimizer, objective: objective_lib.Objective, *, names, global_batch_size: int,
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


def steps_fn(strategy, replica_step):
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


def synchronous_steps(job: Job, replica_step: Callable) -> Callable[[int], tuple[int, float]]:
  """The loop's source under sync strategies: `num` steps in one `tf.function` call."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  iterator = iter(job.strategy.distribute_datasets_from_function(job.dataset_fn("train")))
  train_steps = steps_fn(job.strategy, replica_step)

  def advance(num: int) -> tuple[int, float]:
    with job.reading_data():
      return num, float(train_steps(iterator, tf.constant(num))) / num

  return advance
