"""Transfer learning (trainer/modeling/backbones.py): a Keras Applications backbone from a weights file trains, is frozen then
fine-tuned, exports with its preprocessing inside, and serves. This machine cannot download ImageNet weights, so the
files are the backbones' own weights with random values, saved the two ways users have them: Keras 3's
`.weights.h5`, and the legacy `.h5` layout Keras Applications download (`weights_..._no_top.h5`)."""

from __future__ import annotations

import base64
import json
import os
import re

import numpy as np
import pytest

import procs
import serving_checks
from trainer.core import config as config_lib
from trainer.data import schema as schema_lib
from trainer.modeling import backbones
from trainer.modeling import recipe

TIMEOUT = 300


def _save_weights(application: str, path: str, *, legacy_h5: bool = False) -> list:
  """The backbone (include_top=False, average-pooled, 224x224) with random weights saved to `path`; returns them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.keras.utils.set_random_seed(7)
  model = getattr(tf.keras.applications, application)(include_top=False, weights=None, pooling="avg",
                                                      input_shape=(224, 224, 3))
  if legacy_h5:  # the layout of the files Keras Applications download, read by Keras 3's legacy loader
    import h5py  # pylint: disable=g-import-not-at-top
    from keras.src.legacy.saving import legacy_h5_format  # pylint: disable=g-import-not-at-top

    with h5py.File(path, "w") as f:
      legacy_h5_format.save_weights_to_hdf5_group(f, model)
  else:
    model.save_weights(path)
  return [w.numpy() for w in model.weights]


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("backbone") / "mobilenet_v3_small.weights.h5")
  return path, _save_weights("MobileNetV3Small", path)


def _image_schema() -> schema_lib.Schema:
  return schema_lib.parse_schema({"features": [{"name": "image", "type": "image", "shape": [32, 32, 1]}],
                                  "label": {"name": "digit", "type": "int", "num_classes": 10}}, source="test")


def _backbone_weights(model) -> list:
  return [w.numpy() for w in model.get_layer("MobileNetV3Small").weights]


def _same(a: list, b: list) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.smoke
@pytest.mark.parametrize("distribute", ["default", "mirrored"])
def test_the_backbone_is_frozen_until_the_fine_tuning_step(weights_file, distribute):
  """The gate lets no gradient into the backbone for the first steps, then all of it at the factor's rate; its
  step count is one per step under a 2-replica MirroredStrategy too (only the first replica's add counts). (The
  collective keys are the test's own: conftest's autouse fixture.)"""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  path, saved = weights_file
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if distribute == "mirrored"
              else tf.distribute.get_strategy())
  config = config_lib.ModelConfig(name="mobilenet_v3_small", backbone_weights=path, fine_tune_at_step=2)
  with strategy.scope():
    model = backbones.build(_image_schema(), config)
    optimizer = recipe.make_optimizer(config_lib.TrainConfig(), 4, keras_version=tf.keras.__version__,
                                      fine_tune=backbones.fine_tune(config, 4))
    optimizer.build(model.trainable_variables)
  assert _same(_backbone_weights(model), saved)  # the file's weights, loaded

  rng = np.random.default_rng(0)
  images = tf.constant(rng.uniform(0, 255, (8, 32, 32, 1)), tf.float32)
  labels = tf.constant(rng.integers(0, 10, 8))

  @tf.function
  def step():
    def replica_step(images, labels):
      with tf.GradientTape() as tape:
        logits = model({"image": images}, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
      optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    strategy.run(replica_step, (images, labels))

  head_before = model.get_layer("output").kernel.numpy()
  rates = []
  for _ in range(2):
    rates.append(recipe.current_learning_rate(optimizer))
    step()
  assert _same(_backbone_weights(model), saved), "the backbone learned while frozen"
  assert not np.array_equal(model.get_layer("output").kernel.numpy(), head_before), "the head did not learn"
  rates.append(recipe.current_learning_rate(optimizer))
  step()
  assert not _same(_backbone_weights(model), saved), "the backbone did not learn from the fine-tuning step"
  assert int(model.get_layer("fine_tune_gate").steps_seen.numpy()) == 3
  assert rates == pytest.approx([1e-3, 1e-3, 1e-5])


@pytest.mark.long
@pytest.mark.parametrize("loop,weights_from", [("custom", "gs"), ("fit", "legacy_h5")])
def test_a_backbone_from_a_weights_file_trains_exports_and_serves(weights_file, gcs, tmp_path, loop, weights_from):
  """Digits as PNG files in class folders, a MobileNetV3Small from a weights file (Keras 3's, named by its /gcs/ path
  and read from the emulated bucket; or the legacy .h5 Keras Applications download), 6 steps (3 frozen, 3
  fine-tuning): the export takes the PNG bytes as they are (resized, to RGB and preprocessed inside the SavedModel), and the TF Serving loader answers
  as tf.saved_model.load does."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from scripts.public_data import write_digit_files  # pylint: disable=g-import-not-at-top  (pandas: not in the smoke venv)

  data = tmp_path / "digits"
  frame = write_digit_files(str(data), class_folders=True)
  if weights_from == "legacy_h5":
    weights = str(tmp_path / "weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5")
    _save_weights("MobileNetV3Small", weights, legacy_h5=True)
  else:
    tf.io.gfile.copy(weights_file[0], f"gs://test-bucket/backbones/{tmp_path.name}/mobilenet_v3_small.weights.h5")
    weights = f"/gcs/test-bucket/backbones/{tmp_path.name}/mobilenet_v3_small.weights.h5"  # Vertex's mount path
  out = tmp_path / "out"
  result = procs.run_trainer([f"--train_data={data}/", f"--output_dir={out}", "--model=mobilenet_v3_small",
                              f"--backbone_weights={weights}", "--train_steps=6", "--fine_tune_at_step=3",
                              "--global_batch_size=8", "--eval_steps=2", f"--loop={loop}",
                              "--checkpoint_every_steps=3"], env=gcs.env, timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"step 6/6 .*learning_rate=1e-05", result.stderr), result.stderr[-3000:]  # fine-tuning's rate
  with open(out / "model" / "eval_metrics.json") as f:
    assert json.load(f)["final_step"] == 6
  instances = []
  for path in frame["path"].iloc[:4]:
    with open(path, "rb") as f:
      instances.append({"image": {"b64": base64.b64encode(f.read()).decode()}})
  predictions = serving_checks.serve_instances(str(out / "model"), instances)
  assert len(predictions) == 4 and all(len(p["probabilities"]) == 10 for p in predictions)


