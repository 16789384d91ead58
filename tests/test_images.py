"""Images as they lie in a bucket: scikit-learn's digits saved by Pillow as PNG and JPEG files, referenced by path in a
pandas CSV, in Vertex's image classification export (JSONL with imageGcsUri, through AIP_* on the emulated
bucket), and in one folder per class; each trains to within a margin of the pixel baseline (logistic regression on
the pixels as the files decode) under the default strategy or a 2-process MultiWorkerMirrored job, and serves the
encoded bytes ({"b64": ...}) through TF Serving's loader. Bad images are one error line."""

from __future__ import annotations

import base64
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

import procs
import serving_checks
from scripts.public_data import write_digit_files
from scripts import stage_data
from trainer.data import schema as schema_lib

TIMEOUT = 240
MARGIN = 0.06  # under the pixel baseline (measured: 0.947 for the tabular model at 300 steps against 0.962)
EVAL_ROWS = 397


def _pixels(path) -> np.ndarray:
  with Image.open(path) as image:
    return np.asarray(image, dtype=np.float32).reshape(-1)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
  """PNG and JPEG files of every digit, the shuffled split, and the pixel baseline's accuracy per format."""
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp("digits")
  frames, baselines = {}, {}
  for image_format in ("PNG", "JPEG"):
    frame = write_digit_files(str(root / image_format.lower()), image_format=image_format)
    frame = frame.sample(frac=1, random_state=0).reset_index(drop=True)
    train, evaluation = frame.iloc[:-EVAL_ROWS], frame.iloc[-EVAL_ROWS:]
    model = LogisticRegression(max_iter=3000).fit(np.stack([_pixels(p) for p in train["path"]]) / 255,
                                                  train["digit"])
    accuracy = np.mean(model.predict(np.stack([_pixels(p) for p in evaluation["path"]]) / 255) == evaluation["digit"])
    frames[image_format], baselines[image_format] = frame, float(accuracy)
  return {"root": root, "frames": frames, "baselines": baselines}


def _metrics(model_dir) -> dict:
  with open(os.path.join(model_dir, "eval_metrics.json")) as f:
    return json.load(f)


def _assert_serves_encoded_bytes(model_dir, name: str, evaluation, *, minimum: float) -> None:
  rows = evaluation.iloc[:100]
  instances = []
  for path in rows["path"]:
    with open(path, "rb") as f:
      instances.append({name: {"b64": base64.b64encode(f.read()).decode()}})
  predictions = serving_checks.serve_instances(str(model_dir), instances)
  accuracy = np.mean([p["class_id"] == y for p, y in zip(predictions, rows["digit"])])
  assert accuracy >= minimum, accuracy


def test_a_csv_of_gs_uris(digits, gcs, tmp_path):
  frame = digits["frames"]["PNG"]
  local_root = str(digits["root"] / "png")
  stage_data.upload_tree(local_root, "gs://test-bucket/digit-files")
  uris = frame.assign(path=frame["path"].str.replace(local_root, "gs://test-bucket/digit-files", regex=False))
  uris.iloc[:-EVAL_ROWS].to_csv(tmp_path / "train.csv", index=False)
  uris.iloc[-EVAL_ROWS:].to_csv(tmp_path / "eval.csv", index=False)
  out = tmp_path / "out"
  # In this process, and pre-flight on a sample of 200 records (every file of the split is the default: each a
  # request to the emulator, which pre-flight's own tests cover).
  result = procs.run_trainer_here([f"--train_data={tmp_path}/train.csv", f"--eval_data={tmp_path}/eval.csv",
                                   "--label=digit", f"--output_dir={out}", "--train_steps=300",
                                   "--global_batch_size=64", "--preflight_records=200"], env=gcs.env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "'path' holds image URIs (32 file header(s) read): an image of 8x8x1" in result.stderr
  with open(out / "model" / "schema.json") as f:
    image = schema_lib.parse_schema(json.load(f), source="schema.json").feature("path")
  assert (image.type, image.uri, image.shape, image.encoding) == ("image", True, (8, 8, 1), "png")
  metrics = _metrics(out / "model")
  assert metrics["eval_examples"] == EVAL_ROWS
  assert metrics["eval_accuracy"] >= digits["baselines"]["PNG"] - MARGIN, (metrics, digits["baselines"])
  _assert_serves_encoded_bytes(out / "model", "path", frame.iloc[-EVAL_ROWS:],
                               minimum=digits["baselines"]["PNG"] - 0.1)


def _vertex_image_export(path, frame, ml_use: str, uri_of) -> None:
  """Lines as Vertex AI exports an image classification dataset (single-label)."""
  with open(path, "w") as f:
    for image, digit in zip(frame["path"], frame["digit"]):
      f.write(json.dumps({"imageGcsUri": uri_of(image), "classificationAnnotation": {"displayName": f"digit {digit}"},
                          "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": ml_use}}) + "\n")


