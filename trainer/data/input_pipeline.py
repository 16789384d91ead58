"""Input pipelines: TFRecord (`tf.train.Example`), CSV and JSONL files, plain or gzip/zlib, and Parquet
(`trainer.data.formats.parquet`), local or `gs://`.

The layout follows the tf.data performance guide: shard whole files per input pipeline (the strategy's
`InputContext`), interleave parallel reads, batch first and then parse the whole batch in one vectorized op,
encode (`features.FeatureEncoder`), shuffle the parsed rows across a window of batches, prefetch; every
parallelism knob is AUTOTUNE. JSONL has no TensorFlow parse op: a batch of lines is parsed one column at a time
by a vectorized RE2 extraction (`_jsonl_columns`), which keeps it inside the graph (ParameterServerStrategy
builds datasets on the workers, where a Python parser could not run) and as fast as CSV.

A missing value takes the schema's per-feature `default`; without one the read fails, and `data_errors` names
the file, record and column.
"""

from __future__ import annotations

from typing import Any, Callable

from trainer.data import feature_kinds
from trainer.data import features as features_lib
from trainer.data import formats
from trainer.data import schema as schema_lib

_MAX_PARALLEL_FILES = 16
_READ_BUFFER_BYTES = 1 << 20  # large reads: few requests per gs:// object


def make_dataset_fn(files: list[str], schema: schema_lib.Schema, *, source: formats.Source, global_batch_size: int,
                    training: bool, shuffle_buffer: int = 10_000, seed: int | None = None,
                    repeat: bool | None = None,
                    select: list[str] | None = None, deterministic: bool = False,
                    max_batches: int | None = None) -> Callable:
  """Returns `dataset_fn(input_context)` for `strategy.distribute_datasets_from_function`.

  Each input pipeline reads its own subset of files when there are at least as many files as pipelines
  (else every pipeline reads all files and keeps every n-th record), and batches to the per-replica size.
  Training data repeats forever in full batches. Evaluation data is one pass: every example once, the last
  batch partial (the strategy's distributed iterator pads replicas and workers that run out with empty
  batches, so every worker runs the same number of steps).

  Args:
    files: the data files (local or gs://), already expanded and checked (`preflight`).
    schema: the features and label to parse.
    source: the files' format and compression (and CSV columns), resolved by pre-flight (`formats`).
    global_batch_size: examples per step across all replicas.
    training: shuffle and repeat (training) or one ordered pass (evaluation).
    shuffle_buffer: examples pooled per shuffle window (see `shuffle_window_batches`); 0 keeps file order.
    seed: shuffle seed (None: differs every run).
    repeat: overrides the default of repeating exactly when `training` (tests read one training pass).
    select: keep only these encoded features (Keras `fit` wants exactly the model's inputs).
    deterministic: keep the order fixed across runs even while training (reproducible weights).
    max_batches: stop after this many GLOBAL batches (--eval_steps).

  Returns:
    `dataset_fn(input_context=None) -> tf.data.Dataset` of `(features, labels)`: features encoded by
    `features.FeatureEncoder` (float32 numbers, int64 vocabulary ids, float32 images), labels as parsed.
  """

  if source.format == "csv" and source.columns is None:
    raise ValueError("a CSV source needs its columns (formats.csv_source)")
  repeat = training if repeat is None else repeat

  def dataset_fn(input_context=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    csv_layout = _csv_layout(schema, source.columns) if source.format == "csv" else None

    if input_context is not None:
      batch_size = input_context.get_per_replica_batch_size(global_batch_size)
      num_pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    else:
      batch_size, num_pipelines, pipeline_id = global_batch_size, 1, 0
    shard_files = num_pipelines > 1 and len(files) >= num_pipelines
    shard_records = num_pipelines > 1 and not shard_files

    if source.format == "image_folder":
      ds = _image_folder_batches(files, batch_size=batch_size, training=training, repeat=repeat,
                                 shuffle=training and bool(shuffle_buffer), seed=seed, num_pipelines=num_pipelines,
                                 pipeline_id=pipeline_id, deterministic=deterministic)
    elif source.format == "parquet":
      ds = _parquet_batches(files, schema, batch_size=batch_size, training=training, repeat=repeat,
                            shuffle=training and bool(shuffle_buffer) and not shard_records, seed=seed,
                            num_pipelines=num_pipelines, pipeline_id=pipeline_id, shard_files=shard_files)
    else:
      file_ds = tf.data.Dataset.from_tensor_slices(files)
      if shard_files:
        file_ds = file_ds.shard(num_pipelines, pipeline_id)
      num_files = len(files[pipeline_id::num_pipelines]) if shard_files else len(files)
      if training and shuffle_buffer:
        file_ds = file_ds.shuffle(num_files, seed=seed, reshuffle_each_iteration=True)
      if repeat:
        file_ds = file_ds.repeat()
      ds = file_ds.interleave(
          _reader(source, csv_layout),
          cycle_length=min(num_files, _MAX_PARALLEL_FILES),
          num_parallel_calls=tf.data.AUTOTUNE,
          # Record sharding needs the same order on every pipeline; otherwise let the fastest file win.
          deterministic=deterministic or shard_records or not training)
      if shard_records:
        ds = ds.shard(num_pipelines, pipeline_id)
      ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=deterministic or not training)
    if max_batches is not None:
      # --eval_steps counts global batches; this pipeline makes per-replica ones for several replicas.
      replicas_per_pipeline = (input_context.num_replicas_in_sync // input_context.num_input_pipelines
                               if input_context is not None else 1)
      ds = ds.take(max_batches * max(1, replicas_per_pipeline))
    encoder = features_lib.FeatureEncoder(schema)  # built here: ParameterServerStrategy needs tables made inside dataset_fn
    parse = _finite_checked(_batch_parser(schema, source, csv_layout))

    def encode(columns, target):
      encoded = encoder.encode_records(columns), encoder.encode_label(target)
      return _select(*encoded, select) if select is not None else encoded

    order = dict(num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic or not training)
    shuffle = training and shuffle_buffer
    window = shuffle_window_batches(shuffle_buffer, batch_size) if shuffle else 0
    if shuffle and _shuffle_before_encoding(schema):
      # Images: shuffle the references (paths, or encoded bytes) and decode after, never a window of decoded
      # pixels (10,000 images of 224x224x3 float32 are 6 GB).
      ds = ds.map(parse, **order)
      ds = _shuffle_parsed_batches(ds, batches_per_window=window, seed=seed, deterministic=deterministic)
      ds = ds.map(encode, **order)
    else:
      ds = ds.map(lambda *batch: encode(*parse(*batch)), **order)
      if shuffle:
        # Numbers and vocabulary ids: the cheapest form to shuffle is the encoded one.
        ds = _shuffle_parsed_batches(ds, batches_per_window=window, seed=seed, deterministic=deterministic)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

  return dataset_fn


