"""The recipe flags change what they should: schedule values at chosen steps, the clipped global norm under
MirroredStrategy, class-weighted losses, binary metrics against scikit-learn, early stopping with the best
weights exported, periodic evaluation in TensorBoard and the hypertune file, mixed precision and XLA serving
float32, and a compiled plug-in keeping its own loss and optimizer."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import procs
import serving_checks
import test_train
import test_training
from trainer.core import config as config_lib
from trainer.core.errors import UserError
from trainer.data import schema as schema_lib
from trainer.modeling import objective as objective_lib
from trainer.modeling import recipe


def _train_config(**kwargs):
  return config_lib.TrainConfig(**kwargs)


@pytest.mark.parametrize("schedule,expected", [
    # peak 0.1, 10 warmup steps, 110 steps in all: the decay runs over steps 10..110.
    ("constant", {0: 0.01, 4: 0.05, 9: 0.1, 10: 0.1, 60: 0.1, 110: 0.1}),
    ("linear", {0: 0.01, 9: 0.1, 10: 0.1, 60: 0.05, 85: 0.025, 110: 0.0}),
    ("cosine", {0: 0.01, 10: 0.1, 60: 0.05, 35: 0.1 * (0.5 + 0.5 * np.cos(np.pi / 4)), 110: 0.0}),
    ("exponential", {10: 0.1, 60: 0.01, 110: 0.001}),  # lr_decay_to 0.01: 0.1 * 0.01 ** progress
])
def test_schedule_values_at_chosen_steps(schedule, expected):
  train = _train_config(learning_rate=0.1, lr_schedule=schedule, warmup_steps=10, train_steps=110)
  rate = recipe.learning_rate(train, total_steps=110)
  for step, value in expected.items():
    assert float(rate(tf.constant(step))) == pytest.approx(value, rel=1e-5, abs=1e-7), step
    assert recipe.lr_at(step, peak=0.1, schedule=schedule, warmup_steps=10, total_steps=110) == pytest.approx(
        value, rel=1e-5, abs=1e-7)


def test_a_resumed_optimizer_continues_on_the_curve():
  train = _train_config(learning_rate=0.1, lr_schedule="cosine", train_steps=100)
  optimizer = recipe.make_optimizer(train, 100, keras_version="3")
  optimizer.build([tf.Variable([1.0])])
  optimizer.iterations.assign(50)  # as a restored checkpoint leaves it
  assert recipe.current_learning_rate(optimizer) == pytest.approx(0.05, rel=1e-5)


def test_adamw_decays_weights_and_weight_decay_reaches_other_optimizers():
  adamw = recipe.make_optimizer(_train_config(optimizer="adamw"), 10, keras_version="3")
  assert isinstance(adamw, tf.keras.optimizers.AdamW) and adamw.weight_decay == pytest.approx(0.004)
  sgd = recipe.make_optimizer(_train_config(optimizer="sgd", learning_rate=0.5, weight_decay=0.1), 10,
                              keras_version="3")
  weight = tf.Variable([2.0])
  sgd.apply_gradients([(tf.constant([0.0]), weight)])
  assert float(weight[0]) == pytest.approx(2.0 - 2.0 * 0.1 * 0.5)  # decoupled: w -= w * decay * lr


_CLIP_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    from trainer.core import config as config_lib
    from trainer.modeling import recipe
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    clip = float(sys.argv[1])
    with strategy.scope():
      weight = tf.Variable([0.0, 0.0])
      if sys.argv[2] == "plugin":  # a compiled plug-in's own optimizer, made outside the trainer
        optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
        recipe.sum_in_replica_context(optimizer)
      else:
        optimizer = recipe.make_optimizer(
            config_lib.TrainConfig(optimizer="sgd", learning_rate=1.0, clip_norm=clip), 1,
            keras_version=tf.keras.__version__)
      optimizer.build([weight])
    # Replica gradients (3, 0) and (0, 4): their sum (3, 4) has norm 5, each alone has norm 3 or 4.
    grads = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([[3.0, 0.0], [0.0, 4.0]][ctx.replica_id_in_sync_group]))
    @tf.function
    def step(g):
      strategy.run(lambda g: optimizer.apply_gradients([(g, weight)]), args=(g,))
    step(grads)
    print(json.dumps([float(v) for v in weight.numpy()]))
""")


@pytest.mark.smoke
@pytest.mark.parametrize("clip,optimizer,expected", [(2.5, "trainer", [-1.5, -2.0]), (10.0, "trainer", [-3.0, -4.0]),
                                                     (0.0, "trainer", [-3.0, -4.0]), (0.0, "plugin", [-3.0, -4.0])])
