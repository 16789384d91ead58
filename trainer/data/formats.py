"""Which format and compression the data files are in, and reading a few of their records in plain Python.

`--data_format=auto` (the default) resolves in this order: Vertex's `AIP_DATA_FORMAT` (a managed-dataset job),
the file extension (`.tfrecord`, `.csv`, `.jsonl`, each optionally `.gz` / `.zz`; `.parquet`), then the first
file's content (Parquet's `PAR1` magic, a TFRecord, JSON, else CSV). Parquet is read by `trainer.data.parquet`.
Compression is read from each file's first bytes (gzip's magic, zlib's header), not trusted from the name: Beam
and Dataflow write `*.tfrecord.gz`, `gsutil -Z` and some exporters gzip files whose names do not say so.

Everything here runs before the strategy is built, so it reads files through `tf.io.gfile` and Python's own
gzip/zlib/csv/json, and runs no TensorFlow op (`tf_record_iterator` is a reader, not an op).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import zlib
from typing import Any, Iterator

from trainer.core.errors import first_line
from trainer.core.errors import UserError

# AIP_DATA_FORMAT values (Vertex managed datasets) -> ours; bigquery is refused with its own message.
VERTEX_FORMATS = {"csv": "csv", "jsonl": "jsonl", "tf-record": "tfrecord", "tfrecord": "tfrecord"}
_EXTENSIONS = {".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfrec": "tfrecord", ".csv": "csv",
               ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSED_EXTENSIONS = {".gz": "GZIP", ".gzip": "GZIP", ".zz": "ZLIB", ".zlib": "ZLIB", ".deflate": "ZLIB"}
_GZIP_MAGIC = b"\x1f\x8b"
_SNIFFED_FILES = 16  # files whose first bytes are read to check one compression under a pattern
_HEAD_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Source:
  """How to read one split's files: resolved once in pre-flight, then passed to every reader."""

  format: str  # tfrecord | csv | jsonl | parquet
  compression: str = ""  # "" | GZIP | ZLIB (TensorFlow's compression_type names)
  columns: tuple[str, ...] | None = None  # CSV: every column, in file order
  header: bool = False  # CSV: the first line of each file is a header row
  multiline: bool = False  # CSV: quoted fields hold line breaks (pandas writes free text so): read by CsvDataset
  # Vertex's export JSONL with ml_use labels: read only the lines of this split ("training" also keeps lines
  # without one, which Vertex would assign to training by default).
  ml_use: str | None = None

  def describe(self) -> str:
    kind = {"tfrecord": "TFRecord", "csv": "CSV", "jsonl": "JSONL", "parquet": "Parquet",
            "image_folder": "images in class folders"}[self.format]
    text = f"{self.compression.lower()} {kind}" if self.compression else kind
    if self.ml_use:
      text += f" (the lines whose ml_use is {self.ml_use}{' or unset' if self.ml_use == 'training' else ''})"
    if self.format == "csv":
      text += (f" ({len(self.columns or ())} columns, {'a header row' if self.header else 'no header row'}"
               f"{', quoted line breaks' if self.multiline else ''})")
    return text


TFRECORD = Source("tfrecord")
# Image files in one folder per class (what Keras' image_dataset_from_directory reads): each file is a record of
# two columns, the file's path and its folder's name.
IMAGE_FOLDER = Source("image_folder")
IMAGE_FOLDER_IMAGE, IMAGE_FOLDER_LABEL = "image", "label"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")


def is_image_file(path: str) -> bool:
  return path.lower().endswith(IMAGE_EXTENSIONS)


# Class folders (Keras' image_dataset_from_directory) often hold a stray file (notes.txt, a labels.csv at the top):
# Keras reads only image files; so does the trainer when at least this share of the listed files are images.
IMAGE_FOLDER_SHARE = 0.9


