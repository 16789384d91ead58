"""`python -m scripts.register_model`: a SavedModel the user already has (a Keras tutorial's `model.export`, a
trainer export in Cloud Storage) registered in Model Registry and deployed without a training job, against the
fake Vertex control plane and the Cloud Storage emulator."""

import json
import os
import re

import numpy as np
import pytest
import yaml
from google.cloud import aiplatform_v1
from google.protobuf import json_format

import fake_vertex
import procs
from serving import predict
from scripts import register_model
from scripts import registry
from scripts import stage_data


@pytest.fixture(scope="module")
def tutorial_export(tmp_path_factory) -> str:
  """A SavedModel as a Keras tutorial writes one: a small Sequential, fit a few steps, `model.export(dir)`; none of
  this project's side files (no schemata) beside it."""
  import keras  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                            keras.layers.Dense(3, activation="softmax")])
  model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
  model.fit(rng.random((32, 4), dtype=np.float32), rng.integers(0, 3, 32), epochs=1, batch_size=16, verbose=0)
  directory = str(tmp_path_factory.mktemp("tutorial") / "exported")
  model.export(directory)
  return directory


@pytest.fixture(scope="module")
def gcs_trainer_export(gcs, churn_data, tmp_path_factory) -> str:
  """The trainer's own export (SavedModel + schema.json + predict schemata), a few steps in this process, staged
  at gs://test-bucket/regtest/run1/model as a job leaves it."""
  out = tmp_path_factory.mktemp("trainer-run")
  code = procs.run_trainer_in_process([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={out}",
                                       "--train_steps=10", "--global_batch_size=64", "--eval_steps=0"])
  assert code == 0
  uri = "gs://test-bucket/regtest/run1/model"
  stage_data.upload_tree(str(out / "model"), uri)
  return uri


def _bucket():
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  return storage.Client(project="p").bucket("test-bucket")


def _listing(prefix: str = "") -> dict[str, str]:
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  return {b.name: b.md5_hash for b in storage.Client(project="p").list_blobs("test-bucket", prefix=prefix)}


def _read(uri: str) -> bytes:
  return _bucket().blob(uri[len("gs://test-bucket/"):]).download_as_bytes()


def _run(capsys, args, fake=None):
  code = register_model.main([*args, *([f"--api_endpoint={fake.endpoint}"] if fake else [])])
  out, err = capsys.readouterr()
  return code, out, err


def _upload_request(body: dict, parent: str):
  request = aiplatform_v1.UploadModelRequest()
  json_format.ParseDict({"parent": parent, **body}, request._pb)  # pylint: disable=protected-access
  return request


