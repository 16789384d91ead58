"""Parquet benchmark: the trainer's pipeline against pyarrow's own read of the same files into batches, on local
disk and on gs:// (emulated), in one run; memory at 10x the data.

    .venv/bin/python -m scripts.bench.parquet                      # 400k examples in 4 files, batch 1024
    .venv/bin/python -m scripts.bench.parquet --num_examples=100000 --num_shards=8   # tiny files (90 KiB)

The data is the demo churn dataset (3 numbers, 2 categories, an int label), written by pandas' `to_parquet`, in
files of 100k rows (0.9 MiB; Spark writes parts up to 128 MiB): on gs:// each file costs a request's latency,
which tiny files cannot hide.
- trainer: `input_pipeline.make_dataset_fn` (pyarrow batches through `from_generator`, then the schema's encoding:
  vocabulary ids, float32; the shuffle window), as training reads it;
- pyarrow: `ParquetFile.iter_batches(batch_size)` over the files in a loop, and nothing else (no conversion);
- pyarrow_numpy: the same with every column converted to NumPy (what any feeding of TensorFlow must do).
It measures as scripts/bench/formats.py does (scripts/bench/harness.py: one process per pipeline, short slices while
the others are frozen, ratios within a round, medians over rounds). Nothing here asserts: it reports.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil

from scripts.bench import harness

BUILDER = "scripts.bench.parquet:build"
KINDS = ("trainer", "gcs", "pyarrow", "pyarrow_numpy")


def build(kind: str, pattern: str, schema_path: str, batch: int):
  """One pipeline of this benchmark (built in the pipeline's own process): something `next` can be called on."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top

  files = sorted(tf.io.gfile.glob(pattern))
  if kind in ("trainer", "gcs"):
    return harness.trainer_pipeline(files, schema_lib.load_schema(schema_path), batch)
  return _pyarrow_batches(files, batch, to_numpy=kind == "pyarrow_numpy")


def _pyarrow_batches(files, batch, *, to_numpy):
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  while True:
    for path in files:
      for record_batch in pq.ParquetFile(path).iter_batches(batch_size=batch):
        yield ({name: column.to_numpy(zero_copy_only=False) for name, column in
                zip(record_batch.schema.names, record_batch.columns)} if to_numpy else record_batch)


def write_parquet(csv_dir: str, out_dir: str, copies: int = 1) -> str:
  import pandas as pd  # pylint: disable=g-import-not-at-top

  os.makedirs(out_dir)
  for copy in range(copies):
    for path in sorted(glob.glob(f"{csv_dir}/*.csv")):
      pd.read_csv(path).to_parquet(os.path.join(out_dir, f"c{copy}-{os.path.basename(path)[:-4]}.parquet"))
  shutil.copy(os.path.join(csv_dir, "schema.json"), out_dir)
  return os.path.join(out_dir, "*.parquet")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_examples", type=int, default=400_000)
  parser.add_argument("--num_shards", type=int, default=4)
  harness.add_turn_flags(parser, batch_size=1024)
  args = parser.parse_args()

  from scripts import demo_data, stage_data  # pylint: disable=g-import-not-at-top

  with harness.scratch("parquet") as scratch:
    print(f"making {args.num_examples} examples in {args.num_shards} Parquet files (and 10x that) ...", flush=True)
    demo_data.make(scratch, num_train=args.num_examples, num_eval=8, num_shards=args.num_shards)
    csv_dir = os.path.join(scratch, "train")
    pattern = write_parquet(csv_dir, os.path.join(scratch, "one"))
    big = write_parquet(csv_dir, os.path.join(scratch, "ten"), copies=10)
    schema_path = os.path.join(csv_dir, "schema.json")
    with harness.bench_bucket(scratch) as (emulator, env):
      stage_data.upload_tree(os.path.dirname(pattern), "gs://bench/parquet", client=emulator.storage_client())
      kinds = {kind: (pattern, env) for kind in KINDS}
      kinds["gcs"] = ("gs://bench/parquet/*.parquet", env)
      rounds = harness.timed_rounds(BUILDER, kinds, schema_path, args.batch_size, rounds=args.rounds,
                                    slice_secs=args.slice_secs)
      memory = [harness.one_pass_rss(BUILDER, "trainer", p, schema_path, args.batch_size,
                                     args.num_examples * scale, env) for p, scale in ((pattern, 1), (big, 10))]

  print(f"\n{args.num_examples:,} examples, {args.num_shards} files, batch {args.batch_size}; {args.rounds} rounds of "
        f"{args.slice_secs:g} s slices; examples/s are medians over rounds")
  ratios = (("trainer / pyarrow", "trainer", "pyarrow", 0.9),
            ("trainer / pyarrow_numpy", "trainer", "pyarrow_numpy", 0.9),
            ("gs:// / local", "gcs", "trainer", 0.8))
  harness.report(rounds, ratios, memory, unit="ex/s")

if __name__ == "__main__":
  main()
