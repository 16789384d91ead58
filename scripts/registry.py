"""Model Registry: the UploadModel request for a finished job's SavedModel (`submit.py --upload_model`).

Which container serves it (`serving_container`):
- by default, the project's serving image (Dockerfile.serving: serving/serve.py on Vertex's custom-container
  contract, TF at the training TF's version), built once per TF version with --build_serving_image. Vertex lists
  no prebuilt TF prediction image newer than 2.15, and 2.15's end of availability is 2027-01-14;
- `--serving_image=prebuilt`: Vertex's prebuilt TF prediction container (TF Serving), the newest one not newer than
  the training TF, from the list Vertex's own SDK carries (`google.cloud.aiplatform.constants.prediction`); past
  its end of availability it is a warning naming the replacement. The export's signature is plain TF ops
  (trainer/modeling/export.py), which older TF Serving builds load;
- any other `--serving_image=URI`: that image, as it is.
The predict schemata are the files the export wrote beside the model (trainer/data/predict_schemata.py); labels link the
model to the job that made it.
"""

from __future__ import annotations

import datetime
import re

from scripts import clients
from scripts import vertex_images
from trainer.data import predict_schemata

_PREDICTION_IMAGE = re.compile(r"^(us|europe|asia)-docker\.pkg\.dev/vertex-ai/prediction/tf2-(cpu|gpu)\.2-(\d+):latest$")
_LABEL_VALUE = re.compile(r"[^a-z0-9_-]")


class RegistryError(ValueError):
  """A one-line reason no model can be uploaded."""


_ENDPOINT = re.compile(r"^projects/([^/]+)/locations/([^/]+)/endpoints/[^/]+$")


def endpoint_name(value: str, *, project: str, region: str) -> str:
  """--endpoint as a resource name: given whole, or as the endpoint's number in this project and region. An
  endpoint of another region, or of another project named by its id, is refused (a project named by number may
  be this one: Vertex judges that)."""
  name = f"projects/{project}/locations/{region}/endpoints/{value}" if value.isdigit() else value
  match = _ENDPOINT.match(name)
  if not match:
    raise RegistryError(f"--endpoint={value!r}: expected projects/P/locations/L/endpoints/N, or the endpoint's "
                        "number N")
  endpoint_project, endpoint_region = match.groups()
  if endpoint_region != region:
    raise RegistryError(f"--endpoint={value}: the endpoint is in {endpoint_region}, and the model is registered in "
                        f"{region}; a model deploys to an endpoint in its own region: pass --region={endpoint_region}")
  if endpoint_project != project and not endpoint_project.isdigit() and not project.isdigit():
    raise RegistryError(f"--endpoint={value}: the endpoint is in project {endpoint_project}, and the model is "
                        f"registered in {project}; deploy to an endpoint of {project}, or pass "
                        f"--project={endpoint_project}")
  return name


# Vertex's supported-frameworks page (read 2026-12): the prebuilt TF prediction images it still lists and their end
# of availability. None is newer than 2.15; the SDK still names older ones the page no longer lists.
PREDICTION_END_OF_AVAILABILITY = {minor: image.end_of_availability for minor, image in vertex_images.PREDICTION.items()}
PREBUILT = "prebuilt"
# The TF release each training minor version serves on (tensorflow/tensorflow image tags): the pinned stacks.
SERVING_TF = {"2.21": "2.21.0", "2.17": "2.17.1", "2.16": "2.16.2", "2.15": "2.15.1"}
SERVING_PORT = 8080


def default_serving_image(project: str, region: str, training_tf: str) -> str:
  """Where --build_serving_image pushes Dockerfile.serving's image for models trained on `training_tf`."""
  return f"{region}-docker.pkg.dev/{project}/vertex-tf-trainer/serving:tf{serving_tf_version(training_tf)}"


def serving_tf_version(training_tf: str) -> str:
  """The TF release the serving image runs for a model trained on `training_tf` ("2.17" -> "2.17.1")."""
  minor = ".".join(training_tf.split(".")[:2])
  if minor not in SERVING_TF:
    raise RegistryError(f"no serving image TF for models trained on TF {training_tf} (known: "
                        f"{', '.join(sorted(SERVING_TF))}); pass --serving_image=prebuilt or an image URI")
  return SERVING_TF[minor]


