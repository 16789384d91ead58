r"""Registers a SavedModel you already have in Vertex AI Model Registry, and optionally deploys it: no training job.

    python -m scripts.register_model --model_dir=./exported --bucket=my-bucket        # a local dir: copied first
    python -m scripts.register_model --model_dir=gs://my-bucket/runs/r1/model         # a dir in Cloud Storage
    python -m scripts.register_model --model_dir=./exported --bucket=my-bucket --deploy \
        --deploy_machine_type=g2-standard-8 --accelerator_type=NVIDIA_L4 --serving_image=prebuilt \
        --endpoint=projects/P/locations/us-central1/endpoints/N --traffic_percent=20
    python -m scripts.register_model ... --dry_run                                    # print the requests only

Model Registry reads a model from Cloud Storage only: a local directory is copied as it is to
gs://BUCKET/models/<display name>-<content digest>/ (named by content: a second run of the same model copies
nothing and registers the same artifact), a gs:// directory is registered in place.
Before anything is sent, the directory must be a SavedModel with a `serving_default` signature (the one TF
Serving and the project's serving image answer): its saved_model.pb is parsed, the model is not loaded.

Predict schemata (what Model Registry shows as the request and response): the export's own instance_schema.yaml and
prediction_schema.yaml when it has them (the trainer writes them, trainer/data/predict_schemata.py); otherwise they are
derived from the serving_default signature (input and output names, dtypes and shapes as OpenAPI 3.0 schema
objects) and written beside the model in its bucket directory.

The serving container is chosen as `submit --upload_model` chooses it (scripts/registry.py): the project's serving
image for the TF that wrote the SavedModel (its meta_info_def.tensorflow_version; --build_serving_image builds it
through Cloud Build first), `--serving_image=prebuilt` for Vertex's prebuilt TF prediction image (the GPU one when
deploying with an accelerator), or any image URI. The project and region come from the flags, the environment or
gcloud's configuration (scripts/gcp_context.py).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import os
import re
import sys
import tempfile
from typing import Any

from scripts import gcp_context
from scripts import registry
from scripts import vertex_config
from trainer.core import paths
from trainer.data import predict_schemata

SIGNATURE = "serving_default"
SERVE_TAG = "serve"
SCHEMA_FILES = (predict_schemata.INSTANCE_FILE, predict_schemata.PREDICTION_FILE)
DISPLAY_NAME_LIMIT = 128  # Vertex's limit for a Model's displayName
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
# Directory names that say nothing about the model: the trainer's `<output_dir>/model`, TF Serving's version dirs.
_GENERIC_DIR = re.compile(r"^(model|saved_model|export|\d+)$")


class RegisterError(ValueError):
  """A one-line reason the model cannot be registered (a bad flag, a directory that is no SavedModel)."""


class _OneLineParser(argparse.ArgumentParser):
  """argparse's own mistakes (a missing --model_dir, --min_replicas=two) as one `error:` line, like every other."""

  def error(self, message: str):
    raise RegisterError(message)


@dataclasses.dataclass(frozen=True)
class Tensor:
  dtype: str  # a tensorflow DataType name: DT_FLOAT, DT_STRING, ...
  shape: tuple[int, ...] | None  # -1 for a dimension of any size; None for an unknown rank


@dataclasses.dataclass(frozen=True)
class SavedModelInfo:
  """What registering needs from a SavedModel, read from its saved_model.pb alone."""

  inputs: dict[str, Tensor]
  outputs: dict[str, Tensor]
  tensorflow_version: str  # "2.21.0"; "" when the writer did not record it
  schemata: dict[str, bool]  # instance_schema.yaml / prediction_schema.yaml: present beside the model?


# ----- is it a SavedModel? ------------------------------------------------------------------------------------


