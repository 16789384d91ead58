"""Model builders: the built-in tabular and CNN models, and the hook for a user's own (`model_registry` maps
--model to them; the transfer-learning backbones are `backbones`).

Every builder takes the schema and returns an uncompiled Keras model whose inputs are named after the
schema's features (`Feature.input_name`: the column name with characters outside [A-Za-z0-9_.-] as "_") and
take the encoded tensors `features.FeatureEncoder` produces (float numbers, int64 vocabulary
ids, float images). It outputs logits (classification) or one value (regression). Call builders inside
`strategy.scope()`.

A plug-in is `--model=package.module:build_fn`:

    def build_fn(schema: trainer.data.schema.Schema, hparams: dict) -> keras.Model

  Args:
    schema: the features (`schema.features`, each with `name`, `type`, `vocabulary`, `shape`, `mean`, `std`)
      and the label (`schema.label`, with `num_classes` for classification).
    hparams: the JSON object given with --hparams.

  Returns:
    An uncompiled Keras model taking a dict of encoded features keyed by `feature.input_name` (strings
    arrive as int64 ids, 0 for out-of-vocabulary, i + 1 for vocabulary entry i; free text as the raw string,
    with the feature's token `vocabulary`, `bigrams` and `sequence_length` at hand, and `bag_of_words` below)
    and returning logits of shape (batch, num_classes) for classification or (batch,) / (batch, 1) for
    regression. It is run on one batch built from the schema before training (`check_outputs`); what does not
    fit is one error line.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import traceback
from typing import Any, Callable, Mapping

from absl import logging

from trainer.core import config as config_lib
from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data import schema as schema_lib


def keras_version() -> str:
  """The version of the Keras behind `tf.keras`: Keras 3, or tf_keras 2.x with TF_USE_LEGACY_KERAS=1."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  version = getattr(tf.keras, "__version__", None)
  if version:
    return version
  import tf_keras  # pylint: disable=g-import-not-at-top  (tf.keras is tf_keras, which keeps it here)

  return tf_keras.__version__


def plugin_builder(name: str) -> Callable[..., Any]:
  """A `build(schema, model_config, hparams)` callable for `--model=package.module:build_fn` (the built-in models:
  `model_registry`); import errors become UserError."""
  module_name, _, attr = name.partition(":")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"--model={name!r}: cannot import module {module_name!r} ({type(e).__name__}: {e})") from None
  build_fn = getattr(module, attr, None)
  if not callable(build_fn):
    raise UserError(f"--model={name!r}: module {module_name!r} has no callable {attr!r}")
  # Which copy of the user's code this replica runs (the image's, an --extra_package's, a local checkout's).
  logging.info("Model %s from %s", name, getattr(module, "__file__", None) or module_name)

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
    compiled = user_compile(model, schema, flag=f"--model={name!r}")
    model = adapt_to_contract(model, schema, flag=f"--model={name!r}")
    check_outputs(model, schema, flag=f"--model={name!r}")
    if compiled is not None:
      model.user_compile = compiled  # read by training: the user's loss and optimizer replace the trainer's
    return model

  return build_plugin


