"""The plug-in contract as tutorials meet it: each tutorial-style model shape trains under the custom loop and
`fit`, default and mirrored (2 logical CPUs), and its export serves the model's own probabilities."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import procs
import serving_checks
import test_train
import test_training
import tutorial_models
from serving import predict
from trainer.core.errors import UserError
from trainer.data import schema as schema_lib
from trainer.modeling import export
from trainer.modeling import models

SHAPES = ("sequential_softmax", "sequential_unbuilt", "binary_sigmoid", "raw_strings", "subclassed_dict_softmax",
          "subclassed_vector_logits", "subclassed_vector_softmax", "subclassed_vector_sigmoid")


def _schema(churn_data):
  return schema_lib.load_schema(os.path.join(churn_data, "train", "schema.json"))


def _raw_batch(schema, size=8, seed=0):
  """Raw feature values as serving receives them, and the encoded batch the pipeline would make of them."""
  rng = np.random.default_rng(seed)
  raw = {}
  for f in schema.features:
    if f.type == "string":
      raw[f.name] = rng.choice(list(f.vocabulary) + ["never-seen"], size=size)
    else:
      raw[f.name] = rng.normal(f.mean or 0, f.std or 1, size=size).astype(np.float32)
  from trainer.data import features as features_lib  # pylint: disable=g-import-not-at-top

  encoded = features_lib.FeatureEncoder(schema).encode({k: tf.constant(v) for k, v in raw.items()})
  return raw, encoded


def _user_probabilities(name, model, schema, raw):
  """What the user's own model says for `raw`, fed the way it was written to be fed."""
  numeric = [f for f in schema.features if f.type != "string"]
  vector = np.stack([raw[f.name] for f in numeric], axis=1)
  if name.startswith("sequential") or name == "subclassed_vector_softmax":
    return model(vector).numpy()
  if name == "subclassed_vector_logits":
    return tf.nn.softmax(model(vector)).numpy()
  if name in ("binary_sigmoid", "subclassed_vector_sigmoid"):
    p = model(vector if name.startswith("subclassed") else {f.name: raw[f.name] for f in numeric}).numpy()[:, 0]
    return np.stack([1 - p, p], axis=1)
  if name == "subclassed_dict_softmax":
    return model({f.input_name: tf.constant(raw[f.name]) for f in numeric}).numpy()
  return model({k: tf.constant(v) for k, v in raw.items()}).numpy()


@pytest.mark.parametrize("name", SHAPES)
def test_adapted_model_gives_the_models_own_probabilities(churn_data, name):
  schema = _schema(churn_data)
  user_model = getattr(tutorial_models, name)(schema, {})
  adapted = models.adapt_to_contract(user_model, schema, flag="--model")
  assert adapted is not user_model
  raw, encoded = _raw_batch(schema)
  models.check_outputs(adapted, schema, flag="--model")
  probabilities = tf.nn.softmax(adapted(models.select_inputs(encoded, models.input_names(adapted)))).numpy()
  np.testing.assert_allclose(probabilities, _user_probabilities(name, user_model, schema, raw), atol=1e-5)


def test_a_model_that_fits_is_not_wrapped(churn_data):
  schema = _schema(churn_data)
  from trainer.core import config as config_lib  # pylint: disable=g-import-not-at-top

  model = models.build_tabular(schema, config_lib.ModelConfig())
  assert models.adapt_to_contract(model, schema, flag="--model") is model


def test_what_cannot_fit_is_one_line(churn_data):
  schema = _schema(churn_data)
  with pytest.raises(UserError, match=r"^--model: the model ends in a sigmoid over 3 units \(independent "
                                      r"probabilities, a multi-label output\)"):
    models.adapt_to_contract(tutorial_models.sigmoid_over_three(schema, {}), schema, flag="--model")
  import keras  # pylint: disable=g-import-not-at-top

  wrong = keras.Sequential([keras.Input((7,)), keras.layers.Dense(2)])
  with pytest.raises(UserError, match=r"^--model: the model takes input\(s\) named \w+ of shape \(None, 7\), "
                                      r"which are not features of the schema .*or take one vector of the 3 numeric "
                                      r"value\(s\) \(shape \(None, 3\)\)$"):
    models.adapt_to_contract(wrong, schema, flag="--model")


def test_a_sigmoid_per_class_fits_a_multi_label_task_and_a_softmax_does_not(churn_data):
  import dataclasses  # pylint: disable=g-import-not-at-top

  churn = _schema(churn_data)
  schema = dataclasses.replace(churn, label=schema_lib.Label("tags", "string", 3, ("a", "b", "c"),
                                                              multi_label=True))
  user_model = tutorial_models.sigmoid_over_three(schema, {})
  adapted = models.adapt_to_contract(user_model, schema, flag="--model")
  models.check_outputs(adapted, schema, flag="--model")
  raw, encoded = _raw_batch(schema)
  logits = adapted(models.select_inputs(encoded, models.input_names(adapted)))
  np.testing.assert_allclose(tf.sigmoid(logits).numpy(), _user_probabilities("sequential", user_model, schema, raw),
                             atol=1e-5)
  with pytest.raises(UserError, match=r"^--model: the model ends in a softmax \(one class per example\); label "
                                      r"'tags' is multi-label"):
    models.adapt_to_contract(tutorial_models.sequential_softmax(schema, {}), schema, flag="--model")