def read_saved_model(data: bytes, *, text: bool, where: str) -> SavedModelInfo:
  """The serving signature and TF version from saved_model.pb (or .pbtxt) bytes: the proto, not the model, so a
  model of any size is checked in a moment and nothing it holds runs here."""
  from google.protobuf import message  # pylint: disable=g-import-not-at-top
  from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
  from tensorflow.core.framework import types_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-import-not-at-top

  name = "saved_model.pbtxt" if text else "saved_model.pb"
  proto = saved_model_pb2.SavedModel()
  try:
    if text:
      text_format.Parse(data.decode("utf-8"), proto)
    else:
      proto.ParseFromString(data)
  except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
    raise RegisterError(f"--model_dir={where}: not a SavedModel: its {name} does not parse as one "
                        f"({' '.join(str(e).split())[:120]})") from None
  serving = [m for m in proto.meta_graphs if SERVE_TAG in m.meta_info_def.tags]
  if not serving:
    tags = sorted({t for m in proto.meta_graphs for t in m.meta_info_def.tags})
    raise RegisterError(f"--model_dir={where}: not a SavedModel Vertex can serve: its {name} holds no MetaGraph "
                        f"tagged '{SERVE_TAG}' ({'tags: ' + ', '.join(tags) if tags else 'no MetaGraph at all'}); "
                        "expected what tf.saved_model.save or a Keras model's export() writes")
  meta = serving[0]
  if SIGNATURE not in meta.signature_def:
    names = sorted(n for n in meta.signature_def if not n.startswith("__"))
    raise RegisterError(f"--model_dir={where}: the SavedModel has no '{SIGNATURE}' signature (it has: "
                        f"{', '.join(names) or 'none'}); Vertex serves '{SIGNATURE}': save with signatures="
                        f"{{'{SIGNATURE}': ...}}, or export a Keras model with model.export(dir)")
  signature = meta.signature_def[SIGNATURE]

  def tensors(infos) -> dict[str, Tensor]:
    return {key: Tensor(types_pb2.DataType.Name(info.dtype),
                        None if info.tensor_shape.unknown_rank else tuple(d.size for d in info.tensor_shape.dim))
            for key, info in infos.items()}

  return SavedModelInfo(tensors(signature.inputs), tensors(signature.outputs), meta.meta_info_def.tensorflow_version,
                        {})


def inspect_local(directory: str) -> SavedModelInfo:
  """A local --model_dir, checked: a directory, a SavedModel in it, its serving signature."""
  if not os.path.exists(directory):
    raise RegisterError(f"--model_dir={directory}: no such directory; expected a SavedModel directory (local, or "
                        "gs://BUCKET/PATH)")
  if not os.path.isdir(directory):
    raise RegisterError(f"--model_dir={directory}: not a directory; expected the directory that holds "
                        "saved_model.pb")
  for name, text in (("saved_model.pb", False), ("saved_model.pbtxt", True)):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        info = read_saved_model(f.read(), text=text, where=directory)
      present = {s: os.path.isfile(os.path.join(directory, s)) for s in SCHEMA_FILES}
      return dataclasses.replace(info, schemata=present)
  raise RegisterError(f"--model_dir={directory}: not a SavedModel: no saved_model.pb in it; expected the directory "
                      "tf.saved_model.save or a Keras model's export() writes")


def inspect_gcs(uri: str, client) -> SavedModelInfo:
  """A gs:// --model_dir, checked by downloading its saved_model.pb alone."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

  bucket_name, prefix = paths.split_gcs_uri(uri)
  prefix = prefix.strip("/")
  bucket = client.bucket(bucket_name)
  for name, text in (("saved_model.pb", False), ("saved_model.pbtxt", True)):
    blob = bucket.blob(f"{prefix}/{name}" if prefix else name)
    try:
      data = blob.download_as_bytes()
    except exceptions.NotFound:
      continue
    except exceptions.GoogleAPICallError as e:
      raise RegisterError(f"--model_dir={uri}: cannot read {name} ({_api_error(e)})") from None
    info = read_saved_model(data, text=text, where=uri)
    try:
      present = {s: bucket.blob(f"{prefix}/{s}" if prefix else s).exists() for s in SCHEMA_FILES}
    except exceptions.GoogleAPICallError as e:
      raise RegisterError(f"--model_dir={uri}: cannot look for its predict schemata ({_api_error(e)})") from None
    return dataclasses.replace(info, schemata=present)
  raise RegisterError(f"--model_dir={uri}: not a SavedModel: no saved_model.pb there; expected the directory "
                      "tf.saved_model.save or a Keras model's export() writes")


# ----- predict schemata from the signature ------------------------------------------------------------------------

_FLOATS = {"DT_HALF": "float", "DT_BFLOAT16": "float", "DT_FLOAT": "float", "DT_DOUBLE": "double"}
_INTS = {"DT_INT8": "int32", "DT_INT16": "int32", "DT_INT32": "int32", "DT_INT64": "int64", "DT_UINT8": "int32",
         "DT_UINT16": "int32", "DT_UINT32": "int64", "DT_UINT64": "int64"}
_B64 = {"type": "object", "required": ["b64"], "properties": {"b64": {"type": "string", "format": "byte"}},
        "additionalProperties": False}


def value_schema(dtype: str, *, request: bool) -> dict[str, Any]:
  """One element of a tensor as JSON carries it (OpenAPI 3.0). A string in a request may be binary, which Vertex
  and TF Serving take as {"b64": ...}; a response's strings are text."""
  if dtype in _FLOATS:
    return {"type": "number", "format": _FLOATS[dtype]}
  if dtype in _INTS:
    schema: dict[str, Any] = {"type": "integer", "format": _INTS[dtype]}
    if dtype.startswith("DT_UINT"):
      schema["minimum"] = 0
    if dtype == "DT_UINT8":
      schema["maximum"] = 255
    return schema
  if dtype == "DT_BOOL":
    return {"type": "boolean"}
  if dtype == "DT_STRING":
    return {"anyOf": [{"type": "string"}, dict(_B64)]} if request else {"type": "string"}
  return {"description": f"a {dtype[3:].lower()} value"}


