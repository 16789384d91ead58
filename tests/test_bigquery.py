"""BigQuery tables (`bq://`) through the real Storage Read client, against `scripts.bigquery_emulator` (a gRPC
`BigQueryRead` built from the client library's own protos), serving scikit-learn's breast cancer data: as a Vertex
managed dataset (`AIP_DATA_FORMAT=bigquery`, one table per split) under two replicas, and as one table a pandas
Parquet file filled, split by row filters under `fit` with --epochs; trained to a logistic regression baseline,
served through TF Serving's loader. What the trainer asked of BigQuery is read back from the requests the emulator
received (column selection, the filter, streams). Bad tables are one error line each, nothing written."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import procs
import test_data
import test_parquet
from scripts import bigquery_emulator
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import input_pipeline
from trainer.data import schema as schema_lib

NULL_ROW = 420  # a null label past --preflight_records=300


@pytest.fixture(scope="module")
def bigquery(tmp_path_factory):
  """The emulator serving the cancer tables from Parquet files, in its own process (in this one, a garbage collection
  on its server thread can run a finished pipeline's TensorFlow iterator destructor, which waits on a read that
  needs that thread), its environment set here (in-process trainer runs read it); and the baseline's accuracy on
  the same split."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
  from sklearn.pipeline import make_pipeline  # pylint: disable=g-import-not-at-top
  from sklearn.preprocessing import StandardScaler  # pylint: disable=g-import-not-at-top

  data = datasets.load_breast_cancer(as_frame=True)
  frame = data.frame.copy()
  frame["diagnosis"] = np.asarray(data.target_names)[frame.pop("target")]
  frame = frame.sample(frac=1, random_state=0).reset_index(drop=True)
  train, evaluation = frame.iloc[:450], frame.iloc[450:]
  features = [c for c in frame.columns if c != "diagnosis"]
  baseline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(train[features],
                                                                                     train["diagnosis"])
  accuracy = float(np.mean(baseline.predict(evaluation[features]) == evaluation["diagnosis"]))
  root = tmp_path_factory.mktemp("bq")
  # One table holding every split, as a pandas Parquet file loaded into BigQuery would: a split column and a
  # free-text note, which only the filter and the column selection keep out of training.
  frame.assign(split=np.where(np.arange(len(frame)) < 450, "TRAIN", "EVAL"),
               note=[f"patient {i}" for i in range(len(frame))]).to_parquet(root / "all.parquet", index=False)
  nulls = frame.copy()
  nulls.loc[NULL_ROW - 1, "diagnosis"] = None
  for name, table in (("train", train), ("eval", evaluation), ("nulls", nulls)):
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), root / f"{name}.parquet")
  log = root / "requests.jsonl"
  proc = subprocess.Popen(
      [sys.executable, "-m", "scripts.bigquery_emulator", f"--request_log={log}",
       *(f"--table=proj.cancer.{name}={root / name}.parquet" for name in ("train", "eval", "all", "nulls"))],
      stdout=subprocess.PIPE, text=True, cwd=procs.REPO)
  saved = os.environ.get(bigquery_emulator.EMULATOR_HOST)
  try:
    line = proc.stdout.readline().strip()
    assert line.startswith(f"export {bigquery_emulator.EMULATOR_HOST}="), line
    os.environ[bigquery_emulator.EMULATOR_HOST] = line.split("=", 1)[1]
    env = {bigquery_emulator.EMULATOR_HOST: os.environ[bigquery_emulator.EMULATOR_HOST]}
    formats.configure(env)  # for the input pipelines tests build in this process
    yield {"requests": log, "eval": evaluation, "baseline": accuracy, "features": features, "env": env}
  finally:
    # Input pipelines the runs left behind are collected while the tables are still served: a repeating one's
    # next read session, begun ahead, would otherwise retry against a stopped server for the client's deadline
    # (600 s) when a later collection destroys it.
    gc.collect()
    proc.terminate()
    proc.wait(timeout=30)
    if saved is None:
      os.environ.pop(bigquery_emulator.EMULATOR_HOST, None)
    else:
      os.environ[bigquery_emulator.EMULATOR_HOST] = saved


