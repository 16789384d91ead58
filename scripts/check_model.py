"""Loads an exported SavedModel (local or gs://), predicts the eval split through `serving_default`, and
checks the accuracy.

    python -m scripts.check_model --model_dir=gs://BUCKET/run/model --eval_data='gs://BUCKET/data/eval/*.tfrecord' \
        --min_accuracy=0.88

This is what a serving client sees: raw feature values by name in, `probabilities`/`class_id` out, from the model
loaded the way TF Serving (Vertex's prebuilt prediction containers) loads it: a TF1 session running the restore op,
then the signature (`serving/predict.py`). Exits 1 when accuracy is below --min_accuracy.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import numpy as np

from serving import predict
from trainer.data import schema as schema_lib
from trainer.data.formats import tfrecord
from trainer.modeling import export


def predict_eval(model_dir: str, eval_pattern: str, *, batch_size: int = 1024) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with tf.io.gfile.GFile(f"{model_dir.rstrip('/')}/{export.RUN_RECORD_FILE}") as f:
    schema = schema_lib.parse_schema(json.load(f)["schema"], source=model_dir)
  serving = predict.SessionModel(model_dir)
  label = schema.label
  spec = tfrecord.parse_spec(schema)
  files = sorted(tf.io.gfile.glob(eval_pattern))
  if not files:
    raise SystemExit(f"error: --eval_data: no files match {eval_pattern!r}")
  dataset = tf.data.TFRecordDataset(files).batch(batch_size).map(lambda s: tf.io.parse_example(s, spec))
  hits = count = 0
  first = None
  for batch in dataset:
    inputs = {}
    for feature in schema.features:  # what a request carries: the raw string/bytes, else the kind's numbers
      kind = feature.kind
      value = batch[feature.name]
      if kind.serving_input(feature).dtype != "string":
        value = kind.encode(feature, value)
      inputs[feature.name] = value.numpy()
    outputs = serving.run(inputs)
    predicted = outputs["class_id"]
    truth = batch[label.name].numpy()
    hits += int(np.sum(predicted == truth))
    count += len(truth)
    if first is None:
      first = {"probabilities": outputs["probabilities"][:3].round(3).tolist(),
               "class_id": predicted[:3].tolist(), "label": truth[:3].tolist()}
  serving.close()
  return {"model_dir": model_dir, "examples": count, "accuracy": hits / max(count, 1), "first_predictions": first}


def instances_from_records(model_dir: str, pattern: str, count: int = 50) -> list[dict]:
  """The first `count` eval examples as Vertex prediction instances (one JSON object per row)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with open(os.path.join(model_dir, "trainer_config.json")) as f:
    schema = json.load(f)["schema"]
  rows = []
  for record in tf.data.TFRecordDataset(sorted(glob.glob(pattern))).take(count):
    feature_map = tf.train.Example.FromString(record.numpy()).features.feature
    row = {}
    for feature in schema["features"]:
      value = feature_map[feature["name"]]
      if feature["type"] == "string":
        row[feature["name"]] = value.bytes_list.value[0].decode()
      elif feature["type"] == "image":
        pixels = np.frombuffer(value.bytes_list.value[0], np.uint8).reshape(feature["shape"])
        row[feature["name"]] = pixels.astype(float).tolist()
      elif feature["type"] == "int":
        row[feature["name"]] = int(value.int64_list.value[0])
      else:
        row[feature["name"]] = float(value.float_list.value[0])
    rows.append(row)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--eval_data", required=True)
  parser.add_argument("--min_accuracy", type=float, default=0.0)
  args = parser.parse_args()
  result = predict_eval(args.model_dir, args.eval_data)
  print(json.dumps(result))
  if result["accuracy"] < args.min_accuracy:
    print(f"error: accuracy {result['accuracy']:.4f} of {args.model_dir} is below --min_accuracy="
          f"{args.min_accuracy}", file=sys.stderr)
    sys.exit(1)
  print(f"OK: accuracy {result['accuracy']:.4f} >= {args.min_accuracy} on {result['examples']} eval examples "
        f"(model served from {args.model_dir})")


if __name__ == "__main__":
  main()
