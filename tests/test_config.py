"""Flags -> validated config, with the error messages pinned."""

import ast
import dataclasses
import json
import os

import pytest
from absl import flags

import procs
from trainer import flags as trainer_flags
from trainer.core import config as config_lib
from trainer.core import options as options_lib
from trainer.core.errors import UserError
from trainer.distribute import plan as plan_lib

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick


@pytest.fixture
def parse():
  def _parse(*args, env=None):
    values = flags.FlagValues()
    trainer_flags.define_flags(values)
    values(["task", *args])
    return trainer_flags.config_from_flags(values, config_lib.Environment.from_mapping(env or {}))
  return _parse


def test_defaults_from_vertex_environment(parse):
  config = parse(env={"AIP_MODEL_DIR": "gs://b/out/model/", "AIP_CHECKPOINT_DIR": "gs://b/out/checkpoints/",
                      "AIP_TENSORBOARD_LOG_DIR": "gs://b/out/logs/", "AIP_TRAINING_DATA_URI": "gs://b/d/train-*",
                      "AIP_VALIDATION_DATA_URI": "/gcs/b/d/eval-*"})
  assert config.output.model_dir == "gs://b/out/model"
  assert config.output.checkpoint_dir == "gs://b/out/checkpoints"
  assert config.data.train_pattern == "gs://b/d/train-*"
  assert config.data.eval_pattern == "gs://b/d/eval-*"  # /gcs/ FUSE path read through gs://
  assert config.data.schema_path == "gs://b/d/schema.json"
  assert config.train.train_steps == 1000


def test_output_dir_layout_and_flags_win(parse):
  config = parse("--train_data=/data/t*", "--output_dir=/out", "--model_dir=/elsewhere",
                 env={"AIP_MODEL_DIR": "gs://ignored"})
  assert config.output.model_dir == "/elsewhere"
  assert config.output.checkpoint_dir == "/out/checkpoints"
  assert config.output.tensorboard_dir == "/out/logs"


def test_config_round_trips_to_json(parse):
  config = parse("--train_data=/d/*", "--output_dir=/o", "--hparams={\"units\": 3}", "--hidden_units=8,4")
  value = json.loads(config.to_json())
  assert value["model"]["hidden_units"] == [8, 4] and value["hparams"] == {"units": 3}


@pytest.mark.parametrize("args,message", [
    ((), r"^--train_data is required \(or set AIP_TRAINING_DATA_URI\)$"),
    (("--train_data=/d",), r"^--model_dir is required: pass it, or --output_dir, or run where Vertex sets"),
    (("--train_data=/d", "--output_dir=/o", "--global_batch_size=0"),
     r"^--global_batch_size must be a positive integer, got 0$"),
    (("--train_data=/d", "--output_dir=/o", "--train_steps=10", "--epochs=2"),
     r"^--train_steps and --epochs: give exactly one \(got train_steps=10, epochs=2\)$"),
    (("--train_data=/d", "--output_dir=/o", "--learning_rate=-1"), r"^--learning_rate must be > 0, got -1.0$"),
    (("--train_data=/d", "--output_dir=/o", "--model=not a model"),
     r"^--model='not a model' is neither a built-in model \(tabular, cnn, mobilenet_v3_small, mobilenet_v3_large, "
     r"efficientnet_b0, efficientnet_b3, efficientnet_v2_b0, resnet50, resnet50_v2\) nor an import path "
     r"'package.module:function'$"),
    (("--train_data=/d", "--output_dir=/o", "--hparams=[1]"), r"^--hparams must be a JSON object, got '\[1\]'$"),
    (("--train_data=/d", "--output_dir=/o", "--hidden_units=a,b"),
     r"^--hidden_units must be a comma-separated list of integers, got \['a', 'b'\]$"),
    (("--train_data=/d", "--output_dir=/o", "--dropout=1.5"), r"^--dropout must be in \[0, 1\), got 1.5$"),
])
def test_bad_flags(parse, args, message):
  with pytest.raises(UserError, match=message):
    parse(*args)


def _plan(parse, *args, env=None, num_gpus=0, keras="3.15.1"):
  config = parse("--train_data=/d/*", "--output_dir=/o", *args)
  return plan_lib.make_plan(config, config_lib.Environment.from_mapping(env or {}), num_gpus=num_gpus,
                          keras_version=keras)


MULTI = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}})
PS = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},
                 "task": {"type": "chief", "index": 0}})


