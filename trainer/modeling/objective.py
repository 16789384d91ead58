"""The task's loss and metrics, as per-example values, batch sums and Keras objects.

Eval metrics are built from sums reduced across replicas and workers before dividing, so they are exact under
every strategy. For a two-class task the sums also hold the confusion counts at the argmax (precision, recall)
and histograms of the positive-class probability (AUC, as the trapezoid over `AUC_BUCKETS` thresholds, the way
`keras.metrics.AUC` approximates it with its own thresholds). A multi-label task is scored over every (example,
class) decision, micro-averaged as `keras.metrics.AUC(multi_label=False)` does: `accuracy` is the share of right
yes/no decisions at probability 0.5 (Keras' BinaryAccuracy), precision, recall and AUC count each decision.
"""

from __future__ import annotations

from typing import Sequence

from trainer.data import schema as schema_lib

# The eval metrics, by name, and whether a higher value is better: the one vocabulary the recipe (early stopping,
# --export=best), the flags' help and the tuning checks read.
HIGHER_IS_BETTER = {"loss": False, "accuracy": True, "mae": False, "auc": True, "precision": True, "recall": True}


def metric_names(schema: schema_lib.Schema) -> tuple[str, ...]:
  """The eval metrics `Objective.finalize` reports for the schema's task."""
  if schema.task == "regression":
    return ("loss", "mae")
  if schema.task == "multi_label" or schema.label.num_classes == 2:
    return ("loss", "accuracy", "auc", "precision", "recall")
  return ("loss", "accuracy")

AUC_BUCKETS = 1000


class Objective:
  """Loss and metrics for the schema's task: classification (logits), multi-label (a logit per class, each a
  sigmoid yes/no; multi-hot labels) or regression (one value).

  `class_weights` (by class id) weigh each example's training loss, and `user_loss` (a compiled plug-in's own)
  replaces the task's; eval losses stay the task's, unweighted (make the eval objective without either), so
  runs with different recipes compare on one scale.
  """

  def __init__(self, schema: schema_lib.Schema, class_weights: Sequence[float] | None = None, user_loss=None):
    self.task = schema.task
    self.binary = self.task == "classification" and schema.label.num_classes == 2
    self.scored = self.binary or self.task == "multi_label"  # sums hold confusion counts and AUC histograms
    self.class_weights = tuple(class_weights) if class_weights else None
    self.user_loss = user_loss  # models.UserCompile of a plug-in that arrived compiled: its loss trains

  @property
  def num_sums(self) -> int:
    return 3 + (3 + 2 * AUC_BUCKETS if self.scored else 0)

  def per_example_loss(self, labels, outputs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    outputs = tf.cast(outputs, tf.float32)  # mixed precision: the loss in float32
    if self.user_loss is not None:
      loss = self.user_loss.per_example_loss(labels, outputs)
    elif self.task == "classification":
      loss = tf.keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    elif self.task == "multi_label":
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32),
                                                                    logits=outputs), axis=-1)
    else:
      loss = tf.square(tf.reshape(outputs, [-1]) - tf.cast(labels, tf.float32))
    if self.class_weights:  # classification only (recipe.class_weights refuses them for regression)
      loss *= tf.gather(tf.constant(self.class_weights, tf.float32), tf.reshape(tf.cast(labels, tf.int64), [-1]))
    return loss

  def batch_sums(self, labels, outputs):
    """Sums for one batch: [loss, metric, example count] (+ binary counts and histograms); zeros if empty."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    outputs = tf.cast(outputs, tf.float32)
    loss = tf.reduce_sum(self.per_example_loss(labels, outputs))
    count = tf.cast(tf.shape(outputs)[0], tf.float32)
    if self.task == "regression":
      metric = tf.reduce_sum(tf.abs(tf.reshape(outputs, [-1]) - tf.cast(labels, tf.float32)))
      return tf.stack([loss, metric, count])
    if self.task == "multi_label":  # every (example, class) a yes/no decision
      positive, said_positive = tf.reshape(labels > 0.5, [-1]), tf.reshape(outputs > 0, [-1])
      right = tf.cast(tf.equal(labels > 0.5, outputs > 0), tf.float32)
      metric = tf.reduce_sum(tf.reduce_mean(right, axis=-1))
      probability = tf.reshape(tf.sigmoid(outputs), [-1])
    else:
      labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
      predicted = tf.argmax(outputs, axis=-1)
      metric = tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.float32))
      if self.binary:
        positive, said_positive = tf.equal(labels, 1), tf.equal(predicted, 1)
        probability = tf.nn.softmax(outputs, axis=-1)[:, 1]
    sums = tf.stack([loss, metric, count])
    if not self.scored:
      return sums
    counts = [tf.reduce_sum(tf.cast(tf.logical_and(a, b), tf.float32))
              for a, b in ((said_positive, positive), (said_positive, ~positive), (~said_positive, positive))]
    bucket = tf.minimum(tf.cast(probability * AUC_BUCKETS, tf.int32), AUC_BUCKETS - 1)
    histograms = [tf.math.bincount(tf.boolean_mask(bucket, mask), minlength=AUC_BUCKETS, maxlength=AUC_BUCKETS,
                                   dtype=tf.float32) for mask in (positive, ~positive)]
    return tf.concat([sums, tf.stack(counts)] + histograms, axis=0)

  def finalize(self, sums) -> dict[str, float]:
    """Means from the summed values; `examples` is the true count."""
    values = [float(v) for v in sums]
    loss, metric, count = values[:3]
    count = max(count, 1.0)
    name = "mae" if self.task == "regression" else "accuracy"
    result = {"loss": loss / count, name: metric / count, "examples": int(count)}
    if self.scored:
      tp, fp, fn = values[3:6]
      result["precision"] = tp / (tp + fp) if tp + fp else 0.0
      result["recall"] = tp / (tp + fn) if tp + fn else 0.0
      positives = values[6:6 + AUC_BUCKETS]
      negatives = values[6 + AUC_BUCKETS:6 + 2 * AUC_BUCKETS]
      result["auc"] = auc_from_histograms(positives, negatives)
    return result

  def keras_loss(self):
    """The training loss for `model.compile` (class-weighted like the custom loop's)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.class_weights or self.user_loss is not None:
      def recipe_loss(labels, outputs):
        return self.per_example_loss(labels, outputs)

      return recipe_loss
    if self.task == "classification":
      return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if self.task == "multi_label":
      return tf.keras.losses.BinaryCrossentropy(from_logits=True)
    return tf.keras.losses.MeanSquaredError()

  def keras_metrics(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.task == "classification":
      return [tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if self.task == "multi_label":
      return [tf.keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)]  # on logits: probability 0.5
    return [tf.keras.metrics.MeanAbsoluteError(name="mae")]


def auc_from_histograms(positives: Sequence[float], negatives: Sequence[float]) -> float:
  """ROC AUC from counts of positive and negative examples per probability bucket (trapezoid rule)."""
  total_positive, total_negative = sum(positives), sum(negatives)
  if not total_positive or not total_negative:
    return 0.0
  area, tp, fp = 0.0, 0.0, 0.0
  for pos, neg in zip(reversed(positives), reversed(negatives)):  # thresholds from high to low
    new_tp, new_fp = tp + pos, fp + neg
    area += (new_fp - fp) / total_negative * (tp + new_tp) / 2 / total_positive
    tp, fp = new_tp, new_fp
  return area
