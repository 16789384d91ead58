"""JSON Lines (plain, gzip or zlib): one JSON object per line, nested objects read as dotted columns; and
Vertex AI's image and text classification exports, which are JSONL (the annotation is the label, `ml_use` the
split)."""

from __future__ import annotations

import json
import zlib
from typing import Any, Iterator

from trainer.core.errors import UserError
from trainer.data.formats import base


@base.register
class JsonlFormat(base.DataFormat):
  name = "jsonl"
  display_name = "JSONL"
  extensions = (".jsonl", ".ndjson", ".json")
  vertex_names = ("jsonl",)
  sniff_order = 30  # text that starts with "{"
  holds_label_lists = True  # Vertex's multi-label export, or a JSON array of names

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    text = base.text_head(path, compression, flag=flag).lstrip()
    if not text:
      raise UserError(f"{flag}: {path} is empty; expected TFRecord, CSV or JSONL data")
    return text.startswith("{")

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    return iter_split(path, source, flag=flag)

  def count(self, files: list[str], source: base.Source) -> int:
    return base.count_text_lines(files, source, keep=ml_use_predicate(source.ml_use) if source.ml_use else None)


def iter_split(path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """JSON values, nested objects flattened (`flatten_json`); with `source.ml_use`, only that split's lines."""
  for where, record in iter_jsonl(path, source.compression, flag=flag):
    if source.ml_use is None or _of_split(record, source.ml_use):
      yield where, record


def iter_jsonl(path: str, compression: str, *, flag: str):
  with base.open_text(path, compression, flag=flag) as f:
    line_number = 0
    try:
      for line_number, line in enumerate(f, start=1):
        if not line.strip():
          yield f"line {line_number}", {base.BLANK_LINE: True}
          continue
        try:
          value = json.loads(line)
        except json.JSONDecodeError as e:
          raise UserError(f"{flag}: {path} line {line_number} is not JSON ({e.msg}); expected one JSON object "
                          "per line") from None
        if not isinstance(value, dict):
          raise UserError(f"{flag}: {path} line {line_number} is a JSON {type(value).__name__}; expected one "
                          "object per line")
        yield f"line {line_number}", flatten_json(value)
    except UnicodeDecodeError as e:
      raise UserError(f"{flag}: {path} is not UTF-8 text (after line {line_number}, byte {e.start})") from None
    except (OSError, EOFError, zlib.error) as e:
      raise UserError(f"{flag}: {path} is not valid {compression.lower() or 'JSONL'} data after line "
                      f"{line_number} ({e})") from None


def flatten_json(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """A JSON object's nested objects as dotted columns: {"a": {"b": 1}} -> {"a.b": 1}; a list of objects as one
  list per key: {"a": [{"b": 1}, {"b": 2}]} -> {"a.b": [1, 2]}. An image ({"b64": ...}) is one value. This is
  how a column names a nested value, e.g. the label of Vertex's classification exports,
  `classificationAnnotation.displayName` (one class) or `classificationAnnotations.displayName` (a list: the
  multi-label export); the input pipeline extracts them alike (`_jsonl_columns`)."""
  flat: dict[str, Any] = {}
  for key, item in value.items():
    if isinstance(item, dict) and set(item) != {"b64"}:
      flat.update(flatten_json(item, f"{prefix}{key}."))
    elif isinstance(item, list) and item and all(isinstance(element, dict) for element in item):
      for element in item:
        for name, inner in flatten_json(element, f"{prefix}{key}.").items():
          flat.setdefault(name, []).append(inner)
    elif not prefix and key == "classificationAnnotations" and item == []:
      flat[VERTEX_MULTI_LABEL] = []  # a multi-label item that no class applies to
    else:
      flat[f"{prefix}{key}"] = item
  return flat


# Vertex AI's image and text classification exports (one JSON object per data item): the annotation is the label,
# one class name (single-label) or a list of them (multi-label, each class a yes/no).
VERTEX_LABEL = "classificationAnnotation.displayName"
VERTEX_MULTI_LABEL = "classificationAnnotations.displayName"
VERTEX_LABELS = (VERTEX_LABEL, VERTEX_MULTI_LABEL)
# Keys of those exports that describe the data item, not its content (ml_use, annotation sets): never features.
VERTEX_METADATA_PREFIXES = ("dataItemResourceLabels.", "classificationAnnotation.annotationResourceLabels.",
                            "classificationAnnotations.annotationResourceLabels.")
# The data item's split in those exports: "training", "validation" or "test" (absent: Vertex assigns it).
VERTEX_ML_USE = "dataItemResourceLabels.aiplatform.googleapis.com/ml_use"
ML_USE_VALUES = ("training", "validation", "test")


def vertex_export_label(path: str, source: base.Source, *, flag: str) -> str | None:
  """The label column when the first record of `path` is a line of Vertex's classification export (`VERTEX_LABEL`
  or `VERTEX_MULTI_LABEL`), else None. An empty list of annotations (multi-label: no class applies) counts."""
  if source.format != JsonlFormat.name:
    return None
  for _, record in iter_split(path, source, flag=flag):
    if isinstance(record.get("classificationAnnotations"), list):
      return VERTEX_MULTI_LABEL
    return next((name for name in VERTEX_LABELS if name in record), None)
  return None


def _of_split(record: dict[str, Any], ml_use: str) -> bool:
  """Whether a Vertex export's record belongs to split `ml_use` (as `ml_use_predicate` decides in the graph)."""
  value = record.get(VERTEX_ML_USE)
  return value not in ("validation", "test") if ml_use == "training" else value == ml_use


def ml_use_predicate(ml_use: str):
  """A tf.data filter over JSON lines: True for the lines of split `ml_use` ("training": and those without one).
  A regex over the raw line (the key as json.dumps writes it, or with "\\/"), so it runs in the graph."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def of_split(split):
    return rf'.*"aiplatform\.googleapis\.com(?:/|\\/)ml_use"\s*:\s*"(?:{split})".*'

  if ml_use == "training":
    return lambda line: tf.logical_not(tf.strings.regex_full_match(line, of_split("validation|test")))
  return lambda line: tf.strings.regex_full_match(line, of_split(ml_use))


def count_ml_use(files: list[str], source: base.Source, *, flag: str) -> dict[str, int]:
  """How many lines of Vertex's export(s) `files` each `ml_use` assigns ("" for none): one pass over the lines,
  which name image or text files (a few hundred bytes each), not their content."""
  counts = dict.fromkeys(ML_USE_VALUES + ("",), 0)
  for path in files:
    for where, record in iter_split(path, source, flag=flag):
      value = record.get(VERTEX_ML_USE, "")
      if value not in counts:
        raise UserError(f"{flag}: {path} {where}: ml_use {value!r}; Vertex's exports hold one of "
                        f"{', '.join(ML_USE_VALUES)}")
      counts[value] += 1
  return counts
