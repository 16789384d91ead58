"""The local endpoint (python -m serving.serve) over real HTTP, as Vertex talks to a serving container: health,
predict with rows and columns, images as b64, training rows copied verbatim (nulls, the data's own column names,
the label, an id field), bad instances and bad image bytes, many concurrent clients, a gs:// model; and bad
starts."""

import base64
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys

import pytest

import procs
import serving_checks
from scripts.public_data import digits_rows
from scripts.public_data import write_jsonl
from serving import predict
from scripts import stage_data

INK = "ink level (a.u.)"  # a column name as a spreadsheet has it; the model's input is ink_level__a.u._


def _training_rows(start, stop):
  """Digits as a user's JSONL has them: PNG scans as {"b64": ...}, an ink column named with spaces and parentheses,
  a scanner category; some inks and scanners null (training fills them with the schema's default)."""
  rows = []
  for i, row in enumerate(digits_rows(start, stop)):
    row = {"image": row["image"], INK: row["ink"], "scanner": row["scanner"], "digit": row["digit"]}
    if i % 7 == 0:
      row[INK] = None
    if i % 11 == 0:
      row["scanner"] = None
    rows.append(row)
  return rows


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory):
  data = tmp_path_factory.mktemp("digits")
  write_jsonl(str(data / "train.jsonl"), _training_rows(0, 600))
  out = data / "out"
  result = procs.run_trainer_here([f"--train_data={data}/train.jsonl", "--label=digit", f"--output_dir={out}",
                                   "--train_steps=150", "--global_batch_size=64", "--eval_steps=0"])
  assert result.returncode == 0, result.stderr[-3000:]
  return out / "model"


