"""Model Registry: the UploadModel request for a finished job's SavedModel (`submit.py --upload_model`).

The model is served by Vertex's prebuilt TensorFlow prediction container (TF Serving) matching the TF that trained
it: the newest prebuilt prediction image not newer than the training TF, from the list Vertex's own SDK carries
(`google.cloud.aiplatform.constants.prediction`). The SavedModel's serving signature is plain TF ops (see
trainer/export.py), which older TF Serving builds load. The predict schemata are the files the export wrote beside
the model (trainer/predict_schemata.py); labels link the model to the job that made it.
"""

from __future__ import annotations

import re

from scripts import clients
from trainer import predict_schemata

_PREDICTION_IMAGE = re.compile(r"^(us|europe|asia)-docker\.pkg\.dev/vertex-ai/prediction/tf2-(cpu|gpu)\.2-(\d+):latest$")
_LABEL_VALUE = re.compile(r"[^a-z0-9_-]")


class RegistryError(ValueError):
  """A one-line reason no model can be uploaded."""


def prediction_images() -> list[str]:
  from google.cloud.aiplatform.constants import prediction  # pylint: disable=g-import-not-at-top

  return [uri for uri in prediction.TF_CONTAINER_URIS if _PREDICTION_IMAGE.match(uri)]


def serving_image(training_tf: str, region: str, *, gpu: bool = False) -> str:
  """The prebuilt TF prediction image for a model trained on TF `training_tf` ("2.17"), in the region's
  multi-region registry."""
  area = region.split("-")[0] if region.split("-")[0] in ("us", "europe", "asia") else "us"
  minor = int(training_tf.split(".")[1])
  offered = []
  for uri in prediction_images():
    match = _PREDICTION_IMAGE.match(uri)
    if match.group(1) == area and match.group(2) == ("gpu" if gpu else "cpu"):
      offered.append((int(match.group(3)), uri))
  fitting = sorted(v for v in offered if v[0] <= minor)
  if not fitting:
    raise RegistryError(f"no prebuilt TF prediction image for TF {training_tf} in {area}; pass --serving_image")
  return fitting[-1][1]


def label_value(text: str) -> str:
  """A Vertex label value: lowercase letters, digits, '_' and '-', at most 63 characters."""
  return _LABEL_VALUE.sub("-", text.lower())[:63]


def upload_request(*, parent: str, display_name: str, model_dir: str, image: str, job_name: str,
                   run_id: str, training_tf: str, config_path: str) -> dict:
  """The UploadModelRequest body (REST JSON)."""
  if not model_dir.startswith("gs://"):
    raise RegistryError(f"--upload_model needs the job's model dir in Cloud Storage, and {config_path} has "
                        f"{'no baseOutputDirectory.outputUriPrefix' if not model_dir else repr(model_dir)}: give it "
                        "baseOutputDirectory.outputUriPrefix: gs://BUCKET/runs/${RUN_ID} (the export lands in "
                        "<prefix>/model/)")
  model_dir = model_dir.rstrip("/") + "/"
  return {
      "parent": parent,
      "model": {
          "displayName": display_name,
          "description": f"Trained by vertex-tf-trainer ({config_path}, TF {training_tf}) in {job_name}",
          "artifactUri": model_dir,
          "containerSpec": {"imageUri": image},
          "predictSchemata": {"instanceSchemaUri": model_dir + predict_schemata.INSTANCE_FILE,
                              "predictionSchemaUri": model_dir + predict_schemata.PREDICTION_FILE},
          "labels": {"vertex-tf-trainer-job": label_value(job_name.rsplit("/", 1)[-1]),
                     "vertex-tf-trainer-run": label_value(run_id),
                     "training-tf": label_value(training_tf)},
      },
  }


def model_client(region: str, api_endpoint: str | None):
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  return aiplatform_v1.ModelServiceClient(**clients.vertex_kwargs(region, api_endpoint))


def upload(client, request: dict, *, timeout_secs: float = 1800):
  """Sends the request (parsed into aiplatform_v1 types) and waits for the model; returns its resource name."""
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  parsed = aiplatform_v1.UploadModelRequest()
  json_format.ParseDict(request, parsed._pb)  # pylint: disable=protected-access
  operation = client.upload_model(request=parsed)
  return operation.result(timeout=timeout_secs).model
