"""A user's own model package on disk, as a team ships one (pyproject.toml, a package with a build_fn), for the
--extra_package tests: it is importable only where it was installed, never from the test's own path."""

import os

PYPROJECT = '''[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "churn-models"
version = "0.1.0"

[tool.setuptools]
packages = ["churn_models"]
'''

MODULE = '''"""A Keras-tutorial model: a Sequential over the numeric features, normalized, ending in softmax."""
import tensorflow as tf


def build(schema, hparams):
  print(f"churn_models: built from {__file__}", flush=True)  # where each replica imported it from
  numeric = [f for f in schema.features if f.type != "string"]
  return tf.keras.Sequential([
      tf.keras.Input((len(numeric),)),
      tf.keras.layers.Normalization(mean=[f.mean for f in numeric], variance=[f.std ** 2 for f in numeric]),
      tf.keras.layers.Dense(int(hparams.get("units", 16)), activation="relu"),
      tf.keras.layers.Dense(schema.label.num_classes, activation="softmax")])
'''

MODEL_FLAG = "--model=churn_models:build"


def write(directory: str) -> str:
  """Writes the project into `directory`; returns it."""
  os.makedirs(os.path.join(directory, "churn_models"), exist_ok=True)
  with open(os.path.join(directory, "pyproject.toml"), "w") as f:
    f.write(PYPROJECT)
  with open(os.path.join(directory, "churn_models", "__init__.py"), "w") as f:
    f.write(MODULE)
  return directory
