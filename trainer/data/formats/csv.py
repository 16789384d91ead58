"""CSV files (plain, gzip or zlib; with or without a header row; quoted fields that may hold line breaks), read in
plain Python by the `csv` module. The columns are settled per split (`csv_source`): --csv_columns or the schema's,
checked against the first row, else the header, else `column_0`, `column_1`, ...; CSV is what a file is when its
content is no other format."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import zlib
from typing import Any, Iterator

from absl import logging

from trainer.core.errors import UserError
from trainer.data import features as features_lib
from trainer.data import schema as schema_lib
from trainer.data.feature_kinds import BYTES
from trainer.data.feature_kinds import Kind
from trainer.data.feature_kinds import STRING
from trainer.data.formats import base


@base.register
class CsvFormat(base.DataFormat):
  name = "csv"
  display_name = "CSV"
  extensions = (".csv",)
  vertex_names = ("csv",)
  sniff_order = 90  # last: text that is no other format

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    return True

  def details(self, source: base.Source) -> str:
    return (f" ({len(source.columns or ())} columns, {'a header row' if source.header else 'no header row'}"
            f"{', quoted line breaks' if source.multiline else ''})")

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Strings ("" when empty); a blank line or a row of another length is a record of its own kind."""
    rows = iter_csv(path, source.compression, flag=flag)
    if source.header:
      next(rows, None)
    for line, row in rows:
      if not row:
        yield f"line {line}", {base.BLANK_LINE: True}
        continue
      if len(row) != len(source.columns):
        yield f"line {line}", {base.FIELD_COUNT: len(row)}
        continue
      yield f"line {line}", dict(zip(source.columns, row))

  def count(self, files: list[str], source: base.Source) -> int:
    return base.count_text_lines(files, source, skip=1 if source.header else 0)

  def check_schema(self, schema, source: base.Source, files: list[str], *, flag: str) -> None:
    images = [f.name for f in schema.features if f.kind.holds == BYTES and not f.uri]
    if images:
      raise UserError(f"{flag}: CSV cannot hold image feature(s) {', '.join(images)}; use TFRecord or JSONL, or "
                      "image URIs (\"uri\": true)")
    lists = [f.name for f in schema.features if f.values_per_example > 1]
    if lists:
      raise UserError(f"{flag}: CSV cannot hold multi-valued feature(s) {', '.join(lists)}; use TFRecord or JSONL")
    missing = [c for c in schema.columns if c not in source.columns]
    if missing:
      raise UserError(f"{flag}: the CSV columns ({', '.join(source.columns)}) lack {', '.join(missing)} named in "
                      "the schema")

  converts_to_examples = True

  def present_value(self, name: str, value: Any, *, kind: Kind, count: int, record: dict[str, Any]) -> Any:
    """Every field is text: an empty one is missing whatever its kind (decode_csv's default fills it)."""
    return base.MISSING if value is None or value == "" else value

  def sampled(self, value: Any) -> Any:
    """A field that reads as a number is one ("1e999" too: inference refuses its infinity); the rest is text."""
    return float(value) if isinstance(value, str) and is_number(value) else value

  def typed_value(self, name: str, value: Any, *, kind: Kind, count: int, feature) -> Any:
    """Text stays text; a number column's field must read as a finite number."""
    if kind.holds == STRING:
      return value
    if not is_number(value):
      if _non_finite_text(value):
        raise base.ValueProblem(base.non_finite_problem("column", name, value, feature))
      raise base.ValueProblem(f"column {name!r} holds {value!r}, but the schema says {kind.type}")
    return float(value)

  def settled(self, source: base.Source, first_file: str, schema, *, csv_columns=None, csv_multiline=None,
              flag: str) -> base.Source:
    """The columns and header as the trainer settles them from the first file: `csv_columns` (--csv_columns),
    else the schema's `columns`, checked against the first row; else its header row; else, with a schema and as
    many fields as it has columns, the schema's order."""
    path = first_file
    columns = csv_columns or (schema.csv_columns if schema is not None else None)
    source = csv_source(source, path, columns=columns, flag=flag, multiline=csv_multiline)
    if not source.header and columns is None and schema is not None:
      if len(source.columns) != len(schema.columns):
        raise UserError(f"{flag}: {path} has no header row and {len(source.columns)} fields per row, the schema "
                        f"{len(schema.columns)} columns; name them with --csv_columns or the schema's 'columns'")
      logging.info("%s: %s has no header row: its columns are read in the schema's order (%s)", flag, path,
                   ", ".join(schema.columns))
      source = dataclasses.replace(source, columns=schema.columns)
    elif not source.header and columns is None:
      logging.info("%s: %s has no header row: its columns are named %s..%s (--csv_columns names them)", flag, path,
                   source.columns[0], source.columns[-1])
    return source

  def tf_file_records(self, schema, source: base.Source):
    """Text lines without the header, decoded a batch at a time by `tf.io.decode_csv` rather than read by
    `CsvDataset`: 1.4x the throughput here (scripts/bench/formats.py). Only CsvDataset follows a quoted field
    across lines: files whose fields break lines (`source.multiline`) are read by it, as tuples of the schema's
    columns. No per-line filter (blank lines): a blank line is a bad record, named by pre-flight."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if source.multiline:
      _, indices, defaults = _tf_layout(schema, source)
      scalar_defaults = [d if d.shape[0] == 0 else tf.reshape(d, []) for d in defaults]  # CsvDataset's form
      return lambda path: tf.data.experimental.CsvDataset(
          path, scalar_defaults, compression_type=source.compression, buffer_size=base.READ_BUFFER_BYTES,
          header=source.header, select_cols=indices)
    return lambda path: base.text_lines(path, source, skip=1 if source.header else 0)

  def tf_batch_parser(self, schema, source: base.Source):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    names, indices, defaults = _tf_layout(schema, source)
    if source.multiline:  # CsvDataset's batched columns, in `names` order
      return lambda *fields: base.split_label(dict(zip(names, fields)), schema)
    num_fields = len(source.columns)

    def parse_csv(lines):
      # decode_csv with select_cols refuses a short row but not a long one, whose stray comma would shift values
      # silently: count the commas outside quoted fields (two vectorized regex passes over the batch).
      unquoted = tf.strings.regex_replace(lines, r'"(?:[^"]|"")*"', "")
      fields = tf.strings.length(unquoted) - tf.strings.length(tf.strings.regex_replace(unquoted, ",", "")) + 1
      check = tf.debugging.Assert(tf.reduce_all(fields == num_fields), [
          f"{features_lib.CHECK_PREFIX} {features_lib.CSV_LONG_ROW} ({num_fields})"])
      with tf.control_dependencies([check]):
        lines = tf.identity(lines)
      return base.split_label(dict(zip(names, tf.io.decode_csv(lines, defaults, select_cols=indices))), schema)

    return parse_csv


def _tf_layout(schema: schema_lib.Schema, source: base.Source):
  """(column names, their indices in the file, record defaults), ordered by index as decode_csv yields them.

  Numbers are parsed as float32 whatever their schema type (an int label written "1.0" by pandas still reads);
  the encoder casts them. An empty default makes the field required: an empty field fails, and pre-flight
  names it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if source.columns is None:
    raise ValueError("a CSV source needs its columns (CsvFormat.settled)")
  by_name = {f.name: f for f in schema.features}
  ordered = sorted((source.columns.index(name), name) for name in schema.columns)
  defaults = []
  for _, name in ordered:
    feature = by_name.get(name)
    text = (feature or schema.label).kind.parse_dtype == "string"  # strings, bytes, and file URIs of images
    dtype = tf.string if text else tf.float32
    default = feature.default if feature else None
    defaults.append(tf.constant([], dtype) if default is None else tf.constant([default], dtype))
  return [name for _, name in ordered], [i for i, _ in ordered], defaults


