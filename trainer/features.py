"""The feature encoder shared by training and serving: raw columns -> the model's numeric inputs.

Encoding (vocabulary lookup, image bytes) happens in the input pipeline rather than in the model, so the model
sees dense numeric tensors under every strategy, and the serving signature applies the same `FeatureEncoder`
to raw features by name (`raw_serving_specs`).
"""

from __future__ import annotations

from trainer import schema as schema_lib

# Prefix of the messages of the data checks run in the graph; `preflight.explain_data_error` keys on it.
CHECK_PREFIX = "trainer-data-check:"


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
    self._label_table = None
    if schema.label.vocabulary:
      # Class i is vocabulary entry i; a class name not in it is -1, which `encode_label` refuses.
      self._label_table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
          tf.constant(list(schema.label.vocabulary)), tf.range(len(schema.label.vocabulary), dtype=tf.int64)),
          default_value=-1)

  @property
  def tables(self):
    return list(self._tables.values()) + ([self._label_table] if self._label_table is not None else [])

  def encode_label(self, labels):
    """Class ids (int64) for classification, float32 targets for regression."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self._label_table is not None:
      ids = self._label_table.lookup(labels)
      check = tf.debugging.Assert(tf.reduce_all(ids >= 0), [
          f"{CHECK_PREFIX} label {self._schema.label.name!r} holds a class name not in the schema's label "
          "vocabulary"])
      with tf.control_dependencies([check]):
        return tf.identity(ids)
    if self._schema.task == "classification":
      return tf.cast(labels, tf.int64)
    return tf.cast(labels, tf.float32)

  def encode(self, columns):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    encoded = {}
    for feature in self._schema.features:
      value, key = columns[feature.name], feature.input_name
      if feature.is_categorical:
        encoded[key] = self._tables[feature.name].lookup(value)
      elif feature.type == "image":
        if value.dtype == tf.string:
          value = _decode_images(value, feature)
        encoded[key] = tf.cast(value, tf.float32)
      else:
        encoded[key] = tf.cast(value, tf.float32)
    return encoded


def _decode_images(data, feature: schema_lib.Feature):
  """uint8 or float32 [batch, height, width, channels] from raw bytes or PNG/JPEG bytes (resized to the
  schema's shape where an image differs, as Keras' image_dataset_from_directory does)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  height, width, channels = feature.shape
  if feature.encoding in (None, "raw"):
    return tf.reshape(tf.io.decode_raw(data, tf.uint8), (-1,) + feature.shape)

  def decode(one):
    image = tf.io.decode_image(one, channels=channels, expand_animations=False)
    same = tf.reduce_all(tf.shape(image)[:2] == [height, width])
    image = tf.cond(same, lambda: tf.cast(image, tf.float32),
                    lambda: tf.image.resize(tf.cast(image, tf.float32), [height, width]))
    return tf.ensure_shape(image, feature.shape)

  return tf.map_fn(decode, data, fn_output_signature=tf.TensorSpec(feature.shape, tf.float32))


def raw_serving_specs(schema: schema_lib.Schema):
  """TensorSpecs of the serving signature's inputs, one per feature, named after it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  specs = {}
  for feature in schema.features:
    if feature.type == "string":
      specs[feature.name] = tf.TensorSpec([None], tf.string, name=feature.input_name)
    elif feature.type == "image" and feature.encoding in ("png", "jpeg"):
      # PNG/JPEG bytes; in Vertex's JSON instances {"b64": "..."}, which TF Serving decodes for string inputs.
      specs[feature.name] = tf.TensorSpec([None], tf.string, name=feature.input_name)
    elif feature.type == "image":
      specs[feature.name] = tf.TensorSpec((None,) + feature.shape, tf.float32, name=feature.input_name)
    elif feature.values_per_example > 1:
      specs[feature.name] = tf.TensorSpec([None, feature.values_per_example], tf.float32, name=feature.input_name)
    else:
      specs[feature.name] = tf.TensorSpec([None], tf.float32, name=feature.input_name)
  return specs
