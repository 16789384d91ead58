"""A plug-in model's own hyperparameters by name, as a Vertex AI tuning trial passes them (`--units 16`,
`--units=16`): declared in the module's HPARAMS, typed, merged with --hparams, read back from the export; what
nothing would read is refused in one line before anything runs."""

from __future__ import annotations

import json
import re

import pytest
from absl import flags

import procs
from trainer import flags as trainer_flags
from trainer.core import hparams as hparams_lib
from trainer.core.errors import UserError
from test_train import data_args

TUNABLE = '''
import tensorflow as tf

HPARAMS = {"units": 8, "dropout": 0.0, "activation": "relu", "batch_norm": False}
BUILT = []


def build(schema, hparams):
  BUILT.append(dict(hparams))
  print("tunable: hparams " + __import__("json").dumps(hparams, sort_keys=True), flush=True)
  numeric = [f for f in schema.features if f.type != "string"]
  inputs = {f.input_name: tf.keras.Input((), name=f.input_name) for f in numeric}
  x = tf.keras.layers.Concatenate()([tf.keras.layers.Reshape((1,))(v) for v in inputs.values()])
  if hparams["batch_norm"]:
    x = tf.keras.layers.BatchNormalization()(x)
  x = tf.keras.layers.Dense(hparams["units"], activation=hparams["activation"], name="hidden")(x)
  x = tf.keras.layers.Dropout(hparams["dropout"])(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(schema.label.num_classes)(x))
'''