@dataclasses.dataclass(frozen=True)
class UserCompile:
  """What a plug-in's own `model.compile(...)` chose. The loss is applied to the outputs as the user's model
  gives them (probabilities, one sigmoid unit, one logit), rebuilt from the contract's logits by
  `user_outputs`, so a `SparseCategoricalCrossentropy()` written for softmax outputs gets probabilities."""

  loss: Any
  optimizer: Any
  metrics: tuple
  activation: str | None  # the user's output activation (output_activation)
  binary_unit: bool  # one output unit for two classes
  multi_label: bool = False  # a yes/no per class: sigmoid probabilities (or logits), multi-hot float labels

  def describe(self) -> str:
    loss = self.loss if isinstance(self.loss, str) else type(self.loss).__name__ if self.loss is not None else None
    optimizer = type(self.optimizer).__name__ if self.optimizer is not None else None
    return f"loss={loss}, optimizer={optimizer}, metrics={len(self.metrics)}"

  def user_outputs(self, logits):
    """The user model's own outputs from the contract's logits (the adapter's inverse)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self.activation == "softmax":
      return tf.nn.softmax(logits, axis=-1)
    if self.multi_label:
      return tf.sigmoid(logits) if self.activation == "sigmoid" else logits
    if self.binary_unit:
      logit = logits[:, 1:2] - logits[:, 0:1]  # the adapter's logits are [0, z] or [log(1-p), log p]
      return tf.sigmoid(logit) if self.activation == "sigmoid" else logit
    return logits

  def per_example_loss(self, labels, logits):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    outputs = self.user_outputs(tf.cast(logits, tf.float32))
    if self.binary_unit:  # a binary loss wants float labels shaped like its one unit
      labels = tf.reshape(tf.cast(labels, outputs.dtype), [-1, 1])
    loss = self.loss
    fn = loss.call if isinstance(loss, tf.keras.losses.Loss) else tf.keras.losses.get(loss)
    return tf.reshape(fn(labels, outputs), [-1])


def user_compile(model, schema: schema_lib.Schema, *, flag: str = "--model") -> UserCompile | None:
  """The loss, optimizer and metrics of a plug-in model that arrived compiled (Keras 3 or tf_keras), else None."""
  loss = getattr(model, "loss", None)
  optimizer = getattr(model, "optimizer", None)
  if not loss or optimizer is None:
    return None
  compile_config = getattr(model, "_compile_config", None)  # Keras 3
  metrics = (getattr(compile_config, "config", {}) or {}).get("metrics") if compile_config is not None else None
  if metrics is None:  # tf_keras
    metrics = getattr(getattr(model, "compiled_metrics", None), "_user_metrics", None)
  if isinstance(metrics, dict) or isinstance(loss, (dict, list)):
    return None  # per-output losses or metrics: the model has one output here, so these are not ours to map
  activation, _, binary = _output_form(model, schema, flag=flag)
  return UserCompile(loss=loss, optimizer=optimizer, metrics=tuple(metrics or ()), activation=activation,
                     binary_unit=binary, multi_label=schema.task == "multi_label")


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
    spec = feature.kind.model_input(feature)
    batch[feature.input_name] = tf.zeros((size,) + spec.shape, spec.dtype)
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
  elif schema.task == "multi_label":
    expected, fits = f"({size}, {schema.label.num_classes})", shape == (size, schema.label.num_classes)
    what = (f"a logit (or sigmoid probability) per class of the multi-label label {schema.label.name!r}, "
            f"{schema.label.num_classes} classes")
  else:
    expected, fits = f"({size},) or ({size}, 1)", shape in ((size,), (size, 1))
    what = f"one value per example for the regression label {schema.label.name!r}"
  if not fits:
    raise UserError(f"{flag}: on a batch of {size} the model outputs shape {shape}; the task needs {what}, "
                    f"shape {expected}")


# ----- the plug-in contract, as tutorials write models --------------------------------------------------------

_PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


def output_activation(model) -> str | None:
  """"softmax" or "sigmoid" when the model's output layer ends in one (a Dense activation, an Activation or
  Softmax layer), else None: the outputs are logits (or regression values)."""
  layer = None
  outputs = getattr(model, "outputs", None) or []
  history = getattr(outputs[0], "_keras_history", None) if len(outputs) == 1 else None
  if history is not None:
    layer = history[0]
  elif getattr(model, "layers", None):
    layer = model.layers[-1]
  while layer is not None and getattr(layer, "layers", None) and not getattr(layer, "activation", None):
    layer = layer.layers[-1]  # a nested Sequential or functional block: its own last layer
  if layer is None:
    return None
  if type(layer).__name__ == "Softmax":
    return "softmax"
  activation = getattr(layer, "activation", None)
  name = activation if isinstance(activation, str) else getattr(activation, "__name__", None)
  return name if name in _PROBABILITY_ACTIVATIONS else None


def _numeric_features(schema: schema_lib.Schema) -> list[schema_lib.Feature]:
  return [f for f in schema.features if f.is_numeric]


def adapt_to_contract(model, schema: schema_lib.Schema, *, flag: str):
  """The model as the trainer calls it (a dict of encoded features in, logits out), wrapping what tutorials write:
  probability outputs (a final softmax, or sigmoid over one unit), one unit for a two-class task (a logit), a
  model over one vector of the numeric features (a Sequential), inputs that take raw strings (the model looks them
  up itself). A model that already fits is returned as it is (its checkpoints keep their names)."""
  names = input_names(model)
  features = {f.input_name: f for f in schema.features}
  input_mode = "dict"
  if names is None and _is_unbuilt_sequential(model):
    input_mode = "vector"
  elif names is None:
    input_mode = _probe_subclassed(model, schema, flag=flag)[0]
  elif names is not None and not set(names) <= set(features):
    numeric_size = sum(f.values_per_example for f in _numeric_features(schema))
    shape = tuple(model.inputs[0].shape) if len(names) == 1 else ()
    if len(names) == 1 and len(shape) == 2 and shape[1] == numeric_size:
      input_mode = "vector"
    else:
      unknown = [n for n in names if n not in features]
      raise UserError(f"{flag}: the model takes input(s) named {', '.join(unknown)}"
                      f"{' of shape ' + str(shape) if len(names) == 1 else ''}, which are not features of the "
                      f"schema ({', '.join(features)}); name each keras.Input after the feature it takes, or take "
                      f"one vector of the {numeric_size} numeric value(s) (shape (None, {numeric_size}))")
  string_inputs = tuple(name for name, tensor in zip(names or (), getattr(model, "inputs", None) or ())
                        if name in features and features[name].is_categorical
                        and "string" in str(getattr(tensor, "dtype", "")))
  activation, units, binary = _output_form(model, schema, flag=flag)
  if schema.task == "multi_label" and activation == "softmax":
    raise UserError(f"{flag}: the model ends in a softmax (one class per example); label {schema.label.name!r} "
                    f"is multi-label (any of its {schema.label.num_classes} classes per example): end in a sigmoid "
                    f"over {schema.label.num_classes} units, or logits")
  if activation == "sigmoid" and units not in (1, None) and schema.task != "multi_label":
    raise UserError(f"{flag}: the model ends in a sigmoid over {units} units (independent probabilities, a "
                    f"multi-label output); a classifier of label {schema.label.name!r} needs softmax over "
                    f"{schema.label.num_classes} units, one sigmoid unit for two classes, or logits")
  if input_mode == "dict" and not string_inputs and activation is None and not binary:
    return model
  try:
    return _ContractAdapter(model, schema, input_mode=input_mode, string_inputs=string_inputs,
                            activation=activation, binary=binary)
  except Exception as e:  # pylint: disable=broad-except  (the user's call() on symbolic inputs: theirs to see)
    fed = "numeric vector" if input_mode == "vector" else "features by name"
    raise UserError(f"{flag}: calling the model on the schema's {fed} as Keras inputs failed "
                    f"({type(e).__name__}: {first_line(e)})") from None


def _is_unbuilt_sequential(model) -> bool:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return isinstance(model, tf.keras.Sequential) and not getattr(model, "inputs", None)


def _output_units(model, schema: schema_lib.Schema, *, flag: str) -> int | None:
  outputs = getattr(model, "outputs", None)
  if outputs and len(outputs) == 1 and outputs[0].shape and len(outputs[0].shape) == 2:
    return outputs[0].shape[-1]
  if _is_unbuilt_sequential(model) and getattr(model.layers[-1], "units", None):
    return model.layers[-1].units
  if input_names(model) is None and not _is_unbuilt_sequential(model):
    return _probe_subclassed(model, schema, flag=flag)[1]
  return None


def _probe_subclassed(model, schema: schema_lib.Schema, *, flag: str) -> tuple[str, int | None]:
  """("dict" or "vector", output units) of a subclassed model, which declares neither its inputs nor its outputs:
  called on a batch of the schema's features by name, else on one vector of the numeric ones (as tutorials write
  `call`). Remembered on the model: the probe builds its layers once."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  known = getattr(model, "_trainer_probe", None)
  if known is not None:
    return known
  size = 2
  numeric_size = sum(f.values_per_example for f in _numeric_features(schema))
  failures = []
  for mode, batch in (("dict", lambda: sample_batch(schema, size)),
                      ("vector", lambda: tf.zeros((size, numeric_size)))):
    try:
      outputs = model(batch(), training=False)
    except Exception as e:  # pylint: disable=broad-except  (the user's code: any failure is theirs to see)
      failures.append(f"{mode}: {type(e).__name__}: {first_line(e)}")
      continue
    shape = tuple(getattr(outputs, "shape", ()))
    model._trainer_probe = (mode, shape[-1] if len(shape) == 2 else None)  # pylint: disable=protected-access
    return model._trainer_probe  # pylint: disable=protected-access
  raise UserError(f"{flag}: the subclassed model's call() fails on a dict of the schema's features by name "
                  f"({', '.join(f.input_name for f in schema.features)}) and on one vector of the {numeric_size} "
                  f"numeric value(s), shape ({size}, {numeric_size}); it must take one of them "
                  f"({'; '.join(failures)})")


