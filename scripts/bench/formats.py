"""Input-format benchmark: the trainer's pipeline on CSV, gzip TFRecord and JSONL, each against the fastest
plain tf.data reader of the same files, on local disk and on gs:// (emulated), in one run; memory at 10x the data;
and how long schema inference takes on a 1M-row CSV.

    .venv/bin/python -m scripts.bench.formats                      # 200k examples in 8 shards, batch 1024
    .venv/bin/python -m scripts.bench.formats --rounds=4 --num_examples=50000   # quicker, noisier

It measures the way scripts/bench/input.py does (scripts/bench/harness.py's `Turns`: one process per pipeline, each timed in short
slices while the others are frozen, ratios taken within a round, medians over rounds). The data is the demo
churn dataset (3 numbers, 2 categories, an int label) written by this script as CSV with a header, gzip TFRecord
and JSONL (json.dumps per row).

The ceilings (plain tf.data, no shuffle, no feature encoding, every parallel knob on; the fastest per format):
- CSV: `CsvDataset` per file, interleaved, batched; and `TextLineDataset` batched then `tf.io.decode_csv`.
- gzip TFRecord: `TFRecordDataset(compression_type="GZIP")` interleaved, batched, `tf.io.parse_example`.
- JSONL: TensorFlow has no JSON parse op, so the plain reader is `TextLineDataset` batched with one
  `tf.strings.regex_replace` per column (greedy `^.*"key"` or lazy `^.*?"key"`), the least a hand-written parser
  does (no missing-key check, no defaults, no escapes); the trainer does more than that per column.
Nothing here asserts: it reports.
"""

from __future__ import annotations

import argparse
import csv
import glob
import gzip
import json
import os
import shutil
import statistics
import time

from scripts.bench import harness

FORMATS = ("csv", "tfrecord_gz", "jsonl")
EXTENSIONS = {"csv": "csv", "tfrecord_gz": "tfrecord.gz", "jsonl": "jsonl"}
CEILINGS = {"csv": ("ceiling_csvdataset", "ceiling_decode_csv"), "tfrecord_gz": ("ceiling",),
            "jsonl": ("ceiling_greedy", "ceiling_lazy")}


BUILDER = "scripts.bench.formats:build"  # how each pipeline process builds its pipeline (scripts/bench/harness.py)