UNDECLARED = '''
import tensorflow as tf


def build(schema, hparams):
  numeric = [f for f in schema.features if f.type != "string"]
  inputs = {f.input_name: tf.keras.Input((), name=f.input_name) for f in numeric}
  x = tf.keras.layers.Concatenate()([tf.keras.layers.Reshape((1,))(v) for v in inputs.values()])
  return tf.keras.Model(inputs, tf.keras.layers.Dense(schema.label.num_classes)(x))
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
  (tmp_path / "tunable.py").write_text(TUNABLE)
  (tmp_path / "undeclared.py").write_text(UNDECLARED)
  monkeypatch.syspath_prepend(str(tmp_path))
  return tmp_path


def _values(args: list[str]) -> dict:
  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  model = hparams_lib.model_from_argv(args)
  hparams_lib.define(values, hparams_lib.declared(model), model=model)
  values(["trainer.task", *args])
  return hparams_lib.values(values, model=values.model, hparams_json=json.loads(values.hparams))


def test_declared_hyperparameters_are_flags_typed_by_their_defaults(plugins):
  assert _values(["--model=tunable:build"]) == {"units": 8, "dropout": 0.0, "activation": "relu",
                                                "batch_norm": False}
  # As Vertex passes a trial's values: space or "=", whole numbers possibly as "16.0", bools as words.
  assert _values(["--model", "tunable:build", "--units", "16.0", "--activation=tanh", "--batch_norm=true",
                  "--dropout=0.25"]) == {"units": 16, "dropout": 0.25, "activation": "tanh", "batch_norm": True}
  # --hparams sets them too; a flag wins over it.
  assert _values(["--model=tunable:build", '--hparams={"units": 4, "activation": "elu"}', "--units=32"])[
      "units"] == 32
  # A module without HPARAMS gets --hparams as it is, as before.
  assert _values(["--model=undeclared:build", '--hparams={"anything": [1, 2]}']) == {"anything": [1, 2]}
  assert _values(["--hidden_units=8", "--dropout=0.5"]) == {}  # the built-in model reads its own flags


@pytest.mark.parametrize("args,message", [
    (["--model=tunable:build", "--units=2.5"],
     r"^--units='2.5': hyperparameter 'units' is an int \(its default is 8\)$"),
    (["--model=tunable:build", "--batch_norm=maybe"],
     r"^--batch_norm='maybe': hyperparameter 'batch_norm' is a bool \(true/false\)"),
    (["--model=tunable:build", '--hparams={"unit": 3}'],
     r"^--hparams names 'unit', which --model=tunable:build does not declare \(its HPARAMS: units, dropout, "
     r"activation, batch_norm\)$"),
    (["--model=tunable:build", "--hidden_units=16,8"],
     r"^--hidden_units is read by the built-in models only; --model=tunable:build does not read it \(its HPARAMS: "
     r"units, dropout, activation, batch_norm\): drop it, or declare 'hidden_units' in HPARAMS to receive it$"),
    (["--model=undeclared:build", "--dropout=0.3"],
     r"^--dropout is read by the built-in models only; --model=undeclared:build does not read it \(it declares no "
     r"HPARAMS\)"),
])
def test_what_nothing_would_read_is_refused(plugins, args, message):
  with pytest.raises(UserError, match=message):
    _values(args)


def test_bad_declarations_are_one_line(plugins):
  (plugins / "clash.py").write_text("HPARAMS = {'learning_rate': 0.1}\ndef build(schema, hparams): pass\n")
  (plugins / "odd.py").write_text("HPARAMS = {'layers': {'a': 1}}\ndef build(schema, hparams): pass\n")
  with pytest.raises(UserError, match=r"hyperparameter 'learning_rate' in HPARAMS is also a trainer flag "
                                      r"\(--learning_rate\); rename it"):
    _values(["--model=clash:build"])
  with pytest.raises(UserError, match=r"odd.HPARAMS: 'layers' has default \{'a': 1\}; a hyperparameter is an int"):
    _values(["--model=odd:build"])


def test_a_trial_passes_its_parameters_by_name(churn_data, tmp_path):
  """The command line a tuning trial runs: the trial spec's args, then each parameter as `--NAME VALUE`; the
  values reach build_fn and the run record beside the export; a misspelt parameter is one line, exit 2."""
  (tmp_path / "tunable.py").write_text(TUNABLE)
  env = {"PYTHONPATH": f"{procs.REPO}:{tmp_path}"}
  out = tmp_path / "out"
  result = procs.run_trainer(data_args(churn_data) + [
      f"--output_dir={out}", "--model=tunable:build", "--train_steps=20", "--units", "24", "--dropout", "0.1",
      "--activation", "tanh"], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  received = {"activation": "tanh", "batch_norm": False, "dropout": 0.1, "units": 24}
  assert f"tunable: hparams {json.dumps(received, sort_keys=True)}" in result.stdout
  with open(out / "model" / "trainer_config.json") as f:
    assert json.load(f)["config"]["hparams"] == received
  bad = procs.run_trainer(data_args(churn_data) + [f"--output_dir={tmp_path}/bad", "--model=tunable:build",
                                                   "--unitz=3"], env=env)
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert bad.returncode == 2 and len(errors) == 1, bad.stderr[-3000:]
  assert re.match(r"^error: Unknown command line flag 'unitz'.*--model=tunable:build declares units, dropout, "
                  r"activation, batch_norm", errors[0]), errors
  assert not (tmp_path / "bad").exists()


def test_the_trainers_integer_flags_take_a_whole_number_written_as_a_float():
  """Vertex AI tuning passes a DISCRETE parameter's values as floats ("256.0"): cloud_configs/hp_tuning.yaml tunes
  --global_batch_size over 128, 256, 512, so every trial would fail on absl's integer parser."""
  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  values(["trainer.task", "--global_batch_size=256.0", "--train_steps", "1e3"])
  assert (values.global_batch_size, values.train_steps) == (256, 1000)
  with pytest.raises(flags.IllegalFlagValueError, match="2.5"):
    values(["trainer.task", "--global_batch_size=2.5"])
  with pytest.raises(flags.IllegalFlagValueError):
    values(["trainer.task", "--global_batch_size=many"])


def test_help_lists_the_plugins_hyperparameters(plugins):
  """`python -m trainer.task --model=M --help` lists M's declared hyperparameters beside the trainer's flags."""
  result = procs.run_trainer(["--model=tunable:build", "--help"], env={"PYTHONPATH": f"{procs.REPO}:{plugins}"},
                             timeout=120)
  assert "--train_data:" in result.stdout, result.stderr[-2000:]  # (absl's --help exits 1)
  # (`dropout` is the trainer's own flag, which feeds the plug-in's hyperparameter of that name.)
  for name, default in (("units", "8"), ("activation", "'relu'"), ("batch_norm", "False")):
    assert f"--{name}: Hyperparameter of --model=tunable:build (default {default})." in result.stdout, result.stdout
