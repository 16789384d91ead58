"""Model builders: the built-in tabular and image models, and the hook for a user's own.

Every builder takes the schema and returns an uncompiled Keras model whose inputs are named after the
schema's features (`Feature.input_name`: the column name with characters outside [A-Za-z0-9_.-] as "_") and
take the encoded tensors `features.FeatureEncoder` produces (float numbers, int64 vocabulary
ids, float images). It outputs logits (classification) or one value (regression). Call builders inside
`strategy.scope()`.

A plug-in is `--model=package.module:build_fn`:

    def build_fn(schema: trainer.schema.Schema, hparams: dict) -> keras.Model

  Args:
    schema: the features (`schema.features`, each with `name`, `type`, `vocabulary`, `shape`, `mean`, `std`)
      and the label (`schema.label`, with `num_classes` for classification).
    hparams: the JSON object given with --hparams.

  Returns:
    An uncompiled Keras model taking a dict of encoded features keyed by `feature.input_name` (strings
    arrive as int64 ids, 0 for out-of-vocabulary, i + 1 for vocabulary entry i) and returning logits of
    shape (batch, num_classes) for classification or (batch,) / (batch, 1) for regression. It is run on one
    batch built from the schema before training (`check_outputs`); what does not fit is one error line.
"""

from __future__ import annotations

import importlib
import os
import traceback
from typing import Any, Callable, Mapping

from trainer import config as config_lib
from trainer import schema as schema_lib
from trainer.errors import UserError
from trainer.errors import first_line


def keras_version() -> str:
  """The version of the Keras behind `tf.keras`: Keras 3, or tf_keras 2.x with TF_USE_LEGACY_KERAS=1."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  version = getattr(tf.keras, "__version__", None)
  if version:
    return version
  import tf_keras  # pylint: disable=g-import-not-at-top  (tf.keras is tf_keras, which keeps it here)

  return tf_keras.__version__


def resolve_builder(name: str) -> Callable[..., Any]:
  """Returns a `build(schema, model_config, hparams)` callable; import errors become UserError."""
  if name == "tabular":
    return build_tabular
  if name == "cnn":
    return build_cnn
  module_name, _, attr = name.partition(":")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"--model={name!r}: cannot import module {module_name!r} ({type(e).__name__}: {e})") from None
  build_fn = getattr(module, attr, None)
  if not callable(build_fn):
    raise UserError(f"--model={name!r}: module {module_name!r} has no callable {attr!r}")

  def build_plugin(schema: schema_lib.Schema, model_config: config_lib.ModelConfig,
                   hparams: Mapping[str, Any]):
    del model_config
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    try:
      model = build_fn(schema, dict(hparams))
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (the user's code: name it and where it failed)
      raise UserError(f"--model={name!r}: build_fn raised {type(e).__name__}{_user_frame(e, module)}: "
                      f"{first_line(e)}") from None
    if not isinstance(model, tf.keras.Model):
      raise UserError(f"--model={name!r}: build_fn returned {type(model).__name__}, expected a keras.Model")
    check_outputs(model, schema, flag=f"--model={name!r}")
    return model

  return build_plugin


def _user_frame(error: BaseException, module) -> str:
  """' at FILE line N' for the deepest frame of the traceback inside the plug-in's own file, if any."""
  path = getattr(module, "__file__", None)
  frames = [f for f in traceback.extract_tb(error.__traceback__) if path and f.filename == path]
  return f" at {os.path.basename(path)} line {frames[-1].lineno}" if frames else ""


