"""A value the schema cannot read, in any split and any format that carries types, is refused in one line naming
the split's flag, the file, the real line and the column; pre-flight checks every split (types, labels, image
files) before training; a bad value that only training reaches keeps the checkpoints, and a rerun on fixed data
resumes. On scikit-learn's iris written by pandas and its digits saved by Pillow, in-process (the exit code and
the `error:` line are what `task.run_command` returns and writes)."""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from sklearn import datasets as sk_datasets

import procs
from scripts.public_data import iris_frame
from trainer.core import storage
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import inference as schema_inference
from trainer.planning import preflight

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

COLUMN = "sepal length (cm)"
COMMON = ["--global_batch_size=16", "--shuffle_buffer=0", "--label=species"]


def _run(args, capsys) -> tuple[int, list[str], str]:
  code = procs.run_trainer_in_process(args)
  err = capsys.readouterr().err
  return code, [line for line in err.splitlines() if line.startswith("error:")], err


def _jsonl(path, frame) -> str:
  frame.to_json(path, orient="records", lines=True)
  return str(path)


def _checkpoint_steps(out) -> list[int]:
  return sorted(int(p.rsplit("-", 1)[1].split(".")[0]) for p in glob.glob(str(out / "checkpoints" / "ckpt-*.index")))


@pytest.fixture(scope="module")
def iris():
  return iris_frame()


def _write_bad_tfrecord(path, frame, bad_row):
  """The frame as tf.train.Examples, `COLUMN` of row `bad_row` written as text (a bytes_list)."""
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i, row in frame.iterrows():
      feature = {}
      for name, value in row.items():
        if name == "species" or (name == COLUMN and i == bad_row):
          text = "fast" if name == COLUMN else value
          feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))
        elif not np.isnan(value):
          feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return str(path)


@pytest.mark.parametrize("split", ["train_past_inference_sample", "eval", "test", "eval_tfrecord"])
def test_a_value_of_the_wrong_type_in_any_split_is_refused_before_training(iris, tmp_path, capsys, split):
  """JSONL and TFRecord carry types: "fast" in a number column was read as missing (the column's default) and
  the run exited 0, where CSV refused it. Past schema inference's sample, or only in the eval or test split."""
  train, held_out = iris.iloc[:100].reset_index(drop=True), iris.iloc[100:].reset_index(drop=True)
  what = f"column {COLUMN!r} holds 'fast', but the schema says float (a number)"
  if split == "train_past_inference_sample":
    train = train.astype({COLUMN: object})
    train.loc[80, COLUMN] = "fast"  # line 81; inference reads lines 1-50
    flag, where, args = "--train_data", "line 81", ["--infer_sample_rows=50"]
    path = train_path = _jsonl(tmp_path / "train.jsonl", train)
  elif split == "eval_tfrecord":
    train_path = _write_bad_tfrecord(tmp_path / "train.tfrecord", train, bad_row=-1)
    path = _write_bad_tfrecord(tmp_path / "eval.tfrecord", held_out, bad_row=30)
    flag, where, args = "--eval_data", "record 31", [f"--eval_data={path}"]
    what = f"feature {COLUMN!r} is a bytes_list, but the schema says float (float_list)"
  else:
    bad = held_out.astype({COLUMN: object})
    bad.loc[30, COLUMN] = "fast"
    flag, where = f"--{split}_data", "line 31"
    train_path = _jsonl(tmp_path / "train.jsonl", train)
    path = _jsonl(tmp_path / f"{split}.jsonl", bad)
    args = [f"{flag}={path}"]
  out = tmp_path / "out"
  code, errors, err = _run([f"--train_data={train_path}", f"--output_dir={out}", "--train_steps=5", *COMMON, *args],
                           capsys)
  assert code == 2, err[-3000:]
  assert errors == [f"error: {flag}: {path} {where}: {what}"], err[-3000:]
  assert not out.exists()


def test_a_mixed_label_names_the_line_where_the_other_kind_starts(iris, tmp_path):
  frame = iris.copy()
  frame.loc[120, "species"] = "7"  # line 122 (after the header)
  path = str(tmp_path / "train.csv")
  frame.to_csv(path, index=False)
  source = formats.source_for([path], flag="--train_data")
  with pytest.raises(UserError, match=rf"^--train_data: label 'species' mixes numbers and text \(text from "
                                      rf"{re.escape(path)} line 2, numbers first at {re.escape(path)} line 122\)"):
    schema_inference.infer_schema([path], source, schema_inference.InferenceConfig(label="species"),
                                  flag="--train_data", log=lambda _: None)


