"""Input-pipeline benchmark: the trainer's pipeline on gs:// (emulated) and on local disk, against the fastest
plain tf.data pipeline we could write and a naive one, over the same shards, in one run.

    .venv/bin/python -m scripts.bench.input                     # 200k examples in 8 shards, batch 1024
    .venv/bin/python -m scripts.bench.input --rounds=4 --num_examples=50000   # quicker, noisier

How it measures, and why (scripts/bench/harness.py). Every pipeline runs in its own process, built once and warmed
up. The processes take turns: one runs a timed slice (--slice_secs, after a few untimed batches) while every other one is
frozen with SIGSTOP, so no pipeline fills its buffers, or takes CPU, during another one's turn. A round gives
every pipeline one slice (order reversed every other round); ratios are taken within a round and the median
over rounds is reported with its range. On this 2-core shared machine throughput drifts by 10-30% over
minutes, so runs that are minutes apart cannot be compared; slices a few seconds apart can.

The ceiling (c) is the fastest, over the whole run, of several plain tf.data designs (CEILINGS); every one
reads the same shards with no shuffle and no feature encoding. Peak memory is checked on fresh processes that
read 1x and 10x the data once. Nothing here asserts: it reports.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics

from scripts.bench import harness


PIPELINES = {
    "a": "trainer pipeline, gs:// via emulator",
    "b": "trainer pipeline, local disk",
    "c": "ceiling: the fastest of the plain tf.data designs below",
    "d": "naive: sequential reads, per-example parse, no prefetch",
}
CEILINGS = {
    "c1": "parallel reads, batch, then parse the batch",
    "c2": "parallel reads, parallel batch, then parse the batch",
    "c3": "parallel reads, parallel batch, fused parse_example_dataset",
}
EXTRAS = {
    "a0": "trainer pipeline, gs://, TensorFlow's default 64 MiB read blocks",
}
GOALS = (("(b)/(c)", "b", "c", 0.9), ("(a)/(b)", "a", "b", 0.9), ("(b)/(d)", "b", "d", 3.0))
BUILDER = "scripts.bench.input:build"  # how each pipeline process builds its pipeline (scripts/bench/harness.py)


def build(kind: str, pattern: str, schema_path: str, batch: int):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data import formats  # pylint: disable=g-import-not-at-top
  from trainer.data.formats import tfrecord  # pylint: disable=g-import-not-at-top
  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top

  schema = schema_lib.load_schema(schema_path)
  files = sorted(tf.io.gfile.glob(pattern))
  if kind in ("a", "a0", "b"):
    return harness.trainer_pipeline(files, schema, batch, source=formats.TFRECORD)
  spec = tfrecord.parse_spec(schema)
  if kind == "d":  # what public samples often do
    ds = tf.data.TFRecordDataset(files).repeat().map(lambda s: tf.io.parse_single_example(s, spec))
    return ds.shuffle(1000).batch(batch)
  records = tf.data.Dataset.from_tensor_slices(files).repeat().interleave(
      lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20), cycle_length=len(files),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  if kind == "c1":
    batches = records.batch(batch, drop_remainder=True)
  else:
    batches = records.batch(batch, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  if kind == "c3":
    parsed = batches.apply(tf.data.experimental.parse_example_dataset(
        spec, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False))
  else:
    parsed = batches.map(lambda s: tf.io.parse_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE,
                         deterministic=False)
  options = tf.data.Options()
  options.deterministic = False
  return parsed.prefetch(tf.data.AUTOTUNE).with_options(options)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_examples", type=int, default=200_000)
  parser.add_argument("--num_shards", type=int, default=8)
  harness.add_turn_flags(parser, batch_size=1024, rounds=12)
  args = parser.parse_args()

  from scripts import demo_data, stage_data  # pylint: disable=g-import-not-at-top

  with harness.scratch("input") as scratch:
    print(f"making {args.num_examples} examples in {args.num_shards} shards ...", flush=True)
    demo_data.make(scratch, num_train=args.num_examples, num_eval=8, num_shards=args.num_shards,
                   formats=("tfrecord",))
    local_dir = os.path.join(scratch, "train")
    size_mb = sum(os.path.getsize(p) for p in glob.glob(f"{local_dir}/*.tfrecord")) / 2**20
    # 10x: the same shards listed ten times under other names, for the memory check.
    big_dir = os.path.join(scratch, "train10x")
    os.makedirs(big_dir)
    for copy in range(10):
      for path in glob.glob(f"{local_dir}/*.tfrecord"):
        os.link(path, os.path.join(big_dir, f"c{copy}-{os.path.basename(path)}"))
    shutil.copy(f"{local_dir}/schema.json", big_dir)
    schema_path = f"{local_dir}/schema.json"
    with harness.bench_bucket(scratch) as (emulator, env):
      stage_data.upload_tree(local_dir, "gs://bench/train", client=emulator.storage_client())
      env.pop("GCS_READ_CACHE_BLOCK_SIZE_MB", None)  # (a) gets the trainer's setting, (a0) TF's default
      gcs_pattern, local_pattern = "gs://bench/train/*.tfrecord", f"{local_dir}/*.tfrecord"
      kinds = {"a": (gcs_pattern, env), "a0": (gcs_pattern, {**env, "GCS_READ_CACHE_BLOCK_SIZE_MB": "64"}),
               "b": (local_pattern, env), **{c: (local_pattern, env) for c in CEILINGS}, "d": (local_pattern, env)}
      print(f"starting {len(kinds)} pipeline processes ...", flush=True)
      turns = harness.Turns(BUILDER, kinds, schema_path, args.batch_size)
      rounds: list[dict[str, float]] = []
      emulator_cpu = emulator_secs = 0.0
      try:
        for number in range(args.rounds + 1):  # round 0 is untimed: autotune settles in every pipeline
          order = list(kinds) if number % 2 else list(kinds)[::-1]
          rates = {}
          for kind in order:
            if kind == "a":
              before = harness.cpu_seconds(emulator.pids)
            got = turns.run_slice(kind, args.slice_secs)
            if kind == "a" and number:  # how much of the machine the emulator took while (a) was timed
              emulator_cpu += harness.cpu_seconds(emulator.pids) - before
              emulator_secs += got["seconds"]
            rates[kind] = got["examples"] / got["seconds"]
          if number:
            rounds.append(rates)
            print(f"  round {number:2d}: " + "  ".join(f"({k}) {rates[k] / 1000:5.0f}k" for k in kinds), flush=True)
        peaks = turns.finish()
      finally:
        turns.close()
      memory = {scale: harness.one_pass_rss(BUILDER, "b", f"{d}/*.tfrecord", schema_path, args.batch_size,
                                            args.num_examples * (10 if scale == "10x" else 1), env)
                for scale, d in (("1x", local_dir), ("10x", big_dir))}

  medians = {kind: statistics.median([r[kind] for r in rounds]) for kind in kinds}
  ceiling = max(CEILINGS, key=lambda c: medians[c])
  for r in rounds:
    r["c"] = r[ceiling]
  medians["c"] = medians[ceiling]
  peaks["c"] = peaks[ceiling]

  print(f"\n{args.num_examples:,} examples, {args.num_shards} shards, {size_mb:.1f} MiB, batch {args.batch_size}; "
        f"{args.rounds} rounds of {args.slice_secs:g} s slices; examples/s are medians over rounds")
  rows = [(k, PIPELINES[k]) for k in "ab"] + [("c", f"{PIPELINES['c']} = ({ceiling})")] + [("d", PIPELINES["d"])]
  rows += [(k, f"  ceiling candidate: {v}") for k, v in CEILINGS.items()] + list(EXTRAS.items())
  width = max(len(label) for _, label in rows)
  for kind, label in rows:
    print(f"  ({kind:>2}) {label:<{width}} {medians[kind]:>10,.0f} ex/s   peak RSS {peaks[kind]:6.0f} MiB")
  for name, top, bottom, goal in GOALS + (("(a)/(a0)", "a", "a0", None),):
    per_round = sorted(r[top] / r[bottom] for r in rounds)
    value = statistics.median(per_round)
    verdict = f"goal >= {goal}   {'met' if value >= goal else 'NOT met'}" if goal else "(information)"
    print(f"  {name:<8} = {value:5.2f}  (rounds: {per_round[0]:.2f} to {per_round[-1]:.2f}, middle half "
          f"{per_round[len(per_round) // 4]:.2f} to {per_round[(3 * len(per_round)) // 4]:.2f})   {verdict}")
  print(f"  the emulator (fake-gcs-server + TLS proxy) kept {emulator_cpu / max(emulator_secs, 1e-9):.2f} of the "
        f"{os.cpu_count()} cores busy during (a)'s slices")
  growth = memory["10x"] / memory["1x"]
  print(f"  peak RSS of (b), one fresh pass: {memory['1x']:.0f} MiB at 1x, {memory['10x']:.0f} MiB at 10x data -> "
        f"{growth:.2f}x   goal <= 1.2   {'met' if growth <= 1.2 else 'NOT met'}")


if __name__ == "__main__":
  main()