def _requests(bigquery) -> list[dict]:
  if not os.path.exists(bigquery["requests"]):
    return []
  with open(bigquery["requests"], encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _sessions(requests: list[dict]) -> list[dict]:
  return [r["request"] for r in requests if r["method"] == "CreateReadSession"]


def test_a_vertex_managed_dataset_in_bigquery_on_two_replicas(bigquery, tmp_path):
  since = len(_requests(bigquery))
  out = tmp_path / "out"
  result = procs.run_trainer_here(
      ["--label=diagnosis", f"--output_dir={out}", "--train_steps=300", "--global_batch_size=32",
       "--num_cpu_devices=2"],
      env={**bigquery["env"], "AIP_DATA_FORMAT": "bigquery", "AIP_TRAINING_DATA_URI": "bq://proj.cancer.train",
           "AIP_VALIDATION_DATA_URI": "bq://proj.cancer.eval"})
  assert result.returncode == 0, result.stderr[-3000:]
  assert "--train_data: 1 table(s) of BigQuery table" in result.stderr
  metrics = test_parquet.assert_trained_and_serves(out / "model", bigquery)
  assert metrics["num_replicas"] == 2
  requests = _requests(bigquery)[since:]
  sessions = _sessions(requests)
  assert {s["read_session"]["table"] for s in sessions} == {"projects/proj/datasets/cancer/tables/train",
                                                            "projects/proj/datasets/cancer/tables/eval"}
  assert all(s["parent"] == "projects/proj" and s["read_session"]["data_format"] == "ARROW" for s in sessions)
  # Training asks for several streams and reads them at once; the emulator splits 450 rows into 4.
  assert any(s["max_stream_count"] > 1 and s["read_session"]["table"].endswith("/train") for s in sessions)
  reads = {r["request"]["read_stream"] for r in requests if r["method"] == "ReadRows"}
  assert len({name.rsplit("/", 1)[-1] for name in reads}) > 1


def test_one_table_split_by_row_filters_under_fit_with_epochs(bigquery, tmp_path, capsys):
  """The schema written by `python -m trainer.schema_inference` from the filtered table: the split column, constant
  under the filter, and the note, an id, are left out. The sessions read only the schema's columns, filtered by
  BigQuery."""
  from trainer import schema_inference  # pylint: disable=g-import-not-at-top

  train = "bq://proj.cancer.all?where=split = 'TRAIN'"
  schema_path = tmp_path / "schema.json"
  assert schema_inference.main([f"--data={train}", "--label=diagnosis", f"--output={schema_path}"]) == 0
  schema = json.loads(schema_path.read_text())
  assert not {"split", "note"} & {f["name"] for f in schema["features"]}
  assert "'split' left out: it is constant in the sample ('TRAIN')" in capsys.readouterr().err
  capsys.readouterr()
  since = len(_requests(bigquery))
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={train}", "--eval_data=bq://proj.cancer.all?where=split='EVAL'",
                                   f"--schema={schema_path}", f"--output_dir={out}", "--loop=fit", "--epochs=20",
                                   "--global_batch_size=32"], env=bigquery["env"])
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = test_parquet.assert_trained_and_serves(out / "model", bigquery)
  assert metrics["final_step"] == 450 * 20 // 32  # the filter's 450 rows counted for --epochs (whole batches)
  sessions = _sessions(_requests(bigquery)[since:])
  filters = [s["read_session"]["read_options"]["row_restriction"] for s in sessions]
  assert "split = 'TRAIN'" in filters and "split='EVAL'" in filters and len(set(filters)) == 2
  wanted = {f["name"] for f in schema["features"]} | {"diagnosis"}
  selected = [set(s["read_session"]["read_options"]["selected_fields"]) for s in sessions]
  assert wanted in selected  # the input pipeline's sessions: the schema's columns only
  # 20 passes over the training rows, one read session: the small table is replayed from memory after the first.
  assert [f for f, fields in zip(filters, selected) if fields == wanted].count("split = 'TRAIN'") == 1
  assert all(not fields or fields <= wanted for fields in selected)  # never the split or note column


