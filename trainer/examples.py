"""The one writer of `tf.train.Example`s: a record's values, typed by the schema (each feature's kind says which
Example list holds it and how; the label by its type). Used by the demo data and by staging CSV as TFRecord."""

from __future__ import annotations

from typing import Any, Mapping

from trainer import feature_kinds
from trainer import schema as schema_lib


def serialize(values: Mapping[str, Any], schema: schema_lib.Schema) -> bytes:
  """One serialized `tf.train.Example` of `values` (name -> value) for every feature and the label of `schema`;
  a value that is None is left out (a missing value, as Beam's and TFX's converters write it)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  lists = {"float_list": tf.train.FloatList, "int64_list": tf.train.Int64List, "bytes_list": tf.train.BytesList}
  feature = {}
  for column in schema.features:
    value = values.get(column.name)
    if value is not None:
      kind = feature_kinds.of(column)
      feature[column.name] = tf.train.Feature(
          **{kind.example_list: lists[kind.example_list](value=kind.example_values(column, value))})
  label = schema.label
  value = values.get(label.name)
  if value is not None:
    example_list = schema_lib.EXAMPLE_LISTS[label.type]
    label_value = (value if isinstance(value, bytes) else str(value).encode()) if label.type == "string" else (
        int(value) if label.type == "int" else float(value))
    feature[label.name] = tf.train.Feature(**{example_list: lists[example_list](value=[label_value])})
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