def csv_source(source: base.Source, path: str, *, columns: tuple[str, ...] | None, flag: str,
               multiline: bool | None = None) -> base.Source:
  """Settles a CSV split's columns and header (`_csv_columns`) and whether quoted fields break lines:
  `multiline` (--csv_multiline) when given, else whether any does in the first 64 KiB of `path`."""
  if multiline is None:
    multiline = fields_break_lines(path, source.compression, flag=flag)
  return dataclasses.replace(_csv_columns(source, path, columns=columns, flag=flag), multiline=multiline)


def fields_break_lines(path: str, compression: str, *, flag: str) -> bool:
  """Whether a quoted field in the head of `path` holds a line break: read line by line, its record would split.
  (A head cut inside a quoted field can only cut after the break that makes it multi-line.)"""
  reader = csv.reader(io.StringIO(base.text_head(path, compression, flag=flag)), strict=False)
  try:
    return any("\n" in field or "\r" in field for row in reader for field in row)
  except csv.Error:
    return False  # not CSV that the line reader could read either: pre-flight's record check names it


def _csv_columns(source: base.Source, path: str, *, columns: tuple[str, ...] | None, flag: str) -> base.Source:
  """`columns` (from --csv_columns or the schema), checked against the first row; else the first row when it
  looks like a header; else `column_0`, `column_1`, ... ."""
  rows = head_rows(path, source.compression, flag=flag, limit=20)
  if not rows:
    raise UserError(f"{flag}: {path} is empty; expected CSV rows")
  first = rows[0]
  if columns is not None:
    if [c.strip() for c in first] == list(columns):
      return dataclasses.replace(source, columns=tuple(columns), header=True)
    if looks_like_header(rows) and set(columns) & {c.strip() for c in first}:
      raise UserError(f"{flag}: the header of {path} ({', '.join(first)}) differs from the expected columns "
                      f"({', '.join(columns)})")
    if len(first) != len(columns):
      raise UserError(f"{flag}: {path} has {len(first)} fields per row and no header; {len(columns)} column "
                      f"names were given ({', '.join(columns)}): pass --csv_columns with one name per field")
    return dataclasses.replace(source, columns=tuple(columns), header=False)
  if looks_like_header(rows):
    names = tuple(c.strip() for c in first)
    if not names[0] and len(names) > 1 and all(names[1:]) and len(set(names)) == len(names):
      raise UserError(f"{flag}: the header of {path} leaves its first column unnamed ({', '.join(first[:4])}"
                      f"{', ...' if len(first) > 4 else ''}): that is the row index pandas' to_csv writes by default; "
                      "write the file with to_csv(path, index=False), or name that column in the header")
    if len(set(names)) != len(names) or not all(names):
      raise UserError(f"{flag}: the header of {path} has empty or repeated column names ({', '.join(first)})")
    return dataclasses.replace(source, columns=names, header=True)
  return dataclasses.replace(source, columns=tuple(f"column_{i}" for i in range(len(first))), header=False)