def _output_form(model, schema: schema_lib.Schema, *, flag: str) -> tuple[str | None, int | None, bool]:
  """(output activation for a classifier, output units, one unit for a two-class task): what the adapter
  wraps, and what a compiled plug-in's own loss expects back."""
  units = _output_units(model, schema, flag=flag)
  classification = schema.task in ("classification", "multi_label")
  binary = schema.task == "classification" and schema.label.num_classes == 2 and units == 1
  return (output_activation(model) if classification else None), units, binary


def _contract_layers():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class IdsToStrings(tf.keras.layers.Layer):
    """Vocabulary ids back to the strings a model looks up itself (id i + 1 is entry i; 0, out of vocabulary, is
    "", which a StringLookup also maps to its out-of-vocabulary index)."""

    def __init__(self, vocabulary, **kwargs):
      super().__init__(**kwargs)
      self._vocabulary = ("",) + tuple(vocabulary)

    def call(self, ids):
      return tf.gather(tf.constant(self._vocabulary), tf.cast(ids, tf.int64))

  class ToLogits(tf.keras.layers.Layer):
    """Probabilities (softmax, or one sigmoid unit) or one binary logit, as logits over the classes; or
    (multi-label) a sigmoid probability per class as that class's logit."""

    def __init__(self, activation, binary, multi_label=False, **kwargs):
      super().__init__(**kwargs)
      self._activation, self._binary, self._multi_label = activation, binary, multi_label

    def call(self, outputs):
      outputs = tf.cast(outputs, tf.float32)
      # Probabilities of exactly 0 or 1 would be infinite logits: clip to float32's own limits (its smallest
      # normal number, its largest number below 1), not to Keras' 1e-7, so a served probability keeps its
      # magnitude (a 1e-12 stays 1e-12, not 1e-7).
      tiny, below_one = np.finfo(np.float32).tiny, 1 - np.finfo(np.float32).epsneg
      if self._multi_label:
        p = tf.clip_by_value(outputs, tiny, below_one)
        return tf.math.log(p) - tf.math.log1p(-p)  # sigmoid of this is p
      if self._activation == "sigmoid" or self._binary:
        outputs = tf.reshape(outputs, [-1, 1])
        if self._activation == "sigmoid":
          p = tf.clip_by_value(outputs, tiny, below_one)
          return tf.concat([tf.math.log1p(-p), tf.math.log(p)], axis=-1)  # softmax of these is [1 - p, p]
        return tf.concat([tf.zeros_like(outputs), outputs], axis=-1)  # softmax([0, z]) = [1 - sigmoid z, sigmoid z]
      return tf.math.log(tf.clip_by_value(outputs, tiny, 1.0))  # softmax(log p) = p

  return IdsToStrings, ToLogits