def image_folder_files(files: list[str]) -> tuple[list[str], list[str]]:
  """(the image files, the other files left out) when the files are mostly images (`IMAGE_FOLDER_SHARE`), else
  (files, [])."""
  images = [path for path in files if is_image_file(path)]
  if images and len(images) < len(files) and len(images) >= IMAGE_FOLDER_SHARE * len(files):
    return images, [path for path in files if not is_image_file(path)]
  return files, []


def folder_class(path: str) -> str:
  """The class of an image in a folder-per-class layout: the name of the folder that holds it."""
  parts = path.rstrip("/").split("/")
  return parts[-2] if len(parts) > 1 else ""
# Keys of the records `iter_records` yields for a line that holds no record (checked by preflight.record_problem).
BLANK_LINE = "\0blank line"
FIELD_COUNT = "\0field count"


def compression_of(path: str, *, flag: str) -> str:
  """"GZIP", "ZLIB" or "" from the file's first bytes."""
  head = read_head(path, 2, flag=flag)
  if head[:2] == _GZIP_MAGIC:
    return "GZIP"
  if len(head) == 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0:
    return "ZLIB"  # RFC 1950 header; confirmed (or refuted) by decompressing, see `_confirm_zlib`
  return ""


def read_head(path: str, size: int, *, flag: str) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read(size)
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot read {path}: {first_line(e)}") from None


def _confirm_zlib(path: str, *, flag: str) -> bool:
  try:
    zlib.decompressobj().decompress(read_head(path, 4096, flag=flag))
    return True
  except zlib.error:
    return False


def _extension_format(path: str) -> tuple[str | None, str | None]:
  """(format, compression) the file name claims, None where it says nothing."""
  name = path.rsplit("/", 1)[-1].lower()
  compression = None
  for ext, kind in _COMPRESSED_EXTENSIONS.items():
    if name.endswith(ext):
      compression, name = kind, name[:-len(ext)]
      break
  for ext, kind in _EXTENSIONS.items():
    if name.endswith(ext):
      return kind, compression
  return None, compression


def resolve(files: list[str], *, requested: str, vertex_format: str | None, flag: str) -> Source:
  """The format and compression of one split's files (CSV columns are settled later, by `csv_source`)."""
  if requested == "auto" and not vertex_format and all(is_image_file(path) for path in files):
    return IMAGE_FOLDER
  compression = _one_compression(files, flag=flag)
  if requested != "auto":
    data_format = requested
  elif vertex_format:
    data_format = VERTEX_FORMATS[vertex_format]
  else:
    claimed = {}
    for path in files:
      kind = _extension_format(path)[0]
      if kind:
        claimed.setdefault(kind, path)
    if len(claimed) > 1:
      (a, pa), (b, pb) = list(claimed.items())[:2]
      raise UserError(f"{flag}: the pattern mixes {a} ({pa}) and {b} ({pb}) files; point it at one format")
    data_format = next(iter(claimed), None) or _sniff_format(files[0], compression, flag=flag)
  return Source(data_format, compression)


def source_for(files: list[str], *, requested: str = "auto", columns: tuple[str, ...] | None = None,
               flag: str) -> Source:
  """`resolve`, then (CSV) `csv_source` on the first file: how tools outside a training run read a pattern."""
  source = resolve(files, requested=requested, vertex_format=None, flag=flag)
  if source.format == "csv":
    source = csv_source(source, files[0], columns=columns, flag=flag)
  return source


