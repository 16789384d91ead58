"""Parquet files (pandas, Spark and BigQuery exports), read with pyarrow, the library built for them.

TensorFlow has no Parquet reader of its own (tensorflow-io's is not built for current TensorFlow), so the input
pipeline is a `tf.data.Dataset.from_generator` over pyarrow's record batches: Python reads whole column chunks
(no Python per value for numbers; strings become one NumPy array per batch) and hands TensorFlow batches of the
size the step takes. That needs Python in the process that runs the dataset, which every strategy has except
ParameterServerStrategy, whose workers run the dataset function without Python (`parameter_server_problem`).

pyarrow is imported only when Parquet is read (the `parquet` extra: `pip install '.[parquet]'`); nothing else needs it.
"""

from __future__ import annotations

import io
import random
from typing import Any, Iterator

from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data import schema as schema_lib
from trainer.data.feature_kinds import BYTES
from trainer.data.feature_kinds import Kind
from trainer.data.feature_kinds import NUMBER
from trainer.data.feature_kinds import STRING
from trainer.data.formats import base

MAGIC = b"PAR1"
_OPEN_AHEAD = 4
_READ_ROWS = 8192  # rows per pyarrow record batch when reading a few records in plain Python
_WHOLE_READ_BYTES = 64 << 20  # remote files up to this size are read in one request; larger ones are streamed
# Rows per call into Python in the input pipeline: the fixed cost per call is most of the time at 1,024.
CHUNK_ROWS = 65_536
# Files opened (remote ones: downloaded) ahead of the one being read, in threads: a small file's request latency
# otherwise stalls the pipeline (measured: gs:// at 0.35 of local with one file ahead, 8 files of 90 KiB).


