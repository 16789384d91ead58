"""Parquet as other tools write it: pandas' `to_parquet` file and a Spark-style export folder (`part-*.snappy.parquet`,
`_SUCCESS`, `.crc` files) written by pyarrow, of scikit-learn's breast cancer data; read from the emulated bucket and
from disk, under the default strategy and two replicas (MirroredStrategy), trained to a logistic regression
baseline on the same split, served through TF Serving's loader; bad Parquet is one error line."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pandas as pd
import pytest

import procs
import serving_checks
from scripts import stage_data
from trainer.data import schema as schema_lib

TIMEOUT = 240
MARGIN = 0.04  # under the baseline's accuracy (measured: 0.965 and 0.958 against 0.958)


@pytest.fixture(scope="module")
def cancer(tmp_path_factory):
  """Breast cancer as pandas and pyarrow write it, and the baseline's accuracy on the same split."""
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
  root = tmp_path_factory.mktemp("cancer")
  evaluation.to_parquet(root / "eval.parquet")  # pandas (pyarrow engine), with its index metadata
  export = root / "export"
  export.mkdir()
  table = pa.Table.from_pandas(train, preserve_index=False)
  for i in range(3):  # as Spark writes a DataFrame: part files, a _SUCCESS marker, hidden .crc checksums
    name = f"part-{i:05d}-8c1f2d4e-c000.snappy.parquet"
    pq.write_table(table.slice(i * 150, 150), export / name, compression="snappy")
    (export / f".{name}.crc").write_bytes(b"crc\0")
  (export / "_SUCCESS").write_bytes(b"")
  features = [c for c in frame.columns if c != "diagnosis"]
  baseline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(train[features],
                                                                                     train["diagnosis"])
  accuracy = float(np.mean(baseline.predict(evaluation[features]) == evaluation["diagnosis"]))
  return {"root": root, "eval": evaluation, "baseline": accuracy, "features": features}


def assert_trained_and_serves(model_dir, cancer) -> dict:
  """The export's eval metrics reach the baseline on the cancer eval rows, and it serves them alike through TF
  Serving's loader (test_bigquery's tables hold the same rows); returns the metrics."""
  with open(os.path.join(model_dir, "eval_metrics.json")) as f:
    metrics = json.load(f)
  assert metrics["eval_examples"] == len(cancer["eval"])
  assert metrics["eval_accuracy"] >= cancer["baseline"] - MARGIN, (metrics, cancer["baseline"])
  rows = cancer["eval"].iloc[:50]
  instances = [{schema_lib.safe_name(k): float(row[k]) for k in cancer["features"]} for _, row in rows.iterrows()]
  predictions = serving_checks.serve_instances(str(model_dir), instances)
  assert np.mean([p["class_name"] == y for p, y in zip(predictions, rows["diagnosis"])]) >= cancer["baseline"] - 0.1
  return metrics


