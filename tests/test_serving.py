"""The export as serving stacks load it: TF Serving's session loader, `saved_model_cli run`, and the
Vertex-shaped prediction command (`python -m serving.predict`), good requests and bad ones."""

import io
import json
import os
import re
import subprocess
import sys

import pytest

import procs
import serving_checks
from serving import predict


@pytest.fixture(scope="module")
def churn_export(churn_data, tmp_path_factory):
  out = tmp_path_factory.mktemp("export")
  result = procs.run_trainer_here([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={out}",
                                   "--train_steps=150", "--global_batch_size=128", "--eval_steps=0"])
  assert result.returncode == 0, result.stderr[-3000:]
  return out / "model"


def _predict(monkeypatch, capsys, args, body=None):
  """`python -m serving.predict ARGS` in this process (its `main`): exit code, stdout, stderr."""
  if body is not None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(body))
  code = predict.main(args)
  out, err = capsys.readouterr()
  return code, out, err


LOYAL = {"tenure_months": 60, "monthly_charges": 50.0, "support_calls": 0, "plan": "pro", "region": "east"}
AT_RISK = {"tenure_months": 1.0, "monthly_charges": 120.0, "support_calls": 6, "plan": {"b64": "YmFzaWM="},
           "region": "south"}  # "basic", as a client sends binary strings


@pytest.mark.smoke
def test_predict_command_answers_rows_and_columns_like_vertex(churn_export, tmp_path, monkeypatch, capsys):
  request = tmp_path / "request.json"
  request.write_text(json.dumps({"instances": [LOYAL, AT_RISK]}))
  code, out, err = _predict(monkeypatch, capsys, [f"--model_dir={churn_export}", f"--request={request}"])
  assert code == 0, err[-2000:]
  response = json.loads(out)
  assert [p["class_id"] for p in response["predictions"]] == [0, 1]
  for p in response["predictions"]:
    assert sorted(p) == ["class_id", "probabilities"] and abs(sum(p["probabilities"]) - 1) < 1e-5
  columns = {name: [LOYAL[name], "basic" if name == "plan" else AT_RISK[name]] for name in LOYAL}
  code, out, err = _predict(monkeypatch, capsys, [f"--model_dir={churn_export}"], json.dumps({"inputs": columns}))
  assert code == 0, err[-2000:]
  outputs = json.loads(out)["outputs"]
  assert outputs["class_id"] == [0, 1]
  assert outputs["probabilities"] == [p["probabilities"] for p in response["predictions"]]
  # Fields the model does not take (an id, a name) are ignored, and named once on standard error.
  rows = [{"customer_id": "C-1", **LOYAL}, {"customer_id": "C-2", "name": "Ada", **AT_RISK}]
  code, out, err = _predict(monkeypatch, capsys, [f"--model_dir={churn_export}"], json.dumps({"instances": rows}))
  assert code == 0 and json.loads(out) == response, err[-2000:]
  assert "note: ignored 'customer_id', 'name': not inputs of the model" in err


def test_predict_schemata_describe_what_the_signature_takes_and_returns(churn_export, tmp_path, monkeypatch, capsys):
  """Model Registry's schemata (OpenAPI 3.0), checked with an OpenAPI validator against the signature's own
  inputs, a client's instances and the served predictions."""
  from openapi_schema_validator import OAS30Validator  # pylint: disable=g-import-not-at-top
  import yaml  # pylint: disable=g-import-not-at-top

  instance_schema = yaml.safe_load((churn_export / "instance_schema.yaml").read_text())
  prediction_schema = yaml.safe_load((churn_export / "prediction_schema.yaml").read_text())
  OAS30Validator.check_schema(instance_schema)
  OAS30Validator.check_schema(prediction_schema)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  signature = tf.saved_model.load(str(churn_export)).signatures["serving_default"]
  assert sorted(instance_schema["properties"]) == sorted(signature.structured_input_signature[1])
  OAS30Validator(instance_schema).validate(LOYAL)
  errors = list(OAS30Validator(instance_schema).iter_errors({**LOYAL, "tenure_months": "long"}))
  assert errors and "'long' is not of type 'number'" in errors[0].message
  request = tmp_path / "request.json"
  request.write_text(json.dumps({"instances": [LOYAL, {**AT_RISK, "plan": "basic"}]}))
  code, out, err = _predict(monkeypatch, capsys, [f"--model_dir={churn_export}", f"--request={request}"])
  assert code == 0, err[-2000:]
  for prediction in json.loads(out)["predictions"]:
    OAS30Validator(prediction_schema).validate(prediction)
  assert prediction_schema["properties"]["probabilities"]["maxItems"] == 2


def _other_stack() -> str | None:
  """The other venv's Python: the prebuilt-image stack (.venv-tf217) from the pinned one (.venv), and back."""
  here = os.path.basename(os.path.abspath(sys.prefix))
  other = os.path.join(procs.REPO, ".venv" if here == ".venv-tf217" else ".venv-tf217", "bin", "python")
  return other if os.path.exists(other) else None