@base.register
class ParquetFormat(base.DataFormat):
  name = "parquet"
  display_name = "Parquet"
  extensions = (".parquet", ".pq")
  sniff_order = 10  # first: its magic number

  def sniff(self, path: str, compression: str, *, flag: str) -> bool:
    return not compression and base.read_head(path, 4, flag=flag) == MAGIC

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    return iter_rows(path, flag=flag)

  def count(self, files: list[str], source: base.Source) -> int:
    return sum(num_rows(path, flag="--train_data") for path in files)

  def check_schema(self, schema, source: base.Source, files: list[str], *, flag: str) -> None:
    check_types(files[0], schema, flag=flag)

  converts_to_examples = True

  def check_split(self, files: list[str], *, flag: str) -> None:
    check_files_agree(files, flag=flag)

  def parameter_server_problem(self) -> str | None:
    return ("Parquet cannot be read under ParameterServerStrategy: its workers run the input pipeline without "
            "Python, and TensorFlow has no Parquet op. Convert the files to TFRecord, CSV or JSONL (e.g. pandas: "
            "pd.read_parquet(path).to_csv(...)), or train under a synchronous strategy (one machine, or chief + "
            "workers without parameter servers)")

  def check_for_inference(self, files: list[str], *, label: str | None, flag: str) -> None:
    check_files_agree(files, flag=flag)  # else a column typed otherwise in one file would be sampled as mixed
    unreadable = {name: kind for name, kind in unreadable_columns(files[0], flag=flag).items() if name != label}
    if unreadable:
      name, kind = next(iter(unreadable.items()))
      raise UserError(f"{flag}: {files[0]}: column {name!r} is Parquet type {kind}, which no schema type holds "
                      f"({len(unreadable)} such column(s): {', '.join(unreadable)}); cast it to a number or string "
                      "before writing (e.g. a timestamp to epoch seconds), or give a schema.json without it")

  def typed_value(self, name: str, value: Any, *, kind: Kind, count: int, feature) -> Any:
    """pyarrow's Python values: an image is binary; an int column may be read as strings (ids)."""
    if kind.holds == BYTES:
      if not isinstance(value, bytes):
        raise base.ValueProblem(f"column {name!r} holds {str(value)[:40]!r}; an image is binary (bytes) in Parquet")
      return value
    return base.python_value(name, value, kind=kind, count=count, ints_as_text=True)

  def tf_batches(self, files: list[str], schema, source: base.Source, plan: base.ReadPlan):
    """Python (pyarrow) hands over chunks of many batches of raw columns, cut into batches by `rebatch`."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    mine = files[plan.pipeline_id::plan.num_pipelines] if plan.shard_files else files
    keep_every, keep_offset = (plan.num_pipelines, plan.pipeline_id) if plan.shard_records else (1, 0)
    chunk = plan.batch_size * max(1, CHUNK_ROWS // plan.batch_size)

    def generate():
      yield from batches(mine, schema, batch_size=chunk, repeat=plan.repeat,
                         shuffle=plan.shuffle and not plan.shard_records, seed=plan.seed, keep_every=keep_every,
                         keep_offset=keep_offset, drop_remainder=False, flag=plan.flag)

    ds = tf.data.Dataset.from_generator(generate, output_signature=output_signature(schema))
    ds = ds.map(lambda batch: strings_from_buffers(batch, schema), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.rebatch(plan.batch_size, drop_remainder=plan.training)

  def tf_batch_parser(self, schema, source: base.Source):
    return lambda columns: base.split_label(columns, schema)


def _pyarrow(flag: str):
  try:
    import pyarrow  # pylint: disable=g-import-not-at-top
    import pyarrow.compute  # pylint: disable=g-import-not-at-top,unused-import
    import pyarrow.parquet  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UserError(f"{flag}: reading Parquet needs pyarrow: pip install 'vertex-tf-trainer[parquet]' (or "
                    "pyarrow) into the image, or convert the files to CSV, JSONL or TFRecord") from None
  return pyarrow


class _SeekableGFile(io.RawIOBase):
  """`tf.io.gfile.GFile` as the seekable stream pyarrow reads a footer and column chunks from."""

  def __init__(self, gfile):
    self._gfile = gfile

  def readable(self):
    return True

  def seekable(self):
    return True

  def readinto(self, buffer):
    data = self._gfile.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)

  def seek(self, offset, whence=io.SEEK_SET):
    if whence == io.SEEK_END:
      offset, whence = self._gfile.size() + offset, io.SEEK_SET
    elif whence == io.SEEK_CUR:
      offset, whence = self._gfile.tell() + offset, io.SEEK_SET
    self._gfile.seek(offset)
    return self._gfile.tell()

  def tell(self):
    return self._gfile.tell()

  def close(self):
    self._gfile.close()
    super().close()


def _open(path: str, *, flag: str):
  """A pyarrow ParquetFile: local files by pyarrow itself, others (gs://) through `tf.io.gfile`, so remote storage
  goes the trainer's one way (its emulator and credentials settings included)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  pa = _pyarrow(flag)
  try:
    if "://" not in path:
      return pa.parquet.ParquetFile(path)
    gfile = tf.io.gfile.GFile(path, "rb")
    if gfile.size() <= _WHOLE_READ_BYTES:
      # One request for the object: pyarrow reads a footer, then each column chunk, each a seek and a read,
      # which as HTTP range requests cost gs:// 8x the local speed (measured with the emulator).
      with gfile:
        return pa.parquet.ParquetFile(pa.BufferReader(gfile.read()))
    return pa.parquet.ParquetFile(io.BufferedReader(_SeekableGFile(gfile), buffer_size=1 << 20))
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot read {path}: {first_line(e)}") from None
  except (pa.ArrowException, OSError) as e:
    raise UserError(f"{flag}: {path} is not a readable Parquet file ({first_line(e)})") from None


def column_types(path: str, *, flag: str) -> dict[str, Any]:
  """{column: Arrow type} of the file's schema (nested structs are not flattened: they are refused by name)."""
  schema = _open(path, flag=flag).schema_arrow
  return {field.name: field.type for field in schema}


def num_rows(path: str, *, flag: str) -> int:
  """Rows in the file, from its footer (no data is read)."""
  return _open(path, flag=flag).metadata.num_rows


def iter_rows(path: str, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """("row N", {column: Python value}) of each row, as pyarrow converts them (None for a null)."""
  pa = _pyarrow(flag)
  number = 0
  try:
    for batch in _open(path, flag=flag).iter_batches(batch_size=_READ_ROWS):
      for row in batch.to_pylist():
        number += 1
        yield f"row {number}", row
  except pa.ArrowException as e:
    raise UserError(f"{flag}: {path} cannot be read as Parquet after row {number} ({first_line(e)})") from None


def type_problem(arrow_type, kind: Kind, *, values_per_example: int = 1) -> str | None:
  """Why a column of `arrow_type` cannot hold a schema value of `kind`, or None."""
  pa = _pyarrow("--train_data")
  types = pa.types
  if types.is_dictionary(arrow_type):
    arrow_type = arrow_type.value_type
  numeric = types.is_integer(arrow_type) or types.is_floating(arrow_type) or types.is_boolean(arrow_type)
  if kind.holds == NUMBER:
    if values_per_example > 1:
      if (types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type)) and (
          types.is_integer(arrow_type.value_type) or types.is_floating(arrow_type.value_type)):
        return None
      return f"a list of {values_per_example} numbers"
    return None if numeric else "numbers (integer, floating point or boolean)"
  if kind.holds == STRING:
    if types.is_string(arrow_type) or types.is_large_string(arrow_type) or types.is_integer(arrow_type):
      return None
    return "strings"
  if kind.holds == BYTES:
    return None if types.is_binary(arrow_type) or types.is_large_binary(arrow_type) else "binary (image bytes)"
  return "a type the trainer reads"


def _kind_of(arrow_type) -> str:
  """A column's type as the trainer reads it: numbers (any width), strings, binary, a list, or the type itself."""
  types = _pyarrow("--train_data").types
  if types.is_dictionary(arrow_type):
    arrow_type = arrow_type.value_type
  if types.is_integer(arrow_type) or types.is_floating(arrow_type) or types.is_boolean(arrow_type):
    return "numbers"
  if types.is_string(arrow_type) or types.is_large_string(arrow_type):
    return "strings"
  if types.is_binary(arrow_type) or types.is_large_binary(arrow_type):
    return "binary"
  return str(arrow_type)


def check_files_agree(files: list[str], *, flag: str) -> None:
  """Every file of a split holds each column as the same kind of value (footers only). Parts written at other
  times (a column cast to text in one) would otherwise make inference drop the column, or training fail late."""
  first: dict[str, tuple[str, str, Any]] = {}  # column -> (kind, file, type) as first seen
  for path in files:
    for name, arrow_type in column_types(path, flag=flag).items():
      kind = _kind_of(arrow_type)
      seen = first.setdefault(name, (kind, path, arrow_type))
      if seen[0] != kind:
        raise UserError(f"{flag}: column {name!r} is Parquet type {seen[2]} in {seen[1]} but {arrow_type} in {path}; "
                        "the files of a split must agree: write them with one schema (pandas: cast the column "
                        "before to_parquet)")


def check_types(path: str, schema: schema_lib.Schema, *, flag: str) -> None:
  """Every schema column is in the file, with an Arrow type that holds its kind; else one line naming it."""
  problem = type_mismatch(column_types(path, flag=flag), schema, where=f"{flag}: {path}")
  if problem:
    name, found, kind, wanted = problem
    raise UserError(f"{flag}: {path}: column {name!r} is Parquet type {found}, which cannot hold the schema's "
                    f"{kind.type}; expected {wanted}: cast it (pandas: df[{name!r}].astype(...)) before writing, "
                    "or leave it out of the schema")


def type_mismatch(found: dict[str, Any], schema: schema_lib.Schema, *,
                  where: str) -> tuple[str, Any, Kind, str] | None:
  """The first schema column `found` ({column: Arrow type}) cannot hold, as (column, its type, the schema's kind,
  what would hold it); a column `found` lacks is a UserError ("`where` has no column ...")."""
  for name in schema.columns:
    if name not in found:
      raise UserError(f"{where} has no column {name!r} (its columns: {', '.join(found)})")
    if name == schema.label.name:
      kind, count = schema.label.kind, 1
    else:
      feature = schema.feature(name)
      kind, count = feature.kind, feature.values_per_example
    wanted = type_problem(found[name], kind, values_per_example=count)
    if wanted:
      return name, found[name], kind, wanted
  return None


def unreadable_columns(path: str, *, flag: str) -> dict[str, str]:
  """{column: Arrow type} of the columns no schema kind holds (timestamps, structs, maps, ...): schema inference
  names them instead of guessing."""
  return unreadable_types(column_types(path, flag=flag))


def unreadable_types(found: dict[str, Any]) -> dict[str, str]:
  """{column: Arrow type} of the columns of `found` ({column: Arrow type}) no schema kind holds."""
  types = _pyarrow("--train_data").types
  problems = {}
  for name, arrow_type in found.items():
    value_type = arrow_type.value_type if types.is_dictionary(arrow_type) else arrow_type
    if not (types.is_integer(value_type) or types.is_floating(value_type) or types.is_boolean(value_type)
            or types.is_string(value_type) or types.is_large_string(value_type) or types.is_binary(value_type)
            or types.is_large_binary(value_type) or types.is_null(value_type)
            or ((types.is_list(value_type) or types.is_large_list(value_type) or types.is_fixed_size_list(value_type))
                and (types.is_integer(value_type.value_type) or types.is_floating(value_type.value_type)))):
      problems[name] = str(arrow_type)
  return problems


def batches(files: list[str], schema: schema_lib.Schema, *, batch_size: int, repeat: bool, shuffle: bool,
            seed: int | None, keep_every: int = 1, keep_offset: int = 0, drop_remainder: bool = True,
            flag: str) -> Iterator[dict]:
  """Batches of `batch_size` rows as {column: NumPy array} (numbers float32; strings and bytes as the buffers
  `strings_from_buffers` cuts apart); after the last pass (`repeat` False) the partial batch left, unless
  `drop_remainder`. The file order is reshuffled every pass when `shuffle`; the next files are opened (on gs://:
  downloaded) in threads while this one is read. `keep_every`/`keep_offset` keep every n-th row (record
  sharding)."""
  return rebatched(_file_batches(files, list(schema.columns), batch_size=batch_size, repeat=repeat, shuffle=shuffle,
                                 seed=seed, flag=flag),
                   schema, batch_size=batch_size, keep_every=keep_every, keep_offset=keep_offset,
                   drop_remainder=drop_remainder, flag=flag)


def _file_batches(files: list[str], columns: list[str], *, batch_size: int, repeat: bool, shuffle: bool,
                  seed: int | None, flag: str) -> Iterator[tuple[str, Any]]:
  """(path, pyarrow RecordBatch of `columns`) of every file in turn, the next files opened in threads."""
  import collections  # pylint: disable=g-import-not-at-top
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import itertools  # pylint: disable=g-import-not-at-top

  rng = random.Random(seed)

  def paths():
    while True:
      order = list(files)
      if shuffle:
        rng.shuffle(order)
      yield from order
      if not repeat:
        return

  with concurrent.futures.ThreadPoolExecutor(_OPEN_AHEAD) as opener:
    upcoming = paths()
    opening = collections.deque((path, opener.submit(_open, path, flag=flag))
                                for path in itertools.islice(upcoming, _OPEN_AHEAD))
    while opening:
      current_path, future = opening.popleft()
      current = future.result()
      path = next(upcoming, None)
      if path is not None:
        opening.append((path, opener.submit(_open, path, flag=flag)))
      for batch in current.iter_batches(batch_size=max(batch_size, 1024), columns=columns):
        yield current_path, batch


def rebatched(record_batches: Iterator[tuple[str, Any]], schema: schema_lib.Schema, *, batch_size: int,
              keep_every: int = 1, keep_offset: int = 0, drop_remainder: bool = True, flag: str) -> Iterator[dict]:
  """(where, pyarrow RecordBatch) pairs as `batches` yields them: cut into batches of `batch_size` rows, every
  n-th row kept (`keep_every`/`keep_offset`), nulls checked against the schema's defaults (`where` names the
  file or table in messages). Shared by every Arrow source (Parquet files, BigQuery's read streams)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  pa = _pyarrow(flag)
  pending: list = []
  pending_rows = 0
  row_index = 0
  where = ""
  for where, batch in record_batches:
    if keep_every > 1:
      first = (keep_offset - row_index) % keep_every
      row_index += batch.num_rows
      batch = batch.take(pa.array(np.arange(first, batch.num_rows, keep_every)))
    pending.append(batch)
    pending_rows += batch.num_rows
    while pending_rows >= batch_size:
      table = pa.Table.from_batches(pending)
      yield _columns(table.slice(0, batch_size), schema, path=where, flag=flag)
      rest = table.slice(batch_size)
      pending, pending_rows = rest.to_batches(), rest.num_rows
  if pending_rows and not drop_remainder:
    yield _columns(pa.Table.from_batches(pending), schema, path=where, flag=flag)


def _columns(table, schema: schema_lib.Schema, *, path: str, flag: str) -> dict:
  """One batch's columns as NumPy arrays; a null without a schema default is a data error naming the column."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from trainer.data import features as features_lib  # pylint: disable=g-import-not-at-top

  pa = _pyarrow(flag)
  out = {}
  for name in schema.columns:
    column = table.column(name)
    if pa.types.is_dictionary(column.type):
      column = column.cast(column.type.value_type)
    feature = None if name == schema.label.name else schema.feature(name)
    holds = (feature or schema.label).kind.holds
    if column.null_count:
      default = feature.default if feature is not None else None
      if default is None:
        # The prefix makes data_errors treat it as bad data, then find and name the row in plain Python.
        raise ValueError(f"{features_lib.CHECK_PREFIX} column {name!r} holds a null in {path} and the "
                         "schema gives it no default")
      column = pa.compute.fill_null(column, default)
    if holds in (STRING, BYTES):
      out[name + _DATA], out[name + _OFFSETS] = _string_buffers(column, pa, binary=holds == BYTES)
    elif feature is not None and feature.values_per_example > 1:
      size = feature.values_per_example
      lengths = pa.compute.list_value_length(column).to_numpy(zero_copy_only=False)
      if (lengths != size).any():
        raise ValueError(f"{features_lib.CHECK_PREFIX} column {name!r} must hold {size} numbers per row "
                         f"({path})")
      out[name] = np.asarray(pa.compute.list_flatten(column).to_numpy(zero_copy_only=False),
                             np.float32).reshape(-1, size)
    else:
      out[name] = np.asarray(column.to_numpy(zero_copy_only=False), np.float32)
  return out


# A string or binary column crosses from Python to TensorFlow as its Arrow buffers: all values' bytes as one
# scalar string and the int64 offsets between them; `strings_from_buffers` cuts them apart in the graph. Handing
# TensorFlow a NumPy array of Python strings instead costs a Python object per value (measured: 3x slower).
_DATA, _OFFSETS = "\0data", "\0offsets"


def _string_buffers(column, pa, *, binary: bool):
  """(bytes of every value, int64 offsets [n + 1]) of a string/binary column."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  wide = pa.large_binary() if binary else pa.large_string()
  if column.type != wide:
    column = column.cast(wide)
  array = pa.concat_arrays(column.chunks) if column.num_chunks != 1 else column.chunk(0)
  _, offsets_buffer, data_buffer = array.buffers()
  offsets = np.frombuffer(offsets_buffer, np.int64)[array.offset:array.offset + len(array) + 1]
  start, end = int(offsets[0]), int(offsets[-1])
  data = data_buffer[start:end].to_pybytes() if data_buffer is not None else b""
  return np.array(data, dtype=object), offsets - start


def _is_string_column(schema: schema_lib.Schema, name: str) -> bool:
  column = schema.label if name == schema.label.name else schema.feature(name)
  return column.kind.holds in (STRING, BYTES)


def output_signature(schema: schema_lib.Schema) -> dict:
  """The TensorSpecs `batches` yields: string columns as their buffers, numbers as float32."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  signature = {}
  for name in schema.columns:
    if _is_string_column(schema, name):
      signature[name + _DATA] = tf.TensorSpec((), tf.string)
      signature[name + _OFFSETS] = tf.TensorSpec((None,), tf.int64)
      continue
    feature = None if name == schema.label.name else schema.feature(name)
    size = feature.values_per_example if feature is not None else 1
    signature[name] = tf.TensorSpec((None,) + ((size,) if size > 1 else ()), tf.float32)
  return signature


def strings_from_buffers(batch: dict, schema: schema_lib.Schema) -> dict:
  """A batch as `batches` yields it -> {column: tensor}, string columns cut from their buffers (in the graph)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  columns = {}
  for name in schema.columns:
    if _is_string_column(schema, name):
      offsets = batch[name + _OFFSETS]
      columns[name] = tf.strings.substr(batch[name + _DATA], offsets[:-1], offsets[1:] - offsets[:-1])
    else:
      columns[name] = batch[name]
  return columns