def _signature_instance(directory: str) -> dict:
  """An instance built from the exported signature's own input specs: each input, zeros of its shape."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  specs = tf.saved_model.load(directory).signatures["serving_default"].structured_input_signature[1]
  return {name: np.zeros(spec.shape[1:], spec.dtype.as_numpy_dtype).tolist() for name, spec in specs.items()}


def test_a_keras_tutorial_export_on_disk_is_copied_and_registered_with_derived_schemata(gcs, tutorial_export,
                                                                                         capsys):
  """A local dir: copied byte for byte to gs://BUCKET/models/<name>-<digest>/; no schemata of its own, so they are
  derived from serving_default, written there, valid OpenAPI, and true of the instances the signature takes and the
  predictions it makes. A second run copies nothing and registers the same artifact."""
  from openapi_schema_validator import OAS30Validator  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, [f"--model_dir={tutorial_export}", "--bucket=test-bucket", "--project=proj",
                                   "--region=europe-west4"], fake)
    assert code == 0, err
    (body,) = fake.created("models:upload")
    code, again, err = _run(capsys, [f"--model_dir={tutorial_export}", "--bucket=gs://test-bucket", "--project=proj",
                                     "--region=europe-west4"], fake)
    assert code == 0, err
    assert [b["model"]["artifactUri"] for b in fake.created("models:upload")] == [body["model"]["artifactUri"]] * 2
  request = _upload_request(body, "projects/proj/locations/europe-west4")
  model = request.model
  artifact = model.artifact_uri
  assert re.fullmatch(r"gs://test-bucket/models/exported-[0-9a-f]{12}/", artifact), artifact
  files = register_model.local_files(tutorial_export)
  assert "saved_model.pb" in files and any(f.startswith("variables/") for f in files)
  for name in files:  # byte for byte
    with open(os.path.join(tutorial_export, name), "rb") as f:
      assert _read(artifact + name) == f.read(), name
  assert f"({len(files)} files copied, 0 already there)" in out
  assert f"(0 files copied, {len(files)} already there)" in again

  minor = ".".join(tf.__version__.split(".")[:2])
  assert model.container_spec.image_uri == (f"europe-west4-docker.pkg.dev/proj/vertex-tf-trainer/serving:"
                                            f"tf{registry.serving_tf_version(minor)}")
  assert [p.container_port for p in model.container_spec.ports] == [8080]
  assert model.display_name == "exported"
  assert dict(model.labels) == {"training-tf": registry.label_value(minor),
                                "vertex-tf-trainer-source": "register-model"}
  assert model.predict_schemata.instance_schema_uri == artifact + "instance_schema.yaml"
  assert model.predict_schemata.prediction_schema_uri == artifact + "prediction_schema.yaml"
  instance_schema = yaml.safe_load(_read(model.predict_schemata.instance_schema_uri))
  prediction_schema = yaml.safe_load(_read(model.predict_schemata.prediction_schema_uri))
  OAS30Validator.check_schema(instance_schema)
  OAS30Validator.check_schema(prediction_schema)
  instance = _signature_instance(tutorial_export)
  (name, value), = instance.items()
  OAS30Validator(instance_schema).validate(instance)
  OAS30Validator(instance_schema).validate(value)  # one input: the bare value too, as TF Serving takes it
  assert list(OAS30Validator(instance_schema).iter_errors({name: value[:3]}))  # the signature takes 4 numbers
  assert list(OAS30Validator(instance_schema).iter_errors({name: ["a"] * 4}))
  served = predict.load(tutorial_export)
  try:
    predictions = predict.predict(served, {"instances": [instance, value]})["predictions"]
  finally:
    served.close()
  assert len(predictions) == 2
  for prediction in predictions:
    OAS30Validator(prediction_schema).validate(prediction)
  model_id = re.search(r"^registered projects/proj/locations/europe-west4/models/(\d+) ", out, re.M).group(1)
  assert (f"https://console.cloud.google.com/vertex-ai/models/locations/europe-west4/models/{model_id}?project=proj"
          in out.splitlines())
  assert "the model will name europe-west4-docker.pkg.dev/proj/vertex-tf-trainer/serving:" in err


def test_a_trainer_export_in_cloud_storage_is_registered_in_place_with_its_own_schemata(gcs, gcs_trainer_export,
                                                                                        capsys):
  """A gs:// dir is not copied; the schemata the trainer wrote are the ones named, and nothing is written beside
  them. --build_serving_image builds the serving image first and the model names that exact build."""
  before = _listing("regtest/")
  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, [f"--model_dir={gcs_trainer_export}", "--project=proj", "--build_serving_image",
                                   "--label=team=churn"], fake)
    assert code == 0, err
    order = [r["collection"] for r in fake.requests if r["method"] == "POST"]
    (body,) = fake.created("models:upload")
    (build,) = fake.created("builds")
  assert order == ["builds", "models:upload"]
  assert _listing("regtest/") == before  # registered in place: nothing copied, nothing overwritten
  model = _upload_request(body, "projects/proj/locations/us-central1").model
  assert model.artifact_uri == gcs_trainer_export + "/"
  assert model.display_name == "run1-model"
  assert model.predict_schemata.instance_schema_uri == gcs_trainer_export + "/instance_schema.yaml"
  assert model.predict_schemata.prediction_schema_uri == gcs_trainer_export + "/prediction_schema.yaml"
  own = yaml.safe_load(_read(gcs_trainer_export + "/instance_schema.yaml"))
  assert "tenure_months" in own["properties"]  # the trainer's, by feature name
  image = "us-central1-docker.pkg.dev/proj/vertex-tf-trainer/serving:tf2.21.0"
  assert build["images"] == [image]
  assert model.container_spec.image_uri == image.split(":")[0] + "@sha256:" + "ab" * 32
  assert model.labels["team"] == "churn"
  assert "copied" not in out and "wrote" not in out and "warning:" not in err


def test_a_savedmodel_in_cloud_storage_without_schemata_gets_them_written_beside_it(gcs, tutorial_export, capsys):
  uri = "gs://test-bucket/regtest/tutorial/exported"
  stage_data.upload_tree(tutorial_export, uri)
  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, [f"--model_dir={uri}/", "--project=proj", "--serving_image=prebuilt"], fake)
    assert code == 0, err
    (body,) = fake.created("models:upload")
  model = _upload_request(body, "projects/proj/locations/us-central1").model
  assert model.artifact_uri == uri + "/"
  assert model.container_spec.image_uri == "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"
  written = {name: yaml.safe_load(_read(f"{uri}/{name}"))
             for name in ("instance_schema.yaml", "prediction_schema.yaml")}
  instance, prediction = register_model.signature_schemata(register_model.inspect_local(tutorial_export))
  assert written == {"instance_schema.yaml": instance, "prediction_schema.yaml": prediction}
  assert f"wrote {uri}/instance_schema.yaml (derived from the serving_default signature)" in out


def test_deploy_with_an_accelerator_into_an_existing_endpoint_splits_its_traffic(gcs, tutorial_export, capsys):
  """A first model goes to a new endpoint; a second, on a GPU with Vertex's GPU prediction image, joins it with 30%
  and the first keeps the rest. Both requests parse into the API's types."""
  common = [f"--model_dir={tutorial_export}", "--bucket=test-bucket", "--project=proj", "--deploy"]
  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, common, fake)
    assert code == 0, err
    endpoint = re.search(r"^deployed \S+ to (\S+) ", out, re.M).group(1)
    first_id = fake.resources[endpoint]["deployedModels"][0]["id"]
    fake.requests.clear()
    code, out, err = _run(capsys, [*common, f"--endpoint={endpoint.rsplit('/', 1)[1]}", "--traffic_percent=30",
                                   "--deploy_machine_type=g2-standard-8", "--accelerator_type=NVIDIA_L4",
                                   "--accelerator_count=1", "--min_replicas=1", "--max_replicas=3",
                                   "--serving_image=prebuilt", "--display_name=exported-gpu"], fake)
    assert code == 0, err
    calls = [(r["method"], r["collection"]) for r in fake.requests]
    (upload_body,) = fake.created("models:upload")
    (deploy_body,) = fake.created("endpoints:deployModel")
  # The endpoint is read before anything is registered, and again when deploying.
  assert calls == [("GET", None), ("POST", "models:upload"), ("GET", None), ("POST", "endpoints:deployModel")]
  model = _upload_request(upload_body, "projects/proj/locations/us-central1").model
  assert model.container_spec.image_uri == "us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15:latest"
  request = aiplatform_v1.DeployModelRequest()
  json_format.ParseDict({"endpoint": endpoint, **deploy_body}, request._pb)  # pylint: disable=protected-access
  deployed = request.deployed_model
  registered = re.search(r"^registered (\S+) ", out, re.M).group(1)
  assert deployed.model == registered and deployed.display_name == "exported-gpu"
  machine = deployed.dedicated_resources.machine_spec
  assert machine.machine_type == "g2-standard-8"
  assert machine.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_L4 and machine.accelerator_count == 1
  assert (deployed.dedicated_resources.min_replica_count, deployed.dedicated_resources.max_replica_count) == (1, 3)
  assert dict(request.traffic_split) == {"0": 30, first_id: 70}
  assert re.search(rf"^deployed {re.escape(registered)} to {re.escape(endpoint)} \(deployed model \d+, 30% of its "
                   r"traffic\)$", out, re.M)


