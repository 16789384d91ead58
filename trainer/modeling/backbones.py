"""Transfer learning for images: a Keras Applications backbone under a new classification or regression head.

`--model=mobilenet_v3_small` (or another name in BACKBONES) builds, over the schema's first image feature:

  image (the schema's shape, pixels 0..max_value) -> 0..255 -> 3 channels (a greyscale image repeated) ->
  resized to the backbone's input size -> the backbone's own preprocessing -> the backbone (include_top=False,
  average pooling, its batch normalization in inference mode, so its statistics stay the pretrained ones, as the
  Keras transfer-learning guide does) -> dropout (--dropout; the guide's is 0.2) -> the output layer, a linear head
  (--hidden_units is refused: a head of its own is a plug-in's).

Everything from the raw pixels on is inside the model, so the SavedModel it exports takes the image as the other
built-in models do and serves it with no preprocessing of the caller's. The weights come from
`--backbone_weights`: a weights file (local, /gcs/ or gs://; a Keras `.weights.h5`, or the `.h5` files Keras
Applications download), `imagenet` (Keras downloads them: Vertex jobs can, machines without internet cannot), or
`none` (random: trained from scratch).

Two phases, as the guide's: until `--fine_tune_at_step` (default half of the run) the backbone is frozen and only the
head learns; from that step on the whole model learns at `--fine_tune_learning_rate_factor` (default 0.01) times the
learning rate. Freezing is a gate on the gradient that flows into the backbone (zero, then one) with its own
checkpointed step counter, not `trainable=False`: the training step, the optimizer's variables and the checkpoints
stay the same across the phase change under both loops and every strategy, and a run resumed in either phase goes on
where it was. A frozen backbone's gradients are computed and are zero (an optimizer with weight decay, adamw,
still decays its weights).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import warnings
from typing import Any, Mapping

from absl import logging

from trainer.core import config as config_lib
from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data import schema as schema_lib
from trainer.modeling import models
from trainer.modeling import recipe


@dataclasses.dataclass(frozen=True)
class Backbone:
  application: str  # the keras.applications constructor
  input_size: int  # the side of the square image its ImageNet weights were trained on
  # Its preprocessing of 0..255 RGB pixels, as layers: "inside" (the model does it itself), "tf" (to -1..1),
  # "caffe" (RGB to BGR, ImageNet's mean pixel subtracted).
  preprocessing: str
  constructor_args: tuple[tuple[str, Any], ...] = ()


BACKBONES: dict[str, Backbone] = {
    "mobilenet_v3_small": Backbone("MobileNetV3Small", 224, "inside", (("include_preprocessing", True),)),
    "mobilenet_v3_large": Backbone("MobileNetV3Large", 224, "inside", (("include_preprocessing", True),)),
    "efficientnet_b0": Backbone("EfficientNetB0", 224, "inside"),
    "efficientnet_b3": Backbone("EfficientNetB3", 300, "inside"),
    "efficientnet_v2_b0": Backbone("EfficientNetV2B0", 224, "inside", (("include_preprocessing", True),)),
    "resnet50": Backbone("ResNet50", 224, "caffe"),
    "resnet50_v2": Backbone("ResNet50V2", 224, "tf"),
}
DEFAULT_FINE_TUNE_FACTOR = 0.01  # the guide's 1e-5 after Adam's 1e-3
_IMAGENET_MEAN_BGR = (103.939, 116.779, 123.68)


def fine_tune_step(model_config: config_lib.ModelConfig, train_steps: int) -> int | None:
  """The step from which a backbone model's backbone learns (None for the other models)."""
  if model_config.name not in BACKBONES:
    return None
  if model_config.fine_tune_at_step is not None:
    return model_config.fine_tune_at_step
  return train_steps // 2