@pytest.mark.parametrize("loop", ["custom", "fit"])
@pytest.mark.parametrize("name", SHAPES)
def test_tutorial_models_train_and_serve(churn_data, tmp_path, name, loop):
  """In-process under the default strategy (MirroredStrategy runs in its own process below: several
  MirroredStrategy instances in one process share collective instance keys, and models of different shapes then
  abort each other's all-reduce)."""
  _train_and_serve(churn_data, tmp_path, name, loop, "default")


@pytest.mark.parametrize("name,loop", [("sequential_softmax", "fit"), ("raw_strings", "custom"),
                                       ("binary_sigmoid", "fit"), ("sequential_unbuilt", "custom")])
def test_tutorial_models_under_mirrored(churn_data, tmp_path, name, loop):
  result = procs.run_trainer_here(test_train.data_args(churn_data) + [
      f"--output_dir={tmp_path / 'out'}", "--train_steps=120", f"--loop={loop}", "--num_cpu_devices=2",
      f"--model=tutorial_models:{name}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Strategy: MirroredStrategy" in result.stderr
  with open(tmp_path / "out" / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["num_replicas"] == 2 and metrics["final_step"] == 120
  if not name.startswith("sequential"):
    assert metrics["eval_accuracy"] > 0.6, metrics
  serving_checks.assert_loaders_agree(tmp_path / "out" / "model", f"{churn_data}/eval/*.tfrecord")


def test_a_subclassed_model_that_takes_neither_form_is_one_line(churn_data):
  import keras  # pylint: disable=g-import-not-at-top

  class TakesAList(keras.Model):
    def __init__(self):
      super().__init__()
      self.out = keras.layers.Dense(2)

    def call(self, columns):  # written for a tuple of four columns
      first, second, third, fourth = columns
      return self.out(keras.ops.stack([first, second, third, fourth], axis=-1))

  with pytest.raises(UserError, match=r"^--model: the subclassed model's call\(\) fails on a dict of the schema's "
                                      r"features by name \(.*\) and on one vector of the 3 numeric value\(s\), "
                                      r"shape \(2, 3\); it must take one of them \(dict: "):
    models.adapt_to_contract(TakesAList(), _schema(churn_data), flag="--model")


def _train_and_serve(churn_data, tmp_path, name, loop, strategy):
  from trainer.training import dispatch as training  # pylint: disable=g-import-not-at-top

  out = tmp_path / "out"
  job = test_training.make_job(churn_data, out, "--train_steps=120", f"--loop={loop}",
                               f"--model=tutorial_models:{name}", strategy=strategy)
  result = training.train(job)
  assert result.final_step == 120 and np.isfinite(result.train_loss)
  if not name.startswith("sequential") and "vector" not in name:  # raw, unstandardized numbers: little learnt
    assert result.eval_metrics["accuracy"] > 0.6, result.eval_metrics  # (the others: raw numbers, 120 steps)
  model_dir = str(tmp_path / "model")
  export.export_for_role(result.model, job.schema, model_dir, is_chief=True, complete_marker="eval_metrics.json")
  raw, encoded = _raw_batch(job.schema, seed=1)
  names = models.input_names(result.model)
  taken = {f.name for f in job.schema.features if names is None or f.input_name in names}
  served = predict.SessionModel(model_dir)
  try:
    # A feature the model never sees (the string column a plug-in over the numeric vector leaves out) is no input
    # of the export: a request without it is answered, one with it too (the field is ignored).
    assert set(served.inputs) == {f.input_name for f in job.schema.features if f.name in taken}
    instances = [{k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in raw.items()}
                 for i in range(len(next(iter(raw.values()))))]
    response = predict.predict(served, json.loads(json.dumps({"instances": instances})))
    only_taken = [{k: v for k, v in instance.items() if k in taken} for instance in instances]
    assert predict.predict(served, json.loads(json.dumps({"instances": only_taken}))) == response
  finally:
    served.close()
  probabilities = np.array([p["probabilities"] for p in response["predictions"]])
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
  expected = tf.nn.softmax(result.model(models.select_inputs(encoded, names), training=False)).numpy()
  np.testing.assert_allclose(probabilities, expected, atol=1e-5)


@pytest.mark.parametrize("activation,binary,multi_label,probabilities", [
    ("softmax", False, False, [[1e-12, 1e-30, 1 - 1e-12], [0.5, 0.25, 0.25]]),
    ("sigmoid", True, False, [[1e-12], [1 - 1e-6]]),
    ("sigmoid", False, True, [[1e-12, 0.5, 1 - 1e-6]]),
])
def test_a_confident_models_small_probabilities_are_served_as_they_are(activation, binary, multi_label,
                                                                      probabilities):
  """A plug-in's probabilities become logits and come back from serving's softmax (or sigmoid) with their
  magnitude: 1e-12 stays 1e-12, not a floor of 1e-7."""
  _, to_logits = models._contract_layers()  # pylint: disable=protected-access
  p = np.array(probabilities, dtype=np.float32)
  logits = to_logits(activation, binary, multi_label=multi_label)(tf.constant(p))
  served = tf.sigmoid(logits).numpy() if multi_label else tf.nn.softmax(logits).numpy()
  expected = np.concatenate([1 - p, p], axis=1) if binary else p
  np.testing.assert_allclose(served, expected, rtol=1e-4)
  assert np.all(np.isfinite(logits.numpy()))