def looks_like_header(rows: list[list[str]]) -> bool:
  """The first row is a header when none of its fields is a number, and some column below it holds numbers,
  or no field of it recurs in its column below (all-text files: a header names, rows repeat values)."""
  first, rest = rows[0], rows[1:]
  if any(is_number(field) for field in first):
    return False
  if not rest:
    return True
  for i in range(len(first)):
    below = [row[i] for row in rest if i < len(row) and row[i] != ""]
    if below and all(is_number(v) for v in below):
      return True
  return all(first[i] not in {row[i] for row in rest if i < len(row)} for i in range(len(first)))


def _non_finite_text(text: str) -> bool:
  try:
    return not math.isfinite(float(text))
  except ValueError:
    return False


def is_number(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return text.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity", "")


def head_rows(path: str, compression: str, *, flag: str, limit: int) -> list[list[str]]:
  rows = []
  for _, row in iter_csv(path, compression, flag=flag):
    if not row:
      continue
    rows.append(row)
    if len(rows) >= limit:
      break
  return rows


def iter_csv(path: str, compression: str, *, flag: str) -> Iterator[tuple[int, list[str]]]:
  """(line number, fields) of every row; a blank line is an empty row."""
  with base.open_text(path, compression, flag=flag) as f:
    try:
      reader = csv.reader(f)
      for row in reader:
        yield reader.line_num, row
    except UnicodeDecodeError as e:
      raise UserError(f"{flag}: {path} is not UTF-8 text (byte {e.start}); expected a CSV file") from None
    except (OSError, EOFError, zlib.error) as e:
      raise UserError(f"{flag}: {path} is not valid {compression.lower() or 'CSV'} data ({e})") from None
    except csv.Error as e:
      raise UserError(f"{flag}: {path} line {reader.line_num} is not valid CSV ({e})") from None