def _ContractAdapter(model, schema, *, input_mode, string_inputs, activation, binary):  # pylint: disable=invalid-name
  """A functional model over the schema's named inputs that feeds `model` what it takes and returns logits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  ids_to_strings, to_logits = _contract_layers()
  inputs = model_inputs(schema)
  if input_mode == "vector":
    numeric = _numeric_features(schema)
    columns = [tf.keras.layers.Reshape((f.values_per_example,))(inputs[f.input_name]) for f in numeric]
    taken = {f.input_name: inputs[f.input_name] for f in numeric}
    fed = tf.keras.layers.Concatenate(name="numeric_vector")(columns) if len(columns) > 1 else columns[0]
  else:
    names = input_names(model) or list(inputs)  # a subclassed model over the dict: every feature, by name
    taken = {name: inputs[name] for name in names}
    by_name = {f.input_name: f for f in schema.features}
    fed = {name: (ids_to_strings(by_name[name].vocabulary, name=f"{name}_strings")(tensor)
                  if name in string_inputs else tensor) for name, tensor in taken.items()}
  outputs = model(fed)
  if activation is not None or binary:
    outputs = to_logits(activation, binary, multi_label=schema.task == "multi_label", name="to_logits")(outputs)
  return tf.keras.Model(taken, outputs, name="contract_adapter")


def output_units(schema: schema_lib.Schema) -> int:
  return 1 if schema.task == "regression" else schema.label.num_classes


def model_inputs(schema: schema_lib.Schema) -> dict[str, Any]:
  """Named Keras inputs, one per feature, matching the encoder's output dtypes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  inputs = {}
  for feature in schema.features:
    spec = feature.kind.model_input(feature)
    inputs[feature.input_name] = tf.keras.Input(shape=spec.shape, dtype=spec.dtype, name=feature.input_name)
  return inputs