def test_a_bad_value_past_the_preflight_sample_keeps_the_checkpoints_and_a_rerun_resumes(iris, tmp_path, capsys):
  """The bad value is on line 300 of the eval file; --preflight_records=100 checks lines 1-100, so only the final
  evaluation, after all training steps, reads it."""
  train = _jsonl(tmp_path / "train.jsonl", iris)
  held_out = iris.loc[np.arange(400) % len(iris)].reset_index(drop=True).astype({COLUMN: object})
  good = held_out.copy()
  held_out.loc[299, COLUMN] = "fast"
  eval_path = _jsonl(tmp_path / "eval.jsonl", held_out)
  out = tmp_path / "out"
  args = [f"--train_data={train}", f"--eval_data={eval_path}", f"--output_dir={out}", "--train_steps=20",
          "--checkpoint_every_steps=10", "--preflight_records=100", *COMMON]
  code, errors, err = _run(args, capsys)
  assert code == 2, err[-3000:]
  assert errors == [f"error: --eval_data: {eval_path} line 300: column {COLUMN!r} holds 'fast', but the schema says "
                    f"float (a number); the checkpoints in {out}/checkpoints are kept (the latest at step 20): fix "
                    "the data and rerun the same command, which resumes from there"], err[-3000:]
  assert _checkpoint_steps(out) == [10, 20]
  assert not (out / "model" / "saved_model.pb").exists()
  _jsonl(tmp_path / "eval.jsonl", good)
  code, errors, err = _run(args, capsys)
  assert code == 0 and not errors, err[-3000:]
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["resumed_from_step"] == 20 and metrics["eval_examples"] == 400


def _digit_folders(root, rows) -> list[str]:
  """scikit-learn's digits `rows` saved by Pillow as JPEG files in one folder per digit; their paths."""
  digits = sk_datasets.load_digits()
  paths = []
  for i in rows:
    folder = os.path.join(root, f"digit_{digits.target[i]}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{i:04d}.jpg")
    Image.fromarray((digits.images[i] * 15).astype(np.uint8), mode="L").save(path, format="JPEG")
    paths.append(path)
  return sorted(paths)


def test_a_corrupt_image_in_the_eval_folders_is_named_before_training_or_keeps_the_checkpoints(tmp_path, capsys):
  _digit_folders(str(tmp_path / "train"), range(0, 300))
  held_out = _digit_folders(str(tmp_path / "eval"), range(300, 500))
  corrupt = held_out[1]  # not in an even sample of 50 of the 200 (every 4th file)
  with open(corrupt, "rb") as f:
    data = f.read()
  with open(corrupt, "wb") as f:
    f.write(data[:len(data) // 2])  # a copy cut short (inside its headers: TensorFlow's decoder fails on it)
  args = [f"--train_data={tmp_path}/train/", f"--eval_data={tmp_path}/eval/", "--train_steps=10",
          "--checkpoint_every_steps=5", "--global_batch_size=32", "--shuffle_buffer=0"]
  out = tmp_path / "out"
  code, errors, err = _run([*args, f"--output_dir={out}"], capsys)
  assert code == 2, err[-3000:]
  assert len(errors) == 1 and re.fullmatch(rf"error: --eval_data: {re.escape(corrupt)} is a JPEG cut short \(\d+ "
                                           r"bytes, [^)]*\): it does not decode", errors[0]), errors
  assert not out.exists()  # refused before anything was written
  late = tmp_path / "late"
  code, errors, err = _run([*args, f"--output_dir={late}", "--preflight_records=50"], capsys)
  assert code == 2, err[-3000:]
  assert len(errors) == 1 and errors[0].startswith(f"error: --eval_data: {corrupt} is a JPEG cut short"), errors
  assert errors[0].endswith(f"the checkpoints in {late}/checkpoints are kept (the latest at step 10): fix the data "
                            "and rerun the same command, which resumes from there"), errors
  assert _checkpoint_steps(late) == [5, 10]


def test_an_eval_label_training_never_saw_is_refused_with_its_line(iris, tmp_path):
  train = iris[iris["species"] != "virginica"]
  train_path = _jsonl(tmp_path / "train.jsonl", train)
  eval_path = _jsonl(tmp_path / "eval.jsonl", iris)
  source = formats.source_for([train_path], flag="--train_data")
  schema = schema_inference.infer_schema([train_path], source, schema_inference.InferenceConfig(label="species"),
                                         flag="--train_data", log=lambda _: None)
  line = int(np.flatnonzero(iris["species"].to_numpy() == "virginica")[0]) + 1
  with pytest.raises(UserError, match=rf"^--eval_data: {re.escape(eval_path)} line {line}: label 'species' holds "
                                      r"'virginica', not one of the schema's classes \(setosa, versicolor\)$"):
    preflight.check_split([eval_path], source, schema, flag="--eval_data", budget=1000)


def test_a_failed_run_on_gs_leaves_no_folder_markers(gcs):
  """TensorFlow's makedirs writes a 0-byte "name/" object for each missing folder: a run that removes what it
  created removes those of --output_dir's parents too."""
  out = "gs://test-bucket/bad/e1"
  dirs = [f"{out}/checkpoints", f"{out}/logs", f"{out}/model"]
  created = storage.new_dirs(dirs)
  assert created == ["gs://test-bucket/bad"]
  for directory in dirs:
    tf.io.gfile.makedirs(directory)
  client = gcs.storage_client()
  assert [b.name for b in client.list_blobs("test-bucket", prefix="bad/")]  # the markers are there
  for directory in created:
    storage.remove_tree(directory)
  assert [b.name for b in client.list_blobs("test-bucket", prefix="bad/")] == []