def fine_tune(model_config: config_lib.ModelConfig, train_steps: int) -> recipe.FineTune | None:
  """The learning-rate schedule's second phase for a backbone model, None for the other models."""
  step = fine_tune_step(model_config, train_steps)
  if step is None:
    return None
  factor = model_config.fine_tune_learning_rate_factor
  return recipe.FineTune(at_step=step, factor=DEFAULT_FINE_TUNE_FACTOR if factor is None else factor)


def resolved(model_config: config_lib.ModelConfig, fine_tune_phase: recipe.FineTune | None) -> config_lib.ModelConfig:
  """`model_config` with the fine-tuning step (`fine_tune`'s, resolved once per run) filled in."""
  if fine_tune_phase is None:
    return model_config
  return dataclasses.replace(model_config, fine_tune_at_step=fine_tune_phase.at_step)


def build(schema: schema_lib.Schema, model_config: config_lib.ModelConfig, hparams: Mapping[str, Any] | None = None):
  """The backbone model `model_config.name` names, over the schema's first image feature."""
  del hparams
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  name = model_config.name
  spec = BACKBONES[name]
  images = [f for f in schema.features if f.is_image]
  if not images:
    raise UserError(f"--model={name} needs an image feature in the schema (type 'image'); use --model=tabular")
  feature = images[0]
  layers = tf.keras.layers
  image = models.model_inputs(schema)[feature.input_name]
  x = layers.Rescaling(255.0 * feature.image_scale, name="to_0_255")(image)
  channels = feature.shape[-1] if len(feature.shape) == 3 else 1
  if channels == 1:
    x = layers.Concatenate(name="grey_to_rgb")([x, x, x])
  elif channels != 3:
    raise UserError(f"--model={name}: image feature {feature.name!r} has {channels} channels; the backbone takes "
                    "RGB (3) or greyscale (1) images")
  x = layers.Resizing(spec.input_size, spec.input_size, name="to_backbone_size")(x)
  x = _preprocessing(spec, layers)(x)
  backbone = _backbone(spec, model_config.backbone_weights or "imagenet", name=name)
  # Batch normalization keeps the pretrained statistics in both phases (the guide's `training=False`, which a
  # Keras 3 functional model does not keep: measured, the moving means moved): a non-trainable Keras
  # BatchNormalization runs in inference mode.
  for layer in backbone.layers:
    if isinstance(layer, layers.BatchNormalization):
      layer.trainable = False
  x = backbone(x, training=False)  # (kept for tf_keras, which honours it)
  x = _FineTuneGate(model_config.fine_tune_at_step or 0, name="fine_tune_gate")(x)
  if model_config.dropout:
    x = layers.Dropout(model_config.dropout)(x)
  outputs = models.in_label_units(layers.Dense(models.output_units(schema), name="output", dtype="float32")(x),
                                  schema)
  logging.info("Backbone %s (%s, %s parameters) over image %r resized to %dx%d, weights from %s; frozen until "
               "step %d, then fine-tuned at %s times the learning rate", name, spec.application,
               f"{backbone.count_params():,}", feature.name, spec.input_size, spec.input_size,
               model_config.backbone_weights or "imagenet", model_config.fine_tune_at_step or 0,
               model_config.fine_tune_learning_rate_factor or DEFAULT_FINE_TUNE_FACTOR)
  return tf.keras.Model({feature.input_name: image}, outputs, name=name)


def _preprocessing(spec: Backbone, layers):
  if spec.preprocessing == "tf":
    return layers.Rescaling(1 / 127.5, offset=-1.0, name="backbone_preprocessing")
  if spec.preprocessing == "caffe":
    return _CaffePreprocessing(name="backbone_preprocessing")
  return layers.Identity(name="backbone_preprocessing")


