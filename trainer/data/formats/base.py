"""What every data format shares: `Source` (how one split's files are read), the `DataFormat` class each format
module subclasses and registers, and reading files in plain Python (compression, text, the first bytes).

Compression is read from each file's first bytes (gzip's magic, zlib's header), not trusted from the name: Beam
and Dataflow write `*.tfrecord.gz`, `gsutil -Z` and some exporters gzip files whose names do not say so.
The plain-Python side runs before the strategy is built, so it reads files through `tf.io.gfile` and Python's
own gzip/zlib, and runs no TensorFlow op. The TensorFlow side (`DataFormat.tf_batches`, `tf_batch_parser`) is
what `input_pipeline` builds each pipeline's dataset from, inside `dataset_fn`.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import zlib
from typing import Any, Callable, Iterator

from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data.feature_kinds import Kind
from trainer.data.feature_kinds import STRING

COMPRESSED_EXTENSIONS = {".gz": "GZIP", ".gzip": "GZIP", ".zz": "ZLIB", ".zlib": "ZLIB", ".deflate": "ZLIB"}
_GZIP_MAGIC = b"\x1f\x8b"
_SNIFFED_FILES = 16  # files whose first bytes are read to check one compression under a pattern
HEAD_BYTES = 64 * 1024
# Keys of the records `DataFormat.records` yields for a line that holds no record (checked by
# preflight.record_problem).
BLANK_LINE = "\0blank line"
FIELD_COUNT = "\0field count"
MISSING = type("Missing", (), {"__repr__": lambda self: "MISSING"})()  # a record's value that is absent, null or empty
MAX_PARALLEL_FILES = 16  # files one input pipeline reads at once
READ_BUFFER_BYTES = 1 << 20  # large reads: few requests per gs:// object


@dataclasses.dataclass(frozen=True)
class Source:
  """How to read one split's files: resolved once in pre-flight, then passed to every reader."""

  format: str  # a registered DataFormat's name: tfrecord | csv | jsonl | parquet | image_folder
  compression: str = ""  # "" | GZIP | ZLIB (TensorFlow's compression_type names)
  columns: tuple[str, ...] | None = None  # CSV: every column, in file order
  header: bool = False  # CSV: the first line of each file is a header row
  multiline: bool = False  # CSV: quoted fields hold line breaks (pandas writes free text so): read by CsvDataset
  # Vertex's export JSONL with ml_use labels: read only the lines of this split ("training" also keeps lines
  # without one, which Vertex would assign to training by default).
  ml_use: str | None = None

  def describe(self) -> str:
    data_format = FORMATS[self.format]
    kind = data_format.display_name
    text = f"{self.compression.lower()} {kind}" if self.compression else kind
    if self.ml_use:
      text += f" (the lines whose ml_use is {self.ml_use}{' or unset' if self.ml_use == 'training' else ''})"
    return text + data_format.details(self)


class ValueProblem(ValueError):
  """A record's value this format cannot hold as the schema says: the message is the clause pre-flight reports."""


def non_finite_problem(what: str, name: str, value: Any, feature) -> str:
  """A NaN or infinity would train on silently into a NaN model: refused, with what to write instead."""
  from trainer.data import features as features_lib  # pylint: disable=g-import-not-at-top

  instead = ("leave the value out for the schema's default" if feature is not None and feature.default is not None
             else "remove the record or give the column a value")
  return f"{what} {name!r} holds {value!r}, {features_lib.NON_FINITE}; {instead}"


@dataclasses.dataclass(frozen=True)
class ExampleValues:
  """One feature of a tf.train.Example as schema inference observes it: its list kind and values."""

  kind: str | None  # "float_list" | "int64_list" | "bytes_list" | None (an empty feature)
  values: list


