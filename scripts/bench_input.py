"""Input-pipeline benchmark: the trainer's pipeline on gs:// (emulated) and on local disk, against a
hand-written ceiling and a naive pipeline, over the same shards, in one run.

    .venv/bin/python scripts/bench_input.py                 # 200k examples in 8 shards, batch 1024
    .venv/bin/python scripts/bench_input.py --num_examples=50000 --repeats=1   # quicker

Prints examples/s for each pipeline, the ratios the project aims at ((b)/(c) >= 0.9, (a)/(b) >= 0.9,
(b)/(d) >= 3; each the median of the per-round ratios) and the peak memory of the trainer pipeline when the dataset grows 10x (<= 1.2x). Each measurement
runs in its own process (peak RSS is per process); the pipelines take turns (a b c d, a b c d, ...) and the
median of --repeats runs counts, because single runs on 2 shared cores swing by 10-20%. Nothing here asserts:
it reports.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PIPELINES = {
    "a": "trainer pipeline, gs:// via emulator",
    "b": "trainer pipeline, local disk",
    "c": "ceiling: plain tf.data, parallel reads, batch-then-parse",
    "d": "naive: sequential reads, per-example parse, no prefetch",
}


def build(kind: str, pattern: str, schema_path: str, batch: int):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer import data, schema as schema_lib  # pylint: disable=g-import-not-at-top

  schema = schema_lib.load_schema(schema_path)
  files = sorted(tf.io.gfile.glob(pattern))
  if kind in ("a", "b"):
    return data.make_dataset_fn(files, schema, data_format="tfrecord", global_batch_size=batch, training=True,
                                seed=1)(None)
  kinds = {"float": tf.float32, "int": tf.int64, "string": tf.string}
  spec = {f.name: tf.io.FixedLenFeature([], kinds[f.type]) for f in schema.features}
  spec[schema.label.name] = tf.io.FixedLenFeature([], tf.int64)
  if kind == "c":
    options = tf.data.Options()
    options.deterministic = False
    ds = tf.data.Dataset.from_tensor_slices(files).repeat().interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20), cycle_length=len(files),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return (ds.batch(batch, drop_remainder=True).map(lambda s: tf.io.parse_example(s, spec),
                                                      num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE).with_options(options))
  # (d) what public samples often do.
  ds = tf.data.TFRecordDataset(files).repeat().map(lambda s: tf.io.parse_single_example(s, spec))
  return ds.shuffle(1000).batch(batch)


def measure(kind: str, pattern: str, schema_path: str, batch: int, examples: int, passes: int) -> dict:
  """Runs in a child process: examples/s over `passes` passes after a warm-up, and peak RSS."""
  dataset = build(kind, pattern, schema_path, batch)
  iterator = iter(dataset)
  for _ in range(5):  # warm-up: tracing, autotune, connections
    next(iterator)
  steps = max(20, passes * examples // batch)
  emulator = [int(p) for p in os.environ.get("BENCH_EMULATOR_PIDS", "").split(",") if p]
  emulator_cpu = _cpu_seconds(emulator)
  start = time.perf_counter()
  for _ in range(steps):
    next(iterator)
  elapsed = time.perf_counter() - start
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  # The emulator shares the machine's cores with the reader: how many it kept busy while (a) ran.
  return {"examples_per_sec": steps * batch / elapsed, "peak_rss_mb": peak_mb,
          "emulator_cores": (_cpu_seconds(emulator) - emulator_cpu) / elapsed}


def _cpu_seconds(pids: list[int]) -> float:
  """User + system CPU seconds the given processes have used so far (Linux /proc)."""
  total = 0
  for pid in pids:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
  return total / os.sysconf("SC_CLK_TCK")


def _run_child(kind: str, pattern: str, schema_path: str, batch: int, examples: int, env: dict,
               passes: int) -> dict:
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "_measure", kind, pattern, schema_path,
                        str(batch), str(examples), str(passes)], env=env, capture_output=True, text=True,
                       timeout=900, check=False)
  if out.returncode:
    raise SystemExit(f"error: measuring ({kind}) failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  if len(sys.argv) > 1 and sys.argv[1] == "_measure":
    kind, pattern, schema_path, batch, examples, passes = sys.argv[2:8]
    print(json.dumps(measure(kind, pattern, schema_path, int(batch), int(examples), int(passes))))
    return
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_examples", type=int, default=200_000)
  parser.add_argument("--num_shards", type=int, default=8)
  parser.add_argument("--batch_size", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--passes", type=int, default=5, help="passes over the data timed per run (longer = steadier)")
  args = parser.parse_args()

  from scripts import demo_data, gcs_emulator, stage_data  # pylint: disable=g-import-not-at-top

  scratch = tempfile.mkdtemp(prefix="bench-input-")
  try:
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
    with gcs_emulator.running(buckets=("bench",), directory=os.path.join(scratch, "gcs")) as emulator:
      stage_data.upload_tree(local_dir, "gs://bench/train", client=emulator.storage_client())
      env = {**os.environ, **emulator.env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO,
             "BENCH_EMULATOR_PIDS": ",".join(map(str, emulator.pids))}
      patterns = {"a": "gs://bench/train/*.tfrecord", "b": f"{local_dir}/*.tfrecord",
                  "c": f"{local_dir}/*.tfrecord", "d": f"{local_dir}/*.tfrecord"}
      runs: dict[str, list[dict]] = {kind: [] for kind in "abcd"}
      for repeat in range(args.repeats):
        for kind in "abcd":
          got = _run_child(kind, patterns[kind], schema_path, args.batch_size, args.num_examples, env, args.passes)
          runs[kind].append(got)
          print(f"  run {repeat + 1} ({kind}) {got['examples_per_sec']:>10,.0f} ex/s", flush=True)
      results = {kind: sorted(r, key=lambda x: x["examples_per_sec"])[len(r) // 2] for kind, r in runs.items()}
      # One pass over each size: the 10x run reads ten times the bytes, through the same pipeline.
      memory = {scale: _run_child("b", f"{d}/*.tfrecord", schema_path, args.batch_size,
                                  args.num_examples * (10 if scale == "10x" else 1), env, 1)["peak_rss_mb"]
                for scale, d in (("1x", local_dir), ("10x", big_dir))}
  finally:
    shutil.rmtree(scratch, ignore_errors=True)

  print(f"\n{args.num_examples:,} examples, {args.num_shards} shards, {size_mb:.1f} MiB, batch {args.batch_size}, "
        f"{args.passes} passes timed per run, median of {args.repeats}")
  for kind, label in PIPELINES.items():
    print(f"  ({kind}) {label:<58} {results[kind]['examples_per_sec']:>10,.0f} ex/s")
  # Ratios are paired: each round's pipelines ran back to back, so a round's ratio sees the same machine load.
  for name, top, bottom, goal in (("(b)/(c)", "b", "c", 0.9), ("(a)/(b)", "a", "b", 0.9), ("(b)/(d)", "b", "d", 3.0)):
    per_round = sorted(t["examples_per_sec"] / u["examples_per_sec"] for t, u in zip(runs[top], runs[bottom]))
    value = per_round[len(per_round) // 2]
    shown = ", ".join(f"{r:.2f}" for r in per_round)
    print(f"  {name} = {value:5.2f} (median of rounds: {shown})   goal >= {goal}   "
          f"{'met' if value >= goal else 'NOT met'}")
  print(f"  the emulator (fake-gcs-server + TLS proxy) kept {results['a']['emulator_cores']:.2f} of the "
        f"{os.cpu_count()} cores busy during (a), while it was timed")
  growth = memory["10x"] / memory["1x"]
  print(f"  peak RSS of (b): {memory['1x']:.0f} MiB at 1x, {memory['10x']:.0f} MiB at 10x data -> {growth:.2f}x   "
        f"goal <= 1.2   {'met' if growth <= 1.2 else 'NOT met'}")


if __name__ == "__main__":
  main()
