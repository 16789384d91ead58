"""Pre-flight: everything checked or counted from the data before any device or peer is touched.

File patterns are expanded, the first record of each split is read in plain Python and checked against the
schema, compressed or non-UTF-8 files are named, records are counted for --epochs; failures are one-line
`UserError`s. When training does hit a bad record later, `explain_data_error` turns TensorFlow's message into
one line that names the file.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re

from absl import logging

from trainer import config as config_lib
from trainer import schema as schema_lib
from trainer.errors import UserError
from trainer.errors import first_line


def list_files(pattern: str, *, flag: str) -> list[str]:
  """Expands a file pattern; a pattern that matches nothing is a UserError naming the flag and pattern."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    files = sorted(tf.io.gfile.glob(pattern))
  except tf.errors.NotFoundError:
    files = []
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot list {pattern}: {e.message.splitlines()[0]}") from None
  files = [f for f in files if not f.endswith("/") and not f.rsplit("/", 1)[-1].endswith(".json")]
  if not files:
    raise UserError(f"{flag}: no files match {pattern!r}; expected a file pattern such as "
                    "gs://bucket/data/train-*.tfrecord")
  return files


def check_first_record(path: str, schema: schema_lib.Schema, data_format: str, *, flag: str) -> None:
  """Reads the first record of `path` in plain Python and checks it against the schema.

  Catching a mismatch here gives a one-line error before any device or peer is touched; it reads one
  record, so it costs nothing next to training. Pure Python on purpose: no TensorFlow op may run before the
  strategy is built.
  """
  if data_format == "csv":
    _check_first_csv_row(path, schema, flag=flag)
  else:
    _check_first_example(path, schema, flag=flag)


_GZIP_MAGIC = b"\x1f\x8b"