@pytest.fixture(scope="module")
def not_models(tmp_path_factory) -> dict[str, str]:
  """Directories that are not SavedModels Vertex can serve."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp("not-models")
  (root / "weights").mkdir()
  (root / "weights" / "model.weights.h5").write_bytes(b"\x89HDF\r\n")
  (root / "garbage").mkdir()
  (root / "garbage" / "saved_model.pb").write_bytes(b"\xff\xff\xff\xff not a protocol buffer")
  tf.saved_model.save(tf.Module(), str(root / "no_signature"))
  return {name: str(root / name) for name in ("weights", "garbage", "no_signature")}


@pytest.mark.parametrize("args,message", [
    (["--model_dir={weights}", "--bucket=test-bucket"],
     r"^error: --model_dir=\S+/weights: not a SavedModel: no saved_model\.pb in it; expected the directory "
     r"tf\.saved_model\.save or a Keras model's export\(\) writes$"),
    (["--model_dir={garbage}", "--bucket=test-bucket"],
     r"^error: --model_dir=\S+/garbage: not a SavedModel"),
    (["--model_dir={no_signature}", "--bucket=test-bucket"],
     r"^error: --model_dir=\S+/no_signature: the SavedModel has no 'serving_default' signature \(it has: none\); "),
    (["--model_dir=gs://test-bucket/nothing-here"],
     r"^error: --model_dir=gs://test-bucket/nothing-here: not a SavedModel: no saved_model\.pb there"),
    (["--model_dir={export}/nope", "--bucket=test-bucket"], r"^error: --model_dir=\S+/nope: no such directory"),
    (["--model_dir={export}"],
     r"^error: --model_dir=\S+ is a local directory, and Model Registry reads models from Cloud Storage: pass "
     r"--bucket=BUCKET"),
    (["--model_dir={export}", "--bucket=test-bucket", "--deploy", "--accelerator_type=NVIDIA_TESLA_T5"],
     r"^error: --accelerator_type=NVIDIA_TESLA_T5: not an accelerator Vertex names; expected one of "
     r"NVIDIA_TESLA_K80, .*NVIDIA_L4, "),
    (["--model_dir={export}", "--bucket=test-bucket", "--deploy", "--accelerator_type=NVIDIA_L4"],
     r"^error: --deploy_machine_type=n1-standard-4 --accelerator_type=NVIDIA_L4 --accelerator_count=1: NVIDIA_L4 "
     r"cannot attach to n1-standard-4; .*g2-standard-4"),
    (["--model_dir={export}", "--bucket=test-bucket", "--accelerator_type=NVIDIA_L4"],
     r"^error: --accelerator_type is for --deploy; add --deploy"),
    (["--model_dir={export}", "--bucket=test-bucket", "--deploy", "--traffic_percent=30"],
     r"^error: --traffic_percent=30: the endpoint has no other model to take the rest"),
    (["--model_dir={export}", "--bucket=test-bucket", "--deploy", "--endpoint=projects/p/locations/asia-east1/"
      "endpoints/5"], r"^error: --endpoint=projects/p/locations/asia-east1/endpoints/5: the endpoint is in "
                      r"asia-east1, and the model is registered in us-central1; .* pass --region=asia-east1$"),
    (["--model_dir={export}", "--bucket=test-bucket", "--deploy", "--endpoint=projects/my-project/locations/"
      "us-central1/endpoints/5"], r"^error: --endpoint=projects/my-project/locations/us-central1/endpoints/5: the "
                                  r"endpoint is in project my-project, and the model is registered in p; .* pass "
                                  r"--project=my-project$"),
    (["--model_dir={export}", "--bucket=test-bucket", "--deploy", "--min_replicas=two"],
     r"^error: argument --min_replicas: invalid int value: 'two'$"),
    (["--model_dir={export}", "--bucket=test-bucket", "--label=Team=x"],
     r"^error: --label='Team=x': expected KEY=VALUE"),
    (["--model_dir={export}", "--bucket=Not A Bucket"],
     r"^error: --bucket='Not A Bucket' is not a Cloud Storage bucket"),
    (["--model_dir={export}", "--bucket=test-bucket", "--training_tf=2.3"],
     r"^error: --serving_image \(default, for a model from TF 2\.3\): no serving image TF for models trained on TF "
     r"2\.3 \(known: .*\); pass --serving_image=prebuilt or an image URI$"),
])
def test_bad_inputs_are_one_line_and_send_nothing(gcs, tutorial_export, not_models, capsys, monkeypatch, args,
                                                  message):
  monkeypatch.delenv("BUCKET", raising=False)
  args = [a.format(export=tutorial_export, **not_models) for a in args]
  before = _listing()
  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, [*args, "--project=p"], fake)
    assert not fake.requests
  assert code == 2 and re.search(message, err) and len(err.strip().splitlines()) == 1, err
  assert not out and "Traceback" not in err
  assert _listing() == before


def _no_project_anywhere(monkeypatch, config_dir) -> None:
  for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "PROJECT", "GOOGLE_APPLICATION_CREDENTIALS",
               "CLOUDSDK_ACTIVE_CONFIG_NAME", "CLOUDSDK_AI_REGION", "REGION"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(config_dir))


def test_a_missing_project_is_one_line(tutorial_export, tmp_path, capsys, monkeypatch):
  _no_project_anywhere(monkeypatch, tmp_path / "gcloud")
  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, [f"--model_dir={tutorial_export}", "--bucket=test-bucket"], fake)
    assert not fake.requests
  assert code == 2 and not out and err == f"error: {register_model.gcp_context.MISSING_PROJECT}\n"


def test_the_project_comes_from_the_environment_or_gcloud(tutorial_export, tmp_path, capsys, monkeypatch):
  """GOOGLE_CLOUD_PROJECT, else gcloud's active configuration (project and ai/region) in CLOUDSDK_CONFIG: the dry run
  names them in the requests and sends nothing."""
  config = tmp_path / "gcloud"
  _no_project_anywhere(monkeypatch, config)
  (config / "configurations").mkdir(parents=True)
  (config / "active_config").write_text("dev\n")
  (config / "configurations" / "config_dev").write_text("[core]\nproject = gcloud-proj\n\n[ai]\nregion = asia-east1\n")
  args = [f"--model_dir={tutorial_export}", "--bucket=test-bucket", "--dry_run", "--deploy"]
  with fake_vertex.running() as fake:
    code, out, err = _run(capsys, args, fake)
    assert code == 0, err
    from_gcloud = json.loads(out)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-proj")
    code, out, err = _run(capsys, args, fake)
    assert code == 0, err
    from_env = json.loads(out)
    assert not fake.requests
  assert from_gcloud["project"] == "gcloud-proj (from gcloud configuration 'dev' core/project)"
  assert from_gcloud["upload_model"]["parent"] == "projects/gcloud-proj/locations/asia-east1"
  assert from_gcloud["upload_model"]["model"]["containerSpec"]["imageUri"].startswith(
      "asia-east1-docker.pkg.dev/gcloud-proj/vertex-tf-trainer/serving:")
  assert from_env["project"] == "env-proj (from GOOGLE_CLOUD_PROJECT)"
  assert from_env["upload_model"]["parent"] == "projects/env-proj/locations/asia-east1"  # region still gcloud's
  assert from_env["deploy_model"]["trafficSplit"] == {"0": 100}
  assert from_env["copy"]["to"] == from_env["upload_model"]["model"]["artifactUri"]
  assert from_env["predict_schemata"]["instance_schema.yaml"]["source"].startswith("derived from the serving_default")
