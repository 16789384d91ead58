"""The one writer of `tf.train.Example`s: a record's values, typed by the schema (each feature's kind says which
Example list holds it and how; the label by its type). Used by the demo data and by staging CSV, JSONL or Parquet
files as TFRecord, which converts each record as the trainer reads it (`from_file`): the same reader, record check,
missing-value defaults and one-line errors as a training run on the files themselves."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from trainer.core.errors import UserError
from trainer.data import feature_kinds
from trainer.data.feature_kinds import BYTES, STRING
from trainer.data import formats
from trainer.data import schema as schema_lib


def serialize(values: Mapping[str, Any], schema: schema_lib.Schema) -> bytes:
  """One serialized `tf.train.Example` of `values` (name -> value) for every feature and the label of `schema`;
  a value that is None is left out (a missing value, as Beam's and TFX's converters write it)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  lists = {"float_list": tf.train.FloatList, "int64_list": tf.train.Int64List, "bytes_list": tf.train.BytesList}
  feature = {}
  for column in schema.features:
    value = values.get(column.name)
    if value is not None:
      kind = column.kind
      feature[column.name] = tf.train.Feature(
          **{kind.example_list: lists[kind.example_list](value=kind.example_values(column, value))})
  label = schema.label
  value = values.get(label.name)
  if value is not None:
    example_list = label.kind.example_list
    label_value = (value if isinstance(value, bytes) else str(value).encode()) if label.kind.holds == STRING else (
        int(value) if example_list == "int64_list" else float(value))
    feature[label.name] = tf.train.Feature(**{example_list: lists[example_list](value=[label_value])})
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def record_values(record: Mapping[str, Any], schema: schema_lib.Schema, source: formats.Source) -> dict[str, Any]:
  """The values `serialize` writes for one record as `formats.iter_records` yields it (CSV, JSONL or Parquet) once
  `preflight.record_problem` has accepted it: typed as the schema says, and each missing value the feature's
  schema `default`, where and as the input pipeline fills it when it reads the file itself (an empty CSV cell; an
  absent or null JSON value, or "" for a JSON number; a Parquet null). So the Examples a file is converted to
  train exactly as the file does, and the trainer's one-line record errors stay the only ones.

  Raises ValueError, whose message is one line, for a value an Example cannot hold as the schema types it: a
  fraction in an int column (the input pipeline reads CSV and JSON numbers as float32 and would keep 1.5; an
  `int64_list` cannot), or a missing value `record_problem` would have refused."""
  data_format = formats.FORMATS[source.format]
  if not data_format.converts_to_examples:
    convertible = [name for name, f in formats.FORMATS.items() if f.converts_to_examples]
    raise ValueError(f"records of {source.describe()} are not converted; expected one of {', '.join(convertible)}")
  if schema.label.multi_label:
    raise ValueError(f"label {schema.label.name!r} is multi-label (a list of class names), which the trainer reads "
                     "from JSONL only, not from a tf.train.Example")
  values: dict[str, Any] = {}
  for name in schema.columns:
    feature = None if name == schema.label.name else schema.feature(name)
    kind = feature.kind if feature is not None else schema.label.kind
    count = feature.values_per_example if feature is not None else 1
    try:
      # Missing where the input pipeline takes the default: "" in CSV (decode_csv's default fills it); JSONL and
      # Parquet keep a present "" string as it is.
      value = data_format.present_value(name, record.get(name), kind=kind, count=count, record=record)
      if value is formats.MISSING:
        if feature is None or feature.default is None:
          raise ValueError(f"column {name!r} is empty and the schema gives it no default")
        values[name] = [feature.default] * count if count > 1 else feature.default
        continue
      if kind.holds == BYTES and not (feature is not None and feature.uri):
        value = data_format.typed_value(name, value, kind=kind, count=count, feature=feature)  # the image's bytes
    except formats.ValueProblem as e:
      raise ValueError(str(e)) from None
    if feature is not None and feature.uri:
      values[name] = value.encode() if kind.holds == BYTES else value  # a file's URI, read when training
    elif kind.holds == BYTES:
      values[name] = value
    elif kind.holds == STRING:
      values[name] = value if isinstance(value, str) else str(value)  # Parquet: an int column read as strings
    else:
      numbers = [_number(name, v, kind) for v in (value if isinstance(value, list) else [value])]
      values[name] = numbers if isinstance(value, list) else numbers[0]
  return values


def _number(name: str, value: Any, kind: feature_kinds.Kind) -> float | int:
  """A CSV field (text), JSON or Parquet number as the schema's `kind` holds it; an int is a whole number."""
  if kind.example_list != "int64_list":
    return float(value)
  if isinstance(value, int):  # JSON and Parquet integers (and booleans): exact, however large
    return int(value)
  if isinstance(value, str):
    try:
      return int(value)  # CSV: "12" exactly, beyond float's 2**53 too
    except ValueError:
      pass  # "12.0", "1e3": whole numbers written as floats (pandas writes an int column with a NaN so)
  number = float(value)
  if not number.is_integer():
    raise ValueError(f"column {name!r} holds {value!r}, but the schema says {kind.type}, which a tf.train.Example "
                     "holds as a whole number (int64_list): round the column, or make the feature float in the schema")
  return int(number)


def from_file(path: str, source: formats.Source, schema: schema_lib.Schema, *, flag: str) -> Iterator[bytes]:
  """Each record of `path` (CSV, JSONL or Parquet, as `source` says) as a serialized Example, converted through
  the trainer's own reading: `formats.iter_records` (its CSV dialect, header and line numbers), the pre-flight
  record check `preflight.record_problem` (a NaN or infinity, a missing value without a default, a value of the
  wrong type: refused) and `record_values` (missing values take the schema's `default`). A bad record stops it
  with the one-line `UserError` training gives for the same record: "FLAG: PATH line N: column 'x' holds ...".
  """
  from trainer.planning import preflight  # pylint: disable=g-import-not-at-top  (it imports most of the trainer)

  for where, record in formats.iter_records(path, source, flag=flag):
    problem = preflight.record_problem(record, schema, source)
    if problem is None:
      try:
        values = record_values(record, schema, source)
      except ValueError as e:
        problem = str(e)
    if problem is not None:
      raise UserError(f"{flag}: {path} {where}: {problem}")
    yield serialize(values, schema)
