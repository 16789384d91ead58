"""The feature encoder shared by training and serving: raw columns -> the model's numeric inputs.

Encoding (vocabulary lookup, image bytes) happens in the input pipeline rather than in the model, so the model
sees dense numeric tensors under every strategy, and the serving signature applies the same `FeatureEncoder`
to raw features by name (`raw_serving_specs`).
"""

from __future__ import annotations

from trainer.core.errors import DATA_CHECK_PREFIX
from trainer.data import feature_kinds
from trainer.data import schema as schema_lib

# Prefix of the messages of the data checks run in the graph; `data_errors` reads the detail after it.
CHECK_PREFIX = DATA_CHECK_PREFIX
# The check that no CSV row read line by line has more fields than the columns (`input_pipeline`): when Python's
# csv reader then finds every row whole, a quoted field broke a line (`data_errors`).
CSV_LONG_ROW = "a CSV row has more fields than the columns"
NON_FINITE = "a NaN or infinite number"
# Ends each class name of a multi-label label as the input pipeline parses it: one dense string per record
# ("cat\x1fdog\x1f"), which batches and shuffles like any string column.
CLASS_SEPARATOR = "\x1f"


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
    """Class ids (int64) for classification, float32 targets for regression, multi-hot float32 (batch, classes)
    for a multi-label label."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self._schema.label.multi_label:
      return self._multi_hot(labels)
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

  def _multi_hot(self, labels):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    names = tf.strings.split(labels, CLASS_SEPARATOR)
    ids = self._label_table.lookup(names.flat_values)
    blank = tf.equal(names.flat_values, "")  # after the last separator; or a record no class applies to
    check = tf.debugging.Assert(tf.reduce_all((ids >= 0) | blank), [
        f"{CHECK_PREFIX} label {self._schema.label.name!r} holds a class name not in the schema's label "
        "vocabulary"])
    with tf.control_dependencies([check]):
      ids = names.with_flat_values(tf.where(blank, tf.constant(-1, tf.int64), ids))
    # one_hot of -1 is all zeros; the sum over a record's names is its multi-hot row (a name twice counts once)
    counts = tf.reduce_sum(tf.one_hot(ids.to_tensor(default_value=-1), len(self._schema.label.vocabulary)), axis=1)
    return tf.minimum(counts, 1.0)

  def encode_records(self, columns, *, file_cache: feature_kinds.FileCache | None = None):
    """`encode` after reading the files `uri` features name (the input pipeline's path; serving takes values),
    through `file_cache` when given."""
    return self.encode({f.name: f.kind.load(f, columns[f.name], cache=file_cache)
                        for f in self._schema.features})

  def encode(self, columns):
    return {feature.input_name: feature.kind.encode(feature, columns[feature.name],
                                                    table=self._tables.get(feature.name))
            for feature in self._schema.features}


def raw_serving_specs(schema: schema_lib.Schema):
  """TensorSpecs of the serving signature's inputs, one per feature, named after it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  specs = {}
  for feature in schema.features:
    spec = feature.kind.serving_input(feature)
    specs[feature.name] = tf.TensorSpec((None,) + spec.shape, spec.dtype, name=feature.input_name)
  return specs