def test_a_spark_export_folder_on_the_bucket(cancer, gcs, tmp_path):
  base = "gs://test-bucket/parquet-cancer"
  stage_data.upload_tree(str(cancer["root"]), base)
  out = "gs://test-bucket/runs/parquet"
  result = procs.run_trainer_here([f"--train_data={base}/export/", f"--eval_data={base}/eval.parquet",
                                   "--label=diagnosis", f"--output_dir={out}", "--train_steps=400",
                                   "--global_batch_size=32"], env=gcs.env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "--train_data: 3 file(s) of Parquet" in result.stderr  # _SUCCESS and the .crc files are not data
  local = tmp_path / "model"
  serving_dir = serving_checks.copy_tree(f"{out}/model", local)
  assert_trained_and_serves(serving_dir, cancer)


def test_parquet_on_two_replicas_with_a_test_split(cancer, tmp_path):
  """Parquet under MirroredStrategy (two replicas, in this process). How each format's reader is sharded across a
  multi-worker job's pipelines is test_data's (`InputContext`); the real multi-process runs are one per behaviour
  (test_multiworker, test_gcs, test_your_data), not one per format."""
  root = cancer["root"]
  out = tmp_path / "out"
  result = procs.run_trainer_here([f"--train_data={root}/export", f"--eval_data={root}/eval.parquet",
                                   "--label=diagnosis", f"--output_dir={out}", "--train_steps=300",
                                   "--global_batch_size=32", "--checkpoint_every_steps=300",
                                   f"--test_data={root}/eval.parquet", "--num_cpu_devices=2"])
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  # The test split (here the eval file again) is one exact pass across the replicas, like evaluation.
  assert metrics["num_replicas"] == 2 and metrics["test_examples"] == len(cancer["eval"])
  assert metrics["test_accuracy"] == pytest.approx(metrics["eval_accuracy"])
  assert_trained_and_serves(out / "model", cancer)


def _errors(result) -> list[str]:
  return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_parquet_under_parameter_servers_is_refused_in_one_line(cancer, tmp_path):
  chief, worker, ps = procs.addresses(3)
  cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
  out = tmp_path / "out"
  result = procs.run_trainer([f"--train_data={cancer['root']}/export/", "--label=diagnosis", f"--output_dir={out}"],
                             env={"TF_CONFIG": procs.tf_config(cluster, "chief", 0)}, timeout=TIMEOUT)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = _errors(result)
  assert len(errors) == 1 and errors[0].startswith(
      "error: Parquet cannot be read under ParameterServerStrategy") and "pd.read_parquet(path).to_csv" in errors[0]
  assert not (out / "model").exists()


def test_bad_parquet_is_one_line_and_nothing_written(tmp_path):
  frame = pd.DataFrame({"amount": np.arange(300, dtype=float), "label": np.arange(300) % 2})
  stamped = frame.assign(when=pd.date_range("2026-01-01", periods=300, freq="h"))
  stamped.to_parquet(tmp_path / "stamped.parquet")
  nulls = frame.astype({"amount": object})
  nulls.loc[250, "amount"] = None
  (tmp_path / "nulls").mkdir()
  nulls.astype({"amount": float}).to_parquet(tmp_path / "nulls" / "train.parquet")
  (tmp_path / "nulls" / "schema.json").write_text(json.dumps({
      "features": [{"name": "amount", "type": "float"}], "label": {"name": "label", "type": "int", "num_classes": 2}}))
  (tmp_path / "typed").mkdir()
  frame.assign(amount=frame["amount"].astype(str) + " EUR").to_parquet(tmp_path / "typed" / "train.parquet")
  (tmp_path / "typed" / "schema.json").write_text((tmp_path / "nulls" / "schema.json").read_text())
  cases = [
      ([f"--train_data={tmp_path}/stamped.parquet", "--label=label"],
       rf"^error: --train_data: {tmp_path}/stamped.parquet: column 'when' is Parquet type timestamp\[.*\], which no "
       r"schema type holds .*cast it to a number or string"),
      ([f"--train_data={tmp_path}/typed/train.parquet"],
       rf"^error: --train_data: {tmp_path}/typed/train.parquet: column 'amount' is Parquet type (large_)?string, which "
       r"cannot hold the schema's float; expected numbers"),
      ([f"--train_data={tmp_path}/nulls/train.parquet", "--shuffle_buffer=0", "--global_batch_size=10"],
       rf"^error: --train_data: {tmp_path}/nulls/train.parquet row 251: column 'amount' is empty and the schema "
       r"gives it no default$"),
  ]
  for args, pattern in cases:
    out = tmp_path / "out"
    result = procs.run_trainer_here([*args, f"--output_dir={out}", "--train_steps=40"])
    assert result.returncode == 2, (args, result.stderr[-3000:])
    errors = _errors(result)
    assert len(errors) == 1 and re.match(pattern, errors[0]), (pattern, result.stderr[-3000:])
    assert not (out / "model").exists()


def test_a_later_file_written_with_other_types_is_named_before_training(tmp_path, capsys):
  """A Spark-style folder whose second part was written with `amount` as text: the files' footers are compared in
  pre-flight (no data read), so the run stops naming both files, with a schema given or inferred (where the column
  would otherwise be sampled as mixed and dropped), in the training split or in the eval split."""
  frame = pd.DataFrame({"amount": np.arange(300, dtype=float), "n": np.arange(300) * 2.0,
                        "label": np.arange(300) % 2})
  for folder in ("parts", "good"):
    (tmp_path / folder).mkdir()
    frame.iloc[:150].to_parquet(tmp_path / folder / "part-00000.parquet")
  later = frame.iloc[150:].assign(amount=frame["amount"].iloc[150:].astype(str))
  later.to_parquet(tmp_path / "parts" / "part-00001.parquet")
  frame.iloc[150:].to_parquet(tmp_path / "good" / "part-00001.parquet")
  schema = tmp_path / "schema.json"
  schema.write_text(json.dumps({"features": [{"name": "amount", "type": "float"}, {"name": "n", "type": "float"}],
                                "label": {"name": "label", "type": "int", "num_classes": 2}}))
  common = ["--label=label", f"--output_dir={tmp_path}/out", "--train_steps=4", "--global_batch_size=10"]
  for flag, args in [("--train_data", [f"--train_data={tmp_path}/parts/*.parquet", f"--schema={schema}"]),
                     ("--train_data", [f"--train_data={tmp_path}/parts/*.parquet"]),
                     ("--eval_data", [f"--train_data={tmp_path}/good/*.parquet",
                                      f"--eval_data={tmp_path}/parts/*.parquet"])]:
    code = procs.run_trainer_in_process(args + common)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, (args, errors)
    assert re.fullmatch(
        rf"error: {flag}: column 'amount' is Parquet type double in {tmp_path}/parts/part-00000\.parquet but "
        rf"(large_)?string in {tmp_path}/parts/part-00001\.parquet; the files of a split must agree: write them with "
        r"one schema \(pandas: cast the column before to_parquet\)", errors[0]), errors
    assert not (tmp_path / "out" / "model").exists()