def test_vertex_image_export_through_aip_variables(digits, gcs, tmp_path):
  frame = digits["frames"]["JPEG"]
  local_root = str(digits["root"] / "jpeg")
  base = "gs://test-bucket/dataset-77-image-classification"
  stage_data.upload_tree(local_root, f"{base}/images")
  export = tmp_path / "export"
  export.mkdir()
  uri_of = lambda path: path.replace(local_root, f"{base}/images")  # pylint: disable=unnecessary-lambda-assignment
  _vertex_image_export(export / "training-00000-of-00001.jsonl", frame.iloc[:-EVAL_ROWS], "training", uri_of)
  _vertex_image_export(export / "validation-00000-of-00001.jsonl", frame.iloc[-EVAL_ROWS:], "validation", uri_of)
  stage_data.upload_tree(str(export), f"{base}/export")
  run = "gs://test-bucket/jobs/images"
  env = {"AIP_DATA_FORMAT": "jsonl", "AIP_TRAINING_DATA_URI": f"{base}/export/training-*",
         "AIP_VALIDATION_DATA_URI": f"{base}/export/validation-*", "AIP_MODEL_DIR": f"{run}/model",
         "AIP_CHECKPOINT_DIR": f"{run}/checkpoints", "AIP_TENSORBOARD_LOG_DIR": f"{run}/logs", **gcs.env}
  result = procs.run_trainer_here(["--train_steps=300", "--global_batch_size=64", "--preflight_records=200"], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "the label is classificationAnnotation.displayName" in result.stderr
  model_dir = tmp_path / "model"
  serving_checks.copy_tree(f"{run}/model", model_dir)
  metrics = _metrics(model_dir)
  assert metrics["eval_examples"] == EVAL_ROWS
  assert metrics["eval_accuracy"] >= digits["baselines"]["JPEG"] - MARGIN, (metrics, digits["baselines"])
  rows = frame.iloc[-EVAL_ROWS:].iloc[:100]
  instances = []
  for path in rows["path"]:
    with open(path, "rb") as f:
      instances.append({"imageGcsUri": {"b64": base64.b64encode(f.read()).decode()}})
  predictions = serving_checks.serve_instances(str(model_dir), instances)
  assert np.mean([p["class_name"] == f"digit {y}" for p, y in zip(predictions, rows["digit"])]) >= (
      digits["baselines"]["JPEG"] - 0.1)


# Three yes/no properties of a digit: any set of them (or none) is an image's multi-label annotation.
DIGIT_PROPERTIES = {"even": lambda d: d % 2 == 0, "five or more": lambda d: d >= 5,
                    "has a loop": lambda d: d in (0, 6, 8, 9)}


def _vertex_multi_label_export(path, frame, ml_use_of) -> None:
  """Lines as Vertex AI exports a multi-label image classification dataset: every split in one file, each line's
  ml_use (or none) from `ml_use_of(index)`."""
  with open(path, "w") as f:
    for i, (image, digit) in enumerate(zip(frame["path"], frame["digit"])):
      line = {"imageGcsUri": image, "classificationAnnotations": [
          {"displayName": name, "annotationResourceLabels": {
              "aiplatform.googleapis.com/annotation_set_name": "digit_properties"}}
          for name, holds in DIGIT_PROPERTIES.items() if holds(digit)]}
      if ml_use_of(i):
        line["dataItemResourceLabels"] = {"aiplatform.googleapis.com/ml_use": ml_use_of(i)}
      f.write(json.dumps(line) + "\n")


def test_vertex_multi_label_export_split_by_its_ml_use_labels(digits, tmp_path):
  """One export file holding every split, as `gcloud ai datasets export` writes it: the trainer trains on its
  training (and unassigned) lines, evaluates on validation and tests on test, each class a yes/no; against
  scikit-learn's one-vs-rest logistic regression on the pixels, by the share of right yes/no decisions."""
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  from sklearn.multiclass import OneVsRestClassifier  # pylint: disable=g-import-not-at-top

  frame = digits["frames"]["PNG"]

  def ml_use(i):
    return {0: "test", 1: "validation", 2: None}.get(i % 10, "training")

  _vertex_multi_label_export(tmp_path / "export.jsonl", frame, ml_use)
  split = np.array([ml_use(i) or "training" for i in range(len(frame))])
  targets = np.array([[holds(d) for holds in DIGIT_PROPERTIES.values()] for d in frame["digit"]], dtype=int)
  pixels = np.stack([_pixels(p) for p in frame["path"]]) / 255
  baseline = OneVsRestClassifier(LogisticRegression(max_iter=3000)).fit(pixels[split == "training"],
                                                                         targets[split == "training"])
  baseline_accuracy = float(np.mean(baseline.predict(pixels[split == "validation"]) == targets[split == "validation"]))
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={tmp_path}/export.jsonl", f"--output_dir={out}", "--train_steps=300",
                                   "--global_batch_size=64"])
  assert result.returncode == 0, result.stderr[-3000:]
  uses = [ml_use(i) for i in range(len(frame))]
  counts = {use: uses.count(use) for use in ("training", None, "validation", "test")}
  assert (f"Vertex's export splits its lines by ml_use ({counts['training']} training, {counts[None]} unset, "
          f"{counts['validation']} validation, {counts['test']} test)") in result.stderr
  with open(out / "model" / "schema.json") as f:
    label = schema_lib.parse_schema(json.load(f), source="schema.json").label
  assert (label.name, label.multi_label, label.vocabulary) == (
      "classificationAnnotations.displayName", True, tuple(sorted(DIGIT_PROPERTIES)))
  metrics = _metrics(out / "model")
  assert (metrics["eval_examples"], metrics["test_examples"]) == (counts["validation"], counts["test"])
  assert metrics["eval_accuracy"] >= baseline_accuracy - MARGIN, (metrics, baseline_accuracy)
  assert metrics["test_auc"] > 0.9, metrics
  rows = np.flatnonzero(split == "test")[:100]
  instances = []
  for path in frame["path"].iloc[rows]:
    with open(path, "rb") as f:
      instances.append({"imageGcsUri": {"b64": base64.b64encode(f.read()).decode()}})
  predictions = serving_checks.serve_instances(str(out / "model"), instances)
  assert predictions[0]["class_names"] == list(label.vocabulary)
  order = [list(DIGIT_PROPERTIES).index(name) for name in label.vocabulary]
  served = np.array([p["predicted"] for p in predictions])
  assert np.mean(served == targets[rows][:, order]) >= baseline_accuracy - 0.1
  np.testing.assert_array_equal(served, np.array([p["probabilities"] for p in predictions]) > 0.5)
  # Bytes that are no image, and a path sent where the bytes belong: one line each, as TF Serving answers 400.
  from serving import predict  # pylint: disable=g-import-not-at-top

  model = predict.SessionModel(str(out / "model"))
  try:
    for value in ({"b64": base64.b64encode(b"not a picture").decode()}, frame["path"].iloc[0]):
      with pytest.raises(predict.PredictError, match=r"^instance 0: feature 'imageGcsUri' is not a PNG, JPEG, GIF or "
                                                     r"BMP image \((its 'b64' holds 13 bytes|got the text '/)"):
        predict.predict(model, {"instances": [{"imageGcsUri": value}]})
  finally:
    model.close()


