"""CSV files (plain, gzip or zlib; with or without a header row; quoted fields that may hold line breaks), read in
plain Python by the `csv` module. The columns are settled per split (`csv_source`): --csv_columns or the schema's,
checked against the first row, else the header, else `column_0`, `column_1`, ...; CSV is what a file is when its
content is no other format."""

from __future__ import annotations

import csv
import dataclasses
import io
import zlib
from typing import Any, Iterator

from trainer.core.errors import UserError
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
    images = [f.name for f in schema.features if f.type == "image" and not f.uri]
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