def _check_not_compressed(path: str, *, flag: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      magic = f.read(2)
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot read {path}: {e.message.splitlines()[0]}") from None
  if magic == _GZIP_MAGIC:
    raise UserError(f"{flag}: {path} is gzip-compressed; the trainer reads uncompressed TFRecord and CSV files: "
                    "decompress it, or stage it with scripts/stage_data.py (which reads gzip)")


def find_corrupt_file(files: list[str], *, budget_secs: float = 120.0) -> tuple[str, str] | None:
  """(path, reason) of the first TFRecord file that cannot be read to the end, or None (also when the
  reads take longer than `budget_secs`: this runs on the failure path only, to name the file)."""
  import time  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  deadline = time.monotonic() + budget_secs
  for path in files:
    try:
      for _ in tf.compat.v1.io.tf_record_iterator(path):
        if time.monotonic() > deadline:
          return None
    except tf.errors.OpError as e:
      return path, first_line(e)
  return None


def _check_first_example(path: str, schema: schema_lib.Schema, *, flag: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  _check_not_compressed(path, flag=flag)
  try:
    first = next(iter(tf.compat.v1.io.tf_record_iterator(path)), None)
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot read {path} as TFRecord: {e.message.splitlines()[0]}") from None
  if first is None:
    raise UserError(f"{flag}: {path} holds no records")
  try:
    example = tf.train.Example.FromString(first)
  except Exception:  # pylint: disable=broad-except
    raise UserError(f"{flag}: the first record of {path} is not a tf.train.Example") from None
  expected = {f.name: f for f in schema.features}
  kinds = schema_lib.EXAMPLE_LISTS
  feature_map = example.features.feature
  columns = [(f.name, f.type) for f in schema.features] + [(schema.label.name, schema.label.type)]
  for name, kind in columns:
    if name not in feature_map:
      raise UserError(f"{flag}: the first record of {path} has no feature {name!r} "
                      f"(it has: {', '.join(sorted(feature_map)) or 'none'}); it does not match the schema")
    value = feature_map[name]
    actual = value.WhichOneof("kind")
    if actual != kinds[kind]:
      raise UserError(f"{flag}: feature {name!r} in {path} is a {actual}, but the schema says {kind} "
                      f"({kinds[kind]})")
    count = len(getattr(value, actual).value)
    if count != 1:
      raise UserError(f"{flag}: feature {name!r} in {path} has {count} values; the schema expects exactly 1")
    if kind == "image":
      shape = expected[name].shape
      size = shape[0] * shape[1] * shape[2]
      if len(value.bytes_list.value[0]) != size:
        raise UserError(f"{flag}: image feature {name!r} in {path} has {len(value.bytes_list.value[0])} bytes; "
                        f"shape {list(shape)} needs {size}")


def _check_first_csv_row(path: str, schema: schema_lib.Schema, *, flag: str) -> None:
  header, first_row = _read_csv_head(path, flag=flag)
  missing = [c for c in schema.columns if c not in header]
  if missing:
    raise UserError(f"{flag}: CSV header of {path} lacks column(s) {', '.join(missing)} named in the schema "
                    f"(header: {', '.join(header)})")
  if first_row is None:
    raise UserError(f"{flag}: {path} holds a header and no rows")
  if len(first_row) != len(header):
    raise UserError(f"{flag}: the first row of {path} has {len(first_row)} fields, the header {len(header)}")
  types = {f.name: f.type for f in schema.features}
  types[schema.label.name] = schema.label.type
  for name, kind in types.items():
    value = first_row[header.index(name)]
    try:
      if kind == "float":
        float(value)
      elif kind == "int":
        int(value)
    except ValueError:
      raise UserError(f"{flag}: column {name!r} of {path} holds {value!r}, but the schema says {kind}") from None


def _read_csv_head(path: str, *, flag: str) -> tuple[list[str], list[str] | None]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  _check_not_compressed(path, flag=flag)
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      head = f.read(64 * 1024)
  except tf.errors.OpError as e:
    raise UserError(f"{flag}: cannot read {path}: {e.message.splitlines()[0]}") from None
  try:
    head = head.decode("utf-8")
  except UnicodeDecodeError as e:
    if e.start < len(head) - 3:  # not merely a character cut at the end of the 64 KiB read
      raise UserError(f"{flag}: {path} is not UTF-8 text (byte {e.start}); expected a CSV file with a "
                      "header row") from None
    head = head[:e.start].decode("utf-8")
  rows = list(csv.reader(io.StringIO(head)))
  if not rows:
    raise UserError(f"{flag}: {path} is empty; expected a CSV file with a header row")
  return rows[0], rows[1] if len(rows) > 1 else None


def validate_schema_for_format(schema: schema_lib.Schema, data_format: str) -> None:
  if data_format == "csv":
    images = [f.name for f in schema.features if f.type == "image"]
    if images:
      raise UserError(f"--data_format=csv cannot hold image feature(s) {', '.join(images)}; use tfrecord")



def count_records(files: list[str], data_format: str) -> int:
  """Records in `files` (one pass; used to turn --epochs into steps and size the eval pass)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if data_format == "csv":
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TextLineDataset(path).skip(1), num_parallel_calls=tf.data.AUTOTUNE)
  else:
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
  return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def read_csv_header(path: str, *, flag: str) -> list[str]:
  """The header row of a CSV file (all files of one pattern must share it)."""
  return _read_csv_head(path, flag=flag)[0]


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What pre-flight found: the schema, the files of each split, and CSV headers ("train"/"eval")."""

  schema: schema_lib.Schema
  train_files: list[str]
  eval_files: list[str]
  csv_headers: dict[str, list[str]]


def check_inputs(config: config_lib.Config) -> Inputs:
  """Schema, file lists and first records: all checked in plain Python before any device is touched."""
  data_cfg = config.data
  splits = {"train": ("--train_data", data_cfg.train_pattern)}
  if data_cfg.eval_pattern and config.train.eval_steps != 0:
    splits["eval"] = ("--eval_data", data_cfg.eval_pattern)
  files, headers = {}, {}
  for split, (flag, pattern) in splits.items():
    files[split] = list_files(pattern, flag=flag)
  schema = schema_lib.load_schema(data_cfg.schema_path)
  validate_schema_for_format(schema, data_cfg.format)
  if config.model.name == "cnn" and not any(f.type == "image" for f in schema.features):
    raise UserError("--model=cnn needs an image feature in the schema (type 'image'); use --model=tabular")
  for split, (flag, _) in splits.items():
    check_first_record(files[split][0], schema, data_cfg.format, flag=flag)
    if data_cfg.format == "csv":
      headers[split] = read_csv_header(files[split][0], flag=flag)
  return Inputs(schema=schema, train_files=files["train"], eval_files=files.get("eval", []), csv_headers=headers)


def total_steps(config: config_lib.Config, train_files: list[str]) -> int:
  """--train_steps, or --epochs turned into steps by counting the training records (never 0)."""
  if config.train.train_steps is not None:
    return config.train.train_steps
  examples = count_records(train_files, config.data.format)
  steps = config.train.epochs * examples // config.train.global_batch_size
  if steps < 1:
    raise UserError(f"--epochs={config.train.epochs} over {examples} examples is less than one batch of "
                    f"--global_batch_size={config.train.global_batch_size}")
  logging.info("%d epoch(s) of %d examples = %d steps", config.train.epochs, examples, steps)
  return steps


def explain_data_error(error, config: config_lib.Config, files: list[str]) -> Exception:
  """A record that failed deep in tf.data during training, as one UserError line naming the file or the
  mismatch; any other error is returned unchanged (it is a bug, and keeps its traceback)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if isinstance(error, tf.errors.DataLossError):
    return _corrupt_file_error(error, files, config)
  if not isinstance(error, tf.errors.InvalidArgumentError):
    return error
  for line in (error.message or "").splitlines():
    match = re.search(r"(Feature: .*|Field \d+ .*|Expect(?:ed)? \d+ fields.*|Could not parse .*|"
                      r"Unable to parse .*|Key: .*)$", line)
    if match:
      detail = match.group(1).split(" [[")[0].strip()
      return UserError(f"a record in --train_data/--eval_data does not match the schema "
                       f"{config.data.schema_path}: {detail}")
  return error


def _corrupt_file_error(error, files: list[str], config: config_lib.Config) -> Exception:
  """A truncated or corrupted TFRecord: names the file (TF's message does not), found by reading them."""
  if config.data.format != "tfrecord":
    return error
  found = find_corrupt_file(files)
  if found is None:
    return UserError(f"--train_data/--eval_data: a file is corrupted or truncated ({first_line(error)}); reading "
                     f"the {len(files)} files again did not find which (or took over 2 minutes)")
  path, reason = found
  return UserError(f"--train_data/--eval_data: {path} is corrupted or truncated ({reason}); write it again "
                   "or leave it out of the pattern")