def build_tabular(schema: schema_lib.Schema, model_config: config_lib.ModelConfig,
                  hparams: Mapping[str, Any] | None = None):
  """An MLP over standardized numeric features, embedded categorical ones, flattened images and the bag of words
  of each text feature (a linear layer over it is bag-of-words logistic regression; the MLP can do no worse)."""
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
    elif feature.is_image:
      x = layers.Flatten()(layers.Rescaling(feature.image_scale)(x))
    elif feature.is_textual:  # free text (a category is embedded above)
      x = bag_of_words(feature, x)
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
  outputs = in_label_units(layers.Dense(output_units(schema), name="output", dtype="float32")(x), schema)
  return tf.keras.Model(inputs, outputs, name="tabular")


def in_label_units(outputs, schema: schema_lib.Schema):
  """A regression output scaled from the standardized label the layers learn to the label's units (the schema's
  mean and std): the last layer starts near the mean at the label's spread, so training moves at defaults and
  predictions are served in the label's own units. Classification logits pass unchanged. (The Dense before it is
  float32 under mixed policies, so this is too.)"""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  label = schema.label
  if schema.task != "regression" or label.mean is None:
    return outputs
  return tf.keras.layers.Rescaling(label.std or 1.0, offset=label.mean, name="label_units", dtype="float32")(outputs)


def bag_of_words(feature: schema_lib.Feature, text):
  """Which of the vocabulary's words and word pairs the text holds (multi-hot, one slot for the rest), as TF
  Serving can run it: Keras' TextVectorization over the schema's vocabulary and bigrams, tokenizing as schema
  inference did."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  bigrams = list(feature.bigrams or ())
  vectorize = tf.keras.layers.TextVectorization(vocabulary=list(feature.vocabulary) + bigrams,
                                                ngrams=2 if bigrams else None, output_mode="multi_hot",
                                                name=f"{feature.input_name}_words")
  return vectorize(text)


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
  """A small convolutional network over the schema's first image feature: blocks of two 3x3 convolutions and a 2x2
  max-pool, 32 filters doubling per block up to 128, until the feature map is at most 8x8; then its pixels
  flattened (where the digit or object is matters: global average pooling throws that away and learned less than
  logistic regression on the pixels) into the hidden layers. No batch normalization: a short run's moving
  statistics would not have settled by the evaluation."""
  del hparams
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  images = [f for f in schema.features if f.is_image]
  if not images:
    raise UserError("--model=cnn needs an image feature in the schema (type 'image'); use --model=tabular")
  layers = tf.keras.layers
  image = model_inputs(schema)[images[0].input_name]
  x = layers.Rescaling(images[0].image_scale)(image)
  height, width = images[0].shape[:2]
  filters = 32
  while True:
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    if max(height, width) <= _CNN_FLATTEN_SIZE:
      break
    x = layers.MaxPooling2D(padding="same")(x)  # odd sides round up, as `height` below does
    height, width, filters = (height + 1) // 2, (width + 1) // 2, min(2 * filters, 128)
  x = layers.Flatten()(x)
  for units in model_config.hidden_units:
    x = layers.Dense(units, activation="relu")(x)
    if model_config.dropout:
      x = layers.Dropout(model_config.dropout)(x)
  outputs = in_label_units(layers.Dense(output_units(schema), name="output", dtype="float32")(x), schema)
  return tf.keras.Model({images[0].input_name: image}, outputs, name="cnn")


_CNN_FLATTEN_SIZE = 8  # the feature map's largest side when the convolutions end and its pixels are flattened


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