def serving_container(choice: str | None, *, training_tf: str, project: str, region: str,
                      today: datetime.date | None = None, gpu: bool = False) -> tuple[dict, list[str]]:
  """The model's containerSpec for `--serving_image` (None: the project's serving image), and warnings. `gpu`: the
  model is deployed with an accelerator, so 'prebuilt' is Vertex's GPU prediction image (the project's serving
  image runs TF's CPU build: a warning says the GPU would sit idle)."""
  if choice == PREBUILT:
    image = serving_image(training_tf, region, gpu=gpu)
    version = int(_PREDICTION_IMAGE.match(image).group(3))
    ends = PREDICTION_END_OF_AVAILABILITY.get(version)
    today = today or datetime.date.today()
    replacement = (f"the serving image matching TF {training_tf} (Dockerfile.serving: omit --serving_image, "
                   "build it with --build_serving_image)")
    warnings = []
    if ends is None or ends < today:  # Vertex no longer runs it: a deployment would fail after the training
      raise RegistryError(f"--serving_image=prebuilt: {image.rsplit('/', 1)[-1]} is past its end of availability "
                          f"on Vertex ({'no longer listed' if ends is None else ends.isoformat()}; "
                          f"{vertex_images.SOURCE}); use {replacement}")
    if (ends - today).days <= 90:
      warnings.append(f"{image.rsplit('/', 1)[-1]} reaches its end of availability on {ends.isoformat()}; "
                      f"move to {replacement}")
    return {"imageUri": image}, warnings
  if choice:
    return {"imageUri": choice}, []
  image = default_serving_image(project, region, training_tf)
  warnings = []
  if gpu:
    warnings.append(f"{image} runs TensorFlow's CPU build (Dockerfile.serving: tensorflow/tensorflow:"
                    f"{serving_tf_version(training_tf)}): the accelerator would sit idle; pass --serving_image="
                    f"{PREBUILT} for Vertex's GPU prediction image, or the URI of a GPU serving image of your own")
  return serving_spec(image), warnings


def serving_spec(image: str) -> dict:
  """The containerSpec of the project's serving image: it listens on AIP_HTTP_PORT (Vertex sets it to the port
  below) and reads its routes and model from Vertex's AIP_* variables."""
  return {"imageUri": image, "ports": [{"containerPort": SERVING_PORT}]}


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