@contextlib.contextmanager
def _serving(model_dir, *args, env=None):
  """`python -m serving.serve` on a free port; yields (port, routes); always stopped."""
  proc = subprocess.Popen([sys.executable, "-m", "serving.serve", f"--model_dir={model_dir}", "--port=0", *args],
                          cwd=procs.REPO, env=procs.trainer_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    line = proc.stdout.readline()  # the server's first line, once it listens (or nothing: it failed)
    assert line, proc.stderr.read()[-3000:]
    started = json.loads(line)
    yield int(started["listening"].rsplit(":", 1)[1]), started
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _call(port, method, path, body=None):
  connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
  try:
    connection.request(method, path, body=None if body is None else json.dumps(body),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"{}")
  finally:
    connection.close()


def _session_answers(model_dir, instances):
  model = predict.load(str(model_dir))
  try:
    return predict.predict(model, {"instances": instances})["predictions"]
  finally:
    model.close()


def test_the_endpoint_answers_as_vertex_does(digits_export):
  schema = json.load(open(digits_export / "schema.json"))
  ink = next(f for f in schema["features"] if f["name"] == INK)
  scanner = next(f for f in schema["features"] if f["name"] == "scanner")
  assert ink["default"] is not None and scanner["default"] is not None  # training filled the nulls
  verbatim = _training_rows(600, 630)  # as the training file has them: nulls, column names, the label
  assert any(r[INK] is None for r in verbatim) and any(r["scanner"] is None for r in verbatim)
  # What training read for those rows: input names, defaults for nulls, images as Vertex sends bytes.
  as_trained = [{"image": r["image"], "ink_level__a.u._": ink["default"] if r[INK] is None else r[INK],
                 "scanner": scanner["default"] if r["scanner"] is None else r["scanner"]} for r in verbatim]
  expected = _session_answers(digits_export, as_trained)
  with _serving(digits_export, env={"AIP_ENDPOINT_ID": "123", "AIP_DEPLOYED_MODEL_ID": "456"}) as (port, started):
    assert started["health"] == "/v1/endpoints/123/deployedModels/456"
    assert started["predict"] == "/v1/endpoints/123/deployedModels/456:predict"
    assert _call(port, "GET", started["health"]) == (200, {})
    status, response = _call(port, "POST", started["predict"], {"instances": verbatim, "parameters": {}})
    assert status == 200, response
    assert response["deployedModelId"] == "456"
    serving_checks.assert_same_predictions(response["predictions"], expected)
    # A row that leaves the ink out altogether gets the default too; the column form is TF Serving's.
    status, response = _call(port, "POST", started["predict"],
                              {"instances": [{k: v for k, v in verbatim[1].items() if k != INK}]})
    assert status == 200
    serving_checks.assert_same_predictions(response["predictions"], _session_answers(
        digits_export, [{**as_trained[1], "ink_level__a.u._": ink["default"]}]))
    # NaN, as Python's json writes a blank, is missing too; an infinite value is refused.
    status, response = _call(port, "POST", started["predict"], {"instances": [{**verbatim[1], INK: float("nan")}]})
    assert status == 200
    serving_checks.assert_same_predictions(response["predictions"], _session_answers(
        digits_export, [{**as_trained[1], "ink_level__a.u._": ink["default"]}]))
    status, response = _call(port, "POST", started["predict"], {"instances": [{**verbatim[1], INK: float("inf")}]})
    assert status == 400 and response["error"]["message"] == (
        "instance 0: feature 'ink_level__a.u._' (column 'ink level (a.u.)') is inf; expected a finite number")
    columns = {"image": [r["image"] for r in as_trained[:3]], INK: [r[INK] for r in verbatim[:3]],
               "scanner": [r["scanner"] for r in verbatim[:3]]}
    status, response = _call(port, "POST", started["predict"], {"inputs": columns})
    assert status == 200 and response["outputs"]["class_id"] == [p["class_id"] for p in expected[:3]]
    # A bad instance: 400, Google's error shape, the instance, the feature and what the model takes.
    status, response = _call(port, "POST", started["predict"],
                             {"instances": [verbatim[0], {**verbatim[1], "scanner": 3}]})
    assert status == 400 and response["error"]["status"] == "INVALID_ARGUMENT"
    assert re.match(r"^instance 1: feature 'scanner' must be a string", response["error"]["message"])
    # A field the model does not take (an id) is ignored, as the batch job ignores it; one that looks like a
    # misspelled input the instance lacks is refused rather than answered with that input's default.
    status, response = _call(port, "POST", started["predict"], {"instances": [{**verbatim[0], "id": "scan-0"}]})
    assert status == 200
    serving_checks.assert_same_predictions(response["predictions"], expected[:1])
    misspelled = {("scaner" if k == "scanner" else k): v for k, v in verbatim[2].items()}
    status, response = _call(port, "POST", started["predict"], {"instances": [verbatim[0], misspelled]})
    assert status == 400 and re.match(r"^instance 1: 'scaner' is not an input of the model; did you mean 'scanner', "
                                      r"which this instance lacks\? \(the model takes: image, ink_level__a\.u\._ "
                                      r"\(column 'ink level \(a\.u\.\)'\), scanner\)$", response["error"]["message"])
    # Bad image bytes name the instance and the feature: not an image at all, and a PNG cut short.
    png = base64.b64decode(verbatim[2]["image"]["b64"])
    for image, message in ((b"GIF7 not an image", r"is not a PNG, JPEG, GIF or BMP image \(its 'b64' holds 17 bytes "
                            r"starting b'GIF7 not'\)$"),
                           (png[:40], r"holds image bytes TensorFlow cannot decode \(.+\)$")):
      bad = {**verbatim[2], "image": {"b64": base64.b64encode(image).decode()}}
      status, response = _call(port, "POST", started["predict"], {"instances": [verbatim[0], verbatim[1], bad]})
      assert status == 400 and re.match(r"^instance 2: feature 'image' " + message, response["error"]["message"]), (
          response)
    assert _call(port, "POST", started["predict"], "not an object")[0] == 400
    assert _call(port, "GET", "/nope")[0] == 404

    # 32 clients at once, 8 requests each: every answer is the one a single client gets.
    def client(i):
      return [_call(port, "POST", started["predict"], {"instances": verbatim[i % 30:i % 30 + 1]})
              for _ in range(8)]

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
      results = list(pool.map(client, range(32)))
    for i, answers in enumerate(results):
      assert all(status == 200 and answer["deployedModelId"] == "456" for status, answer in answers), answers
      for _, answer in answers:
        serving_checks.assert_same_predictions(answer["predictions"], [expected[i % 30]])


def test_a_model_in_cloud_storage_is_served(gcs, digits_export):
  stage_data.upload_tree(str(digits_export), "gs://test-bucket/served/model")
  row = _training_rows(640, 641)
  with _serving("gs://test-bucket/served/model", env={"STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"]}
                ) as (port, started):
    status, response = _call(port, "POST", started["predict"], {"instances": row})
  assert status == 200
  serving_checks.assert_same_predictions(response["predictions"], _session_answers(digits_export, row))


def test_bad_starts_are_one_line(digits_export, tmp_path):
  holder = socket.socket()
  holder.bind(("127.0.0.1", 0))
  holder.listen()
  busy = holder.getsockname()[1]
  (tmp_path / "empty").mkdir()
  cases = [([f"--model_dir={digits_export}", f"--port={busy}"],
            rf"^error: --port={busy}: cannot listen on 127\.0\.0\.1:{busy} \(Address already in use\)"),
           ([f"--model_dir={tmp_path}/empty", "--port=0"],
            r"^error: --model_dir: cannot load a SavedModel from .*/empty \(SavedModel file does not exist"),
           ([f"--model_dir={digits_export}", "--port=0", "--signature=nope"],
            r"^error: signature 'nope' is not in .* \(it has: serving_default\)$"),
           (["--port=0"], r"^error: --model_dir is required \(or AIP_STORAGE_URI")]
  try:
    for args, message in cases:
      result = subprocess.run([sys.executable, "-m", "serving.serve", *args], cwd=procs.REPO,
                              env=procs.trainer_env(), capture_output=True, text=True, timeout=120, check=False)
      errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
      assert result.returncode == 2 and len(errors) == 1 and re.search(message, errors[0]), result.stderr[-2000:]
      assert "Traceback" not in result.stderr and not result.stdout
  finally:
    holder.close()
