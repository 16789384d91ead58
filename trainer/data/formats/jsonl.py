"""JSON Lines (plain, gzip or zlib): one JSON object per line, nested objects read as dotted columns; and
Vertex AI's image and text classification exports, which are JSONL (the annotation is the label, `ml_use` the
split)."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any, Iterator

from trainer.core.errors import UserError
from trainer.data.feature_kinds import BYTES
from trainer.data.feature_kinds import Kind
from trainer.data.feature_kinds import STRING
from trainer.data import features as features_lib
from trainer.data import schema as schema_lib
from trainer.data.formats import base


@base.register
class JsonlFormat(base.DataFormat):
  name = "jsonl"
  display_name = "JSONL"
  extensions = (".jsonl", ".ndjson", ".json")
  vertex_names = ("jsonl",)
  sniff_order = 30  # text that starts with "{"
  holds_label_lists = True  # Vertex's multi-label export, or a JSON array of names
  splits_by_ml_use = True  # Vertex's classification export

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    text = base.text_head(path, compression, flag=flag).lstrip()
    if not text:
      raise UserError(f"{flag}: {path} is empty; expected TFRecord, CSV or JSONL data")
    return text.startswith("{")

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    return iter_split(path, source, flag=flag)

  def count(self, files: list[str], source: base.Source) -> int:
    return base.count_text_lines(files, source, keep=ml_use_predicate(source.ml_use) if source.ml_use else None)

  converts_to_examples = True

  def typed_value(self, name: str, value: Any, *, kind: Kind, count: int, feature) -> Any:
    """An image is {"b64": "..."} (as Vertex and TF Serving write it), decoded to its bytes; the rest JSON's
    strings, numbers and arrays of numbers."""
    if kind.holds == BYTES:
      if not isinstance(value, dict) or not isinstance(value.get("b64"), str):
        raise base.ValueProblem(f"column {name!r} holds {str(value)[:40]!r}; an image is {{'b64': '...'}} in JSONL")
      try:
        return base64.b64decode(value["b64"], validate=True)
      except ValueError:
        raise base.ValueProblem(f"column {name!r} holds a 'b64' value that is not base64") from None
    return base.python_value(name, value, kind=kind, count=count)

  def tf_file_records(self, schema, source: base.Source):
    """Lines; of a Vertex export's split, its lines only (a per-line filter: these lines name files, few and
    small). No filter otherwise: one cost JSONL three quarters of its throughput (a blank line is a bad record,
    named by pre-flight)."""
    keep = ml_use_predicate(source.ml_use) if source.ml_use else None
    return lambda path: base.text_lines(path, source, keep=keep)

  def tf_batch_parser(self, schema, source: base.Source):
    """JSON has no TensorFlow parse op: a batch of lines is parsed one column at a time by a vectorized RE2
    extraction (`_tf_columns`), which keeps it inside the graph (ParameterServerStrategy builds datasets on the
    workers, where a Python parser could not run) and as fast as CSV."""
    return lambda lines: base.split_label(_tf_columns(lines, schema), schema)


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
  multi-label export); the input pipeline extracts them alike (`_tf_columns`)."""
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


# ----- JSON lines parsed in the graph -------------------------------------------------------------------------

# One JSON value of each kind, as RE2 captures it: the inside of a string (escapes kept), a number or boolean,
# the inside of a flat array, or the base64 text of an image ({"b64": "..."} as Vertex and TF Serving write it).
_JSON_VALUE = {
    "string": r'"((?:[^"\\]|\\.)*)"',
    "number": r"(-?[0-9][0-9.eE+-]*|true|false)",
    "array": r"\[([^\]]*)\]",
    "image": r'\{\s*"b64"\s*:\s*"([^"]*)"\s*\}',
    # a JSON array of strings or of flat-or-once-nested objects (Vertex's annotations): no bracket outside strings
    "class_list": r'\[((?:[^\[\]"]|"(?:[^"\\]|\\.)*")*)\]',
}
_PRESENT = "\x01"  # marks a matched value: lines that do not match stay as they were (they start with "{")


def _json_value_kind(schema: schema_lib.Schema, name: str) -> str:
  if name == schema.label.name and schema.label.multi_label:
    return "class_list"
  if name == schema.label.name:
    return "string" if schema.label.kind.holds == STRING else "number"
  feature = schema.feature(name)
  return feature.kind.json_kind(feature)