def tensor_schema(tensor: Tensor, *, request: bool) -> dict[str, Any]:
  """One instance's value of a batched tensor: the signature's shape without its first (batch) dimension, as
  nested arrays; a fixed dimension gives the array its exact length."""
  if tensor.shape is None:
    return {"description": f"a {tensor.dtype[3:].lower()} tensor of any shape (the signature leaves its rank open)"}
  schema = value_schema(tensor.dtype, request=request)
  for size in reversed(tensor.shape[1:]):
    schema = {"type": "array", "items": schema, **({"minItems": size, "maxItems": size} if size >= 0 else {})}
  return schema


def signature_schemata(info: SavedModelInfo) -> tuple[dict[str, Any], dict[str, Any]]:
  """(instance, prediction) OpenAPI 3.0 schemata of the serving signature, as Vertex and TF Serving's row format
  read and answer it: an instance is an object of input name -> value (a single-input signature also takes the bare
  value); a prediction is an object of output name -> value, or the bare value when there is one output."""
  origin = f"derived from the SavedModel's {SIGNATURE} signature"
  properties = {name: tensor_schema(t, request=True) for name, t in sorted(info.inputs.items())}
  instance: dict[str, Any] = {"title": "instance", "type": "object", "required": list(properties),
                              "properties": properties, "description": f"one instance, {origin}"}
  if len(properties) == 1:
    (name, bare), = properties.items()
    instance = {"title": "instance", "description": f"one instance, {origin}: an object with {name!r}, or its value "
                                                    "alone", "anyOf": [{k: v for k, v in instance.items()
                                                                        if k not in ("title", "description")}, bare]}
  outputs = {name: tensor_schema(t, request=False) for name, t in sorted(info.outputs.items())}
  if len(outputs) == 1:
    (name, only), = outputs.items()
    prediction = {"title": "prediction", "description": f"one prediction: the output {name!r}, {origin}", **only}
  else:
    prediction = {"title": "prediction", "type": "object", "required": list(outputs), "properties": outputs,
                  "description": f"one prediction, {origin}"}
  return instance, prediction


# ----- Cloud Storage ----------------------------------------------------------------------------------------------


def local_files(directory: str) -> list[str]:
  """Every file under `directory`, relative, sorted: what is copied, as it is."""
  found = []
  for root, _, files in os.walk(directory):
    found.extend(os.path.relpath(os.path.join(root, name), directory) for name in files)
  return sorted(found)


