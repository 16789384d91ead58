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
out-of-vocabulary id); `text` is free text (the model gets the raw string; its `vocabulary` is of tokens, see
below); `image` is image bytes (TFRecord, or base64 in JSONL). A label with `num_classes` makes a
classification task, a `float` label without it a regression task.

Optional keys, all also written by schema inference (`python -m trainer.schema_inference`):
- `"shape": [N]` on a numeric feature: N values per example (a `float_list` of N, a JSON array of N).
- `"default"`: the value a missing field takes (an empty CSV cell, an absent JSON key or Example feature).
  Without it a missing value is an error that names the file, record and column.
- on an image or text: `"uri": true`: the column holds the file's URI (gs://, /gcs/, or a local path), whose bytes
  are read in the input pipeline (an image PNG/JPEG/GIF/BMP: `encoding` png or jpeg). Served as the value itself.
- on an image: `"encoding": "raw" | "png" | "jpeg"` (default raw: uint8 bytes of `shape`; png/jpeg are decoded
  in the pipeline and resized to `shape` when they differ) and `"max_value"`: the pixel value that scales to
  1.0 (default 255; digits scanned 0..16 want 16).
- on a text feature: `"vocabulary"`: its tokens, most frequent first, as Keras' `TextVectorization` splits text
  (ASCII lower-cased, punctuation stripped, split at whitespace; `feature_kinds.text_tokens` in Python), and
  `"sequence_length"` (default 64): the tokens a sequence model keeps per example; optionally `"bigrams"`: word
  pairs ("not bad", two tokens and one space), most frequent first. The built-in models read the text as a bag of
  these words and word pairs; a plug-in gets the raw string and builds its own
  `TextVectorization(vocabulary=feature.vocabulary, output_sequence_length=feature.sequence_length)`.
- on the label: `"type": "string"` with a `"vocabulary"` of class names (class i is vocabulary entry i), and
  `"multi_label": true` when each record holds a list of them (Vertex's multi-label export: each class an
  independent yes/no, sigmoid outputs); on a regression label, `"mean"` and `"std"`: the built-in models learn the standardized label and serve its units.
- `"columns"`: every CSV column in file order, for CSV files without a header row.