def upload_request(*, parent: str, display_name: str, model_dir: str, container: dict, training_tf: str,
                   job_name: str | None = None, run_id: str | None = None, config_path: str | None = None,
                   description: str | None = None, labels: dict[str, str] | None = None) -> dict:
  """The UploadModelRequest body (REST JSON). A job's model (`job_name`, `run_id`, `config_path`: submit
  --upload_model) is labelled with the job and run that made it; a model registered on its own
  (scripts/register_model.py) has no job, and brings its own `description` and extra `labels` (added last: they
  win over the defaults)."""
  if not model_dir.startswith("gs://"):
    if config_path is None:
      raise RegistryError(f"the model's artifactUri must be a Cloud Storage directory (gs://BUCKET/PATH/), got "
                          f"{model_dir!r}")
    raise RegistryError(f"--upload_model needs the job's model dir in Cloud Storage, and {config_path} has "
                        f"{'no baseOutputDirectory.outputUriPrefix' if not model_dir else repr(model_dir)}: give it "
                        "baseOutputDirectory.outputUriPrefix: gs://BUCKET/runs/${RUN_ID} (the export lands in "
                        "<prefix>/model/)")
  model_dir = model_dir.rstrip("/") + "/"
  defaults: dict[str, str] = {}
  if job_name is not None:
    defaults["vertex-tf-trainer-job"] = label_value(job_name.rsplit("/", 1)[-1])
  if run_id is not None:
    defaults["vertex-tf-trainer-run"] = label_value(run_id)
  defaults["training-tf"] = label_value(training_tf)
  if description is None:
    description = (f"Trained by vertex-tf-trainer ({config_path}, TF {training_tf}) in {job_name}" if job_name
                   else f"Registered by vertex-tf-trainer (TF {training_tf})")
  return {
      "parent": parent,
      "model": {
          "displayName": display_name,
          "description": description,
          "artifactUri": model_dir,
          "containerSpec": container,
          "predictSchemata": {"instanceSchemaUri": model_dir + predict_schemata.INSTANCE_FILE,
                              "predictionSchemaUri": model_dir + predict_schemata.PREDICTION_FILE},
          "labels": {**defaults, **(labels or {})},
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


def traffic_split(current: dict[str, int], percent: int) -> dict[str, int]:
  """The endpoint's traffic split once a new model ("0", as DeployModel names it) takes `percent`: the models
  already deployed keep their shares of the rest, in whole percents summing to 100."""
  if not 1 <= percent <= 100:
    raise RegistryError(f"--traffic_percent={percent}: expected 1..100")
  others = {k: v for k, v in current.items() if v > 0}
  rest = 100 - percent
  if not others:
    if percent != 100:
      raise RegistryError(f"--traffic_percent={percent}: the endpoint has no other model to take the rest; its "
                          "only model takes 100 (a share below 100 is for a model added to an existing --endpoint)")
    return {"0": 100}
  if rest == 0:
    return {"0": 100}
  total = sum(others.values())
  split = {k: rest * v // total for k, v in others.items()}
  for k in sorted(others, key=lambda k: -others[k])[:rest - sum(split.values())]:  # the rounding's remainder
    split[k] += 1
  return {"0": percent, **split}


def accelerator_names() -> list[str]:
  """The accelerators a DeployModelRequest can name (aiplatform_v1.AcceleratorType, as this SDK knows them)."""
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  return [e.name for e in aiplatform_v1.AcceleratorType if e.name != "ACCELERATOR_TYPE_UNSPECIFIED"]


def deploy_request(*, endpoint: str, model: str, display_name: str, machine_type: str, min_replicas: int,
                   max_replicas: int, split: dict[str, int], accelerator_type: str | None = None,
                   accelerator_count: int | None = None) -> dict:
  """The DeployModelRequest body (REST JSON): the registered model on dedicated machines (with `accelerator_count`
  x `accelerator_type` on each, when given), with its traffic."""
  if not 1 <= min_replicas <= max_replicas:
    raise RegistryError(f"--min_replicas={min_replicas} --max_replicas={max_replicas}: expected 1 <= min <= max")
  machine: dict = {"machineType": machine_type}
  if accelerator_type:
    count = 1 if accelerator_count is None else accelerator_count
    if count < 1:
      raise RegistryError(f"--accelerator_count={count}: expected 1 or more (with --accelerator_type)")
    machine.update(acceleratorType=accelerator_type, acceleratorCount=count)
  elif accelerator_count:
    raise RegistryError(f"--accelerator_count={accelerator_count} without --accelerator_type: name the accelerator "
                        "(e.g. --accelerator_type=NVIDIA_L4)")
  return {"endpoint": endpoint,
          "deployedModel": {"model": model, "displayName": display_name,
                            "dedicatedResources": {"machineSpec": machine,
                                                   "minReplicaCount": min_replicas,
                                                   "maxReplicaCount": max_replicas}},
          "trafficSplit": split}


def endpoint_client(region: str, api_endpoint: str | None):
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  return aiplatform_v1.EndpointServiceClient(**clients.vertex_kwargs(region, api_endpoint))


def deploy(client, *, parent: str, endpoint: str | None, display_name: str, request_for, timeout_secs: float = 3600):
  """Creates the endpoint unless `endpoint` names one, then deploys (`request_for(endpoint, current split)` makes
  the DeployModelRequest); returns (endpoint name, deployed model id)."""
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  if endpoint:
    current = dict(client.get_endpoint(name=endpoint).traffic_split)
  else:
    created = client.create_endpoint(parent=parent, endpoint=aiplatform_v1.Endpoint(display_name=display_name))
    endpoint, current = created.result(timeout=timeout_secs).name, {}
  parsed = aiplatform_v1.DeployModelRequest()
  json_format.ParseDict(request_for(endpoint, current), parsed._pb)  # pylint: disable=protected-access
  deployed = client.deploy_model(request=parsed).result(timeout=timeout_secs).deployed_model
  return endpoint, deployed.id