def build(kind: str, pattern: str, schema_path: str, batch: int):
  """One pipeline of this benchmark, "<format>.<variant>" (built in the pipeline's own process)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data import formats  # pylint: disable=g-import-not-at-top
  from trainer.data.formats import tfrecord  # pylint: disable=g-import-not-at-top
  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top

  schema = schema_lib.load_schema(schema_path)
  files = sorted(tf.io.gfile.glob(pattern))

  fmt, variant = kind.split(".")
  source = formats.source_for(files, flag="bench")
  if variant in ("trainer", "gcs"):
    return harness.trainer_pipeline(files, schema, batch, source=source)
  numeric = {f.name for f in schema.features if f.type != "string"} | {schema.label.name}

  def interleave(reader):
    return tf.data.Dataset.from_tensor_slices(files).repeat().interleave(
        reader, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)

  if fmt == "csv" and variant == "ceiling_csvdataset":
    defaults = [tf.float32 if name in numeric else tf.string for name in source.columns]
    ds = interleave(lambda f: tf.data.experimental.CsvDataset(f, defaults, header=True, buffer_size=1 << 20))
    ds = ds.batch(batch, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  elif fmt == "csv":
    defaults = [[0.0] if name in numeric else [""] for name in source.columns]
    ds = interleave(lambda f: tf.data.TextLineDataset(f, buffer_size=1 << 20).skip(1))
    ds = ds.batch(batch, drop_remainder=True).map(lambda lines: tf.io.decode_csv(lines, defaults),
                                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  elif fmt == "tfrecord_gz":
    spec = tfrecord.parse_spec(schema)
    ds = interleave(lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP", buffer_size=1 << 20))
    ds = ds.batch(batch, drop_remainder=True).map(lambda s: tf.io.parse_example(s, spec),
                                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  else:
    prefix = "^.*?" if variant == "ceiling_lazy" else "^.*"

    def parse(lines):
      out = {}
      for name in schema.columns:
        value = r"(-?[0-9][0-9.eE+-]*)" if name in numeric else r'"([^"]*)"'
        text = tf.strings.regex_replace(lines, prefix + '"' + name + r'":\s*' + value + ".*$", r"\1")
        out[name] = tf.strings.to_number(text, tf.float32) if name in numeric else text
      return out

    ds = interleave(lambda f: tf.data.TextLineDataset(f, buffer_size=1 << 20))
    ds = ds.batch(batch, drop_remainder=True).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  options = tf.data.Options()
  options.deterministic = False
  return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def write_formats(local_dir: str, out_dir: str) -> dict[str, str]:
  """The demo's CSV shards as CSV, gzip TFRecord and JSONL under out_dir/<format>/; returns each pattern."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with open(os.path.join(local_dir, "schema.json")) as f:
    schema = json.load(f)
  numeric = {f["name"]: f["type"] for f in schema["features"] + [schema["label"]] if f["type"] != "string"}
  patterns = {}
  for fmt in FORMATS:
    os.makedirs(os.path.join(out_dir, fmt))
    shutil.copy(os.path.join(local_dir, "schema.json"), os.path.join(out_dir, fmt, "schema.json"))
    patterns[fmt] = os.path.join(out_dir, fmt, f"*.{EXTENSIONS[fmt]}")
  for path in sorted(glob.glob(f"{local_dir}/*.csv")):
    stem = os.path.basename(path)[:-len(".csv")]
    shutil.copy(path, os.path.join(out_dir, "csv", f"{stem}.csv"))
    with open(path, newline="") as f:
      rows = list(csv.DictReader(f))
    with open(os.path.join(out_dir, "jsonl", f"{stem}.jsonl"), "w") as f:
      for row in rows:
        f.write(json.dumps({k: (int(v) if numeric.get(k) == "int" else float(v)) if k in numeric else v
                            for k, v in row.items()}) + "\n")
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    with tf.io.TFRecordWriter(os.path.join(out_dir, "tfrecord_gz", f"{stem}.tfrecord.gz"), options) as writer:
      for record in tf.data.TFRecordDataset(os.path.join(local_dir, f"{stem}.tfrecord")):
        writer.write(record.numpy())
  return patterns


def ten_times(pattern: str) -> str:
  """The same files linked ten times under other names (the memory check's 10x data)."""
  directory = os.path.dirname(pattern)
  big = directory + "-10x"
  os.makedirs(big)
  for copy in range(10):
    for path in glob.glob(pattern):
      os.link(path, os.path.join(big, f"c{copy}-{os.path.basename(path)}"))
  shutil.copy(os.path.join(directory, "schema.json"), big)
  return os.path.join(big, os.path.basename(pattern))