def sample_batch(schema: schema_lib.Schema, size: int = 2) -> dict[str, Any]:
  """A batch of encoded features as the input pipeline makes them (zeros): float32, int64 ids, images."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  batch = {}
  for feature in schema.features:
    if feature.is_categorical:
      batch[feature.input_name] = tf.zeros([size], tf.int64)
    elif feature.type == "image":
      batch[feature.input_name] = tf.zeros((size,) + feature.shape, tf.float32)
    elif feature.values_per_example > 1:
      batch[feature.input_name] = tf.zeros([size, feature.values_per_example], tf.float32)
    else:
      batch[feature.input_name] = tf.zeros([size], tf.float32)
  return batch


def check_outputs(model, schema: schema_lib.Schema, *, flag: str) -> None:
  """Runs `model` on one batch built from the schema and checks its output fits the task, in one line."""
  names = input_names(model)
  features = [f.input_name for f in schema.features]
  unknown = [n for n in names or () if n not in features]
  if unknown:
    raise UserError(f"{flag}: the model takes input(s) named {', '.join(unknown)}, which are not features of the "
                    f"schema ({', '.join(features)}); name each keras.Input after the feature it takes")
  size = 2
  try:
    outputs = model(select_inputs(sample_batch(schema, size), names), training=False)
  except Exception as e:  # pylint: disable=broad-except  (the user's code: any failure is theirs to see)
    raise UserError(f"{flag}: calling the model on a batch of the schema's features failed "
                    f"({type(e).__name__}: {first_line(e)})") from None
  shape = tuple(getattr(outputs, "shape", ()))
  if schema.task == "classification":
    expected, fits = f"({size}, {schema.label.num_classes})", shape == (size, schema.label.num_classes)
    what = f"logits over the {schema.label.num_classes} classes of label {schema.label.name!r}"
  else:
    expected, fits = f"({size},) or ({size}, 1)", shape in ((size,), (size, 1))
    what = f"one value per example for the regression label {schema.label.name!r}"
  if not fits:
    raise UserError(f"{flag}: on a batch of {size} the model outputs shape {shape}; the task needs {what}, "
                    f"shape {expected}")


def output_units(schema: schema_lib.Schema) -> int:
  return schema.label.num_classes if schema.task == "classification" else 1


def model_inputs(schema: schema_lib.Schema) -> dict[str, Any]:
  """Named Keras inputs, one per feature, matching the encoder's output dtypes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  inputs = {}
  for feature in schema.features:
    if feature.is_categorical:
      inputs[feature.input_name] = tf.keras.Input(shape=(), dtype="int64", name=feature.input_name)
    elif feature.type == "image":
      inputs[feature.input_name] = tf.keras.Input(shape=feature.shape, dtype="float32", name=feature.input_name)
    elif feature.values_per_example > 1:
      inputs[feature.input_name] = tf.keras.Input(shape=(feature.values_per_example,), dtype="float32",
                                                  name=feature.input_name)
    else:
      inputs[feature.input_name] = tf.keras.Input(shape=(), dtype="float32", name=feature.input_name)
  return inputs


def build_tabular(schema: schema_lib.Schema, model_config: config_lib.ModelConfig,
                  hparams: Mapping[str, Any] | None = None):
  """An MLP over standardized numeric features and embedded categorical ones."""
  del hparams
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  layers = tf.keras.layers
  inputs = model_inputs(schema)
  parts = []
  for feature in schema.features:
    x = inputs[feature.input_name]
    if feature.is_categorical:
      size = len(feature.vocabulary) + 1
      x = layers.Embedding(size, min(8, size), name=f"{feature.input_name}_embedding")(x)
    elif feature.type == "image":
      x = layers.Flatten()(layers.Rescaling(feature.image_scale)(x))
    else:
      x = layers.Reshape((feature.values_per_example,))(x)
      if feature.mean is not None and feature.std is not None:
        scale, offset = _standardization(feature)
        x = layers.Rescaling(scale, offset=offset, name=f"{feature.input_name}_std")(x)
    parts.append(x)
  x = layers.Concatenate()(parts) if len(parts) > 1 else parts[0]
  for units in model_config.hidden_units:
    x = layers.Dense(units, activation="relu")(x)
    if model_config.dropout:
      x = layers.Dropout(model_config.dropout)(x)
  outputs = layers.Dense(output_units(schema), name="output")(x)
  return tf.keras.Model(inputs, outputs, name="tabular")


def _standardization(feature: schema_lib.Feature):
  """(scale, offset) with x * scale + offset = (x - mean) / std; per value for a multi-valued feature."""
  size = feature.values_per_example
  means = feature.mean if isinstance(feature.mean, tuple) else (feature.mean,) * size
  stds = feature.std if isinstance(feature.std, tuple) else (feature.std,) * size
  if size == 1:
    return 1 / stds[0], -means[0] / stds[0]
  return [1 / s for s in stds], [-m / s for m, s in zip(means, stds)]


def build_cnn(schema: schema_lib.Schema, model_config: config_lib.ModelConfig,
              hparams: Mapping[str, Any] | None = None):
  """A small convolutional network over the schema's first image feature."""
  del hparams
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  images = [f for f in schema.features if f.type == "image"]
  if not images:
    raise UserError("--model=cnn needs an image feature in the schema (type 'image'); use --model=tabular")
  layers = tf.keras.layers
  image = model_inputs(schema)[images[0].input_name]
  x = layers.Rescaling(images[0].image_scale)(image)
  for filters in (16, 32):
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
  x = layers.GlobalAveragePooling2D()(x)
  for units in model_config.hidden_units:
    x = layers.Dense(units, activation="relu")(x)
    if model_config.dropout:
      x = layers.Dropout(model_config.dropout)(x)
  outputs = layers.Dense(output_units(schema), name="output")(x)
  return tf.keras.Model({images[0].input_name: image}, outputs, name="cnn")


def input_names(model) -> list[str] | None:
  """The feature names a functional model takes, or None when it takes any dict (subclassed models)."""
  inputs = getattr(model, "inputs", None)
  if not inputs:
    return None
  names = [getattr(t, "name", None) for t in inputs]
  return names if all(names) else None


def select_inputs(features: Mapping[str, Any], names: list[str] | None) -> Mapping[str, Any]:
  """The subset of encoded features a model takes (a CNN ignores the tabular columns)."""
  if names is None:
    return features
  return {name: features[name] for name in names}
