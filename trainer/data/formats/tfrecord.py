"""TFRecord files of `tf.train.Example`s (plain, gzip or zlib), read in plain Python by TensorFlow's record
iterator (a reader, not an op), and in the input pipeline by `TFRecordDataset` and one `parse_example` per batch."""

from __future__ import annotations

from typing import Any, Iterator

from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data.feature_kinds import Kind
from trainer.data.feature_kinds import STRING
from trainer.data import schema as schema_lib
from trainer.data.formats import base


@base.register
class TFRecordFormat(base.DataFormat):
  name = "tfrecord"
  display_name = "TFRecord"
  extensions = (".tfrecord", ".tfrecords", ".tfrec")
  vertex_names = ("tf-record", "tfrecord")
  sniff_order = 20  # after Parquet's magic: a file whose first record reads as one
  value_word = "feature"
  columns_ordered = False  # an Example's features are a map
  holds_examples = True

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    return _first_tfrecord(path, compression) is not None

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each Example's features as (kind, values) pairs: kind is the Feature's oneof ("float_list", ...)."""
    return iter_examples(path, source.compression, flag=flag)

  def count(self, files: list[str], source: base.Source) -> int:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    ds = tf.data.TFRecordDataset(files, compression_type=source.compression, num_parallel_reads=tf.data.AUTOTUNE)
    return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))

  def present_value(self, name: str, value: Any, *, kind: Kind, count: int, record: dict[str, Any]) -> Any:
    """An Example's (list kind, values): MISSING when empty; one value, or the list of `count`; strings decoded."""
    list_kind, values = value if value is not None else (None, [])
    if not values:
      return base.MISSING
    expected = kind.example_list
    if list_kind != expected:
      raise base.ValueProblem(f"feature {name!r} is a {list_kind}, but the schema says {kind.type} ({expected})")
    if len(values) != count:
      raise base.ValueProblem(f"feature {name!r} has {len(values)} values; the schema expects exactly {count}")
    value = values[0] if count == 1 else values
    if kind.holds == STRING:
      try:
        value = value.decode("utf-8")
      except UnicodeDecodeError:
        raise base.ValueProblem(f"feature {name!r} is not UTF-8 text") from None
    return value

  def sampled(self, value: Any) -> Any:
    return base.ExampleValues(*value) if value is not None else base.ExampleValues(None, [])

  def missing_problem(self, name: str, record: dict[str, Any], feature) -> str:
    return (f"feature {name!r} is missing (the record has: {', '.join(sorted(record)) or 'none'}); it does "
            "not match the schema" + ("" if feature is None else ", which gives it no default"))

  def tf_file_records(self, schema, source: base.Source):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return lambda path: tf.data.TFRecordDataset(path, compression_type=source.compression,
                                                buffer_size=base.READ_BUFFER_BYTES)

  def tf_batch_parser(self, schema, source: base.Source):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    spec = parse_spec(schema)
    return lambda serialized: base.split_label(tf.io.parse_example(serialized, spec), schema)


def parse_spec(schema: schema_lib.Schema) -> dict[str, Any]:
  """`tf.io.parse_example`'s spec for the schema's features (with their defaults) and label."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  spec = {}
  for f in schema.features:
    kind = f.kind
    shape = list(kind.parse_shape(f))
    default = None if f.default is None else ([f.default] * shape[0] if shape else f.default)
    spec[f.name] = tf.io.FixedLenFeature(shape, tf.as_dtype(kind.parse_dtype), default_value=default)
  spec[schema.label.name] = tf.io.FixedLenFeature([], tf.as_dtype(schema.label.kind.parse_dtype))
  return spec


TFRECORD = base.Source(TFRecordFormat.name)


def _first_tfrecord(path: str, compression: str) -> bytes | None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    options = tf.io.TFRecordOptions(compression_type=compression)
    return next(iter(tf.compat.v1.io.tf_record_iterator(path, options=options)), None)
  except tf.errors.OpError:
    return None


def iter_examples(path: str, compression: str, *, flag: str):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  options = tf.io.TFRecordOptions(compression_type=compression)
  number = 0
  try:
    for number, serialized in enumerate(tf.compat.v1.io.tf_record_iterator(path, options=options), start=1):
      try:
        example = tf.train.Example.FromString(serialized)
      except Exception:  # pylint: disable=broad-except  (protobuf's DecodeError has no stable import path)
        raise UserError(f"{flag}: record {number} of {path} is not a tf.train.Example") from None
      values = {}
      for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values[name] = (kind, list(getattr(feature, kind).value) if kind else [])
      yield f"record {number}", values
  except tf.errors.OpError as e:
    what = f"{compression.lower()} TFRecord" if compression else "TFRecord"
    raise UserError(f"{flag}: {path} cannot be read as {what} after record {number} ({first_line(e)})") from None
