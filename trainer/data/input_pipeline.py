"""Input pipelines over every data format (`trainer.data.formats`), local or `gs://`.

The layout follows the tf.data performance guide: shard whole files per input pipeline (the strategy's
`InputContext`), interleave parallel reads, batch first and then parse the whole batch in one vectorized op,
encode (`features.FeatureEncoder`), shuffle the parsed rows across a window of batches, prefetch; every
parallelism knob is AUTOTUNE. What is format-specific, the raw batches and their parse, each format's class
says (`DataFormat.tf_batches`, `tf_batch_parser`); checking, encoding, shuffling and prefetching are here.

A missing value takes the schema's per-feature `default`; without one the read fails, and `data_errors` names
the file, record and column.
"""

from __future__ import annotations

from typing import Callable

from trainer.data import feature_kinds
from trainer.data import features as features_lib
from trainer.data import formats
from trainer.data import schema as schema_lib


def make_dataset_fn(files: list[str], schema: schema_lib.Schema, *, source: formats.Source, global_batch_size: int,
                    training: bool, shuffle_buffer: int = 10_000, seed: int | None = None,
                    repeat: bool | None = None,
                    select: list[str] | None = None, deterministic: bool = False,
                    max_batches: int | None = None, file_cache_bytes: int = 0) -> Callable:
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
    file_cache_bytes: keep up to about this many bytes of the files `uri` features name in memory after their
      first read (`feature_kinds.FileCache`, one per pipeline; 0: read them every time).

  Returns:
    `dataset_fn(input_context=None) -> tf.data.Dataset` of `(features, labels)`: features encoded by
    `features.FeatureEncoder` (float32 numbers, int64 vocabulary ids, float32 images), labels as parsed.
  """

  data_format = formats.FORMATS[source.format]
  repeat = training if repeat is None else repeat

  def dataset_fn(input_context=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if input_context is not None:
      batch_size = input_context.get_per_replica_batch_size(global_batch_size)
      num_pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    else:
      batch_size, num_pipelines, pipeline_id = global_batch_size, 1, 0
    plan = formats.ReadPlan(batch_size=batch_size, num_pipelines=num_pipelines, pipeline_id=pipeline_id,
                            shard_files=num_pipelines > 1 and len(files) >= num_pipelines, training=training,
                            repeat=repeat, shuffle=training and bool(shuffle_buffer), seed=seed,
                            deterministic=deterministic)
    ds = data_format.tf_batches(files, schema, source, plan)
    if max_batches is not None:
      # --eval_steps counts global batches; this pipeline makes per-replica ones for several replicas.
      replicas_per_pipeline = (input_context.num_replicas_in_sync // input_context.num_input_pipelines
                               if input_context is not None else 1)
      ds = ds.take(max_batches * max(1, replicas_per_pipeline))
    # Built here: ParameterServerStrategy needs tables made inside dataset_fn.
    encoder = features_lib.FeatureEncoder(schema)
    file_cache = (feature_kinds.FileCache(file_cache_bytes)
                  if file_cache_bytes > 0 and any(f.uri for f in schema.features) else None)
    parse = _finite_checked(data_format.tf_batch_parser(schema, source))

    def encode(columns, target):
      encoded = encoder.encode_records(columns, file_cache=file_cache), encoder.encode_label(target)
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


def _shuffle_before_encoding(schema: schema_lib.Schema) -> bool:
  return any(f.is_image for f in schema.features)


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