A TFX / TensorFlow Data Validation schema (`schema.pbtxt`, tensorflow_metadata's `Schema` proto) is read too
(`trainer.data.tfmd`), with `--label` naming its label feature.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from trainer.core import paths
from trainer.core.errors import UserError
from trainer.data import feature_kinds

LABEL_TYPES = ("int", "float", "string")
DEFAULT_IMAGE_MAX = 255.0
SCHEMA_FILE = paths.SCHEMA_FILE


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  type: str
  vocabulary: tuple[str, ...] | None = None
  shape: tuple[int, ...] | None = None  # images: (height, width, channels); numeric: (N,) for N values
  mean: float | tuple[float, ...] | None = None  # a tuple of N for a multi-valued feature
  std: float | tuple[float, ...] | None = None
  default: float | int | str | None = None
  encoding: str | None = None  # images only
  max_value: float | None = None  # images only
  sequence_length: int | None = None  # text only: tokens kept per example by a sequence model
  bigrams: tuple[str, ...] | None = None  # text only: word pairs ("a b") the built-in models also look up
  uri: bool = False  # images and text: the column holds the URI of a file whose bytes are the value

  @property
  def kind(self) -> feature_kinds.Kind:
    """Its type's behaviour (`trainer.data.feature_kinds`)."""
    return feature_kinds.KINDS[self.type]

  @property
  def is_categorical(self) -> bool:
    return self.kind.categorical

  @property
  def is_numeric(self) -> bool:
    """One number per example, or N (`"shape": [N]`)."""
    return self.kind.holds == feature_kinds.NUMBER

  @property
  def is_image(self) -> bool:
    return self.kind.image

  @property
  def is_textual(self) -> bool:
    """A string value per example: a category or free text (both parse to a tf.string)."""
    return self.kind.holds == feature_kinds.STRING

  @property
  def input_name(self) -> str:
    """The name of the model input, the layers and the serving input for this column (`safe_name`)."""
    return safe_name(self.name)

  @property
  def values_per_example(self) -> int:
    """1 for a scalar; N for a numeric feature of shape [N] (images are one bytes value)."""
    return self.kind.values_per_example(self)

  @property
  def image_scale(self) -> float:
    return 1.0 / (self.max_value or DEFAULT_IMAGE_MAX)


@dataclasses.dataclass(frozen=True)
class Label:
  name: str
  type: str
  num_classes: int | None = None
  vocabulary: tuple[str, ...] | None = None  # a string label: class i is vocabulary[i]
  mean: float | None = None  # a regression label: the built-in models predict (y - mean) / std, serve y
  std: float | None = None
  multi_label: bool = False  # a list of class names per record: an independent yes/no per class

  @property
  def kind(self) -> feature_kinds.Kind:
    """Its type's behaviour: how a record and a tf.train.Example hold it (a label type is a feature type)."""
    return feature_kinds.KINDS[self.type]


@dataclasses.dataclass(frozen=True)
class Schema:
  features: tuple[Feature, ...]
  label: Label

  @property
  def task(self) -> str:
    """"classification" (one class per example), "multi_label" (any set of classes) or "regression"."""
    if self.label.multi_label:
      return "multi_label"
    return "classification" if self.label.num_classes else "regression"

  csv_columns: tuple[str, ...] | None = None  # every CSV column in file order (files without a header)

  @property
  def columns(self) -> tuple[str, ...]:
    return tuple(f.name for f in self.features) + (self.label.name,)

  def feature(self, name: str) -> Feature:
    return next(f for f in self.features if f.name == name)

  def to_dict(self) -> dict[str, Any]:
    def clean(obj):
      return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()
              if v is not None and not (k in ("uri", "multi_label") and v is False)}

    value = {"features": [clean(f) for f in self.features], "label": clean(self.label)}
    if self.csv_columns:
      value["columns"] = list(self.csv_columns)
    return value


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
    if kind not in feature_kinds.KINDS:  # each type's behaviour, its settings included, is a class there
      raise UserError(f"schema {source}: feature {name!r} has type {kind!r}; expected one of "
                      f"{', '.join(feature_kinds.KINDS)}")
    kind_of = feature_kinds.KINDS[kind]
    settings = kind_of.settings(raw, name=name, source=source)
    size = kind_of.values_per_example(Feature(name=name, type=kind, **settings))
    mean = _stat(raw.get("mean"), size, name=name, key="mean", source=source)
    std = _stat(raw.get("std"), size, name=name, key="std", source=source)
    if std is not None and not all(s > 0 for s in (std if isinstance(std, tuple) else (std,))):
      raise UserError(f"schema {source}: feature {name!r} has std {raw.get('std')!r}; expected a positive number")
    uri = raw.get("uri", False)
    if uri not in (True, False) or (uri and not kind_of.takes_uri):
      takers = " and ".join(sorted(k.type for k in feature_kinds.KINDS.values() if k.takes_uri))
      raise UserError(f"schema {source}: feature {name!r} ({kind}) has uri {uri!r}; only {takers} features "
                      "take \"uri\": true (the column holds file URIs)")
    default = raw.get("default")
    if default is not None:
      default = kind_of.default(default, name=name, source=source)
    features.append(Feature(name=name, type=kind, mean=mean, std=std, default=default, uri=uri, **settings))
  raw_label = value["label"]
  if not isinstance(raw_label, dict) or not isinstance(raw_label.get("name"), str):
    raise UserError(f"schema {source}: 'label' needs a 'name'")
  if raw_label["name"] in seen:
    raise UserError(f"schema {source}: label {raw_label['name']!r} is also listed as a feature")
  label_type = raw_label.get("type")
  if label_type not in LABEL_TYPES:
    raise UserError(f"schema {source}: label type {label_type!r}; expected one of {', '.join(LABEL_TYPES)}")
  num_classes = raw_label.get("num_classes")
  label_vocabulary = None
  if label_type == "string":
    label_vocabulary = raw_label.get("vocabulary")
    if (not isinstance(label_vocabulary, list) or len(label_vocabulary) < 2
        or not all(isinstance(v, str) for v in label_vocabulary)
        or len(set(label_vocabulary)) != len(label_vocabulary)):
      raise UserError(f"schema {source}: string label {raw_label['name']!r} needs a 'vocabulary' of 2 or more "
                      f"distinct class names, got {label_vocabulary!r}")
    label_vocabulary = tuple(label_vocabulary)
    if num_classes is not None and num_classes != len(label_vocabulary):
      raise UserError(f"schema {source}: label {raw_label['name']!r} has num_classes {num_classes} but "
                      f"{len(label_vocabulary)} vocabulary entries")
    num_classes = len(label_vocabulary)
  elif num_classes is not None:
    if label_type != "int" or not isinstance(num_classes, int) or num_classes < 2:
      raise UserError(f"schema {source}: 'num_classes' needs an int label and a value >= 2, got {num_classes!r}")
  elif label_type == "int":
    raise UserError(f"schema {source}: int label {raw_label['name']!r} needs 'num_classes' (classification); "
                    "use type 'float' for regression")
  csv_columns = value.get("columns")
  if csv_columns is not None:
    if (not isinstance(csv_columns, list) or not all(isinstance(c, str) and c for c in csv_columns)
        or len(set(csv_columns)) != len(csv_columns)):
      raise UserError(f"schema {source}: 'columns' must list every CSV column name once, got {csv_columns!r}")
    missing = [c for c in list(seen) + [raw_label["name"]] if c not in csv_columns]
    if missing:
      raise UserError(f"schema {source}: 'columns' lacks {', '.join(sorted(missing))}")
    csv_columns = tuple(csv_columns)
  by_input_name: dict[str, str] = {}
  for feature in features:
    other = by_input_name.setdefault(feature.input_name, feature.name)
    if other != feature.name:
      raise UserError(f"schema {source}: features {other!r} and {feature.name!r} both become the model input "
                      f"{feature.input_name!r}; rename one")
  label_mean = _stat(raw_label.get("mean"), 1, name=raw_label["name"], key="mean", source=source)
  label_std = _stat(raw_label.get("std"), 1, name=raw_label["name"], key="std", source=source)
  if (label_mean is not None or label_std is not None) and (num_classes is not None or label_type != "float"):
    raise UserError(f"schema {source}: label {raw_label['name']!r} has mean/std, which only a regression label "
                    "(type float) takes")
  if label_std is not None and label_std <= 0:
    raise UserError(f"schema {source}: label {raw_label['name']!r} has std {label_std!r}; expected a positive number")
  multi_label = raw_label.get("multi_label", False)
  if multi_label not in (True, False) or (multi_label and label_type != "string"):
    raise UserError(f"schema {source}: label {raw_label['name']!r} has multi_label {multi_label!r}; expected true "
                    "(on a string label with a vocabulary: a list of class names per record) or false")
  return Schema(features=tuple(features), label=Label(raw_label["name"], label_type, num_classes, label_vocabulary,
                                                      label_mean, label_std, multi_label),
                csv_columns=csv_columns)


