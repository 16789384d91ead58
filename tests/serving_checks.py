"""Test helper: an export must answer alike when loaded the TF Serving way (TF1 session: restore op, then the
signature) and the TF2 way (`tf.saved_model.load`), for rows as Vertex sends them."""

from __future__ import annotations

import json
import os

import numpy as np

from scripts.check_model import instances_from_records  # pylint: disable=unused-import  (the tests use it from here too)
from serving import predict


def assert_loaders_agree(model_dir: str, eval_pattern: str) -> dict:
  """Session-loader predictions (the `serving.predict` command's path) allclose to `tf.saved_model.load`'s;
  returns the Vertex-shaped response."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  instances = instances_from_records(str(model_dir), eval_pattern)
  model = predict.SessionModel(str(model_dir))
  try:
    response = predict.predict(model, json.loads(json.dumps({"instances": instances})))
  finally:
    model.close()
  assert len(response["predictions"]) == len(instances)
  signature = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
  columns = {}
  for name, spec in signature.structured_input_signature[1].items():
    values = [row[name] for row in instances]
    columns[name] = tf.constant(values, dtype=spec.dtype)
  expected = {k: v.numpy() for k, v in signature(**columns).items()}
  for name, value in expected.items():
    got = np.array([p[name] if isinstance(p, dict) else p for p in response["predictions"]])
    np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=name)
  if "class_id" in expected:  # one class per example (a multi-label model's probabilities are each a yes/no)
    np.testing.assert_allclose(expected["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
  return response


def serve_instances(model_dir: str, instances: list[dict]) -> list[dict]:
  """Predictions from the session loader (TF Serving's path), checked against `tf.saved_model.load`'s."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  model = predict.SessionModel(model_dir)
  try:
    response = predict.predict(model, json.loads(json.dumps({"instances": instances})))
  finally:
    model.close()
  signature = tf.saved_model.load(model_dir).signatures["serving_default"]
  columns = {}
  for name, spec in signature.structured_input_signature[1].items():
    values = [row[name]["b64"] if isinstance(row[name], dict) else row[name] for row in instances]
    if spec.dtype == tf.string and isinstance(instances[0][name], dict):
      import base64  # pylint: disable=g-import-not-at-top

      values = [base64.b64decode(v) for v in values]
    columns[name] = tf.constant(values, dtype=spec.dtype)
  expected = signature(**columns)
  for name in ("probabilities", "prediction"):
    if name in expected:
      # One output is answered bare, as TF Serving answers it (a list of values, not of objects).
      got = np.array([p[name] if isinstance(p, dict) else p for p in response["predictions"]])
      np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
  if "class_id" in expected:  # one class per example (a multi-label model's probabilities are each a yes/no)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
  return response["predictions"]


def copy_tree(source: str, target) -> str:
  """Copies a folder (a model exported to gs://) to local disk, where the session loader reads it; returns target."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  for root, _, files in tf.io.gfile.walk(source):
    relative = root[len(source):].strip("/")
    os.makedirs(os.path.join(target, relative), exist_ok=True)
    for name in files:
      tf.io.gfile.copy(f"{root.rstrip('/')}/{name}", os.path.join(target, relative, name), overwrite=True)
  return str(target)


def assert_same_predictions(got, expected, message=""):
  """Predictions (Vertex's dicts, or bare values) with the same classes, and numbers equal up to float32 rounding:
  another batch size, another process or a loaded machine may sum in another order (oneDNN splits its work)."""
  assert [{k: v for k, v in p.items() if k != "probabilities"} for p in got] == \
         [{k: v for k, v in p.items() if k != "probabilities"} for p in expected], message
  np.testing.assert_allclose([p["probabilities"] for p in got], [p["probabilities"] for p in expected], rtol=1e-5,
                             atol=1e-7, err_msg=message)
