"""The feature schema: which columns the data has, their types, and the label.

A schema is a JSON file beside the data (or wherever --schema points):

    {
      "features": [
        {"name": "tenure_months", "type": "float", "mean": 30.0, "std": 17.0},
        {"name": "plan", "type": "string", "vocabulary": ["basic", "plus", "pro"]},
        {"name": "pixels", "type": "image", "shape": [16, 16, 1]}
      ],
      "label": {"name": "churned", "type": "int", "num_classes": 2}
    }

`float` and `int` are numeric; `string` is categorical over its vocabulary (unknown values map to an
out-of-vocabulary id); `image` is raw uint8 bytes of the given shape (TFRecord only). A label with
`num_classes` makes a classification task, a `float` label without it a regression task.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from trainer.errors import UserError

FEATURE_TYPES = ("float", "int", "string", "image")
LABEL_TYPES = ("int", "float")
# Each schema type's `tf.train.Example` list and the dtype it parses to (TensorFlow dtype names, so this module
# imports no TensorFlow). The one table every reader, checker and converter uses.
EXAMPLE_LISTS = {"float": "float_list", "int": "int64_list", "string": "bytes_list", "image": "bytes_list"}
PARSE_DTYPES = {"float": "float32", "int": "int64", "string": "string", "image": "string"}


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  type: str
  vocabulary: tuple[str, ...] | None = None
  shape: tuple[int, ...] | None = None
  mean: float | None = None
  std: float | None = None

  @property
  def is_categorical(self) -> bool:
    return self.type == "string"


@dataclasses.dataclass(frozen=True)
class Label:
  name: str
  type: str
  num_classes: int | None = None


@dataclasses.dataclass(frozen=True)
class Schema:
  features: tuple[Feature, ...]
  label: Label

  @property
  def task(self) -> str:
    return "classification" if self.label.num_classes else "regression"

  @property
  def columns(self) -> tuple[str, ...]:
    return tuple(f.name for f in self.features) + (self.label.name,)

  def to_dict(self) -> dict[str, Any]:
    def clean(obj):
      return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()
              if v is not None}

    return {"features": [clean(f) for f in self.features], "label": clean(self.label)}


def parse_schema(value: Any, *, source: str) -> Schema:
  """Validates a decoded schema JSON object; `source` names the file in errors."""
  if not isinstance(value, dict) or "features" not in value or "label" not in value:
    raise UserError(f"schema {source}: expected an object with 'features' and 'label'")
  raw_features = value["features"]
  if not isinstance(raw_features, list) or not raw_features:
    raise UserError(f"schema {source}: 'features' must be a non-empty list")
  features = []
  seen = set()
  for raw in raw_features:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
      raise UserError(f"schema {source}: every feature needs a 'name', got {raw!r}")
    name = raw["name"]
    if name in seen:
      raise UserError(f"schema {source}: feature {name!r} is listed twice")
    seen.add(name)
    kind = raw.get("type")
    if kind not in FEATURE_TYPES:
      raise UserError(f"schema {source}: feature {name!r} has type {kind!r}; expected one of "
                      f"{', '.join(FEATURE_TYPES)}")
    vocabulary = raw.get("vocabulary")
    if kind == "string":
      if not isinstance(vocabulary, list) or not vocabulary or not all(isinstance(v, str) for v in vocabulary):
        raise UserError(f"schema {source}: string feature {name!r} needs a non-empty 'vocabulary' of strings")
      vocabulary = tuple(vocabulary)
    else:
      vocabulary = None
    shape = raw.get("shape")
    if kind == "image":
      if (not isinstance(shape, list) or len(shape) != 3
          or not all(isinstance(d, int) and d > 0 for d in shape)):
        raise UserError(f"schema {source}: image feature {name!r} needs 'shape': [height, width, channels], "
                        f"got {shape!r}")
      shape = tuple(shape)
    else:
      shape = None
    mean, std = raw.get("mean"), raw.get("std")
    if std is not None and not (isinstance(std, (int, float)) and std > 0):
      raise UserError(f"schema {source}: feature {name!r} has std {std!r}; expected a positive number")
    features.append(Feature(name=name, type=kind, vocabulary=vocabulary, shape=shape,
                            mean=None if mean is None else float(mean), std=None if std is None else float(std)))
  raw_label = value["label"]
  if not isinstance(raw_label, dict) or not isinstance(raw_label.get("name"), str):
    raise UserError(f"schema {source}: 'label' needs a 'name'")
  if raw_label["name"] in seen:
    raise UserError(f"schema {source}: label {raw_label['name']!r} is also listed as a feature")
  label_type = raw_label.get("type")
  if label_type not in LABEL_TYPES:
    raise UserError(f"schema {source}: label type {label_type!r}; expected one of {', '.join(LABEL_TYPES)}")
  num_classes = raw_label.get("num_classes")
  if num_classes is not None:
    if label_type != "int" or not isinstance(num_classes, int) or num_classes < 2:
      raise UserError(f"schema {source}: 'num_classes' needs an int label and a value >= 2, got {num_classes!r}")
  elif label_type == "int":
    raise UserError(f"schema {source}: int label {raw_label['name']!r} needs 'num_classes' (classification); "
                    "use type 'float' for regression")
  return Schema(features=tuple(features), label=Label(raw_label["name"], label_type, num_classes))


def load_schema(path: str) -> Schema:
  """Reads and validates a schema file (local, gs://)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    with tf.io.gfile.GFile(path, "r") as f:
      text = f.read()
  except tf.errors.NotFoundError:
    raise UserError(f"--schema: file {path} not found; pass --schema or put schema.json beside the "
                    "training files") from None
  except tf.errors.OpError as e:
    raise UserError(f"--schema: cannot read {path}: {e.message.splitlines()[0]}") from None
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f"schema {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
  return parse_schema(value, source=path)
