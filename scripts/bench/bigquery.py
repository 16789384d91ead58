"""BigQuery benchmark: the trainer's pipeline over a `bq://` table against the Storage Read client's own read of the
same table into NumPy, and against the trainer over the same rows as a local Parquet file, in one run.

    .venv/bin/python -m scripts.bench.bigquery                      # 400k examples, batch 1024

The table is the demo churn dataset (3 numbers, 2 categories, an int label) written by pandas' `to_parquet` and
served by `scripts.bigquery_emulator` in its own process (never frozen: it stands for BigQuery's servers, and its
CPU is shared with the pipeline in its turn, as a remote server's is not).
- trainer: `input_pipeline.make_dataset_fn` over `bq://bench.ds.churn` (one session of up to 4 streams read at once,
  Arrow batches through `from_generator`, then the schema's encoding and the shuffle window), as training reads it;
- client: `BigQueryReadClient.read_rows` over one session's streams in turn, each response's Arrow batch read and
  every column converted to NumPy (what any feeding of TensorFlow must do), and nothing else;
- parquet: the trainer over the same rows as one local Parquet file (what the table costs beyond a file).
It measures as scripts/bench/parquet.py does (scripts/bench/harness.py: one process per pipeline, short slices while
the others are frozen, ratios within a round, medians over rounds). Nothing here asserts: it reports.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import subprocess
import sys

from scripts.bench import harness

BUILDER = "scripts.bench.bigquery:build"
TABLE = "bench.ds.churn"
KINDS = ("trainer", "client", "parquet")


def build(kind: str, pattern: str, schema_path: str, batch: int):
  """One pipeline of this benchmark (built in the pipeline's own process): something `next` can be called on."""
  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top

  if kind == "client":
    return _client_batches(pattern)
  return harness.trainer_pipeline([pattern], schema_lib.load_schema(schema_path), batch)


def _client_batches(uri: str):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  from trainer.data.formats import bigquery  # pylint: disable=g-import-not-at-top

  table = bigquery.parse(uri, flag="bench")
  reader = bigquery.client(flag="bench")
  while True:
    session = bigquery.read_session(table, streams=4, flag="bench")
    schema = bigquery.arrow_schema(session, flag="bench")
    for stream in session.streams:
      for response in reader.read_rows(stream.name):
        batch = pa.ipc.read_record_batch(pa.py_buffer(response.arrow_record_batch.serialized_record_batch), schema)
        yield {name: column.to_numpy(zero_copy_only=False) for name, column in zip(batch.schema.names, batch.columns)}


@contextlib.contextmanager
def emulator_process(parquet_path: str):
  """`scripts.bigquery_emulator` serving the file as TABLE in its own process; yields its host."""
  proc = subprocess.Popen([sys.executable, "-m", "scripts.bigquery_emulator", f"--table={TABLE}={parquet_path}"],
                          stdout=subprocess.PIPE, text=True, cwd=harness.REPO)
  try:
    line = proc.stdout.readline().strip()
    if not line.startswith("export BIGQUERY_STORAGE_EMULATOR_HOST="):
      raise SystemExit(f"error: the BigQuery emulator did not start (exit code {proc.poll()})")
    yield line.split("=", 1)[1]
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_examples", type=int, default=400_000)
  harness.add_turn_flags(parser, batch_size=1024)
  args = parser.parse_args()

  import pandas as pd  # pylint: disable=g-import-not-at-top

  from scripts import demo_data  # pylint: disable=g-import-not-at-top

  with harness.scratch("bigquery") as scratch:
    print(f"making {args.num_examples} examples as one Parquet file, served as bq://{TABLE} ...", flush=True)
    demo_data.make(scratch, num_train=args.num_examples, num_eval=8, num_shards=1)
    csv_dir = os.path.join(scratch, "train")
    parquet_path = os.path.join(scratch, "churn.parquet")
    pd.concat([pd.read_csv(path) for path in sorted(glob.glob(f"{csv_dir}/*.csv"))]).to_parquet(parquet_path,
                                                                                                   index=False)
    schema_path = os.path.join(csv_dir, "schema.json")
    with emulator_process(parquet_path) as host:
      env = {**os.environ, "BIGQUERY_STORAGE_EMULATOR_HOST": host, "TF_CPP_MIN_LOG_LEVEL": "2",
             "PYTHONPATH": harness.REPO}
      kinds = {"trainer": (f"bq://{TABLE}", env), "client": (f"bq://{TABLE}", env), "parquet": (parquet_path, env)}
      rounds = harness.timed_rounds(BUILDER, kinds, schema_path, args.batch_size, rounds=args.rounds,
                                    slice_secs=args.slice_secs)

  print(f"\n{args.num_examples:,} examples in bq://{TABLE}, batch {args.batch_size}; {args.rounds} rounds of "
        f"{args.slice_secs:g} s slices; examples/s are medians over rounds")
  ratios = (("trainer / client", "trainer", "client", 0.9),
            ("trainer bq:// / trainer Parquet", "trainer", "parquet", 0.8))
  harness.report(rounds, ratios, None, unit="ex/s")


if __name__ == "__main__":
  main()
