"""Batch prediction (python -m scripts.batch_predict): Vertex's output layout over JSONL, CSV and TFRecord inputs
as pandas and TensorFlow write them, local files and gs://, bad lines kept apart; and the BatchPredictionJob."""

import csv
import glob
import json
import os
import re

import numpy as np
import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format

import fake_vertex
import procs
import serving_checks
from scripts.public_data import iris_frame
from scripts import batch_predict
from serving import predict
from scripts import stage_data

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def iris_model(tmp_path_factory):
  """An iris classifier trained from pandas' CSV (column names with spaces, a few blank widths)."""
  directory = tmp_path_factory.mktemp("iris")
  frame = iris_frame()
  frame.iloc[:120].to_csv(directory / "train.csv", index=False)
  result = procs.run_trainer_here([f"--train_data={directory}/train.csv", "--label=species",
                                   f"--output_dir={directory}/out", "--train_steps=120", "--global_batch_size=30",
                                   "--learning_rate=0.02", "--eval_steps=0"])
  assert result.returncode == 0, result.stderr[-3000:]
  return directory / "out" / "model", frame.iloc[120:].reset_index(drop=True)


def _expected(model_dir, rows):
  """The session loader's answers for rows keyed by input name, blanks given the schema's default."""
  schema = json.load(open(model_dir / "schema.json"))
  defaults = {f["name"]: f.get("default") for f in schema["features"]}
  model = predict.load(str(model_dir))
  try:
    instances = [{predict.safe_name(k): (defaults[k] if v is None or v != v else v) for k, v in row.items()
                  if k in defaults} for row in rows]
    return predict.predict(model, {"instances": instances})["predictions"]
  finally:
    model.close()


def _outputs(directory):
  results = [json.loads(line) for path in sorted(glob.glob(f"{directory}/prediction.results-*"))
             for line in open(path)]
  errors = [json.loads(line) for line in open(f"{directory}/prediction.errors_stats-00000-of-00001")]
  assert not glob.glob(f"{directory}/.*.tmp")
  return results, errors