def test_the_update_uses_the_gradient_summed_over_replicas(clip, optimizer, expected):
  """Keras 3.15's own global_clipnorm would clip each replica's part first: (3,0) and (0,4) to norm 2.5 each, a
  step of (-2.5, -2.5). The trainer's clip sees the summed (3, 4) and scales it to norm 2.5: (-1.5, -2.0).
  Keras 3.4 (the TF 2.17 image) would not sum at all: each device would apply its own part."""
  result = subprocess.run([sys.executable, "-c", _CLIP_SCRIPT, str(clip), optimizer], env=procs.trainer_env(),
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1]) == pytest.approx(expected, rel=1e-5)


def _schema(churn_data):
  return schema_lib.load_schema(os.path.join(churn_data, "train", "schema.json"))


def test_class_weights_balanced_and_by_name(churn_data):
  schema = _schema(churn_data)
  weights = recipe.class_weights(_train_config(class_weights="balanced"), schema, [0, 0, 0, 1])
  assert weights == pytest.approx((4 / (2 * 3), 4 / (2 * 1)))  # scikit-learn's n / (k * n_c)
  assert recipe.class_weights(_train_config(class_weights='{"1": 5}'), schema) == (1.0, 5.0)
  named = schema_lib.parse_schema({**schema.to_dict(), "label": {"name": "churned", "type": "string",
                                                                  "vocabulary": ["stay", "leave"]}}, source="t")
  assert recipe.class_weights(_train_config(class_weights='{"leave": 3}'), named) == (1.0, 3.0)
  assert recipe.class_weights(_train_config(class_weights="balanced"), named,
                              [b"stay", b"leave", b"leave", b"leave"]) == pytest.approx((2.0, 2 / 3))
  with pytest.raises(UserError, match=r"^--class_weights=\{\"go\": 3\}: 'go' is not a class of label 'churned' "
                                      r"\(classes: stay, leave\)$"):
    recipe.class_weights(_train_config(class_weights='{"go": 3}'), named)
  with pytest.raises(UserError, match=r"weight of class '1' must be a number >= 0, got -1"):
    recipe.class_weights(_train_config(class_weights='{"1": -1}'), schema)


def test_class_weighted_loss_weighs_each_example(churn_data):
  schema = _schema(churn_data)
  labels = tf.constant([0, 1, 1], tf.int64)
  logits = tf.constant([[2.0, -1.0], [0.5, 0.2], [-1.0, 3.0]])
  plain = objective_lib.Objective(schema).per_example_loss(labels, logits).numpy()
  weighted = objective_lib.Objective(schema, class_weights=(0.5, 4.0)).per_example_loss(labels, logits).numpy()
  np.testing.assert_allclose(weighted, plain * np.array([0.5, 4.0, 4.0]), rtol=1e-6)


def test_binary_metrics_match_scikit_learn(churn_data):
  from sklearn import metrics as sk  # pylint: disable=g-import-not-at-top

  schema = _schema(churn_data)
  rng = np.random.default_rng(3)
  labels = rng.integers(0, 2, size=5000)
  logits = np.stack([np.zeros(5000), rng.normal(labels * 1.5 - 0.75, 1.0)], axis=1).astype(np.float32)
  objective = objective_lib.Objective(schema)
  sums = sum(objective.batch_sums(tf.constant(labels[i:i + 1000]), tf.constant(logits[i:i + 1000])).numpy()
             for i in range(0, 5000, 1000))  # batches summed, as the replicas' sums are
  got = objective.finalize(sums)
  predicted = (logits[:, 1] > 0).astype(int)
  assert got["precision"] == pytest.approx(sk.precision_score(labels, predicted), abs=1e-9)
  assert got["recall"] == pytest.approx(sk.recall_score(labels, predicted), abs=1e-9)
  assert got["auc"] == pytest.approx(sk.roc_auc_score(labels, 1 / (1 + np.exp(-logits[:, 1]))), abs=2e-3)
  assert got["accuracy"] == pytest.approx(sk.accuracy_score(labels, predicted))