def content_digest(directory: str, files: list[str]) -> tuple[str, dict[str, str]]:
  """The directory's content digest (12 hex of sha256 over names and bytes) and each file's base64 MD5, as Cloud
  Storage reports it (so a file already copied is known without downloading it)."""
  digest = hashlib.sha256()
  md5s = {}
  for name in files:
    md5 = hashlib.md5()
    digest.update(name.encode() + b"\0")
    with open(os.path.join(directory, name), "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
        md5.update(chunk)
    digest.update(b"\0")
    md5s[name] = base64.b64encode(md5.digest()).decode()
  return digest.hexdigest()[:12], md5s


def copy_to_bucket(directory: str, destination: str, md5s: dict[str, str], client) -> tuple[int, int]:
  """Copies the files to `destination` (gs://, a directory), skipping those already there with the same bytes;
  returns (copied, already there)."""
  from google.cloud.storage import transfer_manager  # pylint: disable=g-import-not-at-top

  bucket_name, prefix = paths.split_gcs_uri(destination)
  prefix = prefix.strip("/") + "/"
  bucket = client.bucket(bucket_name)
  there = {b.name[len(prefix):]: b.md5_hash for b in client.list_blobs(bucket_name, prefix=prefix)}
  todo = [name for name, md5 in md5s.items() if there.get(name) != md5]
  results = transfer_manager.upload_many_from_filenames(
      bucket, todo, source_directory=directory, blob_name_prefix=prefix, max_workers=8,
      worker_type=transfer_manager.THREAD)
  for name, result in zip(todo, results):
    if isinstance(result, Exception):
      raise result
  return len(todo), len(md5s) - len(todo)


def write_text(uri: str, text: str, client) -> None:
  """A derived schema beside the model: Vertex reads predictSchemata from Cloud Storage (JSON is YAML)."""
  bucket_name, name = paths.split_gcs_uri(uri)
  client.bucket(bucket_name).blob(name).upload_from_string(text, content_type="application/yaml")


def storage_client(project: str):
  """google-cloud-storage as the user's Application Default Credentials allow (anonymous on the emulator, when
  STORAGE_EMULATOR_HOST is set)."""
  from google.auth import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  try:
    return storage.Client(project=project)
  except exceptions.DefaultCredentialsError:
    raise RegisterError("Cloud Storage: no credentials; run `gcloud auth application-default login`") from None


def _api_error(e: Exception) -> str:
  """A Google API error as one short line: its HTTP code and message."""
  return " ".join(f"{getattr(e, 'code', '')} {getattr(e, 'message', None) or e}".split())[:200]


# ----- the command ------------------------------------------------------------------------------------------------


def default_display_name(model_dir: str) -> str:
  """The directory's name, with its parent's when the name alone says nothing (`runs/r1/model` -> r1-model)."""
  parts = [p for p in model_dir[len("gs://"):].split("/") if p] if model_dir.startswith("gs://") else \
      [p for p in os.path.abspath(model_dir).split(os.sep) if p]
  if len(parts) >= 2 and _GENERIC_DIR.match(parts[-1]):
    return f"{parts[-2]}-{parts[-1]}"
  return parts[-1] if parts else "model"


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def parse_labels(pairs: list[str]) -> dict[str, str]:
  labels = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
      raise RegisterError(f"--label={pair!r}: expected KEY=VALUE, the key a lowercase letter then up to 62 lowercase "
                          "letters, digits, '_' or '-', the value up to 63 of those")
    labels[key] = value
  return labels


def check_accelerator(args: argparse.Namespace) -> list[str]:
  """--accelerator_type against the accelerators Vertex names, and the machine it rides on against the project's
  machine table (scripts/vertex_config.py); returns warnings for what only Vertex can judge."""
  if args.accelerator_type:
    names = registry.accelerator_names()
    if args.accelerator_type not in names:
      raise RegisterError(f"--accelerator_type={args.accelerator_type}: not an accelerator Vertex names; expected "
                          f"one of {', '.join(names)}")
  if args.accelerator_count is not None and args.accelerator_count < 1:
    raise RegisterError(f"--accelerator_count={args.accelerator_count}: expected 1 or more")
  if args.accelerator_count and not args.accelerator_type:
    raise RegisterError(f"--accelerator_count={args.accelerator_count} without --accelerator_type: name the "
                        f"accelerator (e.g. --accelerator_type=NVIDIA_L4)")
  machine = {"machineType": args.deploy_machine_type}
  where = f"--deploy_machine_type={args.deploy_machine_type}"
  if args.accelerator_type:
    machine.update(acceleratorType=args.accelerator_type, acceleratorCount=args.accelerator_count or 1)
    where += f" --accelerator_type={args.accelerator_type} --accelerator_count={args.accelerator_count or 1}"
  warning = vertex_config.check_machine(machine, where)
  return [warning] if warning else []


def _parser() -> argparse.ArgumentParser:
  parser = _OneLineParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model_dir", required=True, help="the SavedModel directory: local, or gs://BUCKET/PATH")
  parser.add_argument("--bucket", default=os.environ.get("BUCKET"),
                      help="where a local --model_dir is copied (gs://BUCKET/models/NAME-DIGEST/); default BUCKET")
  parser.add_argument("--display_name", default=None,
                      help="the Model Registry name (default: the directory's name, with its parent's for 'model')")
  parser.add_argument("--description", default=None)
  parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a model label (repeatable)")
  parser.add_argument("--project", default=None, help=gcp_context.PROJECT_HELP)
  parser.add_argument("--region", default=None, help=gcp_context.REGION_HELP)
  parser.add_argument("--serving_image", default=None,
                      help="the model's serving container: default the project's serving image (Dockerfile.serving, "
                      "TF matching the SavedModel's); 'prebuilt' for Vertex's prebuilt TF prediction image; or a URI")
  parser.add_argument("--build_serving_image", action="store_true",
                      help="build and push the project's serving image through Cloud Build first")
  parser.add_argument("--training_tf", default=None,
                      help="the TF that wrote the model (default: the SavedModel's own record of it)")
  parser.add_argument("--deploy", action="store_true",
                      help="deploy the model to an endpoint (a new one, or --endpoint)")
  parser.add_argument("--endpoint", default=None,
                      help="--deploy into this endpoint (projects/P/locations/L/endpoints/N, or N)")
  parser.add_argument("--deploy_machine_type", default=None, help="default n1-standard-4")
  parser.add_argument("--accelerator_type", default=None, help="e.g. NVIDIA_L4 (aiplatform_v1.AcceleratorType)")
  parser.add_argument("--accelerator_count", type=int, default=None, help="default 1 with --accelerator_type")
  parser.add_argument("--min_replicas", type=int, default=None, help="default 1")
  parser.add_argument("--max_replicas", type=int, default=None, help="default --min_replicas")
  parser.add_argument("--traffic_percent", type=int, default=None,
                      help="the model's share of the endpoint's traffic (default 100); the others keep theirs of the "
                      "rest")
  parser.add_argument("--dry_run", action="store_true", help="print the requests as JSON; send and copy nothing")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  parser.add_argument("--timeout_secs", type=float, default=3600, help=argparse.SUPPRESS)
  return parser


DEPLOY_FLAGS = ("endpoint", "deploy_machine_type", "accelerator_type", "accelerator_count", "min_replicas",
                "max_replicas", "traffic_percent")


def main(argv: list[str] | None = None) -> int:
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth_exceptions  # pylint: disable=g-import-not-at-top

  try:
    args = _parser().parse_args(argv)
    return _register(args)
  except (RegisterError, registry.RegistryError, vertex_config.ConfigError) as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  except exceptions.GoogleAPICallError as e:  # after every check: the service said no (permissions, quota...)
    print(f"error: {_api_error(e)}", file=sys.stderr)
    return 1
  except auth_exceptions.GoogleAuthError as e:  # expired or missing credentials, found only when first used
    print(f"error: credentials: {' '.join(str(e).split())[:200]}; run `gcloud auth application-default login`",
          file=sys.stderr)
    return 1


def _register(args: argparse.Namespace) -> int:
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

  project_setting = gcp_context.project(args.project)
  if project_setting is None:
    raise RegisterError(gcp_context.MISSING_PROJECT)
  region_setting = gcp_context.region(args.region)
  project, region = project_setting.value, region_setting.value

  # Every flag first: nothing is read, copied or sent for a command that cannot succeed.
  given = [f"--{f}" for f in DEPLOY_FLAGS if getattr(args, f) is not None]
  if given and not args.deploy:
    raise RegisterError(f"{given[0]} is for --deploy; add --deploy (or drop {given[0]})")
  args.deploy_machine_type = args.deploy_machine_type or "n1-standard-4"
  args.min_replicas = 1 if args.min_replicas is None else args.min_replicas
  args.max_replicas = args.min_replicas if args.max_replicas is None else args.max_replicas
  args.traffic_percent = 100 if args.traffic_percent is None else args.traffic_percent
  warnings: list[str] = []
  endpoint = None
  if args.deploy:
    if args.accelerator_type:
      args.accelerator_type = args.accelerator_type.upper()
    warnings += check_accelerator(args)
    if args.endpoint:
      endpoint = registry.endpoint_name(args.endpoint, project=project, region=region)
  if args.build_serving_image and args.serving_image:
    raise RegisterError(f"--build_serving_image builds the project's serving image; --serving_image="
                        f"{args.serving_image} names another: drop one")
  labels = parse_labels(args.label)
  display_name = args.display_name or default_display_name(args.model_dir)
  if not display_name.strip() or len(display_name) > DISPLAY_NAME_LIMIT:
    raise RegisterError(f"--display_name={display_name!r}: expected 1 to {DISPLAY_NAME_LIMIT} characters")

  local = not args.model_dir.startswith("gs://")
  client = None
  if local:
    info = inspect_local(args.model_dir)
    if not args.bucket:
      raise RegisterError(f"--model_dir={args.model_dir} is a local directory, and Model Registry reads models from "
                          "Cloud Storage: pass --bucket=BUCKET (the model is copied to gs://BUCKET/models/NAME-DIGEST/ "
                          "first), or give a gs:// --model_dir")
    bucket = vertex_config.bucket_name(args.bucket)
    files = local_files(args.model_dir)
    digest, md5s = content_digest(args.model_dir, files)
    artifact = f"gs://{bucket}/models/{_slug(display_name)}-{digest}/"
  else:
    try:
      paths.split_gcs_uri(args.model_dir)
    except ValueError:
      raise RegisterError(f"--model_dir={args.model_dir!r}: expected gs://BUCKET/PATH or a local directory") from None
    client = storage_client(project)
    info = inspect_gcs(args.model_dir, client)
    artifact = args.model_dir.rstrip("/") + "/"
    bucket = vertex_config.bucket_name(args.bucket) if args.bucket else paths.split_gcs_uri(artifact)[0]

  training_tf = args.training_tf or ".".join(info.tensorflow_version.split(".")[:2])
  if not training_tf and args.serving_image in (None, registry.PREBUILT):
    raise RegisterError(f"--model_dir={args.model_dir}: the SavedModel does not record the TF that wrote it "
                        "(meta_info_def.tensorflow_version is empty): pass --training_tf=2.N, or --serving_image=URI")
  try:
    container, serving_warnings = registry.serving_container(
        args.serving_image, training_tf=training_tf, project=project, region=region,
        gpu=bool(args.deploy and args.accelerator_type))
  except registry.RegistryError as e:
    shown = f"={args.serving_image}" if args.serving_image else f" (default, for a model from TF {training_tf})"
    raise RegisterError(f"--serving_image{shown}: {e}") from None
  warnings += serving_warnings
  if not args.serving_image and not args.build_serving_image:
    warnings.append(f"the model will name {container['imageUri']}, which must exist in Artifact Registry when it is "
                    "deployed: add --build_serving_image once per TF version")

  instance, prediction = signature_schemata(info)
  derived = {name: schema for name, schema in zip(SCHEMA_FILES, (instance, prediction)) if not info.schemata[name]}
  request = registry.upload_request(
      parent=f"projects/{project}/locations/{region}", display_name=display_name, model_dir=artifact,
      container=container, training_tf=training_tf or "unknown",
      description=args.description or (f"Registered by vertex-tf-trainer (scripts.register_model) from "
                                        f"{args.model_dir if not local else 'a local SavedModel directory'}"
                                        f"{f' (TF {training_tf})' if training_tf else ''}"),
      labels={"vertex-tf-trainer-source": "register-model", **labels})

  def deploy_request_for(endpoint_: str, current: dict, model: str = "(the registered model)") -> dict:
    return registry.deploy_request(
        endpoint=endpoint_, model=model, display_name=display_name, machine_type=args.deploy_machine_type,
        min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        split=registry.traffic_split(current, args.traffic_percent), accelerator_type=args.accelerator_type,
        accelerator_count=args.accelerator_count)

  # An existing endpoint's split is read when deploying; a new endpoint's only model must take all its traffic.
  preview = deploy_request_for(endpoint or "(a new endpoint)", {"(deployed)": 100} if endpoint else {}) \
      if args.deploy else None

  if args.dry_run:
    printed: dict[str, Any] = {"project": str(project_setting), "region": str(region_setting)}
    if local:
      printed["copy"] = {"from": os.path.abspath(args.model_dir), "to": artifact, "files": len(files)}
    printed["predict_schemata"] = {
        name: ({"uri": artifact + name, "source": f"derived from the {SIGNATURE} signature, written there",
                "schema": derived[name]} if name in derived else {"uri": artifact + name, "source": "the export's own"})
        for name in SCHEMA_FILES}
    if args.build_serving_image:
      printed["build_serving_image"] = {"image": container["imageUri"], "context": f"gs://{bucket}/staging/"}
    printed["upload_model"] = request
    if preview:
      printed["deploy_model"] = preview
    for warning in warnings:
      print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(printed, indent=2))
    return 0

  for warning in warnings:
    print(f"warning: {warning}", file=sys.stderr)
  print(f"project {project_setting}; region {region_setting}", flush=True)
  if endpoint:  # before anything is copied or registered: an endpoint that is not there, or cannot take the split
    try:
      current = dict(registry.endpoint_client(region, args.api_endpoint).get_endpoint(name=endpoint).traffic_split)
    except exceptions.NotFound:
      raise RegisterError(f"--endpoint={args.endpoint}: no such endpoint in {project}/{region}") from None
    deploy_request_for(endpoint, current)
  if local or derived or args.build_serving_image:
    client = client or storage_client(project)
  if local:
    copied, kept = _copy(args.model_dir, artifact, md5s, client, bucket)
    print(f"copied {args.model_dir} -> {artifact} ({copied} files copied, {kept} already there)", flush=True)
  for name, schema in derived.items():
    try:
      write_text(artifact + name, json.dumps(schema, indent=2) + "\n", client)
    except exceptions.GoogleAPICallError as e:
      raise RegisterError(f"--model_dir={args.model_dir}: cannot write the derived {name} to {artifact} "
                          f"({_api_error(e)})") from None
    print(f"wrote {artifact + name} (derived from the {SIGNATURE} signature)", flush=True)
  if args.build_serving_image:
    container.update(registry.serving_spec(_build_serving_image(container["imageUri"], training_tf, project=project,
                                                                region=region, bucket=bucket,
                                                                client=client, api_endpoint=args.api_endpoint)))
  model = registry.upload(registry.model_client(region, args.api_endpoint), request, timeout_secs=args.timeout_secs)
  print(f"registered {model} (serving image {request['model']['containerSpec']['imageUri']})", flush=True)
  print(f"https://console.cloud.google.com/vertex-ai/models/locations/{region}/models/{model.rsplit('/', 1)[-1]}"
        f"?project={project}", flush=True)
  if args.deploy:
    endpoint, deployed_id = registry.deploy(
        registry.endpoint_client(region, args.api_endpoint), parent=f"projects/{project}/locations/{region}",
        endpoint=endpoint, display_name=display_name, timeout_secs=args.timeout_secs,
        request_for=lambda name, current: deploy_request_for(name, current, model))
    print(f"deployed {model} to {endpoint} (deployed model {deployed_id}, {args.traffic_percent}% of its traffic)",
          flush=True)
  return 0


