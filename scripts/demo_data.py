"""Deterministic, learnable demo datasets, written as sharded TFRecord and CSV with a schema.

    python -m scripts.demo_data --output_dir=/tmp/demo            # churn (tabular), TFRecord + CSV
    python -m scripts.demo_data --output_dir=gs://bucket/demo     # the same into a bucket
    python -m scripts.demo_data --dataset=shapes --output_dir=...  # 16x16 images for the CNN

`churn` is a synthetic customer-churn table: numeric and categorical columns, a label drawn from a known
logistic model, so a good model reaches about 0.9 accuracy (the Bayes rate is printed). `shapes` holds 16x16
grey images of a horizontal or a vertical bar on noise. Same seed, same bytes.

Layout: <output_dir>/{train,eval}/part-NNNNN-of-MMMMM.{tfrecord,csv} and schema.json in each split dir.
"""

from __future__ import annotations

import argparse
import csv
import io
import json

import numpy as np

from trainer.data import schema as schema_lib
from trainer.planning import examples

PLANS = ("basic", "plus", "pro")
REGIONS = ("north", "south", "east", "west")


def churn(num_examples: int, seed: int) -> tuple[dict[str, np.ndarray], dict]:
  rng = np.random.default_rng(seed)
  tenure = rng.gamma(2.0, 15.0, num_examples).round(1)
  charges = rng.normal(70.0, 25.0, num_examples).clip(10, 200).round(2)
  calls = rng.poisson(1.5, num_examples).astype(np.int64)
  plan = rng.choice(len(PLANS), num_examples, p=[0.5, 0.3, 0.2])
  region = rng.choice(len(REGIONS), num_examples)
  logit = (1.2 - 0.09 * tenure + 0.03 * (charges - 70.0) + 0.9 * calls
           + np.array([0.8, 0.0, -1.6])[plan] + np.array([0.0, 0.5, -0.5, 0.0])[region])
  probability = 1.0 / (1.0 + np.exp(-3.0 * logit))
  label = (rng.random(num_examples) < probability).astype(np.int64)
  columns = {
      "tenure_months": tenure.astype(np.float32),
      "monthly_charges": charges.astype(np.float32),
      "support_calls": calls,
      "plan": np.array(PLANS)[plan],
      "region": np.array(REGIONS)[region],
      "churned": label,
  }
  schema = {
      "features": [
          {"name": "tenure_months", "type": "float", "mean": 30.0, "std": 21.0},
          {"name": "monthly_charges", "type": "float", "mean": 70.0, "std": 25.0},
          {"name": "support_calls", "type": "int", "mean": 1.5, "std": 1.2},
          {"name": "plan", "type": "string", "vocabulary": list(PLANS)},
          {"name": "region", "type": "string", "vocabulary": list(REGIONS)},
      ],
      "label": {"name": "churned", "type": "int", "num_classes": 2},
  }
  bayes = float(np.mean(np.maximum(probability, 1 - probability)))
  return columns, {"schema": schema, "bayes_accuracy": bayes}


def shapes(num_examples: int, seed: int) -> tuple[dict[str, np.ndarray], dict]:
  rng = np.random.default_rng(seed)
  label = rng.integers(0, 2, num_examples)
  images = rng.integers(0, 90, (num_examples, 16, 16, 1)).astype(np.uint8)
  where = rng.integers(2, 14, num_examples)
  for i in range(num_examples):
    if label[i]:
      images[i, :, where[i] - 1:where[i] + 1, 0] = 230
    else:
      images[i, where[i] - 1:where[i] + 1, :, 0] = 230
  columns = {"pixels": images, "label": label.astype(np.int64)}
  schema = {"features": [{"name": "pixels", "type": "image", "shape": [16, 16, 1]}],
            "label": {"name": "label", "type": "int", "num_classes": 2}}
  return columns, {"schema": schema, "bayes_accuracy": 1.0}


DATASETS = {"churn": churn, "shapes": shapes}


def write_split(directory: str, columns: dict[str, np.ndarray], schema: dict, *, num_shards: int,
                formats: tuple[str, ...]) -> list[str]:
  """Writes one split as `num_shards` files per format plus schema.json; returns the paths written."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.io.gfile.makedirs(directory)
  total = len(next(iter(columns.values())))
  names = [f["name"] for f in schema["features"]] + [schema["label"]["name"]]
  typed = schema_lib.parse_schema(schema, source="demo data")
  written = []
  for shard in range(num_shards):
    rows = range(shard, total, num_shards)
    stem = f"{directory}/part-{shard:05d}-of-{num_shards:05d}"
    if "tfrecord" in formats:
      with tf.io.TFRecordWriter(stem + ".tfrecord") as writer:
        for i in rows:
          writer.write(examples.serialize({name: columns[name][i] for name in names}, typed))
      written.append(stem + ".tfrecord")
    if "csv" in formats:
      buffer = io.StringIO()
      out = csv.writer(buffer, lineterminator="\n")
      out.writerow(names)
      for i in rows:
        out.writerow([columns[n][i] for n in names])
      with tf.io.gfile.GFile(stem + ".csv", "w") as f:
        f.write(buffer.getvalue())
      written.append(stem + ".csv")
  with tf.io.gfile.GFile(f"{directory}/schema.json", "w") as f:
    f.write(json.dumps(schema, indent=2) + "\n")
  return written


def make(output_dir: str, *, dataset: str = "churn", num_train: int = 20_000, num_eval: int = 4_000,
         num_shards: int = 8, seed: int = 7, formats: tuple[str, ...] = ("tfrecord", "csv")) -> dict:
  """Writes train/ and eval/ under `output_dir`; returns a summary (paths, counts, Bayes accuracy)."""
  output_dir = output_dir.rstrip("/")
  train, info = DATASETS[dataset](num_train, seed)
  evaluation, eval_info = DATASETS[dataset](num_eval, seed + 1)
  if dataset == "shapes":
    formats = tuple(f for f in formats if f != "csv")  # images live in TFRecord only
  write_split(f"{output_dir}/train", train, info["schema"], num_shards=num_shards, formats=formats)
  write_split(f"{output_dir}/eval", evaluation, info["schema"], num_shards=max(1, num_shards // 4),
              formats=formats)
  return {"output_dir": output_dir, "dataset": dataset, "num_train": num_train, "num_eval": num_eval,
          "formats": list(formats), "eval_bayes_accuracy": round(eval_info["bayes_accuracy"], 4)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--output_dir", required=True, help="local dir or gs://bucket/prefix")
  parser.add_argument("--dataset", choices=sorted(DATASETS), default="churn")
  parser.add_argument("--num_train", type=int, default=20_000)
  parser.add_argument("--num_eval", type=int, default=4_000)
  parser.add_argument("--num_shards", type=int, default=8)
  parser.add_argument("--seed", type=int, default=7)
  parser.add_argument("--formats", default="tfrecord,csv", help="comma-separated: tfrecord,csv")
  args = parser.parse_args()
  formats = tuple(f for f in args.formats.split(",") if f)
  bad = [f for f in formats if f not in ("tfrecord", "csv")]
  if bad or args.num_train < 1 or args.num_eval < 1 or args.num_shards < 1:
    parser.error(f"--formats takes tfrecord,csv (got {args.formats!r}); counts and shards must be >= 1")
  summary = make(args.output_dir, dataset=args.dataset, num_train=args.num_train, num_eval=args.num_eval,
                 num_shards=args.num_shards, seed=args.seed, formats=formats)
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