def _write_tfrecord(path, frame):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with tf.io.TFRecordWriter(str(path)) as writer:
    for row in frame.to_dict("records"):
      feature = {}
      for key, value in row.items():
        if isinstance(value, str):
          feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif value == value:  # a blank width is left out of the record, as TFRecord writers leave it
          feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_every_input_format_gives_vertexs_output_layout(iris_model, gcs, tmp_path, capsys):
  model_dir, rows = iris_model
  records = rows.to_dict("records")
  expected = _expected(model_dir, records)
  inputs = tmp_path / "inputs"
  inputs.mkdir()
  # JSONL as pandas writes it (NaN -> null, the file's own column names, the label) and as Python's json writes it
  # (a blank as NaN), plus two bad lines.
  rows.iloc[:15].to_json(inputs / "new.jsonl", orient="records", lines=True)
  with open(inputs / "new.jsonl", "a") as f:
    f.writelines(json.dumps(r) + "\n" for r in records[15:])
  with open(inputs / "new.jsonl", "a") as f:
    f.write("{not json\n")
    f.write(json.dumps({**records[0], "petal length (cm)": "long"}) + "\n")
  # CSV as Vertex reads one (the model's columns in order, text quoted; blank cells), in the bucket; a bad row at
  # the end.
  features = rows.drop(columns=["species"])
  bad_row = features.iloc[:1].copy()
  bad_row["petal width (cm)"] = "wide"
  csv_text = (features.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC) +
              bad_row.to_csv(index=False, header=False, quoting=csv.QUOTE_NONNUMERIC) + "5.1,3.5\n")  # a short row
  (inputs / "new.csv").write_text(csv_text)
  stage_data.upload_tree(str(inputs), "gs://test-bucket/batch-in")
  _write_tfrecord(inputs / "new.tfrecord", rows)
  cases = [("jsonl", str(inputs / "new.jsonl"), 2), ("csv", "gs://test-bucket/batch-in/*.csv", 2),
           ("tfrecord", str(inputs / "*.tfrecord"), 0)]
  for kind, pattern, bad in cases:
    out = tmp_path / f"out-{kind}"
    code = batch_predict.main(["local", f"--model_dir={model_dir}", f"--input={pattern}", f"--output_dir={out}",
                               "--batch_size=7", "--results_per_file=20"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads(printed)
    # Vertex's layout: a new prediction-<model>-<time> folder for each run (the run's dir names the model).
    assert re.fullmatch(rf"{re.escape(str(out))}/prediction-out-\d{{4}}_\d\d_\d\dT\d\d_\d\d_\d\d_\d{{3}}Z",
                        summary.pop("output_dir"))
    assert summary == {"instances": len(records) + bad, "predictions": len(records), "errors": bad,
                       "result_files": 2, "input_files": 1, "format": kind}
    (folder,) = glob.glob(f"{out}/prediction-*")
    results, errors = _outputs(folder)
    serving_checks.assert_same_predictions([r["prediction"] for r in results], expected, kind)  # a bad one never shifts the others
    assert len(errors) == bad and all(e["error"]["code"] == 3 for e in errors)
    if kind == "jsonl":
      assert results[0]["instance"] == json.loads(open(inputs / "new.jsonl").readline())  # as it was sent
      results_text = "".join(open(path).read() for path in glob.glob(f"{folder}/prediction.results-*"))
      assert "NaN" in open(inputs / "new.jsonl").read() and "NaN" not in results_text  # standard JSON out
      assert "line 31 is not JSON" in errors[0]["error"]["message"]
      assert re.match(r"^feature 'petal_length__cm_' must be a number", errors[1]["error"]["message"])
    if kind == "csv":  # each row sent as the list of its values, as Vertex sends it
      assert results[0]["instance"] == [None if v != v else v for v in features.iloc[0].tolist()]
      assert re.match(r"^feature 'petal_width__cm_' must be a number", errors[0]["error"]["message"])
      assert errors[1] == {"instance": "5.1,3.5", "error": {"code": 3, "message": "new.csv line 33 has 2 fields; its "
                                                                                  "header has 4"}}
  accuracy = np.mean([r["prediction"]["class_name"] == y for r, y in zip(results, rows["species"])])
  assert accuracy >= 0.8


def test_bad_batch_inputs_are_one_line(iris_model, tmp_path, capsys):
  model_dir, _ = iris_model
  (tmp_path / "odd.txt").write_text("x")
  cases = [(["local", f"--model_dir={model_dir}", f"--input={tmp_path}/none-*.jsonl", f"--output_dir={tmp_path}/o"],
            r"^error: --input=.*/none-\*\.jsonl: no file matches"),
           (["local", f"--model_dir={model_dir}", f"--input={tmp_path}/odd.txt", f"--output_dir={tmp_path}/o"],
            r"^error: --input: cannot tell the format of .*odd\.txt"),
           (["local", f"--model_dir={model_dir}", f"--input={tmp_path}/odd.txt", "--format=csv",
             f"--output_dir={tmp_path}/odd.txt"], r"^error: --output_dir=.*odd\.txt: a file is there; expected a directory"),
           (["local", f"--model_dir={tmp_path}", f"--input={tmp_path}/odd.txt", "--format=csv",
             f"--output_dir={tmp_path}/o"], r"^error: --model_dir: cannot load a SavedModel"),
           (["submit", "--model=m", "--input=gs://b/x.jsonl", "--output_dir=gs://b/o", "--project=p"],
            r"^error: --model='m': expected a registered model"),
           (["submit", "--model=projects/p/locations/l/models/1", "--input=gs://b/x.tfrecord", "--output_dir=gs://b/o",
             "--project=p"], r"^error: --input: Vertex sends each TFRecord record to the model as one")]
  for args, message in cases:
    assert batch_predict.main(args) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err) and len(captured.err.strip().splitlines()) == 1, captured.err
    assert not os.path.exists(f"{tmp_path}/o")


def test_a_batch_prediction_job_is_sent_as_the_api_takes_it(capsys):
  args = ["submit", "--model=projects/p/locations/europe-west4/models/42", "--input=gs://b/new/*.jsonl",
          "--output_dir=gs://b/predictions", "--project=p", "--region=europe-west4", "--machine_type=n1-standard-8",
          "--replica_count=2"]
  with fake_vertex.running() as fake:
    assert batch_predict.main([*args, "--dry_run", f"--api_endpoint={fake.endpoint}"]) == 0
    assert not fake.requests
    printed = json.loads(capsys.readouterr().out)
    assert batch_predict.main([*args, f"--api_endpoint={fake.endpoint}"]) == 0
    (body,) = fake.created("batchPredictionJobs")
  assert body == printed["batchPredictionJob"]
  request = aiplatform_v1.CreateBatchPredictionJobRequest()
  json_format.ParseDict(printed, request._pb)  # pylint: disable=protected-access
  job = request.batch_prediction_job
  assert job.model == "projects/p/locations/europe-west4/models/42"
  assert job.input_config.instances_format == "jsonl" and list(job.input_config.gcs_source.uris) == ["gs://b/new/*.jsonl"]
  assert job.output_config.gcs_destination.output_uri_prefix == "gs://b/predictions"
  assert job.instance_config.instance_type == "object"
  assert job.dedicated_resources.machine_spec.machine_type == "n1-standard-8"
  assert job.dedicated_resources.starting_replica_count == 2


def _with_ids(rows):
  """The held-out iris rows as a raw export has them: a unique name first (commas and quotes, as names have them),
  the label still there."""
  frame = rows.copy()
  frame.insert(0, "Name", [f'Iris #{i}, "plot {i % 3}"' for i in range(len(frame))])
  return frame


def _run(capsys, args):
  """`scripts.batch_predict` ARGS in this process: exit code, the summary (or None), its `error:` and `warning:`
  lines, the output folder's results and errors."""
  code = batch_predict.main(args)
  captured = capsys.readouterr()
  summary = json.loads(captured.out) if captured.out.strip() else None
  outputs = _outputs(summary["output_dir"]) if summary else ([], [])
  said = "\n".join(line for line in captured.err.splitlines() if line.startswith(("error:", "warning:")))
  return code, summary, said, outputs


def test_instances_with_an_id_column_are_predicted_and_keyed(iris_model, tmp_path, capsys):
  """A raw export with a name column (the issue's 0 of 80): the name is ignored by default and echoed with the
  instance; --key_field carries it as `key`; --excluded_fields and --included_fields choose what is sent."""
  model_dir, rows = iris_model
  frame = _with_ids(rows)
  expected = _expected(model_dir, rows.to_dict("records"))
  frame.to_json(tmp_path / "new.jsonl", orient="records", lines=True)
  common = [f"--model_dir={model_dir}", f"--output_dir={tmp_path}/out", "--batch_size=8"]
  code, summary, err, (results, errors) = _run(capsys, ["local", f"--input={tmp_path}/new.jsonl", *common])
  assert code == 0 and not err and not errors, err
  assert summary["predictions"] == len(frame) and summary["ignored_fields"] == ["Name"]
  serving_checks.assert_same_predictions([r["prediction"] for r in results], expected)
  assert [r["instance"]["Name"] for r in results] == list(frame["Name"])  # echoed as it came
  # CSV: Vertex sends a row as the list of its values (no header), the key field left out: an id column then the
  # model's columns in order, text quoted.
  frame.drop(columns=["species"]).to_csv(tmp_path / "new.csv", index=False, quoting=csv.QUOTE_NONNUMERIC)
  for kind in ("jsonl", "csv"):
    code, summary, err, (results, errors) = _run(capsys, ["local", f"--input={tmp_path}/new.{kind}",
                                                          "--key_field=Name", *common])
    assert code == 0 and not err and "ignored_fields" not in summary, err
    assert [sorted(r) for r in results] == [["key", "prediction"]] * len(frame)
    assert [r["key"] for r in results] == list(frame["Name"])
    serving_checks.assert_same_predictions([r["prediction"] for r in results], expected)
  code, summary, err, (results, _) = _run(capsys, ["local", f"--input={tmp_path}/new.jsonl",
                                                   "--excluded_fields=Name,species", *common])
  assert code == 0 and "ignored_fields" not in summary
  serving_checks.assert_same_predictions([r["prediction"] for r in results], expected)
  assert results[0]["instance"]["Name"] == frame["Name"][0]  # excluded fields stay in the output's instance
  features = [c for c in rows.columns if c != "species"]
  code, summary, err, (results, _) = _run(capsys, ["local", f"--input={tmp_path}/new.jsonl",
                                                   f"--included_fields={','.join(features)}", *common])
  assert code == 0
  serving_checks.assert_same_predictions([r["prediction"] for r in results], expected)
  assert sorted(results[0]["instance"]) == sorted(features)  # the instance as it was sent


def test_a_csv_is_read_as_vertex_reads_it(iris_model, tmp_path, capsys):
  """Vertex sends each CSV row as the list of its values, without the header, reading unquoted values as numbers:
  a CSV whose columns are not the model's inputs in order (pandas' default, label included) is one line before
  anything is written; an unquoted word fails its row only; the serving side maps a list by the schema's order."""
  model_dir, rows = iris_model
  common = [f"--model_dir={model_dir}", f"--output_dir={tmp_path}/out"]
  rows.to_csv(tmp_path / "raw.csv", index=False)
  code, summary, err, _ = _run(capsys, ["local", f"--input={tmp_path}/raw.csv", *common])
  assert code == 2 and summary is None and not os.path.exists(tmp_path / "out")
  assert err == (f"error: --input: {tmp_path}/raw.csv has the columns sepal length (cm), sepal width (cm), petal "
                 "length (cm), petal width (cm), species; Vertex sends each CSV row to the model as the list of its "
                 "values, without the header, so they must be the model's inputs in order: sepal length (cm), sepal "
                 "width (cm), petal length (cm), petal width (cm) (or give JSONL: one object per line, by name, other "
                 "fields ignored); leave out the label column 'species'"), err
  named = _with_ids(rows).drop(columns=["species"])
  named.to_csv(tmp_path / "named.csv", index=False, quoting=csv.QUOTE_NONNUMERIC)
  code, _, err, _ = _run(capsys, ["local", f"--input={tmp_path}/named.csv", *common])
  assert code == 2 and err.endswith("fields ignored); if 'Name' is an id, --key_field=Name keeps it out of what is "
                                    "sent and in the output"), err
  features = rows.drop(columns=["species"]).iloc[:4]
  text = features.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC).splitlines()
  text[2] = "5.9,wide,4.2,1.5"
  (tmp_path / "words.csv").write_text("\n".join(text) + "\n")
  code, summary, err, (results, errors) = _run(capsys, ["local", f"--input={tmp_path}/words.csv", *common])
  assert code == 0 and (summary["predictions"], summary["errors"]) == (3, 1)
  assert errors[0]["error"]["message"] == (
      "words.csv line 3: could not convert string to float: 'wide'; Vertex reads an unquoted CSV value as a number: "
      "put text in double quotes (pandas: to_csv(..., quoting=csv.QUOTE_NONNUMERIC))")
  model = predict.load(str(model_dir))
  try:
    by_list = predict.predict(model, {"instances": [[5.1, 3.5, 1.4, 0.2]]})["predictions"]
    by_name = predict.predict(model, {"instances": [dict(zip(features.columns, [5.1, 3.5, 1.4, 0.2]))]})
    assert by_list == by_name["predictions"]
    with pytest.raises(predict.PredictError, match=r"^instance 0: a list of 3 values \(a CSV row, as Vertex sends "
                                                   r"one\); the model takes 4, in this order: sepal length \(cm\), "):
      predict.predict(model, {"instances": [[5.1, 3.5, 1.4]]})
  finally:
    model.close()