def _backbone(spec: Backbone, weights: str, *, name: str):
  """The application without its top, average-pooled, with `weights` loaded."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  constructor = getattr(tf.keras.applications, spec.application)
  kwargs = dict(spec.constructor_args, include_top=False, pooling="avg",
                input_shape=(spec.input_size, spec.input_size, 3))
  if weights == "imagenet":
    try:
      return constructor(weights="imagenet", **kwargs)
    except Exception as e:  # pylint: disable=broad-except  (a download that cannot happen here is the user's to fix)
      raise UserError(f"--backbone_weights=imagenet: Keras could not download {spec.application}'s ImageNet weights "
                      f"({type(e).__name__}: {first_line(e)}); give --backbone_weights=PATH to a weights file "
                      "(local, /gcs/ or gs://), or none to train from scratch") from None
  backbone = constructor(weights=None, **kwargs)
  if weights != "none":
    _load_weights(backbone, weights, spec=spec, name=name)
  return backbone


def _load_weights(backbone, path: str, *, spec: Backbone, name: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not tf.io.gfile.exists(path):
    raise UserError(f"--backbone_weights={path}: no such file; give a {spec.application} weights file (.weights.h5, "
                    "or the .h5 Keras Applications download with include_top=False), imagenet, or none")
  with tempfile.TemporaryDirectory(prefix="backbone_") as local_dir:
    local = path
    if "://" in path:  # h5py reads local files only
      local = os.path.join(local_dir, os.path.basename(path))
      tf.io.gfile.copy(path, local)
    # Keras warns once per layer it skips ("Affected layers will retain their freshly-initialized weights"): a
    # file of another model. Those warnings are the failure, said in one line, and never a partial load.
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      try:
        backbone.load_weights(local)
        failure = next((str(w.message) for w in caught if "freshly-initialized" in str(w.message)), None)
      except Exception as e:  # pylint: disable=broad-except  (a file of another model, or no weights file at all)
        failure = f"{type(e).__name__}: {e}"
  if failure:
    detail = " ".join(line.strip() for line in failure.splitlines() if line.strip())
    detail = detail.split(" List of objects that could not be loaded")[0]  # Keras then lists every layer
    raise UserError(f"--backbone_weights={path}: not the weights of --model={name} ({spec.application} without its "
                    f"top, include_top=False): {detail[:400]}")


@functools.lru_cache(maxsize=None)  # one class per process: Keras tells layers apart by class
def _layers():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class FineTuneGate(tf.keras.layers.Layer):
    """The identity, letting no gradient through for the first `open_at_step` training steps, then all of it.

    It counts the training calls itself (one per step; the count is checkpointed with the model), so it needs
    nothing from the loop; the count is summed once per step across replicas (only the first replica's add)."""

    def __init__(self, open_at_step: int, **kwargs):
      super().__init__(**kwargs)
      self.open_at_step = int(open_at_step)

    def build(self, input_shape):
      aggregation = "only_first_replica" if _keras3() else tf.VariableAggregation.ONLY_FIRST_REPLICA
      self.steps_seen = self.add_weight(name="steps_seen", shape=(), dtype="int64", initializer="zeros",
                                        trainable=False, aggregation=aggregation)

    def call(self, inputs, training=None):
      if not training:
        return inputs
      self.steps_seen.assign_add(1)
      opened = tf.cast(self.steps_seen > self.open_at_step, inputs.dtype)
      frozen = tf.stop_gradient(inputs)
      return frozen + opened * (inputs - frozen)  # the value of `inputs`; its gradient times 0 or 1

    def get_config(self):
      return {**super().get_config(), "open_at_step": self.open_at_step}

  class CaffePreprocessing(tf.keras.layers.Layer):
    """keras.applications.resnet.preprocess_input as a layer: RGB to BGR, ImageNet's mean pixel subtracted."""

    def call(self, inputs):
      return tf.reverse(inputs, axis=[-1]) - tf.constant(_IMAGENET_MEAN_BGR, dtype=inputs.dtype)

  return FineTuneGate, CaffePreprocessing


def _keras3() -> bool:
  return models.keras_version().startswith("3.")


def _FineTuneGate(open_at_step: int, **kwargs):  # pylint: disable=invalid-name
  return _layers()[0](open_at_step, **kwargs)


def _CaffePreprocessing(**kwargs):  # pylint: disable=invalid-name
  return _layers()[1](**kwargs)