def _copy(directory: str, artifact: str, md5s: dict[str, str], client, bucket: str) -> tuple[int, int]:
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top

  try:
    return copy_to_bucket(directory, artifact, md5s, client)
  except exceptions.NotFound as e:
    raise RegisterError(f"--bucket={bucket}: no such bucket ({_api_error(e)})") from None
  except exceptions.Forbidden as e:
    raise RegisterError(f"--bucket={bucket}: cannot write there ({_api_error(e)})") from None


def _build_serving_image(image: str, training_tf: str, *, project: str, region: str, bucket: str, client,
                         api_endpoint: str | None) -> str:
  """Dockerfile.serving built and pushed through Cloud Build as submit --build_serving_image does it (the trainer's
  sdist and the server's scripts, staged in the bucket); returns the image by digest."""
  from scripts import cloud_build  # pylint: disable=g-import-not-at-top
  from scripts import submit  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory(prefix="register-model-") as scratch:
    try:
      archive = submit.build_sdist(scratch)
    except submit.SubmitError as e:
      raise RegisterError(f"--build_serving_image: {e}") from None
    context = cloud_build.build_context(archive, scratch, serving=True)
    context_uri = f"gs://{bucket}/staging/{os.path.basename(context)}"
    client.bucket(bucket).blob(f"staging/{os.path.basename(context)}").upload_from_filename(context)
    print(f"staged {os.path.basename(context)} -> {context_uri}", flush=True)
  request = cloud_build.build_request(project=project, region=region, image=image, context_uri=context_uri,
                                      tf_version=registry.serving_tf_version(training_tf))
  try:
    return cloud_build.build_and_say(request, api_endpoint)
  except RuntimeError as e:
    raise RegisterError(f"--build_serving_image: {e}") from None


if __name__ == "__main__":
  sys.exit(main())