def _one_compression(files: list[str], *, flag: str) -> str:
  """The compression every file shares, read from the first bytes of up to 16 files spread over the list."""
  step = max(1, len(files) // _SNIFFED_FILES)
  sampled = files[::step][:_SNIFFED_FILES]
  if files[-1] not in sampled:
    sampled.append(files[-1])
  found: dict[str, str] = {}
  for path in sampled:
    kind = compression_of(path, flag=flag)
    if kind == "ZLIB" and not _confirm_zlib(path, flag=flag):
      kind = ""
    found.setdefault(kind, path)
  if len(found) > 1:
    described = [f"{kind.lower() or 'uncompressed'} ({path})" for kind, path in found.items()]
    raise UserError(f"{flag}: the pattern mixes compressions: {' and '.join(described)}; TensorFlow reads one "
                    "compression per pattern: compress or decompress them alike")
  return next(iter(found))


def _sniff_format(path: str, compression: str, *, flag: str) -> str:
  """Parquet by its magic, TFRecord if the first record reads as one, else JSONL if the text starts with '{',
  else CSV."""
  from trainer.data import parquet  # pylint: disable=g-import-not-at-top

  if not compression and read_head(path, 4, flag=flag) == parquet.MAGIC:
    return "parquet"
  if _first_tfrecord(path, compression) is not None:
    return "tfrecord"
  text = _text_head(path, compression, flag=flag).lstrip()
  if not text:
    raise UserError(f"{flag}: {path} is empty; expected TFRecord, CSV or JSONL data")
  return "jsonl" if text.startswith("{") else "csv"


def _first_tfrecord(path: str, compression: str) -> bytes | None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    options = tf.io.TFRecordOptions(compression_type=compression)
    return next(iter(tf.compat.v1.io.tf_record_iterator(path, options=options)), None)
  except tf.errors.OpError:
    return None


def _text_head(path: str, compression: str, *, flag: str) -> str:
  with open_text(path, compression, flag=flag) as f:
    try:
      return f.read(_HEAD_BYTES)
    except UnicodeDecodeError as e:
      raise UserError(f"{flag}: {path} is not UTF-8 text (byte {e.start}); expected TFRecord, CSV, "
                      "JSONL or Parquet data") from None
    except (OSError, EOFError, zlib.error) as e:
      raise UserError(f"{flag}: {path} is not valid {compression.lower()} data ({e})") from None


class _GFileReader(io.RawIOBase):
  """`tf.io.gfile.GFile` as a standard readable stream (GFile is not an io.IOBase), for gzip and TextIOWrapper."""

  def __init__(self, gfile):
    self._gfile = gfile

  def readable(self):
    return True

  def readinto(self, buffer):
    data = self._gfile.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)

  def close(self):
    self._gfile.close()
    super().close()


class _ZlibReader(io.RawIOBase):
  """A readable stream over a zlib-compressed one (gzip.GzipFile's counterpart for TF's ZLIB files)."""

  def __init__(self, raw):
    self._raw, self._inflate, self._pending = raw, zlib.decompressobj(), b""

  def readable(self):
    return True

  def readinto(self, buffer):
    while not self._pending:
      chunk = self._raw.read(1 << 16)
      if not chunk:
        self._pending = self._inflate.flush()
        break
      self._pending = self._inflate.decompress(chunk)
    size = min(len(buffer), len(self._pending))
    buffer[:size], self._pending = self._pending[:size], self._pending[size:]
    return size


def open_binary(path: str, compression: str, *, flag: str):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    raw = io.BufferedReader(_GFileReader(tf.io.gfile.GFile(path, "rb")), buffer_size=1 << 20)
    raw.peek(1)  # opens it: a missing or unreadable file fails here, with its name
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot read {path}: {first_line(e)}") from None
  if compression == "GZIP":
    return gzip.GzipFile(fileobj=raw, mode="rb")
  if compression == "ZLIB":
    return io.BufferedReader(_ZlibReader(raw))
  return raw


def open_text(path: str, compression: str, *, flag: str):
  return io.TextIOWrapper(open_binary(path, compression, flag=flag), encoding="utf-8", newline="")


# ----- CSV columns -----------------------------------------------------------------------------------------