def _image_folder_batches(files, *, batch_size, training, repeat, shuffle, seed, num_pipelines, pipeline_id,
                          deterministic):
  """Batches of {"image": path, "label": folder name} for images in class folders: each file is one record, so
  the file list itself is sharded and shuffled (all of it: a list of paths), and the images are read by the
  schema's `uri` image feature when parsed."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  labels = [formats.folder_class(path) for path in files]
  ds = tf.data.Dataset.from_tensor_slices({formats.IMAGE_FOLDER_IMAGE: files, formats.IMAGE_FOLDER_LABEL: labels})
  if num_pipelines > 1:
    ds = ds.shard(num_pipelines, pipeline_id)
  if shuffle:
    ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
  if repeat:
    ds = ds.repeat()
  return ds.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=deterministic or not training)


_PARQUET_CHUNK_ROWS = 65_536  # rows per call into Python: its fixed cost per call is most of the time at 1,024


def _parquet_batches(files, schema, *, batch_size, training, repeat, shuffle, seed, num_pipelines, pipeline_id,
                     shard_files):
  """Batches of raw columns from `trainer.data.formats.parquet` (pyarrow in Python; see its docstring for why). Python hands
  over chunks of many batches, cut into batches by `rebatch`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data.formats import parquet  # pylint: disable=g-import-not-at-top

  mine = files[pipeline_id::num_pipelines] if shard_files else files
  keep_every, keep_offset = (1, 0) if shard_files or num_pipelines == 1 else (num_pipelines, pipeline_id)
  chunk = batch_size * max(1, _PARQUET_CHUNK_ROWS // batch_size)

  def generate():
    yield from parquet.batches(mine, schema, batch_size=chunk, repeat=repeat, shuffle=shuffle, seed=seed,
                               keep_every=keep_every, keep_offset=keep_offset, drop_remainder=False,
                               flag="--train_data" if training else "--eval_data")

  ds = tf.data.Dataset.from_generator(generate, output_signature=parquet.output_signature(schema))
  ds = ds.map(lambda batch: parquet.strings_from_buffers(batch, schema), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.rebatch(batch_size, drop_remainder=training)


def _shuffle_before_encoding(schema: schema_lib.Schema) -> bool:
  return any(f.type == "image" for f in schema.features)


def _select(features, labels, names):
  return {name: features[name] for name in names}, labels


def shuffle_window_batches(shuffle_buffer: int, batch_size: int) -> int:
  """Batches pooled per shuffle window: enough to hold `shuffle_buffer` examples, and never fewer than two
  (permuting the rows of one batch alone would change no gradient)."""
  return max(2, -(-shuffle_buffer // batch_size))


def _shuffle_parsed_batches(ds, *, batches_per_window: int, seed: int | None, deterministic: bool):
  """Pools every `batches_per_window` consecutive parsed batches and deals their rows out again at random.

  Why here and not `Dataset.shuffle` on serialized records: a per-record shuffle buffer costs about a third of
  the pipeline's throughput on two cores (scripts/bench/input.py), because every record becomes its own
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



def _reader(source: formats.Source, csv_layout):
  """Records of one file: serialized Examples, or text lines (CSV without its header, JSONL) parsed per batch,
  or (CSV whose quoted fields break lines) CsvDataset's tuples of the schema's columns.

  CSV lines are decoded a batch at a time by `tf.io.decode_csv` rather than read by `CsvDataset`: 1.4x the
  throughput here (scripts/bench/formats.py); only CsvDataset follows a quoted field across lines. No per-line
  filter (blank lines): a per-element filter cost JSONL three quarters of its throughput; a blank line is a bad
  record instead, named by pre-flight."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  compression = source.compression
  if source.format == "tfrecord":
    return lambda path: tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=_READ_BUFFER_BYTES)
  if source.format == "csv" and source.multiline:
    _, indices, defaults = csv_layout
    scalar_defaults = [d if d.shape[0] == 0 else tf.reshape(d, []) for d in defaults]  # CsvDataset's form
    return lambda path: tf.data.experimental.CsvDataset(
        path, scalar_defaults, compression_type=compression, buffer_size=_READ_BUFFER_BYTES,
        header=source.header, select_cols=indices)
  skip = 1 if source.format == "csv" and source.header else 0
  if source.ml_use:  # one split of a Vertex export (a per-line filter; these lines name files, few and small)
    keep = formats.ml_use_predicate(source.ml_use)
    return lambda path: tf.data.TextLineDataset(path, compression_type=compression,
                                                buffer_size=_READ_BUFFER_BYTES).filter(keep)
  return lambda path: tf.data.TextLineDataset(path, compression_type=compression,
                                              buffer_size=_READ_BUFFER_BYTES).skip(skip)


def _csv_layout(schema: schema_lib.Schema, columns: tuple[str, ...]):
  """(column names, their indices in the file, record defaults), ordered by index as decode_csv yields them.

  Numbers are parsed as float32 whatever their schema type (an int label written "1.0" by pandas still reads);
  the encoder casts them. An empty default makes the field required: an empty field fails, and pre-flight
  names it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  by_name = {f.name: f for f in schema.features}
  ordered = sorted((columns.index(name), name) for name in schema.columns)
  defaults = []
  for _, name in ordered:
    feature = by_name.get(name)
    text = (schema_lib.PARSE_DTYPES[feature.type] == "string") if feature else schema.label.type == "string"
    dtype = tf.string if text else tf.float32
    default = feature.default if feature else None
    defaults.append(tf.constant([], dtype) if default is None else tf.constant([default], dtype))
  return [name for _, name in ordered], [i for i, _ in ordered], defaults


def tfrecord_parse_spec(schema: schema_lib.Schema) -> dict[str, Any]:
  """`tf.io.parse_example`'s spec for the schema's features (with their defaults) and label."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  spec = {}
  for f in schema.features:
    kind = feature_kinds.of(f)
    shape = list(kind.parse_shape(f))
    default = None if f.default is None else ([f.default] * shape[0] if shape else f.default)
    spec[f.name] = tf.io.FixedLenFeature(shape, tf.as_dtype(kind.parse_dtype(f)), default_value=default)
  spec[schema.label.name] = tf.io.FixedLenFeature([], tf.as_dtype(schema_lib.PARSE_DTYPES[schema.label.type]))
  return spec


def _finite_checked(parse: Callable) -> Callable:
  """`parse`, failing on a NaN or infinite number in any column or the label. One would train on silently: a NaN
  feature makes its rows of the first kernel NaN while ReLU turns the NaN activations into 0, so the loss stays
  finite (measured: exit 0, 64 of 768 kernel values NaN, AUC 0.5). The error names the column; `data_errors`
  then finds the file and record. check_numerics, not Assert + identity: the stateful Assert cost a 300-image
  test 10 of its 47 s."""

  def parse_and_check(*batch):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    def checked(name, values):
      # check_numerics passes the tensor through (no control dependency, no copy); it fails on NaN or inf.
      if isinstance(values, tf.Tensor) and values.dtype.is_floating:
        return tf.debugging.check_numerics(values, f"{features_lib.CHECK_PREFIX} {features_lib.NON_FINITE} in "
                                                   f"column {name!r}")
      return values

    columns, target = parse(*batch)
    return {name: checked(name, values) for name, values in columns.items()}, checked("label", target)

  return parse_and_check


def _batch_parser(schema: schema_lib.Schema, source: formats.Source, csv_layout):
  """A batch of records -> ({column: raw tensor}, raw label): parsed and checked, not yet encoded."""
  label = schema.label
  data_format = source.format
  if data_format in ("parquet", "image_folder"):

    def parse_columns(columns):
      columns = dict(columns)
      target = columns.pop(label.name)
      return columns, target

    return parse_columns

  if data_format == "tfrecord":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    spec = tfrecord_parse_spec(schema)

    def parse_examples(serialized):
      columns = tf.io.parse_example(serialized, spec)
      target = columns.pop(label.name)
      return columns, target

    return parse_examples

  if data_format == "jsonl":

    def parse_lines(lines):
      columns = _jsonl_columns(lines, schema)
      target = columns.pop(label.name)
      return columns, target

    return parse_lines

  names, indices, defaults = csv_layout
  if source.multiline:

    def parse_csv_columns(*fields):  # CsvDataset's batched columns, in `names` order
      columns = dict(zip(names, fields))
      target = columns.pop(label.name)
      return columns, target

    return parse_csv_columns

  num_fields = len(source.columns)

  def parse_csv(lines):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    # decode_csv with select_cols refuses a short row but not a long one, whose stray comma would shift values
    # silently: count the commas outside quoted fields (two vectorized regex passes over the batch).
    unquoted = tf.strings.regex_replace(lines, r'"(?:[^"]|"")*"', "")
    fields = tf.strings.length(unquoted) - tf.strings.length(tf.strings.regex_replace(unquoted, ",", "")) + 1
    check = tf.debugging.Assert(tf.reduce_all(fields == num_fields), [
        f"{features_lib.CHECK_PREFIX} {features_lib.CSV_LONG_ROW} ({num_fields})"])
    with tf.control_dependencies([check]):
      lines = tf.identity(lines)
    columns = dict(zip(names, tf.io.decode_csv(lines, defaults, select_cols=indices)))
    target = columns.pop(label.name)
    return columns, target

  return parse_csv


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
    return "string" if schema.label.type == "string" else "number"
  feature = schema.feature(name)
  return feature_kinds.of(feature).json_kind(feature)


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
  """RE2 for `"name":` up to its value. A dotted name ("a.b", as `formats.flatten_json` names a nested value) is
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
  if name == formats.VERTEX_MULTI_LABEL:
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


def _jsonl_columns(lines, schema: schema_lib.Schema):
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
