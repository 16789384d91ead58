"""The feature encoder shared by training and serving: raw columns -> the model's numeric inputs.

Encoding (vocabulary lookup, image bytes) happens in the input pipeline rather than in the model, so the model
sees dense numeric tensors under every strategy, and the serving signature applies the same `FeatureEncoder`
to raw features by name (`raw_serving_specs`).
"""

from __future__ import annotations

from trainer import schema as schema_lib


class FeatureEncoder:
  """Turns raw parsed columns into the model's numeric inputs: vocabulary ids, float images.

  Used by the input pipeline and by the serving signature, so training and serving encode alike. Id 0 is the
  out-of-vocabulary bucket; vocabulary entry i gets id i + 1.
  """

  def __init__(self, schema: schema_lib.Schema):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._schema = schema
    self._tables = {}
    for feature in schema.features:
      if feature.is_categorical:
        keys = tf.constant(list(feature.vocabulary))
        ids = tf.range(1, len(feature.vocabulary) + 1, dtype=tf.int64)
        self._tables[feature.name] = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, ids), default_value=0)

  @property
  def tables(self):
    return list(self._tables.values())

  def encode(self, columns):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    encoded = {}
    for feature in self._schema.features:
      value = columns[feature.name]
      if feature.is_categorical:
        encoded[feature.name] = self._tables[feature.name].lookup(value)
      elif feature.type == "image":
        if value.dtype == tf.string:
          value = tf.reshape(tf.io.decode_raw(value, tf.uint8), (-1,) + feature.shape)
        encoded[feature.name] = tf.cast(value, tf.float32)
      else:
        encoded[feature.name] = tf.cast(value, tf.float32)
    return encoded


def raw_serving_specs(schema: schema_lib.Schema):
  """TensorSpecs of the serving signature's inputs, one per feature, named after it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  specs = {}
  for feature in schema.features:
    if feature.type == "string":
      specs[feature.name] = tf.TensorSpec([None], tf.string, name=feature.name)
    elif feature.type == "image":
      specs[feature.name] = tf.TensorSpec((None,) + feature.shape, tf.float32, name=feature.name)
    else:
      specs[feature.name] = tf.TensorSpec([None], tf.float32, name=feature.name)
  return specs
