"""Exports made on the pinned TF, served by TF 2.15's session loader: the TF of Vertex's newest prebuilt TF
prediction image (tf2-cpu.2-15), which `--serving_image=prebuilt` registers. Every kind of export the trainer
makes that a user may serve there: the built-in model (custom loop), `fit` under mixed bfloat16 with XLA, a string
label inferred from a CSV as pandas writes it, PNG images in JSONL, a plug-in with its own StringLookup. Each
answers the same requests alike on both TFs.

.venv-tf215 (requirements-tf215.txt) is made by scripts/test.sh before the suite runs; a full run requires it
(REQUIRE_TF215=1), a partial one skips without it."""

import json
import os
import subprocess

import numpy as np
import pytest

import procs
import serving_checks
from scripts.public_data import digits_rows
from scripts.public_data import iris_frame
from scripts.public_data import write_jsonl
from serving import predict

TF215 = os.path.join(procs.REPO, ".venv-tf215", "bin", "python")

# Run by TF 2.15: each (model dir, request) through serving/predict.py's session loader, the answers as JSON.
SERVE_ALL = """
import json, sys
from serving import predict
cases = json.load(sys.stdin)
out = []
for model_dir, body in cases:
  model = predict.load(model_dir)
  out.append(predict.predict(model, body))
  model.close()
import tensorflow as tf
print(json.dumps({"tensorflow": tf.__version__, "responses": out}))
"""


def _train(args, out):
  result = procs.run_trainer_here([*args, f"--output_dir={out}", "--eval_steps=0"])  # in this process
  assert result.returncode == 0, result.stderr[-3000:]
  return str(out / "model")


@pytest.fixture(scope="module")
def exports(churn_data, tmp_path_factory):
  """(model dir, request) for each kind of export, made on the pinned TF."""
  root = tmp_path_factory.mktemp("tf215")
  churn = [f"--train_data={churn_data}/train/*.tfrecord", "--train_steps=60", "--global_batch_size=64"]
  rows = serving_checks.instances_from_records  # eval examples as Vertex instances, from the export's own schema
  made = []
  model = _train(churn, root / "custom")
  made.append((model, {"instances": rows(model, f"{churn_data}/eval/*.tfrecord", 20)}))
  model = _train([*churn, "--loop=fit", "--precision=mixed_bfloat16", "--jit_compile"], root / "fit_bf16_xla")
  made.append((model, {"instances": rows(model, f"{churn_data}/eval/*.tfrecord", 20)}))
  model = _train([*churn, "--model=tutorial_models:raw_strings"], root / "string_lookup")
  made.append((model, {"instances": rows(model, f"{churn_data}/eval/*.tfrecord", 20)}))
  iris = iris_frame()
  iris.iloc[:120].to_csv(root / "iris.csv", index=False)
  model = _train([f"--train_data={root}/iris.csv", "--label=species", "--train_steps=60"], root / "iris")
  made.append((model, {"instances": json.loads(iris.iloc[120:140].drop(columns="species").to_json(orient="records"))}))
  write_jsonl(str(root / "digits.jsonl"), digits_rows(0, 400))
  model = _train([f"--train_data={root}/digits.jsonl", "--label=digit", "--train_steps=40"], root / "digits")
  made.append((model, {"instances": [{k: v for k, v in r.items() if k != "digit"} for r in digits_rows(400, 420)]}))
  return made


def test_every_kind_of_export_serves_alike_on_tf_215(exports):
  if not os.path.exists(TF215):
    if os.environ.get("REQUIRE_TF215") == "1":
      pytest.fail(f"{TF215} is missing; scripts/test.sh makes it (requirements-tf215.txt)")
    pytest.skip(".venv-tf215 is not made (scripts/test.sh makes it for a full run)")
  here = []
  for model_dir, body in exports:
    model = predict.load(model_dir)
    here.append(predict.predict(model, body))
    model.close()
  result = subprocess.run([TF215, "-c", SERVE_ALL], input=json.dumps(exports), cwd=procs.REPO,
                          env=procs.trainer_env(), capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  there = json.loads(result.stdout.strip().splitlines()[-1])
  assert there["tensorflow"] == "2.15.1"
  names = ["custom", "fit_bf16_xla", "string_lookup", "iris", "digits"]
  for name, mine, theirs in zip(names, here, there["responses"]):
    assert len(mine["predictions"]) == len(theirs["predictions"]) == 20, name
    for a, b in zip(mine["predictions"], theirs["predictions"]):
      assert a.keys() == b.keys(), name
      np.testing.assert_allclose(a["probabilities"], b["probabilities"], rtol=1e-4, atol=1e-5, err_msg=name)
      assert a["class_id"] == b["class_id"] and a.get("class_name") == b.get("class_name"), name
