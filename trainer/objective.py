"""The task's loss and metrics (as per-example values, batch sums and Keras objects) and the optimizer."""

from __future__ import annotations

from trainer import config as config_lib
from trainer import schema as schema_lib


class Objective:
  """Loss and metrics for the schema's task: classification (logits) or regression (one value)."""

  def __init__(self, schema: schema_lib.Schema):
    self.task = schema.task

  def per_example_loss(self, labels, outputs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.task == "classification":
      return tf.keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    return tf.square(tf.reshape(outputs, [-1]) - tf.cast(labels, tf.float32))

  def batch_sums(self, labels, outputs):
    """[loss sum, metric sum, example count] for one batch (an empty batch gives zeros)."""
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
    """Means from summed [loss, metric, count]; `examples` is the true count."""
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
  """The optimizer --optimizer names, at --learning_rate. Build it inside `strategy.scope()`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  classes = {"adam": tf.keras.optimizers.Adam, "sgd": tf.keras.optimizers.SGD,
             "adagrad": tf.keras.optimizers.Adagrad, "rmsprop": tf.keras.optimizers.RMSprop}
  return classes[train.optimizer](learning_rate=train.learning_rate)
