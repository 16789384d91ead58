"""The trainer on data as users have it, end to end: a Vertex managed dataset with only Vertex's variables, an
inferred schema on a 2-process job, the export served the way TF Serving loads it, and bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import tensorflow as tf

import procs
import serving_checks
from scripts.public_data import digits_rows
from scripts.public_data import iris_frame
from scripts.public_data import write_jsonl
from trainer import task
from trainer.data import schema as schema_lib

TIMEOUT = 240


def test_vertex_managed_csv_dataset_with_only_vertex_variables(gcs, tmp_path):
  """A tabular dataset as Vertex exports it for a custom job: CSV shards with a header under
  dataset-<id>-tables-<time>/, named training-*/validation-* without an extension, no schema; the job gets
  AIP_DATA_FORMAT=csv, the AIP_* URIs and --label, and nothing else."""
  from scripts import stage_data  # pylint: disable=g-import-not-at-top

  frame = iris_frame()
  export = tmp_path / "export"
  export.mkdir()
  for i, part in enumerate((frame.iloc[:60], frame.iloc[60:120])):
    part.to_csv(export / f"training-{i:05d}-of-00002", index=False)
  frame.iloc[120:].to_csv(export / "validation-00000-of-00001", index=False)
  base = "gs://test-bucket/dataset-4242-tables-2026-12-03T10:00:00.000Z"
  stage_data.upload_tree(str(export), base)
  run = "gs://test-bucket/jobs/iris"
  env = {"AIP_DATA_FORMAT": "csv", "AIP_TRAINING_DATA_URI": f"{base}/training-*",
         "AIP_VALIDATION_DATA_URI": f"{base}/validation-*", "AIP_MODEL_DIR": f"{run}/model",
         "AIP_CHECKPOINT_DIR": f"{run}/checkpoints", "AIP_TENSORBOARD_LOG_DIR": f"{run}/logs",
         "CLOUD_ML_JOB_ID": "4242", **gcs.env}
  result = procs.run_trainer_here(["--label=species", "--train_steps=300", "--global_batch_size=32"], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "--train_data: 2 file(s) of CSV (5 columns, a header row)" in result.stderr
  with tf.io.gfile.GFile(f"{run}/model/schema.json") as f:
    schema = schema_lib.parse_schema(json.load(f), source="schema.json")
  assert schema.label.vocabulary == ("setosa", "versicolor", "virginica")
  with tf.io.gfile.GFile(f"{run}/model/eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["eval_examples"] == 30 and metrics["eval_accuracy"] >= 0.8, metrics
  # Served as Vertex serves it: JSON instances keyed by the signature's input names (the column names made
  # TensorFlow names), answered with the class names.
  eval_rows = frame.iloc[120:]
  instances = [{schema_lib.safe_name(k): v for k, v in row.items() if k != "species"}
               for row in eval_rows.fillna(3.0).to_dict("records")]
  local_model = tmp_path / "model"
  serving_checks.copy_tree(f"{run}/model", str(local_model))
  predictions = serving_checks.serve_instances(str(local_model), instances)
  names = [p["class_name"] for p in predictions]
  assert all(isinstance(name, str) for name in names)  # JSON strings, as TF Serving answers
  assert np.mean(np.array(names) == eval_rows["species"].to_numpy()) >= 0.8


def test_inferred_schema_with_images_on_a_two_process_job(tmp_path):
  """JSONL (Vertex's managed-dataset format) with PNG images, a number and a category: both workers infer the
  same schema, train together, and the export takes PNG bytes as b64 the way Vertex sends them."""
  data = tmp_path / "data"
  data.mkdir()
  write_jsonl(str(data / "training-00000-of-00002.jsonl"), digits_rows(0, 700))
  write_jsonl(str(data / "training-00001-of-00002.jsonl"), digits_rows(700, 1400))
  write_jsonl(str(data / "validation-00000-of-00001.jsonl"), digits_rows(1400, 1797))
  out = tmp_path / "out"
  env = {"AIP_DATA_FORMAT": "jsonl", "AIP_TRAINING_DATA_URI": f"{data}/training-*",
         "AIP_VALIDATION_DATA_URI": f"{data}/validation-*"}
  args = ["--label=digit", f"--output_dir={out}", "--train_steps=300", "--global_batch_size=64",
          "--checkpoint_every_steps=300"]
  logs = procs.run_chief_and_worker(str(tmp_path), args, env=env, timeout=TIMEOUT)
  inferred = {name: [line.split("Schema (inferred", 1)[1] for line in log.splitlines() if "Schema (inferred" in line]
              for name, log in logs.items()}
  assert len(inferred["chief"]) == 1 and inferred["chief"] == inferred["worker"]
  with open(out / "model" / "schema.json") as f:
    schema = schema_lib.parse_schema(json.load(f), source="schema.json")
  image = schema.feature("image")
  assert (image.type, image.encoding, image.shape) == ("image", "png", (8, 8, 1))
  assert set(schema.feature("scanner").vocabulary) == {"flatbed", "phone", "fax"}
  assert schema.feature("ink").std > 0 and schema.label.num_classes == 10
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["num_replicas"] == 2 and metrics["eval_examples"] == 397
  instances = [{k: v for k, v in row.items() if k != "digit"} for row in digits_rows(1400, 1450)]
  predictions = serving_checks.serve_instances(str(out / "model"), instances)
  labels = [row["digit"] for row in digits_rows(1400, 1450)]
  assert np.mean([p["class_id"] == y for p, y in zip(predictions, labels)]) >= 0.6


def _run_in_process(argv: list[str], environ: dict[str, str], capfd) -> tuple[int, str]:
  from absl import flags  # pylint: disable=g-import-not-at-top

  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  code = task.run_command(["trainer.task", *argv], {**os.environ, **environ}, flag_values=values)
  return code, capfd.readouterr().err


def _bad_inputs(tmp_path):
  frame = iris_frame()
  good = tmp_path / "good"
  good.mkdir()
  frame.to_csv(good / "train.csv.gz", index=False, compression="gzip")
  bad = frame.copy().astype({"petal width (cm)": object})
  bad.loc[140, "petal width (cm)"] = "wide"
  (tmp_path / "deep").mkdir()
  bad.to_csv(tmp_path / "deep" / "train.csv.gz", index=False, compression="gzip")
  (tmp_path / "mixed").mkdir()
  frame.to_csv(tmp_path / "mixed" / "a.csv", index=False)
  frame.to_csv(tmp_path / "mixed" / "b.csv", index=False, compression="gzip")
  with open(good / "train.csv.gz", "rb") as f:
    data = f.read()
  # pandas quotes a field with a line break and writes the break as is; here the first one is past the 64 KiB
  # head pre-flight looks in, so the files are read line by line and the split record fails deep in training.
  (tmp_path / "late_break").mkdir()
  late = pd.concat([frame] * 20, ignore_index=True).assign(note="ok")
  late.loc[2800, "note"] = "two\nlines"
  late.to_csv(tmp_path / "late_break" / "train.csv", index=False)
  assert (tmp_path / "late_break" / "train.csv").read_text().index("two\nlines") > 64 * 1024
  (tmp_path / "corrupt").mkdir()
  (tmp_path / "corrupt" / "train.csv.gz").write_bytes(data[:20] + bytes(len(data) - 20))
  return [
      ("bad_value_in_sample", [f"--train_data={tmp_path}/deep/*.csv.gz", "--label=species"], {},
       rf"^error: column 'petal width \(cm\)' holds numbers in 149 of 150 sampled records but 'wide' at "
       rf"{tmp_path}/deep/train.csv.gz line 142; fix or blank those values"),
      ("bad_value_deep", [f"--train_data={tmp_path}/deep/*.csv.gz", "--label=species", "--shuffle_buffer=0",
                          "--global_batch_size=16", "--infer_sample_rows=100"], {},
       rf"^error: --train_data: {tmp_path}/deep/train.csv.gz line 142: column 'petal width \(cm\)' holds 'wide', "
       r"but the schema says float$"),
      ("line_break_past_the_head", [f"--train_data={tmp_path}/late_break/*.csv", "--label=species",
                                    "--shuffle_buffer=0"], {},
       r"^error: --train_data: a quoted CSV field holds a line break beyond the first 64 KiB of the "
       r"first file, .*: pass --csv_multiline to read them with CsvDataset"),
      ("label_not_a_column", [f"--train_data={good}/*.csv.gz", "--label=Species"], {},
       r"^error: --label='Species' is not a column of .*train.csv.gz \(columns: sepal length \(cm\), "),
      ("no_schema_no_label", [f"--train_data={good}/*.csv.gz"], {},
       rf"^error: no schema: {good}/schema.json does not exist; pass --label=COLUMN to infer one"),
      ("mixed_compressions", [f"--train_data={tmp_path}/mixed/*", "--label=species"], {},
       r"^error: --train_data: the pattern mixes compressions: uncompressed \(.*a.csv\) and gzip \(.*b.csv\)"),
      ("corrupt_gzip", [f"--train_data={tmp_path}/corrupt/*", "--label=species"], {},
       r"^error: --train_data: .*corrupt/train.csv.gz is not valid gzip data"),
      # A BigQuery dataset with neither credentials nor an emulator (tests/test_bigquery.py reads tables).
      ("bigquery_without_credentials", ["--label=species"], {"AIP_DATA_FORMAT": "bigquery",
                                                             "AIP_TRAINING_DATA_URI": "bq://proj.dataset.table",
                                                             "BIGQUERY_STORAGE_EMULATOR_HOST": ""},
       r"^error: --train_data: no Google credentials to read BigQuery with \(.*\); on Vertex the job's service "
       r"account is used"),
      ("unknown_vertex_format", [f"--train_data={good}/*.csv.gz", "--label=species"], {"AIP_DATA_FORMAT": "parquet"},
       r"^error: AIP_DATA_FORMAT='parquet'; expected one of bigquery, csv, jsonl, tf-record"),
      ("label_mismatch", [f"--train_data={good}/*.csv.gz", "--label=species",
                          f"--schema={tmp_path}/schema.json"], {},
       r"^error: --label='species' but the schema .*schema.json names the label 'y'"),
  ]


def test_bad_data_is_one_line_exit_2_nothing_written(tmp_path, capfd):
  (tmp_path / "schema.json").write_text(json.dumps({"features": [{"name": "petal width (cm)", "type": "float"}],
                                                    "label": {"name": "y", "type": "float"}}))
  problems = []
  for name, args, env, message in _bad_inputs(tmp_path):
    out = tmp_path / f"out-{name}"
    code, stderr = _run_in_process([*args, f"--output_dir={out}", "--train_steps=50"],
                                   {"AIP_DATA_FORMAT": "", "AIP_TRAINING_DATA_URI": "", **env}, capfd)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    import re  # pylint: disable=g-import-not-at-top

    if code != 2 or len(errors) != 1 or not re.search(message, errors[0]) or "Traceback" in stderr:
      problems.append(f"{name}: exit {code}, {errors or stderr[-1500:]}")
    elif out.exists() and any(p.is_file() for p in out.rglob("*")):
      problems.append(f"{name}: left {sorted(str(p) for p in out.rglob('*') if p.is_file())}")
  assert not problems, "\n".join(problems)


def test_schema_inference_command_writes_a_schema_the_trainer_reads(tmp_path):
  frame = iris_frame()
  frame.to_json(tmp_path / "train.jsonl", orient="records", lines=True)
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  result = subprocess.run([sys.executable, "-m", "trainer.schema_inference", f"--data={tmp_path}/*.jsonl",
                           "--label=species"], capture_output=True, text=True, timeout=120, env=procs.trainer_env(),
                          cwd=procs.REPO, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"wrote {tmp_path}/schema.json" in result.stderr
  schema = schema_lib.load_schema(str(tmp_path / "schema.json"))
  assert json.loads(result.stdout) == schema.to_dict()
  assert [f.name for f in schema.features] == [c for c in frame.columns if c != "species"]
  bad = subprocess.run([sys.executable, "-m", "trainer.schema_inference", f"--data={tmp_path}/*.jsonl",
                        "--label=petals"], capture_output=True, text=True, timeout=120, env=procs.trainer_env(),
                       cwd=procs.REPO, check=False)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
      "error: --label='petals' is not a column of"), bad.stderr[-1000:]
