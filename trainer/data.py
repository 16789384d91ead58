"""Input pipelines: TFRecord (`tf.train.Example`) and CSV files, local or `gs://`, per worker.

The layout follows the tf.data performance guide: shard whole files per input pipeline (the strategy's
`InputContext`), interleave parallel reads, batch first and then parse the whole batch in one vectorized op,
shuffle the parsed rows across a window of batches, prefetch; every parallelism knob is AUTOTUNE. Encoding
(vocabulary lookup, image bytes) happens here rather than in the model, so the model sees dense numeric tensors
under every strategy, and the serving signature applies the same `FeatureEncoder`.
"""

from __future__ import annotations

import csv
import io
from typing import Callable

from trainer import schema as schema_lib
from trainer.errors import UserError
from trainer.errors import first_line

_MAX_PARALLEL_FILES = 16
_READ_BUFFER_BYTES = 1 << 20  # large reads: few requests per gs:// object


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
  kinds = {"float": "float_list", "int": "int64_list", "string": "bytes_list", "image": "bytes_list"}
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


class FeatureEncoder:
  """Turns raw parsed columns into the model's numeric inputs: vocabulary ids, float images.

  Used by the input pipeline and by the serving signature, so training and serving encode alike. Id 0 is the
  out-of-vocabulary bucket; vocabulary entry i gets id i + 1.
  """

  def __init__(self, schema: schema_lib.Schema):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._schema = schema
    self._tables = {}
    for feature in schema.features:
      if feature.is_categorical:
        keys = tf.constant(list(feature.vocabulary))
        ids = tf.range(1, len(feature.vocabulary) + 1, dtype=tf.int64)
        self._tables[feature.name] = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, ids), default_value=0)

  @property
  def tables(self):
    return list(self._tables.values())

  def encode(self, columns):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    encoded = {}
    for feature in self._schema.features:
      value = columns[feature.name]
      if feature.is_categorical:
        encoded[feature.name] = self._tables[feature.name].lookup(value)
      elif feature.type == "image":
        if value.dtype == tf.string:
          value = tf.reshape(tf.io.decode_raw(value, tf.uint8), (-1,) + feature.shape)
        encoded[feature.name] = tf.cast(value, tf.float32)
      else:
        encoded[feature.name] = tf.cast(value, tf.float32)
    return encoded