def test_backbone_flags_are_checked_before_anything_runs(weights_file, tmp_path):
  from scripts.public_data import write_digit_files  # pylint: disable=g-import-not-at-top  (pandas: not in the smoke venv)

  data = tmp_path / "digits"
  write_digit_files(str(data), class_folders=True)
  cases = [
      (["--model=tabular", "--backbone_weights=x.h5"],
       "error: --backbone_weights: only backbone models take it (--model=mobilenet_v3_small or"),
      (["--model=mobilenet_v3_small", "--fine_tune_learning_rate_factor=2"],
       "error: --fine_tune_learning_rate_factor must be in (0, 1], got 2.0"),
      (["--model=mobilenet_v3_small", "--fine_tune_at_step=2"],
       "error: --fine_tune_at_step=2 is not before the last step (--train_steps=2): the backbone would never learn"),
      (["--model=resnet50_v2", "--hidden_units=128"],
       "error: --hidden_units: --model=resnet50_v2 has a linear head over the backbone's pooled features"),
      (["--model=mobilenet_v3_small", f"--backbone_weights={tmp_path}/missing.h5"],
       f"error: --backbone_weights={tmp_path}/missing.h5: no such file; give a MobileNetV3Small weights file"),
      (["--model=efficientnet_b0", f"--backbone_weights={weights_file[0]}"],
       f"error: --backbone_weights={weights_file[0]}: not the weights of --model=efficientnet_b0 (EfficientNetB0"),
      (["--model=mobilenet_v3_small", f"--backbone_weights={data}/digit_0/0000.png"],  # not a weights file at all
       f"error: --backbone_weights={data}/digit_0/0000.png: not the weights of --model=mobilenet_v3_small"),
  ]
  # These are refused before any download could start: in this process. The default, imagenet, is Keras' download,
  # which this machine cannot make: in a process of its own, since Keras reads KERAS_HOME once, at import (its
  # own cache dir here, so weights cached on the machine cannot hide the failure), and urllib keeps the proxy (a
  # closed local port: no real host is reached) for the process's life.
  no_download = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                 "https_proxy": "http://127.0.0.1:9", "KERAS_HOME": str(tmp_path / "keras_home")}
  download = (["--model=mobilenet_v3_small"],
              "error: --backbone_weights=imagenet: Keras could not download MobileNetV3Small's ImageNet weights")
  for args, expected in [*cases, download]:
    out = tmp_path / "out"
    run_args = [f"--train_data={data}/", f"--output_dir={out}", "--train_steps=2", *args]
    result = (procs.run_trainer(run_args, env=no_download, timeout=TIMEOUT) if (args, expected) == download
              else procs.run_trainer_here(run_args))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and errors[0].startswith(expected), (args, result.stderr[-2000:])
    assert not os.path.exists(out / "model")