def test_plan_reports_replicas(parse):
  plan = _plan(parse, "--num_cpu_devices=2", "--global_batch_size=64", env={"TF_CONFIG": MULTI})
  assert plan.choice.class_name == "MultiWorkerMirroredStrategy"
  assert plan_lib.replicas(plan) == 4  # each worker's logical CPU devices count, as its GPUs would on Vertex
  assert plan_lib.replicas(_plan(parse, "--global_batch_size=64", env={"TF_CONFIG": MULTI}, num_gpus=4)) == 8


@pytest.mark.parametrize("args,env,keras,message", [
    (("--global_batch_size=30", "--num_cpu_devices=4"), {}, "3.15.1",
     r"^--global_batch_size=30 is not divisible by the 4 replicas of MirroredStrategy; use a multiple of 4$"),
    (("--loop=fit",), {"TF_CONFIG": MULTI}, "3.15.1",
     r"^--loop=fit does not work under MultiWorkerMirroredStrategy with Keras 3.15.1 \(keras-team/keras#20585\); "
     r"use --loop=custom, or install tf_keras and set TF_USE_LEGACY_KERAS=1$"),
    (("--loop=fit",), {"TF_CONFIG": PS}, "3.15.1",
     r"^--loop=fit does not work under ParameterServerStrategy with Keras 3.15.1 \(keras-team/keras#18624\)"),
    (("--run_eagerly",), {"TF_CONFIG": PS}, "3.15.1", r"^--run_eagerly cannot run under ParameterServerStrategy"),
    (("--strategy=mirrored",), {"TF_CONFIG": MULTI}, "3.15.1", r"^--strategy=mirrored contradicts the cluster"),
    (("--hypertune_metric=accuracy",), {}, "3.15.1",
     r"^--hypertune_metric=accuracy needs evaluation: set --eval_data \(or AIP_VALIDATION_DATA_URI\)"),
])
def test_bad_combinations(parse, args, env, keras, message):
  with pytest.raises(UserError, match=message):
    _plan(parse, *args, env=env, keras=keras)


def test_fit_under_multi_worker_allowed_with_legacy_keras(parse):
  plan = _plan(parse, "--loop=fit", env={"TF_CONFIG": MULTI}, keras="2.21.0")
  assert plan.choice.class_name == "MultiWorkerMirroredStrategy"


def test_each_flag_is_one_declared_option():
  """Every trainer flag comes from one declaration (a config field's `option`), and no module of the trainer
  defines a flag by hand but the one function that turns declarations into flags (and a plug-in's HPARAMS)."""
  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  declared = [entry.flag for config_class in trainer_flags.OPTION_CLASSES
              for entry in options_lib.declared(config_class)]
  assert sorted(declared) == sorted(values) and len(set(declared)) == len(declared)
  defining = set()
  for directory, _, files in os.walk(os.path.join(procs.REPO, "trainer")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        tree = ast.parse(open(path).read(), path)
        for function in ast.walk(tree):
          if isinstance(function, ast.FunctionDef) and any(
              isinstance(node, ast.Attribute) and node.attr.startswith("DEFINE")
              and isinstance(node.value, ast.Name) and node.value.id == "flags" for node in ast.walk(function)):
            defining.add(f"{os.path.relpath(path, procs.REPO)}:{function.name}")
  assert defining == {"trainer/flags.py:define_option", "trainer/core/hparams.py:define"}


def test_a_new_option_is_one_field():
  """What adding an option takes: one field. Its flag (with the whole-number parser a tuning trial needs), its
  typed value and its check all come from the declaration."""

  @dataclasses.dataclass(frozen=True)
  class Extra:
    prefetch_batches: int = options_lib.option(4, "Batches read ahead.", accepts=options_lib.POSITIVE)
    warm_start: tuple[int, ...] | None = options_lib.option(None, "Steps to warm start at.")

  values = flags.FlagValues()
  for entry in options_lib.declared(Extra):
    trainer_flags.define_option(entry, {}, values)
  values(["task", "--prefetch_batches=8.0", "--warm_start=10, 20"])
  extra = Extra(**trainer_flags.option_values(Extra, values))
  assert extra == Extra(prefetch_batches=8, warm_start=(10, 20)) and "Batches read ahead." in values.get_help()
  options_lib.check(extra)
  with pytest.raises(UserError, match=r"^--prefetch_batches must be a positive integer, got 0$"):
    options_lib.check(Extra(prefetch_batches=0))