@pytest.mark.long
def test_class_folders_on_two_replicas(digits, tmp_path):
  """Class folders under MirroredStrategy (two replicas, in this process); their sharding across a multi-worker
  job's pipelines is test_data's (InputContext), a real two-process job test_multiworker's."""
  frame = digits["frames"]["PNG"]
  for split, part in (("train", frame.iloc[:-EVAL_ROWS]), ("eval", frame.iloc[-EVAL_ROWS:])):
    for path, digit in zip(part["path"], part["digit"]):
      folder = tmp_path / split / ("zero" if digit == 0 else f"digit{digit}")
      folder.mkdir(parents=True, exist_ok=True)
      shutil.copy(path, folder)
  out = tmp_path / "out"
  args = [f"--train_data={tmp_path}/train/", f"--eval_data={tmp_path}/eval/", f"--output_dir={out}",
          "--train_steps=300", "--global_batch_size=64", "--checkpoint_every_steps=300", "--num_cpu_devices=2"]
  result = procs.run_trainer_here(args)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "images in 10 class folders (digit1, digit2" in result.stderr
  with open(out / "model" / "schema.json") as f:
    schema = schema_lib.parse_schema(json.load(f), source="schema.json")
  assert schema.label.vocabulary[:2] == ("digit1", "digit2") and schema.label.vocabulary[-1] == "zero"
  metrics = _metrics(out / "model")
  assert metrics["num_replicas"] == 2 and metrics["eval_examples"] == EVAL_ROWS
  assert metrics["eval_accuracy"] >= digits["baselines"]["PNG"] - MARGIN, (metrics, digits["baselines"])