def _run(churn_data, out, *args, env=None, loop="custom"):
  result = procs.run_trainer_here(test_train.data_args(churn_data) + [
      f"--output_dir={out}", f"--loop={loop}", "--deterministic_input", *args], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_early_stopping_stops_and_exports_the_best_step(churn_data, tmp_path, loop):
  out = tmp_path / "out"
  hypertune_file = tmp_path / "hypertune" / "output.metrics"
  args = ["--train_steps=2000", "--eval_every_steps=50", "--early_stopping_metric=loss",
          "--early_stopping_patience=2", "--learning_rate=0.01", "--hidden_units=128,128", "--export=best",
          "--hypertune_metric=loss", "--log_every_steps=50"]
  _run(churn_data, out, *args, loop=loop, env={"CLOUD_ML_HP_METRIC_FILE": str(hypertune_file)})
  with open(out / "checkpoints" / "best" / "best.json") as f:
    best = json.load(f)
  metrics = test_train.final_metrics(out / "model")
  assert best["stopped_at"] == metrics["final_step"] < 2000
  assert best["step"] == best["stopped_at"] - 2 * 50  # patience 2: two evaluations without improvement
  assert metrics["eval_loss"] == pytest.approx(best["value"])  # the exported weights are the best step's
  lines = [json.loads(line) for line in hypertune_file.read_text().splitlines()]
  assert [int(line["global_step"]) for line in lines] == list(range(50, best["stopped_at"] + 1, 50))
  assert float(lines[-3]["loss"]) == pytest.approx(best["value"])
  eval_steps = test_training.train_steps_logged(out, split="eval")
  assert eval_steps == list(range(50, best["stopped_at"] + 1, 50)), eval_steps
  served = serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")
  assert served["predictions"]
  if loop == "custom":  # a restart of a run that stopped early trains no further
    again = _run(churn_data, out, *args, loop=loop, env={"CLOUD_ML_HP_METRIC_FILE": str(hypertune_file)})
    assert "stopped early at step" in again.stderr
    assert test_train.final_metrics(out / "model")["final_step"] == best["stopped_at"]


@pytest.mark.parametrize("loop,precision,extra", [
    ("custom", "mixed_bfloat16", ["--jit_compile", "--num_cpu_devices=2", "--clip_norm=1.0"]),
    ("fit", "mixed_float16", ["--jit_compile"]),
    ("custom", "mixed_float16", ["--num_cpu_devices=2", "--lr_schedule=cosine", "--warmup_steps=20"]),
])
def test_mixed_precision_and_xla_train_and_serve_float32(churn_data, tmp_path, loop, precision, extra):
  out = tmp_path / "out"
  _run(churn_data, out, "--train_steps=100", f"--precision={precision}", *extra, loop=loop)
  metrics = test_train.final_metrics(out / "model")
  assert metrics["final_step"] == 100 and metrics["eval_accuracy"] > 0.8, metrics
  signature = tf.saved_model.load(str(out / "model")).signatures["serving_default"]
  assert signature.structured_outputs["probabilities"].dtype == tf.float32
  served = serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")
  sums = [sum(p["probabilities"]) for p in served["predictions"]]
  np.testing.assert_allclose(sums, 1.0, rtol=1e-5)


COMPILED_PLUGIN = '''
import tensorflow as tf

def _model(schema):
  inputs = {f.name: tf.keras.Input((), name=f.name) for f in schema.features if f.type != "string"}
  x = tf.keras.layers.Concatenate()([tf.keras.layers.Reshape((1,))(v) for v in inputs.values()])
  x = tf.keras.layers.Dense(8, activation="relu")(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(2, activation="softmax")(x))

def zero_loss(schema, hparams):  # a loss of its own (always 0: nothing may move)
  model = _model(schema)
  model.compile(optimizer="adam", loss=lambda y, p: 0.0 * tf.reduce_sum(p, axis=-1), metrics=["accuracy"])
  return model

def frozen_optimizer(schema, hparams):  # an optimizer of its own (rate 0: nothing may move)
  model = _model(schema)
  model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.0),
                loss=tf.keras.losses.SparseCategoricalCrossentropy())
  return model

def probabilities_loss(schema, hparams):  # the tutorial's: a loss written for softmax outputs
  model = _model(schema)
  model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
  return model
'''


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_a_compiled_plugin_keeps_its_loss_and_optimizer(churn_data, tmp_path, monkeypatch, loop):
  from trainer.training import dispatch as training  # pylint: disable=g-import-not-at-top

  (tmp_path / "compiled_models.py").write_text(COMPILED_PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  results = {}
  for name in ("zero_loss", "frozen_optimizer", "probabilities_loss"):
    job = test_training.make_job(churn_data, tmp_path / name, "--train_steps=60", f"--loop={loop}",
                                 f"--model=compiled_models:{name}", "--log_every_steps=30")
    with job.strategy.scope():
      initial = test_training.weights(job.build_model())
    tf.keras.utils.set_random_seed(job.config.train.seed)  # the run builds the same initial weights
    result = training.train(job)
    results[name] = result
    moved = not all(np.array_equal(a, b) for a, b in zip(initial, test_training.weights(result.model)))
    assert moved == (name == "probabilities_loss"), name
  assert results["zero_loss"].train_loss == 0.0
  assert results["frozen_optimizer"].train_loss > 0  # its cross-entropy, of weights that did not move
  assert results["probabilities_loss"].eval_metrics["accuracy"] > 0.8, results["probabilities_loss"].eval_metrics