def python_value(name: str, value: Any, *, kind: Kind, count: int, ints_as_text: bool = False) -> Any:
  """A JSON or pyarrow value as the value model holds `kind`: a list of `count` numbers, a str (an int too where
  `ints_as_text`: a column of ids read as strings), or a number."""
  if count > 1:
    if not (isinstance(value, list) and len(value) == count
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
      raise ValueProblem(f"column {name!r} holds {str(value)[:40]}; the schema expects a list of {count} numbers")
  elif kind.holds == STRING:
    if not isinstance(value, str) and not (ints_as_text and isinstance(value, int)):
      raise ValueProblem(f"column {name!r} holds {value!r}, but the schema says {kind.type} (a string)")
  elif not isinstance(value, (int, float)):
    raise ValueProblem(f"column {name!r} holds {value!r}, but the schema says {kind.type} (a number)")
  return value


@dataclasses.dataclass(frozen=True)
class ReadPlan:
  """What one input pipeline reads and how (from the strategy's `InputContext`, in `input_pipeline`)."""

  batch_size: int  # records per batch: the per-replica batch size
  num_pipelines: int = 1
  pipeline_id: int = 0
  shard_files: bool = False  # each pipeline reads its own files (at least as many files as pipelines)
  training: bool = False  # full batches only; the order may follow the fastest file
  repeat: bool = False
  shuffle: bool = False  # shuffle what can be shuffled before parsing (the file order)
  seed: int | None = None
  deterministic: bool = False  # the same order every run

  @property
  def shard_records(self) -> bool:
    """Fewer files than pipelines: every pipeline reads every file and keeps every n-th record."""
    return self.num_pipelines > 1 and not self.shard_files

  @property
  def flag(self) -> str:
    return "--train_data" if self.training else "--eval_data"


class DataFormat:
  """One data format, everything the trainer asks of it: how to recognise its files (extensions, Vertex's
  AIP_DATA_FORMAT names, their content), how to describe, read, count and check them in plain Python, and how
  TensorFlow reads them in the input pipeline (raw batches, then one parse per batch).

  A format is one module in `trainer/data/formats/` with one subclass decorated `@register`; the package imports
  every module in it, so nothing else lists the formats."""

  name: str = ""  # Source.format, and --data_format's value
  display_name: str = ""  # in messages: "CSV", "gzip CSV"
  extensions: tuple[str, ...] = ()  # file names that claim the format (before an optional .gz / .zz)
  vertex_names: tuple[str, ...] = ()  # AIP_DATA_FORMAT values (Vertex managed datasets) that mean it
  flag_value: bool = True  # a --data_format choice (image folders are only ever detected)
  sniff_order: int | None = None  # where `sniff` runs among the formats (lower first); None: never by content
  holds_label_lists: bool = False  # a record can hold a list of class names (a multi-label label)
  value_word: str = "column"  # how messages name one value of a record ("feature" in TFRecord)
  columns_ordered: bool = True  # a record's columns have an order of their own (an Example's map has none)
  # Each file is one record and its folder the label (images in class folders): the label is implied, pre-flight
  # samples files, messages name the file alone, and schema inference reads the listing.
  files_are_records: bool = False
  splits_by_ml_use: bool = False  # a Vertex export of every split in one file: its lines' ml_use labels split it
  converts_to_examples: bool = False  # `examples.from_file` writes its records as tf.train.Examples (stage_data)
  holds_examples: bool = False  # its records are serialized tf.train.Examples already (staged as they are)
  # Its "files" are files (not tables named by URI, such as bq://): their bytes tell compression and format.
  reads_files: bool = True
  unit: str = "file"  # what one of a split's listed items is, in messages ("table" for bq://)

  def configure(self, environ) -> None:
    """Reads the process environment a run was given (an emulator's address: BigQuery's), once per run."""
    del environ

  def claims_listing(self, files: list[str]) -> bool:
    """Whether the listed files as a whole are this format (image folders: every file an image)."""
    del files
    return False

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    """Whether the first file's content is this format (run in `sniff_order`, the first True wins)."""
    raise NotImplementedError

  def details(self, source: Source) -> str:
    """More for `Source.describe` (CSV: its columns and header)."""
    del source
    return ""

  def records(self, path: str, source: Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, {column: value}) of each record of one file, in plain Python: `where` names it in messages."""
    raise NotImplementedError

  def count(self, files: list[str], source: Source) -> int:
    """Records in `files` (one pass; used to turn --epochs into steps)."""
    raise NotImplementedError

  def check_schema(self, schema, source: Source, files: list[str], *, flag: str) -> None:
    """Refuses a schema the files cannot hold (a UserError naming `flag`)."""
    del schema, source, files, flag

  # ----- a record's values in the trainer's value model (what pre-flight checks and the Example writer writes) ---

  def present_value(self, name: str, value: Any, *, kind: Kind, count: int, record: dict[str, Any]) -> Any:
    """`value` (as `records` yields it) or MISSING where the input pipeline reads none and takes the schema's
    default: absent or null, or "" where a number belongs (JSON and Parquet values, the default here; a "" string
    is a string). Raises ValueProblem for a value whose container cannot be the schema's (TFRecord: another
    list kind or length)."""
    del name, count, record
    return MISSING if value is None or (value == "" and kind.holds != STRING) else value

  def missing_problem(self, name: str, record: dict[str, Any], feature) -> str:
    """The clause for a MISSING value the schema gives no default (`feature` None: the label)."""
    del record
    return f"{self.value_word} {name!r} is empty" + ("" if feature is None else " and the schema gives it no default")

  def sampled(self, value: Any) -> Any:
    """A value as schema inference observes it: None (absent), a str, a number, bytes, a list, a dict (JSON), or
    `ExampleValues` (TFRecord's typed lists). Default: the value as `records` yields it (JSON, pyarrow)."""
    return value

  def check_split(self, files: list[str], *, flag: str) -> None:
    """Refuses one split's files that cannot be read alike (Parquet: parts whose column types differ), before
    training; cheap (Parquet reads footers only)."""
    del files, flag

  def parameter_server_problem(self) -> str | None:
    """Why ParameterServerStrategy cannot read this format (its workers run the input pipeline as a graph,
    without Python), or None."""
    return None

  def check_for_inference(self, files: list[str], *, label: str | None, flag: str) -> None:
    """Refuses, before sampling, files schema inference cannot read alike (Parquet: files whose column types
    differ, a column no schema type holds)."""
    del files, label, flag

  def typed_value(self, name: str, value: Any, *, kind: Kind, count: int, feature) -> Any:
    """A present value as the trainer's value model holds a `kind` (by `kind.holds`): a str (STRING), a number or
    a list of `count` numbers (NUMBER), bytes (BYTES: an image's encoded or raw bytes). Raises ValueProblem for a
    value of another type (the format's own words). Default: the value is already so (checked by the model's
    rules)."""
    del name, kind, count, feature
    return value

  def settled(self, source: Source, first_file: str, schema, *, csv_columns: tuple[str, ...] | None = None,
              csv_multiline: bool | None = None, flag: str) -> Source:
    """The split's source once its first file is read (CSV: its columns and header). `schema` is None before
    one is inferred; `csv_*` are the reading flags of that name (formats other than CSV have none)."""
    del first_file, schema, csv_columns, csv_multiline, flag
    return source

  # ----- the TensorFlow side (called inside `dataset_fn`; TensorFlow is imported there) ----------------------

  def tf_batches(self, files: list[str], schema, source: Source, plan: ReadPlan):
    """A `tf.data.Dataset` of raw batches (what `tf_batch_parser` takes) for one input pipeline. By default the
    records of each file (`tf_file_records`), files interleaved, sharded by file or by record, batched."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if plan.shard_files:
      file_ds = file_ds.shard(plan.num_pipelines, plan.pipeline_id)
    num_files = len(files[plan.pipeline_id::plan.num_pipelines]) if plan.shard_files else len(files)
    if plan.shuffle:
      file_ds = file_ds.shuffle(num_files, seed=plan.seed, reshuffle_each_iteration=True)
    if plan.repeat:
      file_ds = file_ds.repeat()
    ds = file_ds.interleave(
        self.tf_file_records(schema, source),
        cycle_length=min(num_files, MAX_PARALLEL_FILES),
        num_parallel_calls=tf.data.AUTOTUNE,
        # Record sharding needs the same order on every pipeline; otherwise let the fastest file win.
        deterministic=plan.deterministic or plan.shard_records or not plan.training)
    if plan.shard_records:
      ds = ds.shard(plan.num_pipelines, plan.pipeline_id)
    return batched(ds, plan)

  def tf_file_records(self, schema, source: Source) -> Callable:
    """path -> a `tf.data.Dataset` of that file's records (the default `tf_batches` interleaves these)."""
    raise NotImplementedError

  def tf_batch_parser(self, schema, source: Source) -> Callable:
    """A batch from `tf_batches` -> ({column: raw tensor}, raw label): parsed, not yet checked nor encoded."""
    raise NotImplementedError


# name -> the format, in registration order (the package imports its modules alphabetically).
FORMATS: dict[str, DataFormat] = {}


def register(cls: type[DataFormat]) -> type[DataFormat]:
  """Class decorator: the format's one instance joins FORMATS under its name."""
  if not cls.name or cls.name in FORMATS:
    raise ValueError(f"data format {cls.__name__}: its name {cls.name!r} is empty or taken")
  FORMATS[cls.name] = cls()
  return cls


# ----- compression and reading bytes -------------------------------------------------------------------------


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


def one_compression(files: list[str], *, flag: str) -> str:
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


def text_head(path: str, compression: str, *, flag: str) -> str:
  with open_text(path, compression, flag=flag) as f:
    try:
      return f.read(HEAD_BYTES)
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


def split_label(columns: dict, schema) -> tuple[dict, Any]:
  """({feature column: tensor}, the label's tensor) from every parsed column."""
  columns = dict(columns)
  target = columns.pop(schema.label.name)
  return columns, target


def text_lines(path, source: Source, *, skip: int = 0, keep=None):
  """A file's lines as a `tf.data.Dataset` (CSV without its header, JSONL), `keep` a per-line filter."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  lines = tf.data.TextLineDataset(path, compression_type=source.compression, buffer_size=READ_BUFFER_BYTES)
  return lines.filter(keep) if keep is not None else lines.skip(skip)


def count_text_lines(files: list[str], source: Source, *, skip: int = 0, keep=None) -> int:
  """Non-blank lines of text files (CSV, JSONL), less `skip` per file, those `keep` keeps (a tf.data predicate)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  ds = tf.data.Dataset.from_tensor_slices(files).interleave(
      lambda path: tf.data.TextLineDataset(path, compression_type=source.compression).skip(skip),
      num_parallel_calls=tf.data.AUTOTUNE).filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
  if keep is not None:
    ds = ds.filter(keep)
  return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def batched(records, plan: ReadPlan):
  """One pipeline's records in batches of the plan's size: whole batches when training (every replica steps alike);
  in file order where the plan must be reproducible or is evaluating."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return records.batch(plan.batch_size, drop_remainder=plan.training, num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=plan.deterministic or not plan.training)