def test_class_folders_with_gif_bmp_and_stray_files(digits, tmp_path):
  """Class folders as people fill them: GIF and BMP files (Pillow, greyscale and colour) among the PNGs, a notes.txt
  in a class folder and a labels.csv at the top, which Keras' image_dataset_from_directory leaves out too."""
  frame = digits["frames"]["PNG"]
  for i, (path, digit) in enumerate(zip(frame["path"].iloc[:800], frame["digit"].iloc[:800])):
    folder = tmp_path / ("train" if i < 600 else "eval") / f"digit{digit}"
    folder.mkdir(parents=True, exist_ok=True)
    with Image.open(path) as image:
      kind = ("GIF", "BMP", "PNG")[i % 3]
      (image.convert("RGB") if i % 6 == 1 else image).save(folder / f"{i}.{kind.lower()}", format=kind)
  (tmp_path / "train" / "digit3" / "notes.txt").write_text("scanned on tuesday\n")
  (tmp_path / "train" / "labels.csv").write_text("file,label\n")
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={tmp_path}/train/", f"--eval_data={tmp_path}/eval/",
                                   f"--output_dir={out}", "--train_steps=150", "--global_batch_size=32"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "600 image file(s) and 2 other file(s), left out" in result.stderr
  with open(out / "model" / "schema.json") as f:
    image = schema_lib.parse_schema(json.load(f), source="schema.json").feature("image")
  assert image.shape[:2] == (8, 8)
  assert _metrics(out / "model")["eval_accuracy"] > 0.8


def _errors(result) -> list[str]:
  return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_bad_images_are_one_line_and_nothing_written(digits, tmp_path):
  frame = digits["frames"]["PNG"].iloc[:300].copy()
  missing = frame.copy()
  missing.loc[200, "path"] = str(tmp_path / "gone.png")
  missing.to_csv(tmp_path / "missing.csv", index=False)
  not_an_image = tmp_path / "note.png"
  not_an_image.write_text("this is not a picture\n")
  unreadable = frame.copy()
  unreadable.loc[250, "path"] = str(not_an_image)
  unreadable.to_csv(tmp_path / "unreadable.csv", index=False)
  _vertex_image_export(tmp_path / "vertex.jsonl", frame, "training", lambda path: path)
  lines = (tmp_path / "vertex.jsonl").read_text().splitlines()
  unannotated = json.loads(lines[150])
  del unannotated["classificationAnnotation"]
  lines[150] = json.dumps(unannotated)
  (tmp_path / "vertex.jsonl").write_text("\n".join(lines) + "\n")
  multi = tmp_path / "multi.jsonl"
  _vertex_multi_label_export(multi, frame, lambda i: "training")
  lines = multi.read_text().splitlines()
  lines[150] = json.dumps({key: value for key, value in json.loads(lines[150]).items()
                           if key != "classificationAnnotations"})
  multi.write_text("\n".join(lines) + "\n")
  held_out = tmp_path / "held_out.jsonl"
  _vertex_multi_label_export(held_out, frame, lambda i: "validation" if i % 2 else "test")
  cases = [
      ([f"--train_data={multi}"],
       r"^error: --train_data: label 'classificationAnnotations.displayName' is missing in 1 sampled record\(s\), "
       rf"the first at {multi} line 151 \(a data item without an annotation\); every record needs a label$"),
      ([f"--train_data={held_out}"],
       rf"^error: --train_data: every line of {held_out} has ml_use validation or test \(150 and 150\); none is left "
       "to train on$"),
      ([f"--train_data={tmp_path}/missing.csv", "--label=digit"],
       rf"^error: --train_data: {tmp_path}/missing.csv line 202: column 'path' names {tmp_path}/gone.png, which "
       r"cannot be read \("),
      ([f"--train_data={tmp_path}/unreadable.csv", "--label=digit"],
       rf"^error: --train_data: {tmp_path}/unreadable.csv line 252: column 'path' names {not_an_image}, which is not "
       r"a PNG, JPEG, GIF or BMP image \(it starts b'this is '\)$"),
      ([f"--train_data={tmp_path}/vertex.jsonl"],
       r"^error: --train_data: label 'classificationAnnotation.displayName' is missing in 1 sampled record\(s\), the "
       rf"first at {tmp_path}/vertex.jsonl line 151 \(a data item without an annotation\); every record needs a "
       r"label$"),
  ]
  for args, pattern in cases:
    out = tmp_path / "out"
    result = procs.run_trainer_here([*args, f"--output_dir={out}", "--train_steps=20", "--global_batch_size=32",
                                     "--shuffle_buffer=0"])
    assert result.returncode == 2, (args, result.stderr[-3000:])
    errors = _errors(result)
    assert len(errors) == 1 and __import__("re").match(pattern, errors[0]), (pattern, result.stderr[-3000:])
    assert not (out / "model").exists()