def time_inference(local_dir: str, scratch: str, rows: int) -> tuple[float, int]:
  """Seconds `schema_inference.infer_schema` takes on a CSV of `rows` rows (the demo's rows repeated)."""
  from trainer.data import formats  # pylint: disable=g-import-not-at-top
  from trainer.data import inference as schema_inference  # pylint: disable=g-import-not-at-top

  shards = sorted(glob.glob(f"{local_dir}/*.csv"))
  header, body = None, []
  for path in shards:
    with open(path) as f:
      lines = f.read().splitlines()
    header, body = lines[0], body + lines[1:]
  path = os.path.join(scratch, "million.csv.gz")
  with gzip.open(path, "wt", compresslevel=1) as f:
    f.write(header + "\n")
    written = 0
    while written < rows:
      chunk = body[:rows - written]
      f.write("\n".join(chunk) + "\n")
      written += len(chunk)
  start = time.perf_counter()
  source = formats.source_for([path], flag="bench")
  config = schema_inference.InferenceConfig(label="churned")
  schema_inference.infer_schema([path], source, config, flag="bench", log=lambda _: None)
  return time.perf_counter() - start, config.sample_rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_examples", type=int, default=200_000)
  parser.add_argument("--num_shards", type=int, default=8)
  harness.add_turn_flags(parser, batch_size=1024)
  parser.add_argument("--inference_rows", type=int, default=1_000_000)
  args = parser.parse_args()

  from scripts import demo_data, stage_data  # pylint: disable=g-import-not-at-top

  with harness.scratch("formats") as scratch:
    print(f"making {args.num_examples} examples in {args.num_shards} shards as CSV, gzip TFRecord, JSONL ...",
          flush=True)
    demo_data.make(scratch, num_train=args.num_examples, num_eval=8, num_shards=args.num_shards)
    local_dir = os.path.join(scratch, "train")
    patterns = write_formats(local_dir, os.path.join(scratch, "formats"))
    inference_secs, sampled = time_inference(local_dir, scratch, args.inference_rows)
    schema_path = os.path.join(local_dir, "schema.json")
    with harness.bench_bucket(scratch) as (emulator, env):
      kinds = {}
      for fmt, pattern in patterns.items():
        stage_data.upload_tree(os.path.dirname(pattern), f"gs://bench/{fmt}", client=emulator.storage_client())
        kinds[f"{fmt}.trainer"] = (pattern, env)
        kinds[f"{fmt}.gcs"] = (f"gs://bench/{fmt}/{os.path.basename(pattern)}", env)
        for ceiling in CEILINGS[fmt]:
          kinds[f"{fmt}.{ceiling}"] = (pattern, env)
      print(f"starting {len(kinds)} pipeline processes ...", flush=True)
      turns = harness.Turns(BUILDER, kinds, schema_path, args.batch_size)
      rounds = []
      try:
        for number in range(args.rounds + 1):  # round 0 untimed
          order = list(kinds) if number % 2 else list(kinds)[::-1]
          rates = {}
          for kind in order:
            got = turns.run_slice(kind, args.slice_secs)
            rates[kind] = got["examples"] / got["seconds"]
          if number:
            rounds.append(rates)
            print(f"  round {number:2d}: " + "  ".join(f"{k} {rates[k] / 1000:.0f}k" for k in kinds), flush=True)
      finally:  # killed, not finished: memory is measured on fresh processes below, and a TF process can hang
        # in its exit-time clean-up (seen once here, 60 s and counting)
        turns.close()
      memory = {}
      for fmt, pattern in patterns.items():
        big = ten_times(pattern)
        memory[fmt] = [harness.one_pass_rss(BUILDER, f"{fmt}.trainer", p, schema_path, args.batch_size,
                                            args.num_examples * scale, env)
                       for p, scale in ((pattern, 1), (big, 10))]

  print(f"\n{args.num_examples:,} examples, {args.num_shards} shards, batch {args.batch_size}; {args.rounds} rounds "
        f"of {args.slice_secs:g} s slices; examples/s are medians over rounds")
  for fmt in FORMATS:
    medians = {k: statistics.median(r[k] for r in rounds) for k in kinds if k.startswith(fmt + ".")}
    ceiling = max(CEILINGS[fmt], key=lambda c: medians[f"{fmt}.{c}"])
    for kind, value in medians.items():
      print(f"  {kind:<32} {value:>10,.0f} ex/s" + ("   <- ceiling" if kind == f"{fmt}.{ceiling}" else ""))
    for name, top, bottom in (("trainer/ceiling", "trainer", ceiling), ("gs:// / local", "gcs", "trainer")):
      per_round = sorted(r[f"{fmt}.{top}"] / r[f"{fmt}.{bottom}"] for r in rounds)
      value = statistics.median(per_round)
      print(f"  {fmt} {name:<16} = {value:5.2f}  (rounds {per_round[0]:.2f} to {per_round[-1]:.2f})   goal >= 0.9   "
            f"{'met' if value >= 0.9 else 'NOT met'}")
    one, ten = memory[fmt]
    print(f"  {fmt} peak RSS, one fresh pass: {one:.0f} MiB at 1x, {ten:.0f} MiB at 10x -> {ten / one:.2f}x   "
          f"goal <= 1.2   {'met' if ten / one <= 1.2 else 'NOT met'}")
  print(f"  schema inference on a {args.inference_rows:,}-row gzip CSV ({sampled:,} rows sampled): "
        f"{inference_secs:.1f} s")


if __name__ == "__main__":
  main()