_ESCAPED_BACKSLASH = "\x02"  # a raw control character cannot be in a JSON string: a safe stand-in for \\
_SIMPLE_ESCAPES = ((r'\\"', '"'), (r"\\/", "/"), (r"\\b", "\b"), (r"\\f", "\f"), (r"\\n", "\n"), (r"\\r", "\r"),
                   (r"\\t", "\t"))  # (RE2 pattern, character)


def _unescape_json_strings(text):
  """JSON string bodies decoded as json.loads decodes them, in the graph: the two-character escapes, then
  \\uXXXX (json.dumps and pandas' to_json write every non-ASCII character so, by default) with UTF-16 surrogate
  pairs joined. Batches without a backslash, the common case, skip the work."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def unescape():
    out = tf.strings.regex_replace(text, r"\\\\", _ESCAPED_BACKSLASH)
    for escape, character in _SIMPLE_ESCAPES:
      out = tf.strings.regex_replace(out, escape, character)
    out = _decode_unicode_escapes(out)
    return tf.strings.regex_replace(out, _ESCAPED_BACKSLASH, r"\\")  # RE2's rewrite for one backslash

  return tf.cond(tf.reduce_any(tf.strings.regex_full_match(text, r"(?s).*\\.*")), unescape, lambda: text)


def _decode_unicode_escapes(text):
  """Replaces each \\uXXXX (no escaped backslash is left in `text`) by its character: the pieces after a "\\u"
  start with 4 hex digits; a high surrogate piece with nothing after its digits, followed by a low one, is
  one character (an emoji as json.dumps writes it). Malformed escapes become U+FFFD."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  pieces = tf.strings.split(text, "\\u")
  flat = pieces.flat_values
  is_escape = tf.ragged.range(pieces.row_lengths()).flat_values > 0  # every piece but a row's first
  digits = tf.strings.unicode_decode(tf.strings.substr(flat, 0, 4), "UTF-8").to_tensor(shape=[None, 4])
  lower = tf.bitwise.bitwise_or(digits, 32)
  nibbles = tf.where((digits >= 48) & (digits <= 57), digits - 48,
                     tf.where((lower >= 97) & (lower <= 102), lower - 87, -1))
  length = tf.strings.length(flat)
  well_formed = tf.reduce_all(nibbles >= 0, axis=1) & (length >= 4)
  code = tf.reduce_sum(tf.maximum(nibbles, 0) * tf.constant([4096, 256, 16, 1]), axis=1)
  code = tf.where(well_formed, code, 0xFFFD)
  rest = tf.strings.substr(flat, tf.where(well_formed, 4, 0), length)
  next_code = tf.concat([code[1:], [0]], 0)
  next_is_escape = tf.concat([is_escape[1:], [False]], 0)  # the next piece is in this row only if it is an escape
  pair = (is_escape & (code >= 0xD800) & (code <= 0xDBFF) & (tf.strings.length(rest) == 0) & next_is_escape &
          (next_code >= 0xDC00) & (next_code <= 0xDFFF))
  second_of_pair = tf.concat([[False], pair[:-1]], 0)
  code = tf.where(pair, 0x10000 + (code - 0xD800) * 0x400 + (next_code - 0xDC00), code)
  character = tf.strings.unicode_encode(code[:, None], "UTF-8", errors="replace")
  decoded = tf.where(is_escape, tf.where(second_of_pair, rest, character + rest), flat)
  return tf.strings.reduce_join(pieces.with_flat_values(decoded), axis=1)


def _json_key_pattern(name: str) -> str:
  """RE2 for `"name":` up to its value. A dotted name ("a.b", as `flatten_json` names a nested value) is
  also `"a": {... "b":`, inside the one object (objects nested one deeper may come before it). Each key as json.dumps writes it by
  default (non-ASCII as \\uXXXX) or as UTF-8."""
  import json  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top

  def key(text):
    spellings = dict.fromkeys(re.escape(json.dumps(text, ensure_ascii=ascii_only)) for ascii_only in (True, False))
    return "(?:" + "|".join(spellings) + r")\s*:\s*"

  if "." not in name:
    return key(name)
  nested = r"\{(?:[^{}]|\{[^{}]*\})*?".join(key(part) for part in name.split("."))
  return f"(?:{key(name)}|{nested})"


