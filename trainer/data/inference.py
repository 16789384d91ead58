r"""Schema inference: a `schema.json` from the data itself, given the label column (the command is
`trainer/schema_inference.py`).

    python -m trainer.schema_inference --data='gs://BUCKET/data/train-*.csv' --label=churned --output=schema.json

The trainer runs the same inference when there is no `--schema` and no `schema.json` beside the training files
but there is a `--label`, logs the result, and writes it beside the checkpoints and the export.

It reads a bounded, deterministic sample (`--infer_sample_rows`, default 100,000 records: an even share from each of
16 files spread evenly over the sorted list, more of up to 64 spread files only when those run short), so every
worker of a job infers the same schema, 1M rows cost what 100k do, and data written in order (one class after
another, day by day) is sampled across its whole length, not from its first files only. Pure Python: no
TensorFlow op runs before the strategy is built. Per column:
- numbers (an Example's float/int64 list, CSV fields that all parse as numbers, JSON numbers or arrays of them):
  numeric with mean/std for the model's standardization and the mean as the default for a missing value;
  a fixed-length list of N is one feature of shape [N]; a constant column is left out.
- text: categorical over the values seen at least `--vocab_min_count` times (at most `--max_vocab_size`, most
  frequent first); the rest map to the out-of-vocabulary id, and so does a missing value. A column whose values
  are mostly unique, or more than 1,000 distinct ones, is free text when they average 3 or more words (a `text` feature: its vocabulary the words
  seen `--vocab_min_count`+ times, its sequence_length the 95th percentile of words per value), else an id,
  left out with a warning that says how to use it; so is a name (90%+ of the records each with its own value of
  under 8 words on average, 70%+ of them capitalized: "Braund, Mr. Owen Harris").
- PNG/JPEG bytes (an Example's bytes, `{"b64": ...}` in JSON): an image of the most common size, 255 as max value;
  fixed-length raw uint8 bytes: a square image (1 or 3 channels) with the sample's largest byte as max value.
- the label: text -> classification over its sorted values; whole numbers >= 0 with at most 20 distinct values ->
  classification with `max + 1` classes; other numbers -> regression. `--task` overrides the guess.
Every decision is logged; review the written file and pass it back with `--schema` to pin it.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import math
import struct
import zlib
from typing import Any

from trainer.core import config as config_lib
from trainer.core.errors import UserError
from trainer.data import feature_kinds
from trainer.data import formats
from trainer.data import schema as schema_lib

MAX_CLASSES_GUESSED = 20
MAX_INFERRED_IMAGE_SIDE = 224  # a larger most-common image size is scaled down to fit (ImageNet models' input)
_URI_HEADERS_READ = 32
_TEXT_FILES_READ = 2000
_TEXT_HEAD_BYTES = 1 << 20
_IMAGE_HEAD_BYTES = 1 << 20  # a JPEG's size marker can follow large EXIF data
TEXT_MIN_WORDS = 3.0  # mostly unique values averaging this many words are free text, fewer an id
# ... unless nearly every record has its own value of fewer than NAME_MAX_WORDS words: a name, left out as an id.
NAME_MIN_UNIQUE_SHARE = 0.9
NAME_MAX_WORDS = 8.0
NAME_MIN_CAPITALIZED = 0.7  # of the words that start with a letter, as names write them
# Values of 3+ words that repeat (duplicated rows, stock phrases) are still free text past this many distinct ones.
_MAX_CATEGORIES_OF_WORDS = 1000
_MAX_SEQUENCE_LENGTH = 512
_SAMPLED_FILES = 16
_MAX_FILES_READ = 64
_MAX_DISTINCT = 1000
_NUMERIC_SHARE = 0.9  # a column this numeric with some text in it is numbers with typos, not a category
_CONTROL_BYTES = frozenset(range(0, 9)) | frozenset(range(14, 32))


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
  label: str
  task: str = "auto"
  sample_rows: int = 100_000
  vocab_min_count: int = 2
  max_vocab_size: int = 10_000


@dataclasses.dataclass
class _Column:
  """What the sample holds in one column."""

  name: str
  missing: int = 0
  present: int = 0
  kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  lengths: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  sums: list[float] = dataclasses.field(default_factory=list)
  squares: list[float] = dataclasses.field(default_factory=list)
  strings: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  images: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (h, w, c, encoding)
  integral: bool = True
  minimum: float = math.inf  # of scalar numbers (the label's range)
  maximum: float = -math.inf
  distinct: set = dataclasses.field(default_factory=set)  # of scalar numbers, up to _MAX_DISTINCT
  max_byte: int = 0
  where: str = ""  # the first record seen, for messages
  first_missing: str = ""  # the first record without a value
  first_text: tuple[str, str] | None = None  # (value, where) of the first text value
  first_of_kind: dict = dataclasses.field(default_factory=dict)  # kind -> where it first appears, in sample order

  def add_numbers(self, values: list[float]) -> None:
    if len(self.sums) < len(values):
      self.sums.extend([0.0] * (len(values) - len(self.sums)))
      self.squares.extend([0.0] * (len(values) - len(self.squares)))
    for i, v in enumerate(values):
      self.sums[i] += v
      self.squares[i] += v * v
      if self.integral and (not math.isfinite(v) or v != int(v)):
        self.integral = False
    if len(values) == 1:
      self.minimum, self.maximum = min(self.minimum, values[0]), max(self.maximum, values[0])
      if len(self.distinct) < _MAX_DISTINCT:
        self.distinct.add(values[0])
    self.lengths[len(values)] += 1
    self.kinds["number"] += 1


def _reading_order(files: list[str]) -> list[str]:
  """The files a sample reads, in order: 16 spread evenly over the sorted list first (every file when fewer), then
  the others of up to 64 spread evenly, for when those run short. A newcomer's 356 one-row files, written class
  after class, were sampled from the first 64 only: two classes of three, and a later file's label refused."""
  def spread(count: int) -> list[int]:
    if len(files) <= count:
      return list(range(len(files)))
    return sorted({i * len(files) // count for i in range(count)})

  first = spread(_SAMPLED_FILES)
  return [files[i] for i in first + [i for i in spread(_MAX_FILES_READ) if i not in set(first)]]


def sample_records(files: list[str], source: formats.Source, *, limit: int, flag: str):
  """Up to `limit` (where, record) pairs: an even share from each of 16 files spread over the sorted list,
  deterministically (`_reading_order`)."""
  share = max(1, -(-limit // min(len(files), _SAMPLED_FILES)))
  taken: list[tuple[str, dict[str, Any]]] = []
  for path in _reading_order(files):
    wanted = min(share, limit - len(taken))
    read = 0
    for where, record in formats.iter_records(path, source, flag=flag):
      if read >= wanted:
        break
      if formats.BLANK_LINE in record or formats.FIELD_COUNT in record:
        continue  # training reports it, with its line
      taken.append((f"{path} {where}", record))
      read += 1
    if len(taken) >= limit:
      break
  if not taken:
    raise UserError(f"{flag}: {files[0]} holds no records")
  return taken


def infer_schema(files: list[str], source: formats.Source, config: InferenceConfig, *, flag: str,
                 log=print, warn=None) -> schema_lib.Schema:
  """A validated `Schema` for `files`, inferred from a sample; `log` receives one line per decision, `warn` (else
  `log`) the decisions that leave a column out that a user may want in."""
  warn = warn or log
  data_format = formats.FORMATS[source.format]
  data_format.check_for_inference(files, label=config.label, flag=flag)
  if data_format.files_are_records:
    return _image_folder_schema(files, config, flag=flag, log=log)
  records = sample_records(files, source, limit=config.sample_rows, flag=flag)
  names = list(source.columns) if source.columns else _names_in_order(records)
  if not data_format.columns_ordered:
    names.sort()
  if config.label not in names:
    raise UserError(f"--label={config.label!r} is not a column of {files[0]} (columns: {', '.join(names)})")
  columns = {name: _Column(name) for name in names}
  for where, record in records:
    for name, column in columns.items():
      _observe(column, data_format.sampled(record.get(name)), where, flag=flag)
  log(f"schema inference: {len(records)} records sampled from {min(len(files), _MAX_FILES_READ)} of {len(files)} "
      f"{data_format.unit}(s) ({source.describe()})")
  features = []
  for name in names:
    if name == config.label:
      continue
    if name.startswith(formats.VERTEX_METADATA_PREFIXES):
      log(f"schema inference: {name!r} left out: it describes the data item in Vertex's export, not its content")
      continue
    feature = _feature(columns[name], config, log=log, warn=warn)
    if feature is not None:
      features.append(feature)
  if not features:
    raise UserError(f"{flag}: schema inference found no usable feature besides the label {config.label!r} in "
                    f"{files[0]}")
  label = _label(columns[config.label], config.task, flag=flag, log=log)
  value = {"features": features, "label": label}
  if source.columns and not source.header:  # a headerless CSV: the schema names its columns
    value["columns"] = list(source.columns)
  return schema_lib.parse_schema(value, source="(inferred)")


def _image_folder_schema(files: list[str], config: InferenceConfig, *, flag: str, log) -> schema_lib.Schema:
  """Images in one folder per class: the image read by path, the label the folder names (every file's, so no
  class is missed), sorted as Keras' image_dataset_from_directory sorts them."""
  if config.label != formats.IMAGE_FOLDER_LABEL:
    raise UserError(f"--label={config.label!r}: images in class folders have the label {formats.IMAGE_FOLDER_LABEL!r} "
                    "(each image's folder name); drop --label")
  classes = sorted({formats.folder_class(path) for path in files})
  if len(classes) < 2:
    raise UserError(f"{flag}: {len(files)} image(s) in one folder ({classes[0]!r}); images in class folders need "
                    "one folder per class, 2 or more (e.g. gs://b/images/train/<class>/*.jpg)")
  log(f"schema inference: {len(files)} images in {len(classes)} class folders ({', '.join(classes[:10])}"
      f"{', ...' if len(classes) > 10 else ''})")
  step = max(1, len(files) // _URI_HEADERS_READ)
  column = _Column(formats.IMAGE_FOLDER_IMAGE, present=len(files))
  column.strings.update(files[::step][:_URI_HEADERS_READ])
  image = _image_uri_feature(column, log=log)
  return schema_lib.parse_schema({"features": [image], "label": {"name": formats.IMAGE_FOLDER_LABEL, "type": "string",
                                                                  "vocabulary": classes}}, source="(inferred)")


def _names_in_order(records) -> list[str]:
  names: dict[str, None] = {}
  for _, record in records:
    for name in record:
      names.setdefault(name, None)
  return list(names)


def _check_finite(column: _Column, values, where: str, *, flag: str) -> None:
  """A NaN or infinity would make the column's mean and variance NaN, and every prediction with them."""
  bad = next((v for v in values if not math.isfinite(v)), None)
  if bad is not None:
    raise UserError(f"{flag}: column {column.name!r} at {where} holds {bad}, a NaN or infinite number; remove the "
                    "record or write the value as missing, or give the column's type in a schema.json")


def _observe(column: _Column, value: Any, where: str, *, flag: str) -> None:
  """Adds one value to what the column holds, and where each kind of value first appears (a message about a
  column that mixes kinds names the record where the second kind starts, not the first record)."""
  _observe_value(column, value, where, flag=flag)
  if len(column.kinds) > len(column.first_of_kind):
    for kind in column.kinds:
      column.first_of_kind.setdefault(kind, where)


def _mixed_at(column: _Column) -> str:
  """Where the sample's second kind of value first appears in `column` ("X at PATH line N; Y from PATH line M")."""
  firsts = list(column.first_of_kind.items())
  if len(firsts) < 2:
    return column.where
  (kind, where), (other, other_where) = firsts[0], firsts[1]
  return f"{_KIND_WORDS.get(kind, kind)} from {where}, {_KIND_WORDS.get(other, other)} first at {other_where}"


_KIND_WORDS = {"number": "numbers", "text": "text", "text_list": "lists of class names", "image": "images",
               "raw_bytes": "raw bytes", "float_list": "float_list", "int64_list": "int64_list",
               "bytes_list_multi": "lists of bytes", "other": "other values"}


def _observe_value(column: _Column, value: Any, where: str, *, flag: str) -> None:
  """One value as its format samples it (`DataFormat.sampled`)."""
  if not column.where:
    column.where = where
  if isinstance(value, formats.ExampleValues):
    kind, values = value.kind, value.values
    if not values:
      column.missing += 1
      column.first_missing = column.first_missing or where
      return
    column.present += 1
    if kind in ("float_list", "int64_list"):
      _check_finite(column, values, where, flag=flag)
      column.add_numbers([float(v) for v in values])
      column.kinds[kind] += 1
    else:
      if len(values) != 1:
        column.lengths[len(values)] += 1
        column.kinds["bytes_list_multi"] += 1
        return
      _observe_bytes(column, values[0])
    return
  if value is None or value == "":
    column.missing += 1
    column.first_missing = column.first_missing or where
    return
  column.present += 1
  if isinstance(value, bytes):
    _observe_bytes(column, value)
  elif isinstance(value, bool):
    column.add_numbers([float(value)])
  elif isinstance(value, (int, float)):
    _check_finite(column, [value], where, flag=flag)
    column.add_numbers([float(value)])
  elif isinstance(value, str):
    column.strings[value] += 1
    column.kinds["text"] += 1
    column.first_text = column.first_text or (value, where)
  elif isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
    _check_finite(column, value, where, flag=flag)
    column.add_numbers([float(v) for v in value])
  elif isinstance(value, list) and all(isinstance(v, str) for v in value):  # class names (multi-label; [] none)
    column.strings.update(value)
    column.kinds["text_list"] += 1
  elif isinstance(value, dict) and isinstance(value.get("b64"), str):
    try:
      data = base64.b64decode(value["b64"], validate=True)
    except ValueError:
      raise UserError(f"{flag}: column {column.name!r} at {where} holds a 'b64' value that is not base64") from None
    _observe_bytes(column, data)
  else:
    column.kinds["other"] += 1


def _observe_bytes(column: _Column, data: bytes) -> None:
  size = image_size(data)
  if size is not None:
    column.images[size] += 1
    column.kinds["image"] += 1
    return
  try:
    if _CONTROL_BYTES.intersection(data):  # pixels 0..16 are valid UTF-8, but no text holds NUL..BS
      raise UnicodeDecodeError("utf-8", data, 0, 1, "control bytes")
    column.strings[data.decode("utf-8")] += 1
    column.kinds["text"] += 1
  except UnicodeDecodeError:
    column.kinds["raw_bytes"] += 1
    column.lengths[len(data)] += 1
    column.max_byte = max(column.max_byte, max(data))


def image_size(data: bytes) -> tuple[int, int, int, str] | None:
  """(height, width, channels, encoding) from a PNG, JPEG, GIF or BMP header, None for anything else. Pure
  Python. GIF and BMP palettes are read as colour (3 channels), except an 8-bit BMP (grey, as Pillow writes it)."""
  if data[:4] == b"GIF8" and len(data) >= 10:
    width, height = struct.unpack("<HH", data[6:10])
    return height, width, 3, "gif"
  if data[:2] == b"BM" and len(data) >= 30:
    width, height = struct.unpack("<ii", data[18:26])
    bits = struct.unpack("<H", data[28:30])[0]
    return abs(height), width, 1 if bits == 8 else 3, "bmp"
  if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 26 and data[12:16] == b"IHDR":
    width, height = struct.unpack(">II", data[16:24])
    channels = {0: 1, 4: 1}.get(data[25], 3)  # grey (+alpha) -> 1; RGB, palette, RGBA -> 3
    return height, width, channels, "png"
  if data[:2] == b"\xff\xd8":
    i = 2
    while i + 9 < len(data):
      if data[i] != 0xFF:
        return None
      marker = data[i + 1]
      length = struct.unpack(">H", data[i + 2:i + 4])[0]
      if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
        height, width = struct.unpack(">HH", data[i + 5:i + 9])
        return height, width, 1 if data[i + 9] == 1 else 3, "jpeg"
      i += 2 + length
  return None


def image_problem(data: bytes) -> str | None:
  """Why `data` would not decode as the PNG, JPEG, GIF or BMP image it claims to be, or None. Pure Python (pre-flight
  runs no TensorFlow op): the header, and the structure a decoder fails on, e.g. a file cut short in a copy. A PNG is
  checked whole (each chunk's CRC, the image data inflated to its full size); a JPEG needs its scan and its end
  marker; a GIF its trailer; a BMP as many bytes as its header says. Damage inside a JPEG's compressed scan decodes
  to wrong pixels in TensorFlow too, without an error, so it is not looked for."""
  size = image_size(data)
  if size is None:
    return f"not a PNG, JPEG, GIF or BMP image (it starts {data[:8]!r})"
  height, width, channels, encoding = size
  if encoding == "png":
    return _png_problem(data, height, width)
  if encoding == "jpeg":
    return _jpeg_problem(data)
  if encoding == "gif":
    return None  # giflib reads what a GIF holds; nothing cheap to check past the header
  declared = struct.unpack("<I", data[2:6])[0]
  if 0 < declared <= 1 << 31 and len(data) < declared:
    return f"a BMP cut short ({len(data)} of the {declared} bytes its header says)"
  return None


def _jpeg_problem(data: bytes) -> str | None:
  """A JPEG's segments up to its (first) scan, then an end-of-image marker after it (data may follow, as phones
  write): a file cut short in its scan fails in TensorFlow's decoder ("Invalid JPEG data")."""
  i = 2
  while i + 4 <= len(data):
    if data[i] != 0xFF:
      return f"a damaged JPEG (no segment marker at byte {i})"
    marker = data[i + 1]
    if marker == 0xFF:  # fill byte
      i += 1
      continue
    if marker == 0xDA:
      if data.find(b"\xff\xd9", i) < 0:
        return f"a JPEG cut short ({len(data)} bytes, no end-of-image marker): it does not decode"
      return None
    if marker == 0x01 or 0xD0 <= marker <= 0xD7:
      i += 2
      continue
    i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
  return f"a JPEG cut short ({len(data)} bytes, it ends before its image data): it does not decode"


def _png_problem(data: bytes, height: int, width: int) -> str | None:
  position, compressed, ended = 8, [], False
  while position + 8 <= len(data):
    length = struct.unpack(">I", data[position:position + 4])[0]
    kind = data[position + 4:position + 8]
    body = data[position + 8:position + 8 + length]
    crc = data[position + 8 + length:position + 12 + length]
    if len(body) < length or len(crc) < 4:
      break
    if zlib.crc32(kind + body) != struct.unpack(">I", crc)[0]:
      return f"a damaged PNG (the CRC of its {kind.decode('latin-1')!r} chunk does not match)"
    if kind == b"IDAT":
      compressed.append(body)
    if kind == b"IEND":
      ended = True
      break
    position += 12 + length
  if not ended:
    return f"a PNG cut short ({len(data)} bytes, no IEND chunk): it does not decode"
  try:
    pixels = zlib.decompress(b"".join(compressed))
  except zlib.error as e:
    return f"a damaged PNG (its image data does not inflate: {e})"
  bit_depth, colour = data[24], data[25]
  samples = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour, 1)
  interlaced = data[28] == 1
  needed = height * (1 + -(-width * samples * bit_depth // 8))
  if not interlaced and len(pixels) < needed:
    return f"a damaged PNG ({len(pixels)} of the {needed} bytes of pixels it declares)"
  return None


def _feature(column: _Column, config: InferenceConfig, *, log, warn) -> dict[str, Any] | None:
  name, kinds = column.name, column.kinds
  if column.present == 0:
    log(f"schema inference: {name!r} left out: no value in the sample")
    return None
  dominant = kinds.most_common(1)[0][0]
  if len(kinds) > 1 and not set(kinds) <= {"number", "float_list", "int64_list"}:
    if set(kinds) <= {"number", "text"}:  # values of no type of their own (CSV), or JSON's numbers and strings
      if kinds["number"] >= _NUMERIC_SHARE * (kinds["number"] + kinds["text"]):
        value, where = column.first_text
        raise UserError(f"column {name!r} holds numbers in {kinds['number']} of {column.present} sampled records "
                        f"but {value!r} at {where}; fix or blank those values, or give the column's type in a "
                        "schema.json")
      dominant = "text"  # numbers and words mixed in one column: categorical
    else:
      raise UserError(f"column {name!r} mixes {', '.join(sorted(kinds))} values ({_mixed_at(column)}); write a "
                      "schema.json (python -m trainer.schema_inference) that says which it is")
  if dominant in ("number", "float_list", "int64_list"):
    return _numeric_feature(column, log=log)
  if dominant == "image":
    (height, width, channels, encoding), count = column.images.most_common(1)[0]
    sizes = {size[:3] for size in column.images}  # not the encoding: PNG and JPEG of one size are one size
    if len(sizes) > 1:
      log(f"schema inference: image {name!r} comes in {len(sizes)} sizes; {height}x{width}x{channels} (the most "
          "common) is used, others are resized to it")
    return {"name": name, "type": "image", "shape": [height, width, channels], "encoding": encoding,
            "max_value": 255}
  if dominant == "raw_bytes":
    return _raw_image_feature(column)
  if dominant == "text":
    return _categorical_feature(column, config, log=log, warn=warn)
  raise UserError(f"column {name!r} holds values the trainer cannot use ({column.where}): expected numbers, "
                  "text, fixed-length number arrays or PNG/JPEG bytes")


def _numeric_feature(column: _Column, *, log) -> dict[str, Any] | None:
  name = column.name
  if len(column.lengths) > 1:
    raise UserError(f"column {name!r} has {min(column.lengths)}..{max(column.lengths)} values per record "
                    f"({column.where}); the trainer needs a fixed number: pad the lists, or write a schema.json")
  size = next(iter(column.lengths))
  count = column.lengths[size]
  means = [s / count for s in column.sums]
  stds = [math.sqrt(max(0.0, q / count - m * m)) for q, m in zip(column.squares, means)]
  if all(s < 1e-12 for s in stds):
    log(f"schema inference: {name!r} left out: it is constant in the sample")
    return None
  kind = "int" if column.kinds["int64_list"] else "float"  # an Example's int64_list
  feature: dict[str, Any] = {"name": name, "type": kind}
  if size > 1:
    feature["shape"] = [size]
    feature["mean"] = [round(m, 6) for m in means]
    feature["std"] = [round(s, 6) if s >= 1e-12 else 1.0 for s in stds]
    feature["default"] = round(sum(means) / size) if kind == "int" else 0.0
  else:
    feature["mean"], feature["std"] = round(means[0], 6), round(stds[0], 6)
    feature["default"] = round(means[0]) if kind == "int" else round(means[0], 6)
  if column.missing:
    log(f"schema inference: {name!r} has {column.missing} missing value(s) in the sample; they take the "
        f"default {feature['default']}")
  return feature


def _categorical_feature(column: _Column, config: InferenceConfig, *, log, warn) -> dict[str, Any] | None:
  name, counts = column.name, column.strings
  distinct = len(counts)
  named_images = sum(n for value, n in counts.items() if formats.is_image_file(value))
  if named_images >= _NUMERIC_SHARE * column.present:
    return _image_uri_feature(column, log=log)
  named_texts = sum(n for value, n in counts.items() if value.lower().endswith(".txt"))
  if named_texts >= _NUMERIC_SHARE * column.present:
    return _text_uri_feature(column, config, log=log)
  if distinct == 1 and not column.missing:
    # As a constant number is: one value everywhere teaches nothing, and a column a row filter fixes (a table's
    # split = 'TRAIN') would make every other split's value out of vocabulary.
    log(f"schema inference: {name!r} left out: it is constant in the sample ({next(iter(counts))!r})")
    return None
  mostly_unique = distinct > 100 and distinct > 0.5 * column.present
  if mostly_unique or distinct > _MAX_CATEGORIES_OF_WORDS:
    words = {value: len(feature_kinds.text_tokens(value)) for value in counts}
    mean_words = sum(words[v] * n for v, n in counts.items()) / sum(counts.values())
    # A value per record of a few capitalized words is a name ("Braund, Mr. Owen Harris"), not free text: it would
    # teach the model each training row by heart and make serving require it. Headlines (11 words), reviews and
    # short lower-case utterances ("play some jazz") stay text.
    name_like = (distinct >= NAME_MIN_UNIQUE_SHARE * column.present and mean_words < NAME_MAX_WORDS
                 and _capitalized_share(counts) >= NAME_MIN_CAPITALIZED)
    if mean_words >= TEXT_MIN_WORDS and not (mostly_unique and name_like):
      return _text_feature(column, words, mean_words, config, log=log)
  if mostly_unique:
    warn(f"schema inference: {name!r} left out: {distinct} distinct values in {column.present} records, "
         f"{mean_words:.1f} word(s) each: an id or a name, not a category or free text. To use it as text, give it "
         f"{{\"name\": {name!r}, \"type\": \"text\"}} with a vocabulary in a schema.json (python -m "
         "trainer.data.inference writes one to edit)")
    return None
  kept = [value for value, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
          if count >= config.vocab_min_count][:config.max_vocab_size]
  if not kept:
    log(f"schema inference: {name!r} left out: no value occurs {config.vocab_min_count}+ times in the sample")
    return None
  if len(kept) < distinct:
    log(f"schema inference: {name!r}: {len(kept)} of {distinct} values kept in the vocabulary (seen "
        f"{config.vocab_min_count}+ times); the rest map to the out-of-vocabulary id")
  return {"name": name, "type": "string", "vocabulary": kept, "default": ""}


def _capitalized_share(counts: dict[str, int]) -> float:
  """Of the words (split at spaces) that start with a letter, the share that start with a capital one."""
  letters = capitals = 0
  for value, n in counts.items():
    for word in value.split():
      first = word.lstrip("(\"'")[:1]
      if first.isalpha():
        letters += n
        capitals += n if first.isupper() else 0
  return capitals / letters if letters else 0.0


def _image_uri_feature(column: _Column, *, log) -> dict[str, Any]:
  """An image read by URI: the size and channels of the most common of up to 32 files' headers (read in
  sample order), at most `MAX_INFERRED_IMAGE_SIDE` on a side (larger images are resized to fit)."""
  name = column.name
  uris = list(column.strings)[:_URI_HEADERS_READ]
  sizes: collections.Counter = collections.Counter()
  for uri in uris:
    head = formats.read_head(_gs(uri), _IMAGE_HEAD_BYTES, flag=f"column {name!r}")
    size = image_size(head)
    if size is None:
      raise UserError(f"column {name!r} names {uri}, which is not a PNG, JPEG, GIF or BMP image (it starts "
                      f"{head[:8]!r})")
    sizes[size] += 1
  (height, width, channels, encoding), _ = sizes.most_common(1)[0]
  scale = min(1.0, MAX_INFERRED_IMAGE_SIDE / max(height, width))
  shape = [max(1, round(height * scale)), max(1, round(width * scale)), channels]
  log(f"schema inference: {name!r} holds image URIs ({len(uris)} file header(s) read): an image of "
      f"{shape[0]}x{shape[1]}x{channels} read from the files in the input pipeline"
      + (f" (the most common size, {height}x{width}, scaled to fit {MAX_INFERRED_IMAGE_SIDE}; images of other sizes "
         "are resized to it)" if scale < 1 or len({size[:3] for size in sizes}) > 1 else ""))
  return {"name": name, "type": "image", "uri": True, "shape": shape, "encoding": encoding, "max_value": 255}


def _text_uri_feature(column: _Column, config: InferenceConfig, *, log) -> dict[str, Any]:
  """Text read by URI (Vertex's textGcsUri): the vocabulary of up to 2,000 of the files, read in sample order."""
  texts = _Column(column.name, present=0)
  for uri in list(column.strings)[:_TEXT_FILES_READ]:
    data = formats.read_head(_gs(uri), _TEXT_HEAD_BYTES, flag=f"column {column.name!r}")
    texts.strings[data.decode("utf-8", errors="replace")] += 1
    texts.present += 1
  words = {value: len(feature_kinds.text_tokens(value)) for value in texts.strings}
  mean_words = sum(words.values()) / max(1, len(words))
  log(f"schema inference: {column.name!r} holds text file URIs ({texts.present} file(s) read for the vocabulary)")
  feature = _text_feature(texts, words, mean_words, config, log=log)
  return {**feature, "uri": True}


def gcs_uri(uri: str) -> str:
  """A `/gcs/` path (Vertex's Cloud Storage FUSE mount, as its exports name files) as the gs:// URI it mounts."""
  return _gs(uri)


def _gs(uri: str) -> str:
  return "gs://" + uri[len("/gcs/"):] if uri.startswith("/gcs/") else uri


def _text_feature(column: _Column, words: dict[str, int], mean_words: float, config: InferenceConfig, *,
                  log) -> dict[str, Any] | None:
  """A `text` feature: the words seen `vocab_min_count`+ times (most frequent first, ties in order), and the
  95th percentile of words per value (rounded up to a multiple of 8) as the sequence length."""
  name, counts = column.name, column.strings
  token_counts: collections.Counter = collections.Counter()
  bigram_counts: collections.Counter = collections.Counter()
  for value, count in counts.items():
    tokens = feature_kinds.text_tokens(value)
    for token in tokens:
      token_counts[token] += count
    for pair in zip(tokens, tokens[1:]):
      bigram_counts[pair] += count

  def most_frequent(counter: collections.Counter) -> list:
    return [key for key, count in sorted(counter.items(), key=lambda item: (-item[1], item[0]))
            if count >= config.vocab_min_count][:config.max_vocab_size]

  reserved = set(feature_kinds.RESERVED_TOKENS)
  vocabulary = most_frequent(collections.Counter({t: c for t, c in token_counts.items() if t not in reserved}))
  # Word pairs too ("not good"): measured on Rotten Tomatoes (scripts/bench/models.py), the bag of words and word
  # pairs reaches TF-IDF + logistic regression over both, where the words alone stayed 0.01 below it.
  bigrams = [f"{a} {b}" for a, b in most_frequent(collections.Counter(
      {pair: c for pair, c in bigram_counts.items() if not reserved.intersection(pair)}))]
  if not vocabulary:
    raise UserError(f"column {name!r} is free text ({mean_words:.1f} words per value) but no word occurs "
                    f"{config.vocab_min_count}+ times in the sample; lower --vocab_min_count or sample more rows")
  lengths = sorted(n for value, n in words.items() for _ in range(counts[value]))
  percentile = lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))]
  sequence_length = min(_MAX_SEQUENCE_LENGTH, max(8, -(-percentile // 8) * 8))
  log(f"schema inference: {name!r} is free text ({len(counts)} distinct values in {column.present} records, "
      f"{mean_words:.1f} words on average): type text, {len(vocabulary)} of {len(token_counts)} words and "
      f"{len(bigrams)} of {len(bigram_counts)} word pairs in its vocabulary (seen {config.vocab_min_count}+ times), "
      f"sequence_length {sequence_length}")
  feature: dict[str, Any] = {"name": name, "type": "text", "vocabulary": vocabulary,
                             "sequence_length": sequence_length}
  if bigrams:
    feature["bigrams"] = bigrams
  if column.missing:
    feature["default"] = ""
    log(f"schema inference: {name!r} has {column.missing} missing value(s) in the sample; they read as empty text")
  return feature


def _raw_image_feature(column: _Column) -> dict[str, Any]:
  if len(column.lengths) != 1:
    raise UserError(f"column {column.name!r} holds raw bytes of {len(column.lengths)} different lengths "
                    f"({column.where}); give its image shape in a schema.json")
  size = next(iter(column.lengths))
  for channels in (1, 3):
    side = math.isqrt(size // channels)
    if side * side * channels == size:
      return {"name": column.name, "type": "image", "shape": [side, side, channels], "encoding": "raw",
              "max_value": max(1, column.max_byte)}
  raise UserError(f"column {column.name!r} holds {size} raw bytes per record ({column.where}), not a square "
                  "image; give its shape in a schema.json")


def _label(column: _Column, task: str, *, flag: str, log) -> dict[str, Any]:
  name = column.name
  if column.missing:
    unannotated = " (a data item without an annotation)" if name in formats.VERTEX_LABELS else ""
    raise UserError(f"{flag}: label {name!r} is missing in {column.missing} sampled record(s), the first at "
                    f"{column.first_missing}{unannotated}; every record needs a label")
  if column.kinds["text_list"]:
    if task != "auto" or len(column.kinds) > 1:
      raise UserError(f"{flag}: label {name!r} holds lists of class names ({column.where}), a multi-label task "
                      f"(each class a yes/no); {'drop --task' if task != 'auto' else 'every record needs a list'}")
    classes = sorted(column.strings)
    if len(classes) < 2:
      raise UserError(f"{flag}: label {name!r} names {len(classes)} class(es) in the sample "
                      f"({', '.join(map(repr, classes)) or 'none'}); a multi-label classifier needs 2 or more")
    log(f"schema inference: label {name!r}: multi-label classification over {len(classes)} class names (each "
        "a yes/no)")
    return {"name": name, "type": "string", "vocabulary": classes, "multi_label": True}
  if column.kinds["text"]:
    if task == "regression":
      raise UserError(f"--task=regression: label {name!r} holds text (e.g. {column.strings.most_common(1)[0][0]!r})")
    classes = sorted(column.strings)
    if column.kinds["number"]:
      raise UserError(f"{flag}: label {name!r} mixes numbers and text ({_mixed_at(column)}); use one kind of value")
    if len(classes) < 2:
      raise UserError(f"{flag}: label {name!r} has a single value {classes[0]!r} in the sample; a classifier "
                      "needs 2 or more classes")
    log(f"schema inference: label {name!r}: classification over {len(classes)} class names")
    return {"name": name, "type": "string", "vocabulary": classes}
  if not column.kinds["number"] or len(column.lengths) != 1 or next(iter(column.lengths)) != 1:
    raise UserError(f"{flag}: label {name!r} must be one number or one string per record ({_mixed_at(column)})")
  minimum, maximum, distinct = _label_range(column)
  whole = column.integral and minimum >= 0
  if task == "auto":
    task = "classification" if whole and distinct <= MAX_CLASSES_GUESSED and maximum >= 1 else "regression"
    log(f"schema inference: label {name!r}: {task} ({distinct} distinct value(s), {minimum:g}..{maximum:g}; "
        f"--task={'regression' if task == 'classification' else 'classification'} to override)")
  if task == "classification":
    if not whole:
      raise UserError(f"--task=classification: label {name!r} holds values that are not whole numbers >= 0 "
                      f"({minimum:g}..{maximum:g}); class ids must be 0, 1, 2, ...")
    if column.kinds["float_list"] and not column.kinds["int64_list"]:  # an Example's float_list
      raise UserError(f"{flag}: label {name!r} is a float_list; a classification label must be an int64_list "
                      "or text")
    return {"name": name, "type": "int", "num_classes": max(2, int(maximum) + 1)}
  if column.kinds["int64_list"]:
    raise UserError(f"{flag}: label {name!r} is an int64_list; a regression label must be a float_list "
                    "(or pass --task=classification)")
  count = column.lengths[1]
  mean = column.sums[0] / count
  std = math.sqrt(max(0.0, column.squares[0] / count - mean * mean))
  label: dict[str, Any] = {"name": name, "type": "float", "mean": round(mean, 6)}
  if std > 1e-12:
    label["std"] = round(std, 6)
  return label


def _label_range(column: _Column) -> tuple[float, float, int]:
  return column.minimum, column.maximum, len(column.distinct)


def check_inference_config(config: InferenceConfig) -> None:
  if config.task not in config_lib.TASKS:
    raise UserError(f"--task={config.task!r}; expected one of {', '.join(config_lib.TASKS)}")
  for flag, value in (("--infer_sample_rows", config.sample_rows), ("--vocab_min_count", config.vocab_min_count),
                      ("--max_vocab_size", config.max_vocab_size)):
    if value < 1:
      raise UserError(f"{flag} must be a positive integer, got {value}")