def raw_serving_specs(schema: schema_lib.Schema):
  """TensorSpecs of the serving signature's inputs, one per feature, named after it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  specs = {}
  for feature in schema.features:
    if feature.type == "string":
      specs[feature.name] = tf.TensorSpec([None], tf.string, name=feature.name)
    elif feature.type == "image":
      specs[feature.name] = tf.TensorSpec((None,) + feature.shape, tf.float32, name=feature.name)
    else:
      specs[feature.name] = tf.TensorSpec([None], tf.float32, name=feature.name)
  return specs


def make_dataset_fn(files: list[str], schema: schema_lib.Schema, *, data_format: str, global_batch_size: int,
                    training: bool, shuffle_buffer: int = 10_000, seed: int | None = None,
                    repeat: bool | None = None, csv_header: list[str] | None = None,
                    select: list[str] | None = None, deterministic: bool = False,
                    max_batches: int | None = None) -> Callable:
  """Returns `dataset_fn(input_context)` for `strategy.distribute_datasets_from_function`.

  Each input pipeline reads its own subset of files when there are at least as many files as pipelines
  (else every pipeline reads all files and keeps every n-th record), and batches to the per-replica size.
  Training data repeats forever in full batches. Evaluation data is one pass: every example once, the last
  batch partial (the strategy's distributed iterator pads replicas and workers that run out with empty
  batches, so every worker runs the same number of steps); `max_batches` stops it earlier. `repeat`
  overrides the default (tests read one training pass).
  `select` keeps only those encoded features (Keras `fit` wants exactly the model's inputs).
  `deterministic` keeps the order fixed across runs even while training (reproducible weights).
  """

  if data_format == "csv" and csv_header is None:
    raise ValueError("csv_header is required for CSV data")
  repeat = training if repeat is None else repeat

  def dataset_fn(input_context=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    csv_layout = _csv_layout(schema, csv_header) if data_format == "csv" else None

    if input_context is not None:
      batch_size = input_context.get_per_replica_batch_size(global_batch_size)
      num_pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    else:
      batch_size, num_pipelines, pipeline_id = global_batch_size, 1, 0
    shard_files = num_pipelines > 1 and len(files) >= num_pipelines
    shard_records = num_pipelines > 1 and not shard_files

    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if shard_files:
      file_ds = file_ds.shard(num_pipelines, pipeline_id)
    num_files = len(files[pipeline_id::num_pipelines]) if shard_files else len(files)
    if training and shuffle_buffer:
      file_ds = file_ds.shuffle(num_files, seed=seed, reshuffle_each_iteration=True)
    if repeat:
      file_ds = file_ds.repeat()
    ds = file_ds.interleave(
        _reader(data_format, csv_layout),
        cycle_length=min(num_files, _MAX_PARALLEL_FILES),
        num_parallel_calls=tf.data.AUTOTUNE,
        # Record sharding needs the same order on every pipeline; otherwise let the fastest file win.
        deterministic=deterministic or shard_records or not training)
    if shard_records:
      ds = ds.shard(num_pipelines, pipeline_id)
    ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=deterministic or not training)
    if max_batches is not None:
      ds = ds.take(max_batches)
    encoder = FeatureEncoder(schema)  # built here: ParameterServerStrategy needs tables made inside dataset_fn
    parse = _batch_parser(schema, data_format, encoder, csv_layout)
    if select is not None:
      parse_all = parse
      parse = lambda *batch: _select(*parse_all(*batch), select)  # pylint: disable=unnecessary-lambda-assignment
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic or not training)
    if training and shuffle_buffer:
      ds = _shuffle_parsed_batches(ds, batches_per_window=shuffle_window_batches(shuffle_buffer, batch_size),
                                   seed=seed, deterministic=deterministic)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

  return dataset_fn


def _select(features, labels, names):
  return {name: features[name] for name in names}, labels


def shuffle_window_batches(shuffle_buffer: int, batch_size: int) -> int:
  """Batches pooled per shuffle window: enough to hold `shuffle_buffer` examples, and never fewer than two
  (permuting the rows of one batch alone would change no gradient)."""
  return max(2, -(-shuffle_buffer // batch_size))


def _shuffle_parsed_batches(ds, *, batches_per_window: int, seed: int | None, deterministic: bool):
  """Pools every `batches_per_window` consecutive parsed batches and deals their rows out again at random.

  Why here and not `Dataset.shuffle` on serialized records: a per-record shuffle buffer costs about a third of
  the pipeline's throughput on two cores (scripts/bench_input.py), because every record becomes its own
  string tensor. Parsed batches are a few dense numeric columns (categorical values are already ids), so a
  permutation of a window of them is one gather per column. Each output batch is a uniform sample without
  replacement from its window of `batches_per_window * batch_size` consecutive examples (already mixed across
  files by the interleave, and the file order is reshuffled every epoch); every example is still seen once per
  pass. Each window's permutation is keyed by its own seed from `Dataset.random(seed)`, so a seeded,
  deterministic pipeline repeats exactly and an unseeded one differs every run.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def permute(window, window_seed):
    rows = tf.shape(tf.nest.flatten(window)[0])[:2]
    order = tf.random.experimental.stateless_shuffle(tf.range(rows[0] * rows[1]), seed=window_seed)

    def deal(column):
      flat = tf.reshape(column, tf.concat([[-1], tf.shape(column)[2:]], axis=0))
      dealt = tf.reshape(tf.gather(flat, order), tf.shape(column))
      dealt.set_shape(column.shape)
      return dealt

    return tf.nest.map_structure(deal, window)

  windows = tf.data.Dataset.zip((ds.batch(batches_per_window), tf.data.Dataset.random(seed=seed).batch(2)))
  return windows.map(permute, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic).unbatch()


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


def _reader(data_format: str, csv_layout):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if data_format == "tfrecord":
    return lambda path: tf.data.TFRecordDataset(path, buffer_size=_READ_BUFFER_BYTES)
  _, indices, defaults = csv_layout
  return lambda path: tf.data.experimental.CsvDataset(path, defaults, header=True, select_cols=indices)


def _csv_layout(schema: schema_lib.Schema, header: list[str]):
  """(column names, their header indices, record defaults), ordered by index as CsvDataset yields them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  types = {f.name: f.type for f in schema.features}
  types[schema.label.name] = schema.label.type
  dtypes = {"float": tf.float32, "int": tf.int64, "string": tf.string}
  ordered = sorted((header.index(name), name) for name in schema.columns)
  # A dtype (not a value) as default makes every field required: an empty field fails loudly.
  return [name for _, name in ordered], [i for i, _ in ordered], [dtypes[types[name]] for _, name in ordered]


def _batch_parser(schema: schema_lib.Schema, data_format: str, encoder: FeatureEncoder, csv_layout):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  label = schema.label
  if data_format == "tfrecord":
    dtypes = {"float": tf.float32, "int": tf.int64, "string": tf.string, "image": tf.string}
    spec = {f.name: tf.io.FixedLenFeature([], dtypes[f.type]) for f in schema.features}
    spec[label.name] = tf.io.FixedLenFeature([], dtypes[label.type])

    def parse_examples(serialized):
      columns = tf.io.parse_example(serialized, spec)
      target = columns.pop(label.name)
      return encoder.encode(columns), target

    return parse_examples

  names = csv_layout[0]

  def parse_csv(*fields):
    columns = dict(zip(names, fields))
    target = columns.pop(label.name)
    return encoder.encode(columns), target

  return parse_csv