def csv_source(source: Source, path: str, *, columns: tuple[str, ...] | None, flag: str,
               multiline: bool | None = None) -> Source:
  """Settles a CSV split's columns and header (`_csv_columns`) and whether quoted fields break lines:
  `multiline` (--csv_multiline) when given, else whether any does in the first 64 KiB of `path`."""
  if multiline is None:
    multiline = fields_break_lines(path, source.compression, flag=flag)
  return dataclasses.replace(_csv_columns(source, path, columns=columns, flag=flag), multiline=multiline)


def fields_break_lines(path: str, compression: str, *, flag: str) -> bool:
  """Whether a quoted field in the head of `path` holds a line break: read line by line, its record would split.
  (A head cut inside a quoted field can only cut after the break that makes it multi-line.)"""
  reader = csv.reader(io.StringIO(_text_head(path, compression, flag=flag)), strict=False)
  try:
    return any("\n" in field or "\r" in field for row in reader for field in row)
  except csv.Error:
    return False  # not CSV that the line reader could read either: pre-flight's record check names it


def _csv_columns(source: Source, path: str, *, columns: tuple[str, ...] | None, flag: str) -> Source:
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
  with open_text(path, compression, flag=flag) as f:
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


# ----- records as Python values ----------------------------------------------------------------------------


def iter_records(path: str, source: Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(where, {column: value}) of each record: `where` is "line N" or "record N"; values are as the file holds
  them: Example value lists (TFRecord), strings (CSV; "" when empty), JSON values (JSONL), pyarrow's Python
  values (Parquet: "row N")."""
  if source.format == "csv":
    rows = iter_csv(path, source.compression, flag=flag)
    if source.header:
      next(rows, None)
    for line, row in rows:
      if not row:
        yield f"line {line}", {BLANK_LINE: True}
        continue
      if len(row) != len(source.columns):
        yield f"line {line}", {FIELD_COUNT: len(row)}
        continue
      yield f"line {line}", dict(zip(source.columns, row))
  elif source.format == "jsonl":
    for where, record in _iter_jsonl(path, source.compression, flag=flag):
      if source.ml_use is None or _of_split(record, source.ml_use):
        yield where, record
  elif source.format == "parquet":
    from trainer.data import parquet  # pylint: disable=g-import-not-at-top

    yield from parquet.iter_rows(path, flag=flag)
  elif source.format == "image_folder":
    yield "file", {IMAGE_FOLDER_IMAGE: path, IMAGE_FOLDER_LABEL: folder_class(path)}
  else:
    yield from _iter_examples(path, source.compression, flag=flag)


def _iter_jsonl(path: str, compression: str, *, flag: str):
  with open_text(path, compression, flag=flag) as f:
    line_number = 0
    try:
      for line_number, line in enumerate(f, start=1):
        if not line.strip():
          yield f"line {line_number}", {BLANK_LINE: True}
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


def vertex_export_label(path: str, source: Source, *, flag: str) -> str | None:
  """The label column when the first record of `path` is a line of Vertex's classification export (`VERTEX_LABEL`
  or `VERTEX_MULTI_LABEL`), else None. An empty list of annotations (multi-label: no class applies) counts."""
  if source.format != "jsonl":
    return None
  for _, record in iter_records(path, source, flag=flag):
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


def count_ml_use(files: list[str], source: Source, *, flag: str) -> dict[str, int]:
  """How many lines of Vertex's export(s) `files` each `ml_use` assigns ("" for none): one pass over the lines,
  which name image or text files (a few hundred bytes each), not their content."""
  counts = dict.fromkeys(ML_USE_VALUES + ("",), 0)
  for path in files:
    for where, record in iter_records(path, source, flag=flag):
      value = record.get(VERTEX_ML_USE, "")
      if value not in counts:
        raise UserError(f"{flag}: {path} {where}: ml_use {value!r}; Vertex's exports hold one of "
                        f"{', '.join(ML_USE_VALUES)}")
      counts[value] += 1
  return counts


def _iter_examples(path: str, compression: str, *, flag: str):
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