@pytest.mark.smoke
def test_an_export_from_the_other_tf_stack_serves_here(churn_data, tmp_path):
  """Trained and exported on one TF (2.21 pinned, or 2.17 as on Vertex's prebuilt image), served by the other's
  session loader: a model trained in the container serves on an older TF Serving, and one trained on the
  prebuilt image on a newer one."""
  other = _other_stack()
  if other is None:
    pytest.skip("the other venv is not made yet (scripts/test.sh makes .venv-tf217 after the main run)")
  result = subprocess.run([other, "-m", "trainer.task", f"--train_data={churn_data}/train/*.tfrecord",
                           f"--output_dir={tmp_path}", "--train_steps=100", "--eval_steps=0"], cwd=procs.REPO,
                          env=procs.trainer_env(), capture_output=True, text=True, timeout=240, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  exported_on = json.loads((tmp_path / "model" / "eval_metrics.json").read_text())["tensorflow_version"]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert exported_on != tf.__version__
  response = serving_checks.assert_loaders_agree(str(tmp_path / "model"), f"{churn_data}/eval/*.tfrecord")
  assert len(response["predictions"]) == 50


def test_saved_model_cli_runs_the_signature(churn_export):
  """The other session-based loader users reach for first."""
  exprs = ('tenure_months=[60.0,1.0];monthly_charges=[50.0,120.0];support_calls=[0.0,6.0];'
           'plan=["pro","basic"];region=["east","south"]')
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")  # installed with tensorflow
  result = subprocess.run([cli, "run", "--dir", str(churn_export), "--tag_set", "serve", "--signature_def",
                           "serving_default", "--input_exprs", exprs], env=procs.trainer_env(), capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert re.search(r"Result for output key class_id:\s*\[0 1\]", result.stdout), result.stdout


@pytest.mark.smoke
def test_session_loader_agrees_with_the_tf2_loader(churn_export, churn_data):
  serving_checks.assert_loaders_agree(churn_export, f"{churn_data}/eval/*.tfrecord")


def _bad_requests():
  no_region = {k: v for k, v in LOYAL.items() if k != "region"}
  return [
      ("missing_feature", {"instances": [LOYAL, no_region]},
       r"^instance 1: feature 'region' is missing, and the schema it was trained with gives it no default \(the model takes: monthly_charges, plan, region, support_calls, "
       r"tenure_months\)$"),
      ("number_as_text", {"instances": [{**LOYAL, "tenure_months": "sixty"}]},
       r"^instance 0: feature 'tenure_months' must be a number \(float32\), got \"sixty\"$"),
      ("number_for_string", {"instances": [{**LOYAL, "plan": 3}]},
       r"^instance 0: feature 'plan' must be a string \(or \{\"b64\": \.\.\.\}\), got 3$"),
      ("bool_for_number", {"instances": [{**LOYAL, "support_calls": True}]},
       r"^instance 0: feature 'support_calls' must be a number"),
      ("list_for_scalar", {"instances": [{**LOYAL, "tenure_months": [1.0, 2.0]}]},
       r"^instance 0: feature 'tenure_months' has shape \[2\]; the model takes \[\]$"),
      ("misspelled_feature", {"instances": [LOYAL, {**no_region, "Regoin": "east"}]},
       r"^instance 1: 'Regoin' is not an input of the model; did you mean 'region', which this instance lacks\?"),
      ("bad_b64", {"instances": [{**LOYAL, "plan": {"b64": "@@"}}]},
       r"^instance 0: feature 'plan' has a 'b64' value that is not base64$"),
      ("row_not_object", {"instances": ["x"]}, r"^instance 0: expected an object of feature -> value"),
      ("row_a_short_list", {"instances": [[1, 2, 3]]}, r"^instance 0: a list of 3 values \(a CSV row, as Vertex "
                                                       r"sends one\); the model takes 5, in this order: tenure_months, "),
      ("empty", {"instances": []}, r"^'instances' must be a non-empty list of rows$"),
      ("both_forms", {"instances": [LOYAL], "inputs": {}}, r"^the request must be a JSON object with exactly one"),
      ("neither", {"rows": [LOYAL]}, r"^the request must be a JSON object with exactly one"),
      ("uneven_columns", {"inputs": {k: [v, v] if k != "plan" else [v] for k, v in LOYAL.items()}},
       r"^'inputs': every feature needs the same number of rows"),
  ]


def test_bad_requests_name_the_instance_and_feature(churn_export):
  model = predict.SessionModel(str(churn_export))
  try:
    for name, body, message in _bad_requests():
      with pytest.raises(predict.PredictError, match=message):
        predict.predict(model, body)
      assert name
  finally:
    model.close()


def test_predict_command_bad_input_is_one_line_and_exit_2(churn_export, tmp_path, monkeypatch, capsys):
  """The first case through `python -m serving.predict` itself (the process's exit code and streams), the others
  through its `main` in this process."""
  cases = [([f"--model_dir={churn_export}"], "{not json", r"^error: --request: not valid JSON"),
           ([f"--model_dir={tmp_path}/none"], json.dumps({"instances": [LOYAL]}),
            r"^error: --model_dir: cannot load a SavedModel from .*/none \(SavedModel file does not exist"),
           ([f"--model_dir={churn_export}"], json.dumps({"instances": [{"plan": "pro"}]}),
            r"^error: instance 0: feature 'monthly_charges' is missing")]
  for number, (args, body, message) in enumerate(cases):
    if number == 0:
      result = subprocess.run([sys.executable, "-m", "serving.predict", *args], input=body, cwd=procs.REPO,
                              env=procs.trainer_env(), capture_output=True, text=True, timeout=120, check=False)
      code, out, err = result.returncode, result.stdout, result.stderr
    else:
      code, out, err = _predict(monkeypatch, capsys, args, body)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and re.search(message, errors[0]), err[-1500:]
    assert "Traceback" not in err and not out
