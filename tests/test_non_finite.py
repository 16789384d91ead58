"""NaN and infinity never train into a model: in the data they are refused in one line naming the file, record and
column (exit 2, nothing exported); in the weights the run stops before a checkpoint or an export holds them.

Before: a NaN deep in the data exited 0 with a NaN model (ReLU turns the NaN activations into 0, so the loss
stayed finite and the loss guard never fired; 64 of 768 kernel values were NaN, eval AUC 0.5)."""

from __future__ import annotations

import json
import re
import os

import numpy as np
import pandas as pd
import pytest

import procs
from scripts.public_data import iris_frame
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import inference as schema_inference

ROWS = 3000  # iris 20 times: the bad value sits far beyond what pre-flight reads first
BAD_ROW = 2500
COLUMN = "petal length (cm)"


def _frame():
  frame = pd.concat([iris_frame()] * 20, ignore_index=True)
  frame["sepal width (cm)"] = frame["sepal width (cm)"].fillna(3.0)  # iris_frame's missing widths: not the point
  return frame


def _write_tfrecord(path, frame):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with tf.io.TFRecordWriter(path) as writer:
    for row in frame.to_dict("records"):
      feature = {name: (tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
                        if isinstance(value, str) else tf.train.Feature(float_list=tf.train.FloatList(value=[value])))
                 for name, value in row.items()}
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _schema_file(tmp_path, clean_path):
  """The schema a user keeps beside the data (inferred here from the clean file)."""
  source = formats.source_for([clean_path], requested="auto", columns=None, flag="--train_data")
  schema = schema_inference.infer_schema([clean_path], source, schema_inference.InferenceConfig(label="species"),
                                         flag="--train_data", log=lambda _: None)
  path = tmp_path / "schema.json"
  path.write_text(json.dumps(schema.to_dict()))
  return str(path)


@pytest.mark.parametrize("kind", ["csv", "tfrecord"])
def test_a_nan_deep_in_the_data_is_refused_and_nothing_is_exported(tmp_path, kind):
  frame = _frame()
  clean = str(tmp_path / f"clean.{kind}")
  bad = str(tmp_path / "data" / f"train.{kind}")
  os.makedirs(tmp_path / "data")
  if kind == "csv":
    frame.to_csv(clean, index=False)
    frame.loc[BAD_ROW, COLUMN] = np.nan
    frame.to_csv(bad, index=False, na_rep="nan")  # as numpy.savetxt and na_rep="nan" write a missing float
    where, what, value = f"line {BAD_ROW + 2}", "column", "'nan'"
  else:
    _write_tfrecord(clean, frame)
    frame.loc[BAD_ROW, COLUMN] = np.nan
    _write_tfrecord(bad, frame)
    where, what, value = f"record {BAD_ROW + 1}", "feature", "nan"
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={bad}", f"--schema={_schema_file(tmp_path, clean)}",
                                   "--train_steps=300", "--global_batch_size=32", "--eval_steps=2",
                                   f"--output_dir={out}"])
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2, result.stderr[-3000:]
  assert errors == [f"error: --train_data: {bad} {where}: {what} {COLUMN!r} holds {value}, a NaN or infinite "
                    "number; leave the value out for the schema's default"], result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert not out.exists()  # nothing half-written: the dirs this run created are removed


def test_schema_inference_refuses_a_nan_instead_of_averaging_it(tmp_path):
  frame = _frame()
  frame.loc[BAD_ROW, COLUMN] = np.inf
  path = str(tmp_path / "train.tfrecord")
  _write_tfrecord(path, frame)
  source = formats.source_for([path], requested="auto", columns=None, flag="--train_data")
  with pytest.raises(UserError, match=rf"^--train_data: column '{re.escape(COLUMN)}' at {re.escape(path)} record {BAD_ROW + 1} holds "
                                      r"inf, a NaN or infinite number"):
    schema_inference.infer_schema([path], source, schema_inference.InferenceConfig(label="species"),
                                  flag="--train_data", log=lambda _: None)


def test_non_finite_weights_are_never_checkpointed_or_exported(tmp_path):
  """The guard before every save and the export: one line naming the weights, and nothing written."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.training import actions  # pylint: disable=g-import-not-at-top
  from trainer.training import checkpoints  # pylint: disable=g-import-not-at-top

  model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4, name="hidden"),
                               tf.keras.layers.Dense(1, name="out")])
  actions.check_finite_weights(model, step=10)  # finite: passes
  kernel = model.get_layer("hidden").kernel
  kernel.assign(tf.tensor_scatter_nd_update(tf.convert_to_tensor(kernel), [[1, 2], [2, 0]], [np.nan, np.inf]))
  keeper = checkpoints.CheckpointKeeper(tf.train.Checkpoint(model=model), directory=str(tmp_path / "ckpt"),
                                        is_chief=True)
  with pytest.raises(UserError, match=r"^the model's weights hold NaN or infinite values at step 20 "
                                      r"\(.*hidden.*kernel.*: 2 of 12 values\); nothing from this run since its "
                                      r"last checkpoint is checkpointed or exported; look for NaN or inf in the "
                                      r"data \(features or labels\), or lower --learning_rate$"):
    actions.guarded_save(keeper, model, 20)
  assert not (tmp_path / "ckpt").exists() or not os.listdir(tmp_path / "ckpt")


def test_record_checks_keep_their_kinds_beside_the_non_finite_one():
  """The NaN check sits beside the type checks, not in their place: a JSONL string column holding a number and a
  number column holding text are still refused, a TFRecord vector feature still passes, and a NaN inside a
  vector is named."""
  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top
  from trainer.planning import preflight  # pylint: disable=g-import-not-at-top

  schema = schema_lib.parse_schema({"features": [{"name": "city", "type": "string", "vocabulary": ["a", "b"]},
                                                 {"name": "x", "type": "float"},
                                                 {"name": "v", "type": "float", "shape": [3]}],
                                    "label": {"name": "y", "type": "float"}}, source="t")
  jsonl, tfrecord = formats.Source("jsonl"), formats.Source("tfrecord")
  good = {"city": "a", "x": 1.5, "v": [1.0, 2.0, 3.0], "y": 0.5}
  assert preflight.record_problem(good, schema, jsonl) is None
  assert preflight.record_problem({**good, "city": 7}, schema, jsonl) == (
      "column 'city' holds 7, but the schema says string (a string)")
  assert preflight.record_problem({**good, "x": "seven"}, schema, jsonl) == (
      "column 'x' holds 'seven', but the schema says float (a number)")
  assert preflight.record_problem({**good, "v": [1.0, float("nan"), 3.0]}, schema, jsonl) == (
      "column 'v' holds nan, a NaN or infinite number; remove the record or give the column a value")
  as_example = {"city": ("bytes_list", [b"a"]), "x": ("float_list", [1.5]), "v": ("float_list", [1.0, 2.0, 3.0]),
                "y": ("float_list", [0.5])}
  assert preflight.record_problem(as_example, schema, tfrecord) is None
  assert preflight.record_problem({**as_example, "y": ("float_list", [float("inf")])}, schema, tfrecord) == (
      "feature 'y' holds inf, a NaN or infinite number; remove the record or give the column a value")