def test_a_key_field_the_model_takes_is_refused_before_anything_is_written(iris_model, tmp_path, capsys):
  """A key field is not sent to the model (Vertex's keyField): naming one of its inputs would fail every instance,
  so it is one line naming --key_field, the input and what to do; no output folder is made."""
  model_dir, rows = iris_model
  rows.iloc[:5].to_json(tmp_path / "new.jsonl", orient="records", lines=True)
  code, _, err, _ = _run(capsys, ["local", f"--input={tmp_path}/new.jsonl", "--key_field=petal width (cm)",
                                  f"--model_dir={model_dir}", f"--output_dir={tmp_path}/out"])
  assert code == 2 and re.fullmatch(
      r"error: --key_field=petal width \(cm\): the model takes it as its input 'petal_width__cm_' \(column 'petal "
      r"width \(cm\)'\), and a key field is not sent to the model \(as on Vertex\): key by a field the model does "
      r"not take, or leave --key_field out \(each output line then carries its instance\)", err), err
  assert not os.path.exists(tmp_path / "out")


def test_an_input_no_instance_gives_is_named(iris_model, tmp_path, capsys):
  """A column every instance lacks (files exported without it) gets the schema's default in every prediction: the
  run succeeds, as Vertex's would, and says which input was never given; one instance that lacks it is not news."""
  model_dir, rows = iris_model
  rows.drop(columns=["sepal width (cm)"]).to_json(tmp_path / "new.jsonl", orient="records", lines=True)
  common = [f"--model_dir={model_dir}", f"--output_dir={tmp_path}/out"]
  code, summary, err, (results, _) = _run(capsys, ["local", f"--input={tmp_path}/new.jsonl", *common])
  assert code == 0 and len(results) == len(rows) and summary["defaulted_inputs"] == ["sepal_width__cm_"]
  assert err == ("warning: no instance gave 'sepal_width__cm_' (column 'sepal width (cm)'): every prediction used "
                 "the schema's default for it (a column the input lacks, or names otherwise?)"), err
  records = rows.to_dict("records")
  del records[0]["sepal width (cm)"]
  with open(tmp_path / "one.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  code, summary, err, _ = _run(capsys, ["local", f"--input={tmp_path}/one.jsonl", *common])
  assert code == 0 and "defaulted_inputs" not in summary and not err, err


def test_a_batch_that_predicts_nothing_exits_2_and_a_partial_one_says_how_many_failed(iris_model, tmp_path, capsys):
  model_dir, rows = iris_model
  frame = _with_ids(rows.iloc[:10])
  frame.to_json(tmp_path / "new.jsonl", orient="records", lines=True)
  common = [f"--model_dir={model_dir}", f"--output_dir={tmp_path}/out"]
  # Every instance an error: one line, how many, the first reason and where; the errors file is written.
  code, summary, err, (results, errors) = _run(capsys, ["local", f"--input={tmp_path}/new.jsonl",
                                                        "--key_field=id", *common])
  lines = err.splitlines()
  assert code == 2 and len(lines) == 1 and not results and len(errors) == 10, err
  assert re.match(r"^error: no prediction: all 10 instances failed; the first at new\.jsonl line 1: the instance "
                  r"has no field 'id' \(--key_field\) \(every error in .*/prediction\.errors_stats-00000-of-00001\)$",
                  lines[0]), lines[0]
  assert summary["predictions"] == 0
  # Some fail: exit 0, and standard error says how many. A misspelled column is refused, not defaulted.
  records = frame.to_dict("records")
  misspelled = {("petal width" if k == "petal width (cm)" else k): v for k, v in records[3].items()}
  with open(tmp_path / "mixed.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records[:3] + [misspelled] + records[4:])
  code, summary, err, (results, errors) = _run(capsys, ["local", f"--input={tmp_path}/mixed.jsonl", *common])
  assert code == 0 and (summary["predictions"], summary["errors"]) == (9, 1)
  assert re.match(r"^warning: 1 of 10 instances failed; the first at mixed\.jsonl line 4: 'petal width' is not an "
                  r"input of the model; did you mean 'petal_width__cm_' \(column 'petal width \(cm\)'\), which this "
                  r"instance lacks\?", err), err
  assert errors[0]["instance"]["petal width"] == misspelled["petal width"]
  # No instance at all is nothing predicted too.
  (tmp_path / "empty.jsonl").write_text("\n")
  code, _, err, _ = _run(capsys, ["local", f"--input={tmp_path}/empty.jsonl", *common])
  assert code == 2 and re.match(r"^error: --input=.*empty\.jsonl: its 1 file\(s\) hold no instance", err), err


def test_instance_config_flags_are_checked_as_vertex_checks_them(iris_model, tmp_path, capsys):
  model_dir, _ = iris_model
  (tmp_path / "new.jsonl").write_text("{}\n")
  (tmp_path / "new.csv").write_text("a\n1\n")
  local = ["local", f"--model_dir={model_dir}", f"--output_dir={tmp_path}/o"]
  cases = [([*local, f"--input={tmp_path}/new.jsonl", "--included_fields=a", "--excluded_fields=b"],
            r"^error: --included_fields=a and --excluded_fields=b: Vertex takes one or the other"),
           ([*local, f"--input={tmp_path}/new.csv", "--excluded_fields=Name"],
            r"^error: --excluded_fields=Name: Vertex applies it to JSONL objects \(and TFRecord\), not to CSV"),
           ([*local, f"--input={tmp_path}/new.jsonl", "--instance_type=array"],
            r"^error: --instance_type=array: needs --included_fields"),
           ([*local, f"--input={tmp_path}/new.jsonl", "--instance_type=array", "--included_fields=a,b"],
            r"^error: --instance_type=array: each instance would reach the model as a list of values, and its "
            r"signature takes 4 inputs by name"),
           ([*local, f"--input={tmp_path}/new.jsonl", "--excluded_fields=a,,b"],
            r"^error: --excluded_fields=a,,b: an empty field name"),
           (["submit", "--model=projects/p/locations/l/models/1", "--input=gs://b/x.csv", "--output_dir=gs://b/o",
             "--project=p", "--included_fields=a"], r"^error: --included_fields=a: Vertex applies it to JSONL")]
  for args, message in cases:
    assert batch_predict.main(args) == 2, args
    captured = capsys.readouterr()
    assert re.search(message, captured.err) and len(captured.err.strip().splitlines()) == 1, captured.err
    assert not os.path.exists(f"{tmp_path}/o")


def test_the_job_carries_the_instance_config(capsys):
  """keyField, excludedFields, includedFields and instanceType as the API takes them (parsed into aiplatform_v1)."""
  base = ["submit", "--model=projects/p/locations/l/models/42", "--input=gs://b/new/*.jsonl",
          "--output_dir=gs://b/predictions", "--project=p", "--region=l"]
  with fake_vertex.running() as fake:
    assert batch_predict.main([*base, "--key_field=Name", "--excluded_fields=Ticket,Cabin",
                               f"--api_endpoint={fake.endpoint}"]) == 0
    assert batch_predict.main([*base, "--included_fields=x", "--instance_type=array", "--dry_run"]) == 0
    (body,) = fake.created("batchPredictionJobs")
  printed = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # after the "submitted ..." line
  configs = []
  for job in (body, printed["batchPredictionJob"]):
    parsed = aiplatform_v1.BatchPredictionJob()
    json_format.ParseDict(job, parsed._pb)  # pylint: disable=protected-access
    configs.append(parsed.instance_config)
  assert (configs[0].instance_type, configs[0].key_field, list(configs[0].excluded_fields),
          list(configs[0].included_fields)) == ("object", "Name", ["Ticket", "Cabin"], [])
  assert (configs[1].instance_type, configs[1].key_field, list(configs[1].included_fields)) == ("array", "", ["x"])


def test_a_local_batch_reports_its_progress_batch_by_batch(iris_model, tmp_path):
  """Off a terminal, a line per interval (here every batch) with the count so far, as staging and training do."""
  import io  # pylint: disable=g-import-not-at-top

  from scripts import progress as tool_progress  # pylint: disable=g-import-not-at-top

  model_dir, rows = iris_model
  rows.iloc[:20].drop(columns=["species"]).to_json(tmp_path / "in.jsonl", orient="records", lines=True)
  stream = io.StringIO()
  reporter = tool_progress.Progress(total=None, what="batch prediction", unit="instance", stream=stream, every_secs=0)
  model = predict.SessionModel(str(model_dir))
  try:
    counts = batch_predict.run_local(model, [str(tmp_path / "in.jsonl")], "jsonl", str(tmp_path), batch_size=8,
                                     results_per_file=100, progress=reporter)
  finally:
    model.close()
  assert counts["predictions"] == 20
  assert [line.split(",")[0] for line in stream.getvalue().splitlines()] == [
      "batch prediction: 8 instances", "batch prediction: 16 instances", "batch prediction: 20 instances",
      "batch prediction: 20 instances"]  # each batch of 8, the last 4, then the total at the end