def safe_name(column: str) -> str:
  """`column` as a TensorFlow/Keras name: each character outside [A-Za-z0-9_.-] becomes "_" (real headers hold
  spaces and parentheses, e.g. "sepal length (cm)" -> "sepal_length__cm_"), a leading "_" or "-" gets "f"."""
  name = re.sub(r"[^A-Za-z0-9_.\-]", "_", column)
  return name if name[:1].isalnum() or name[:1] == "." else "f" + name


def _stat(value: Any, size: int, *, name: str, key: str, source: str) -> float | tuple[float, ...] | None:
  """A feature's mean or std: one number, or (multi-valued features) one number or a list of `size`."""
  if value is None:
    return None
  if feature_kinds.is_number_value(value):
    return float(value)
  if (size > 1 and isinstance(value, list) and len(value) == size
      and all(feature_kinds.is_number_value(v) for v in value)):
    return tuple(float(v) for v in value)
  raise UserError(f"schema {source}: feature {name!r} has {key} {value!r}; expected a number"
                  + (f" or a list of {size}" if size > 1 else ""))


def load_schema(path: str, *, label: str | None = None) -> Schema:
  """Reads and validates a schema file (local, gs://): our JSON, or a TFX/TFDV `schema.pbtxt` (needs `label`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    with tf.io.gfile.GFile(path, "r") as f:
      text = f.read()
  except tf.errors.NotFoundError:
    raise UserError(f"--schema: file {path} not found; pass --schema, put schema.json beside the training files, "
                    "or pass --label to infer one") from None
  except tf.errors.OpError as e:
    raise UserError(f"--schema: cannot read {path}: {e.message.splitlines()[0]}") from None
  if path.endswith((".pbtxt", ".textproto")):
    from trainer.data import tfmd  # pylint: disable=g-import-not-at-top

    return parse_schema(tfmd.schema_from_text(text, label=label, source=path), source=path)
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f"schema {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
  return parse_schema(value, source=path)
