"""What the input benchmarks share (scripts/bench/input.py, formats.py, parquet.py, images.py, text.py): their
flags, a scratch directory, the emulated bucket, and turn-taking. Every pipeline runs in its own process, built once and warmed up; the processes take turns, one running a timed slice while every other one is
frozen with SIGSTOP, so no pipeline fills its buffers, or takes CPU, during another one's turn.

A pipeline is named by its builder, `module:function` with `function(kind, pattern, schema_path, batch)` returning a
`tf.data.Dataset`, and a kind; the child process imports the builder itself (so this module imports no benchmark).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/bench/..
_UNTIMED_BATCHES = 10  # after each resume: drains what was in flight when the process was frozen


def _build(builder: str, kind: str, pattern: str, schema_path: str, batch: int):
  module, _, function = builder.partition(":")
  return getattr(importlib.import_module(module), function)(kind, pattern, schema_path, batch)


def _start_child_env() -> None:
  """Every pipeline runs with the trainer's storage settings, applied as `python -m trainer.task` does."""
  from trainer.core import storage  # pylint: disable=g-import-not-at-top

  storage.configure_gcs(os.environ)


def serve(builder: str, kind: str, pattern: str, schema_path: str, batch: int) -> None:
  """Child: builds one pipeline, then runs one timed slice per line of stdin; at EOF reports peak RSS."""
  _start_child_env()
  iterator = iter(_build(builder, kind, pattern, schema_path, batch))
  for _ in range(5):  # tracing, autotune, connections
    next(iterator)
  print("ready", flush=True)
  for line in sys.stdin:
    slice_secs = float(line)
    for _ in range(_UNTIMED_BATCHES):
      next(iterator)
    batches, start = 0, time.perf_counter()
    while time.perf_counter() - start < slice_secs:
      next(iterator)
      batches += 1
    elapsed = time.perf_counter() - start
    print(json.dumps({"examples": batches * batch, "seconds": elapsed}), flush=True)
  print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def one_pass(builder: str, kind: str, pattern: str, schema_path: str, batch: int, examples: int) -> None:
  """Child: one pass over `examples` on a fresh process, then its peak RSS (the memory check)."""
  _start_child_env()
  iterator = iter(_build(builder, kind, pattern, schema_path, batch))
  for _ in range(max(1, examples // batch)):
    next(iterator)
  print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


def _die_with_parent() -> None:
  """Children get SIGKILL if the benchmark dies, so no frozen pipeline outlives it (Linux prctl)."""
  with contextlib.suppress(OSError, AttributeError):
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Turns:
  """The pipeline processes, each frozen except while it runs its own slice."""

  def __init__(self, builder: str, kinds: dict[str, tuple[str, dict]], schema_path: str, batch: int):
    self._procs: dict[str, subprocess.Popen] = {}
    try:
      for kind, (pattern, env) in kinds.items():
        self._procs[kind] = subprocess.Popen(
            [sys.executable, "-m", "scripts.bench.harness", "_serve", builder, kind, pattern, schema_path,
             str(batch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, preexec_fn=_die_with_parent)
      for kind, proc in self._procs.items():  # they warm up side by side, then each is frozen
        if proc.stdout.readline().strip() != "ready":
          raise SystemExit(f"error: pipeline ({kind}) failed to start (exit code {proc.wait()})")
        os.kill(proc.pid, signal.SIGSTOP)
    except BaseException:
      self.close()
      raise

  def run_slice(self, kind: str, slice_secs: float) -> dict:
    proc = self._procs[kind]
    os.kill(proc.pid, signal.SIGCONT)
    try:
      proc.stdin.write(f"{slice_secs}\n")
      proc.stdin.flush()
      line = proc.stdout.readline()
    finally:
      if proc.poll() is None:
        os.kill(proc.pid, signal.SIGSTOP)
    if not line:
      raise SystemExit(f"error: pipeline ({kind}) exited with code {proc.wait()} during its slice")
    return json.loads(line)

  def finish(self) -> dict[str, float]:
    """Ends every process; returns their peak RSS in MiB."""
    peaks = {}
    for kind, proc in self._procs.items():
      os.kill(proc.pid, signal.SIGCONT)
      proc.stdin.close()
      peaks[kind] = json.loads(proc.stdout.readline())["peak_rss_mb"]
      proc.wait(timeout=60)
    return peaks

  def close(self) -> None:
    for proc in self._procs.values():
      if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          os.kill(proc.pid, signal.SIGCONT)
          proc.kill()
        proc.wait()


def timed_rounds(builder: str, kinds: dict[str, tuple[str, dict]], schema_path: str, batch: int, *, rounds: int,
                 slice_secs: float) -> list[dict[str, float]]:
  """Starts one process per pipeline, then runs an untimed round and `rounds` timed ones, each pipeline one slice
  per round, in alternating order; returns each timed round's examples/s by kind (printed as it goes)."""
  print(f"starting {len(kinds)} pipeline processes ...", flush=True)
  turns = Turns(builder, kinds, schema_path, batch)
  results = []
  try:
    for number in range(rounds + 1):  # round 0 untimed
      order = list(kinds) if number % 2 else list(kinds)[::-1]
      rates = {}
      for kind in order:
        got = turns.run_slice(kind, slice_secs)
        rates[kind] = got["examples"] / got["seconds"]
      if number:
        results.append(rates)
        print(f"  round {number:2d}: " + "  ".join(f"{k} {rates[k]:,.0f}" for k in kinds), flush=True)
  finally:  # killed, not finished: memory is measured on fresh processes, and a TF process can hang in clean-up
    turns.close()
  return results


def report(rounds: list[dict[str, float]], ratios, memory: tuple[float, float] | None, *,
           unit: str = "ex/s") -> None:
  """Prints the median rate of each kind, each (name, top, bottom, goal) ratio's median over rounds with its
  range, and the memory check (peak RSS at 1x and at 10x the data) unless `memory` is None."""
  for kind in rounds[0]:
    print(f"  {kind:<16} {statistics.median(r[kind] for r in rounds):>12,.0f} {unit}")
  for name, top, bottom, goal in ratios:
    per_round = sorted(r[top] / r[bottom] for r in rounds)
    value = statistics.median(per_round)
    print(f"  {name:<26} = {value:5.2f}  (rounds {per_round[0]:.2f} to {per_round[-1]:.2f})   goal >= {goal}   "
          f"{'met' if value >= goal else 'NOT met'}")
  if memory is None:
    return
  one, ten = memory
  print(f"  peak RSS, one fresh pass: {one:.0f} MiB at 1x, {ten:.0f} MiB at 10x -> {ten / one:.2f}x   goal <= 1.2   "
        f"{'met' if ten / one <= 1.2 else 'NOT met'}")


def trainer_pipeline(files: list[str], schema, batch: int, *, source=None, file_cache_bytes: int = 0):
  """The trainer's own training pipeline over `files` (`input_pipeline.make_dataset_fn`, the format detected as
  the trainer detects it unless `source` is given), seeded: the "trainer" row of every input benchmark. Files
  that `uri` features name are read every time unless `file_cache_bytes` (--uri_cache_mb) holds them."""
  from trainer.data import formats  # pylint: disable=g-import-not-at-top
  from trainer.data import input_pipeline  # pylint: disable=g-import-not-at-top

  source = source or formats.source_for(files, flag="bench")
  return input_pipeline.make_dataset_fn(files, schema, source=source, global_batch_size=batch, training=True,
                                        seed=1, file_cache_bytes=file_cache_bytes)(None)


def add_turn_flags(parser, *, batch_size: int, rounds: int = 8) -> None:
  """The flags every turn-taking benchmark takes: the batch, how many rounds, how long each slice."""
  parser.add_argument("--batch_size", type=int, default=batch_size)
  parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds (each gives every pipeline one slice)")
  parser.add_argument("--slice_secs", type=float, default=2.0, help="timed seconds per pipeline per round")


@contextlib.contextmanager
def scratch(name: str):
  """A scratch directory for one benchmark's files, removed however the benchmark ends."""
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  directory = tempfile.mkdtemp(prefix=f"bench-{name}-")
  try:
    yield directory
  finally:
    shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def bench_bucket(scratch_dir: str):
  """The Cloud Storage emulator with the bucket `bench`, its files under the scratch directory; yields the emulator
  and the environment a pipeline process needs to read `gs://bench/...` (and import this repository)."""
  from scripts import emulator as emulator_lib  # pylint: disable=g-import-not-at-top

  with emulator_lib.running(buckets=("bench",), directory=os.path.join(scratch_dir, "gcs")) as emulator:
    yield emulator, {**os.environ, **emulator.env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}


def cpu_seconds(pids: list[int]) -> float:
  """User + system CPU seconds the given processes have used so far (Linux /proc)."""
  total = 0
  for pid in pids:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
  return total / os.sysconf("SC_CLK_TCK")


def one_pass_rss(builder: str, kind: str, pattern: str, schema_path: str, batch: int, examples: int,
                 env: dict) -> float:
  """Peak RSS (MiB) of a fresh process that reads `examples` through pipeline `kind` once."""
  out = subprocess.run([sys.executable, "-m", "scripts.bench.harness", "_pass", builder, kind, pattern, schema_path,
                        str(batch), str(examples)], env=env, capture_output=True, text=True, timeout=900, check=False)
  if out.returncode:
    raise SystemExit(f"error: the memory pass failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


if __name__ == "__main__":  # a pipeline's own process: `_serve` (turns) or `_pass` (the memory check)
  if sys.argv[1] == "_serve":
    serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
  else:
    one_pass(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