@pytest.mark.quick
def test_a_table_is_sharded_alike_across_input_pipelines(bigquery):
  """Two input pipelines of a multi-worker job on one table: disjoint rows that together are the table."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  files = ["bq://proj.cancer.train"]
  source = formats.source_for(files, flag="--train_data")
  schema = schema_lib.parse_schema({
      "features": [{"name": name, "type": "float"} for name in bigquery["features"]],
      "label": {"name": "diagnosis", "type": "string", "vocabulary": ["benign", "malignant"]}}, source="test")
  whole = test_data._fingerprints(input_pipeline.make_dataset_fn(  # pylint: disable=protected-access
      files, schema, source=source, global_batch_size=7, training=False, repeat=False)(None))
  parts = []
  for pipeline in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
    parts.append(test_data._fingerprints(input_pipeline.make_dataset_fn(  # pylint: disable=protected-access
        files, schema, source=source, global_batch_size=14, training=False, repeat=False)(context)))
  assert parts[0] and parts[1]
  assert sorted(parts[0] + parts[1]) == sorted(whole) and len(set(whole)) == len(whole) == 450


@pytest.mark.quick
@pytest.mark.parametrize("case,args,expected", [
    ("no such table", ["--train_data=bq://proj.cancer.missing", "--label=diagnosis"],
     r"^error: --train_data: bq://proj\.cancer\.missing: Not found: Table proj:cancer\.missing was not found"),
    ("a bad filter", ["--train_data=bq://proj.cancer.all?where=split = ", "--label=diagnosis"],
     r"^error: --train_data: bq://proj\.cancer\.all\?where=split =: request failed: row restriction"),
    ("not a table name", ["--train_data=bq://proj.cancer", "--label=diagnosis"],
     r"^error: --train_data='bq://proj\.cancer': expected a BigQuery table as bq://PROJECT\.DATASET\.TABLE"),
    ("no label to infer with", ["--train_data=bq://proj.cancer.train"],
     r"^error: no schema: a table \(bq://proj\.cancer\.train\) has no schema\.json beside it; pass --label"),
    ("a label the table lacks", ["--train_data=bq://proj.cancer.train", "--label=outcome"],
     r"^error: --label='outcome' is not a column of bq://proj\.cancer\.train"),
    ("a null label deep in the table", ["--train_data=bq://proj.cancer.nulls", "--label=diagnosis",
                                        "--preflight_records=300", "--infer_sample_rows=300"],
     rf"^error: --train_data: bq://proj\.cancer\.nulls row {NULL_ROW}: .*'diagnosis'"),
])
def test_a_bad_table_is_one_line_and_nothing_written(bigquery, tmp_path, case, args, expected):
  del case
  out = tmp_path / "out"
  result = procs.run_trainer_here([*args, f"--output_dir={out}", "--train_steps=5"], env=bigquery["env"])
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
  assert errors[0] == result.stderr.strip().splitlines()[-1]
  assert re.search(expected, errors[0]), errors[0]
  assert not (out / "model").exists() and not (out / "checkpoints").exists()


@pytest.mark.quick
def test_parameter_servers_refuse_a_table_in_one_line():
  with pytest.raises(UserError, match=r"^a BigQuery table cannot be read under ParameterServerStrategy: .*bq extract"):
    formats.check_strategy({"train": formats.Source("bigquery")}, parameter_server=True)


@pytest.mark.quick
def test_the_emulator_variable_as_users_write_it(bigquery, tmp_path, monkeypatch):
  """host:port as the emulator prints it, or a URL as STORAGE_EMULATOR_HOST is written; a port nobody answers on
  or a value that is no address is one line naming the variable, at once (not after the client's 600 s of retries)."""
  from trainer import schema_inference  # pylint: disable=g-import-not-at-top

  host = bigquery["env"][bigquery_emulator.EMULATOR_HOST]
  monkeypatch.setenv(bigquery_emulator.EMULATOR_HOST, f"http://{host}/")
  assert schema_inference.main(["--data=bq://proj.cancer.eval", "--label=diagnosis",
                                f"--output={tmp_path / 'schema.json'}"]) == 0
  for value, expected in ((f"127.0.0.1:{procs.free_ports(1)[0]}", r"no BigQuery Storage Read API answers there"),
                          ("localhost", r"expected HOST:PORT")):
    out = tmp_path / "out"
    result = procs.run_trainer_here(["--train_data=bq://proj.cancer.train", "--label=diagnosis",
                                     f"--output_dir={out}"], env={bigquery_emulator.EMULATOR_HOST: value})
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f"error: {bigquery_emulator.EMULATOR_HOST}=") and re.search(expected, errors[0])
    assert not out.exists()


@pytest.mark.quick
def test_the_emulator_refuses_a_taken_port_and_a_table_named_twice(tmp_path, capsys):
  (tmp_path / "t.csv").write_text("x,y\n1,a\n")
  table = f"--table=p.d.t={tmp_path / 't.csv'}"
  holder = bigquery_emulator.BigQueryReadEmulator({})
  try:
    assert bigquery_emulator.main([table, f"--port={holder.port}"]) == 2
  finally:
    holder.stop()
  assert re.fullmatch(rf"(# .*\n)?error: --port={holder.port}: cannot listen there \(.*\); pick a free port, or 0\n",
                      capsys.readouterr().err)
  assert bigquery_emulator.main([table, table]) == 2
  assert capsys.readouterr().err == "error: --table=p.d.t=...: that table is named twice; give each table one file\n"
