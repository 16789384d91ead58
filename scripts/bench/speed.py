"""Training throughput of the speed switches, side by side in one run, on whatever device this machine has.

For the CNN (shapes images) and a larger MLP (tabular churn, hidden 1024,1024), runs the trainer itself with
float32, mixed_float16, mixed_bfloat16, and each with --jit_compile, and prints examples/s and the ratio to
float32. The rate is the trainer's own `examples_per_sec` over its last logging interval (after compilation),
the median of --rounds runs. On CPUs mixed precision is expected to be slower (no float16/bfloat16 math units);
the switches are for GPU pools.

    python -m scripts.bench.speed                  # about 5 minutes on 2 CPU cores
    python -m scripts.bench.speed --steps=600 --rounds=3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from scripts.bench import harness
from trainer.modeling import export

REPO = harness.REPO
VARIANTS = [("float32", []), ("mixed_float16", ["--precision=mixed_float16"]),
            ("mixed_bfloat16", ["--precision=mixed_bfloat16"]), ("float32+xla", ["--jit_compile"]),
            ("mixed_float16+xla", ["--precision=mixed_float16", "--jit_compile"]),
            ("mixed_bfloat16+xla", ["--precision=mixed_bfloat16", "--jit_compile"])]


def _data(directory: str) -> dict[str, list[str]]:
  from scripts import demo_data  # pylint: disable=g-import-not-at-top

  demo_data.make(os.path.join(directory, "shapes"), dataset="shapes", num_train=2048, num_eval=256, num_shards=2)
  demo_data.make(os.path.join(directory, "churn"), num_train=20000, num_eval=1000, num_shards=2)
  return {
      "cnn": [f"--train_data={directory}/shapes/train/*.tfrecord", "--model=cnn", "--global_batch_size=128"],
      "mlp_1024x2": [f"--train_data={directory}/churn/train/*.tfrecord", "--hidden_units=1024,1024",
                     "--global_batch_size=1024"],
  }


def _rate(args: list[str], out: str, steps: int) -> float:
  env = {**os.environ, "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "true",
         "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
  command = [sys.executable, "-m", "trainer.task", *args, f"--output_dir={out}", f"--train_steps={steps}",
             f"--log_every_steps={steps // 2}", f"--steps_per_loop={steps // 2}", "--eval_steps=0"]
  result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
  if result.returncode:
    raise SystemExit(f"error: {' '.join(args)} failed:\n{result.stderr[-2000:]}")
  with open(os.path.join(out, "model", export.METRICS_FILE)) as f:
    return json.load(f)["examples_per_sec"]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("--steps", type=int, default=200, help="training steps per run (the rate is of the 2nd half)")
  parser.add_argument("--rounds", type=int, default=1, help="runs per variant (the median is printed)")
  parser.add_argument("--models", default="cnn,mlp_1024x2")
  args = parser.parse_args(argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  gpus = tf.config.list_physical_devices("GPU")
  device = f"{len(gpus)} GPU(s): " + ", ".join(tf.config.experimental.get_device_details(g).get("device_name", "?")
                                               for g in gpus) if gpus else f"CPU ({os.cpu_count()} cores)"
  print(f"device: {device}; TensorFlow {tf.__version__}; {args.steps} steps, median of {args.rounds}")
  with tempfile.TemporaryDirectory(prefix="bench-speed-") as directory:
    data = _data(directory)
    print(f"{'model':<12} {'variant':<20} {'examples/s':>12} {'vs float32':>10}")
    for model in args.models.split(","):
      baseline = None
      for name, flags in VARIANTS:
        rates = [_rate(data[model] + flags, os.path.join(directory, f"out-{model}-{name}-{r}"), args.steps)
                 for r in range(args.rounds)]
        rate = statistics.median(rates)
        baseline = baseline or rate
        print(f"{model:<12} {name:<20} {rate:>12,.0f} {rate / baseline:>9.2f}x", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