def _class_list_key(name: str) -> tuple[str, str | None]:
  """(the key of the JSON array, the key of the class name in each of its objects, None for an array of
  strings): Vertex's multi-label export keeps the names in `classificationAnnotations[*].displayName`."""
  if name == VERTEX_MULTI_LABEL:
    array, field = name.split(".")
    return array, field
  return name, None


def _class_names(array_text, field: str | None):
  """The class names in the inside of a JSON array, each followed by `features.CLASS_SEPARATOR`: its strings, or
  the `field` of each of its objects. RE2 skips whole strings up to each name, so a name's own quotes or a
  value "displayName" (not a key) do not derail it; what follows the last name is dropped."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  string = _JSON_VALUE["string"]
  target = string if field is None else _json_key_pattern(field) + string
  skipped = r'(?:[^"]|"(?:[^"\\]|\\.)*")*?'
  separator = features_lib.CLASS_SEPARATOR
  names = tf.strings.regex_replace(array_text, skipped + target, r"\1" + separator)
  return tf.strings.regex_replace(names, f"[^{separator}]*$", "")


def _tf_columns(lines, schema: schema_lib.Schema):
  """{column: tensor} for a batch of JSON lines: one RE2 pass per column extracts its value."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  columns = {}
  for name in schema.columns:
    kind = _json_value_kind(schema, name)
    key_name, field = _class_list_key(name) if kind == "class_list" else (name, None)
    extracted = tf.strings.regex_replace(
        lines, r"^.*?" + _json_key_pattern(key_name) + _JSON_VALUE[kind] + r".*$",
        _PRESENT + r"\1")
    present = tf.strings.substr(extracted, 0, 1) == _PRESENT
    length = tf.strings.length(extracted)
    text = tf.strings.substr(extracted, tf.ones_like(length), length - 1)
    feature = None if name == schema.label.name else schema.feature(name)
    default = feature.default if feature is not None else None
    if default is None:
      check = tf.debugging.Assert(tf.reduce_all(present), [
          f"{features_lib.CHECK_PREFIX} JSONL column {name!r} is missing, null or not a {kind}"])
      with tf.control_dependencies([check]):
        text = tf.identity(text)
    elif kind != "class_list":
      # The default stands in for a missing or null value only: a value of another kind ("fast" in a number
      # column) is refused as CSV's decode refuses it, not read as missing. Only the lines without a value of
      # the column's kind are matched again (the others are blanked: RE2 on an empty string is free).
      unread = tf.where(present, "", lines)
      wrong = tf.strings.regex_full_match(unread, r".*?" + _json_key_pattern(key_name) + r"[^n\s].*")
      check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(wrong)), [
          f"{features_lib.CHECK_PREFIX} JSONL column {name!r} holds a value that is not a {kind}"])
      with tf.control_dependencies([check]):
        text = tf.identity(text)
    if kind == "string":
      text = _unescape_json_strings(text)
      columns[name] = text if default is None else tf.where(present, text, default)
    elif kind == "class_list":
      columns[name] = _unescape_json_strings(_class_names(text, field))
    elif kind == "image":
      columns[name] = tf.io.decode_base64(tf.strings.regex_replace(tf.strings.regex_replace(
          tf.strings.regex_replace(text, r"\\/", "/"), r"\+", "-"), "/", "_"))
    elif kind == "number":
      text = tf.strings.regex_replace(tf.strings.regex_replace(text, "^true$", "1"), "^false$", "0")
      number = tf.strings.to_number(tf.where(present, text, "0"), tf.float32)
      columns[name] = number if default is None else tf.where(present, number, float(default))
    else:
      size = feature.values_per_example
      parts = tf.strings.split(tf.where(present, text, ",".join(["0"] * size)), ",")
      check = tf.debugging.Assert(
          tf.reduce_all(tf.logical_or(parts.row_lengths() == size, tf.logical_not(present))),
          [f"{features_lib.CHECK_PREFIX} JSONL column {name!r} must hold {size} numbers"])
      with tf.control_dependencies([check]):
        numbers = tf.strings.to_number(tf.strings.strip(parts), tf.float32).to_tensor(shape=[None, size])
      columns[name] = (numbers if default is None else
                       tf.where(present[:, None], numbers, tf.fill(tf.shape(numbers), float(default))))
  return columns
