"""What Vertex offers today: the trainer image (Dockerfile), containerSpec configs, the prebuilt images' end of
availability, Cloud Build, and Model Registry. Requests are captured by the fake control plane and parsed into
the API's own types; the build context and sdist go to the emulated bucket."""

import datetime
import glob
import io
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest
from google.cloud import aiplatform_v1
from google.cloud.devtools import cloudbuild_v1
from google.protobuf import json_format

import fake_vertex
import procs
import user_package
from scripts import cloud_build
from scripts import registry
from scripts import submit
from scripts import vertex_config

VALUES = {"PROJECT": "p", "REGION": "us-central1", "BUCKET": "b", "PACKAGE_URI": "gs://b/staging/t.tar.gz",
          "RUN_ID": "r1"}
CONTAINER = """
workerPoolSpecs:
  - machineSpec: {machineType: n1-standard-4}
    replicaCount: 1
    containerSpec:
      imageUri: ${TRAINER_IMAGE}
      command: [python3, -m, trainer.task]
      args: [--train_steps=10]
baseOutputDirectory: {outputUriPrefix: gs://b/runs/r1}
"""


def _load(tmp_path, text, values=VALUES):
  path = tmp_path / "job.yaml"
  path.write_text(text)
  return vertex_config.load(str(path), values, today=datetime.date(2026, 1, 5))  # a prebuilt image still offered


def test_container_configs_run_the_trainer_image(tmp_path):
  for name in ("single_gpu.yaml", "multi_worker_gpu.yaml", "parameter_server.yaml"):
    config = vertex_config.load(os.path.join(procs.REPO, "cloud_configs", name), VALUES)
    for pool in config.body["workerPoolSpecs"]:
      assert pool["containerSpec"]["imageUri"] == "us-central1-docker.pkg.dev/p/vertex-tf-trainer/trainer:0.1.0"
      assert vertex_config.trainer_command(pool) == ["python3", "-m", "trainer.task"]
    assert not config.warnings  # the trainer image has no end of availability
  # The image's ENTRYPOINT, when a config gives no command, is the trainer too.
  assert re.search(r'^ENTRYPOINT \["python3", "-m", "trainer.task"\]$', open(cloud_build.DOCKERFILE).read(), re.M)


@pytest.mark.parametrize("text,message", [
    (CONTAINER.replace("      imageUri: ${TRAINER_IMAGE}\n", ""),
     r"workerPoolSpecs\[0\]\.containerSpec\.imageUri is required: the trainer image"),
    (CONTAINER.replace("[python3, -m, trainer.task]", "[python3, train.py]"),
     r"containerSpec\.command \['python3', 'train.py'\] is not the trainer; expected \[\"python3\", \"-m\", "
     r"\"trainer.task\"\]"),
    (CONTAINER.replace("${TRAINER_IMAGE}", "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"),
     r"is a prebuilt training image, which does not hold the trainer"),
    (CONTAINER.replace("baseOutputDirectory", "  - machineSpec: {machineType: n1-standard-4}\n    replicaCount: 1\n"
                       "    pythonPackageSpec:\n      executorImageUri: ${CPU_IMAGE}\n      packageUris: [${PACKAGE_URI}]\n"
                       "      pythonModule: trainer.task\nbaseOutputDirectory"),
     r"mix pythonPackageSpec and containerSpec trainer pools; every replica must run the same TensorFlow"),
])
def test_bad_container_configs(tmp_path, text, message):
  with pytest.raises(vertex_config.ConfigError, match=message) as raised:
    _load(tmp_path, text)
  assert "\n" not in str(raised.value)


def test_the_images_table_refuses_a_prebuilt_image_from_the_day_after_its_end(tmp_path):
  own = tmp_path / "own.yaml"
  own.write_text(CONTAINER.replace("""    containerSpec:
      imageUri: ${TRAINER_IMAGE}
      command: [python3, -m, trainer.task]
      args: [--train_steps=10]""", """    pythonPackageSpec:
      executorImageUri: ${CPU_IMAGE}
      packageUris: [${PACKAGE_URI}]
      pythonModule: trainer.task"""))
  assert vertex_config.load(str(own), VALUES, today=datetime.date(2026, 3, 1)).warnings == ()
  assert len(vertex_config.load(str(own), VALUES, today=datetime.date(2026, 7, 11)).warnings) == 1  # its last day
  with pytest.raises(vertex_config.ConfigError, match=r"tf-cpu\.2-17\.py310:latest \(TF 2\.17\) reached its end of "
                     r"availability on 2026-07-11 \(Vertex AI's supported-frameworks page, read 2026-12-06\)"):
    vertex_config.load(str(own), VALUES, today=datetime.date(2026, 7, 12))
  info = vertex_config.prebuilt_image_info("us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest")
  assert (info.tf_version, info.python, info.end_of_availability) == ("2.17", "3.10", datetime.date(2026, 7, 11))


def test_the_validator_passes_every_shipped_config_without_a_warning():
  configs = sorted(os.path.relpath(p, procs.REPO) for p in glob.glob(os.path.join(procs.REPO, "cloud_configs", "*")))
  result = subprocess.run([sys.executable, "-m", "scripts.vertex_config", *configs],
                          cwd=procs.REPO, env=procs.trainer_env(), capture_output=True, text=True, check=False)
  assert result.returncode == 0 and result.stderr == "", result.stderr
  assert [line.split(":")[0] for line in result.stdout.splitlines()] == [f"ok  {c}" for c in configs]


# ----- the Dockerfile ------------------------------------------------------------------------------------------


def test_the_dockerfile_lints_clean_and_pins_the_tested_tf():
  hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")
  result = subprocess.run([hadolint, cloud_build.DOCKERFILE], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  pinned = re.search(r"^tensorflow==(\S+)$", open(os.path.join(procs.REPO, "requirements-dev.txt")).read(), re.M)
  assert cloud_build.dockerfile_tf_version() == pinned.group(1)  # the image runs the TF CI tests
  from dockerfile_parse import DockerfileParser  # pylint: disable=g-import-not-at-top
  parser = DockerfileParser(path=cloud_build.DOCKERFILE)
  assert parser.baseimage == f"tensorflow/tensorflow:{pinned.group(1)}-gpu"  # the official GPU image, ARG resolved


def test_the_dockerfiles_install_step_in_a_clean_venv(tmp_path):
  """The image's COPY and RUN, reproduced: a venv with nothing in it stands for the base image's Python (its
  TensorFlow is not needed to install the trainer or to list its flags)."""
  from dockerfile_parse import DockerfileParser  # pylint: disable=g-import-not-at-top
  instructions = DockerfileParser(path=cloud_build.DOCKERFILE).structure
  (copy,) = [i["value"] for i in instructions if i["instruction"] == "COPY"]
  (run,) = [i["value"] for i in instructions if i["instruction"] == "RUN"]
  source, destination = copy.split()
  assert source == "dist/"
  # The build context as submit makes it: the sdist, and a user's package (--extra_package) in dist/extra/.
  sdist = submit.build_sdist(str(tmp_path / "built"))
  wheel = submit.build_extra_package(user_package.write(str(tmp_path / "churn-models")), str(tmp_path))
  context = cloud_build.build_context(sdist, str(tmp_path), extras=(wheel,))
  staged = tmp_path / destination.strip("/")
  with tarfile.open(context) as tar:
    members = [m for m in tar.getmembers() if m.name.startswith(source)]
    for member in members:
      member.name = member.name[len(source):]
    tar.extractall(staged, members=members, filter="data")  # what COPY dist/ /tmp/trainer/ puts in the image
  venv = tmp_path / "image"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
  command = run.replace("python3 ", f"{venv}/bin/python ").replace(destination.rstrip("/"), str(staged))
  env = {**procs.trainer_env(), "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
  env.pop("PYTHONPATH")
  result = subprocess.run(["bash", "-c", command], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  assert not staged.exists()  # the layer keeps no copy of the sdist
  help_text = subprocess.run([f"{venv}/bin/python", "-m", "trainer.task", "--help"], cwd=str(tmp_path), env=env,
                             capture_output=True, text=True, check=False)
  assert "--train_data" in help_text.stdout + help_text.stderr, help_text.stderr[-2000:]
  model = subprocess.run([f"{venv}/bin/python", "-c",
                          "import importlib.util; print(importlib.util.find_spec('churn_models').origin)"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
  assert model.stdout.startswith(str(venv)), model.stderr  # the user's package is in the image beside the trainer
  check = subprocess.run([f"{venv}/bin/python", "-m", "pip", "check"], env=env, capture_output=True, text=True,
                         check=False)
  assert check.returncode == 0, check.stdout


def test_the_serving_image_lints_clean_and_runs_on_vertexs_contract(gcs, churn_data, tmp_path):
  """Dockerfile.serving's files laid out as its COPY and RUN lay them out (the trainer from the sdist, the
  serving package in /srv/serving), its ENTRYPOINT started with the variables Vertex gives a serving container: the
  port, Vertex's routes, the model in Cloud Storage (the emulator). Its TF is the pin CI tests."""
  hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")
  result = subprocess.run([hadolint, cloud_build.SERVING_DOCKERFILE], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert cloud_build.dockerfile_tf_version(cloud_build.SERVING_DOCKERFILE) == cloud_build.dockerfile_tf_version()
  from dockerfile_parse import DockerfileParser  # pylint: disable=g-import-not-at-top
  with open(cloud_build.SERVING_DOCKERFILE, "rb") as f:
    instructions = DockerfileParser(fileobj=f).structure
  copies = [i["value"].split() for i in instructions if i["instruction"] == "COPY"]
  (workdir,) = [i["value"] for i in instructions if i["instruction"] == "WORKDIR"]
  (entrypoint,) = [json.loads(i["value"]) for i in instructions if i["instruction"] == "ENTRYPOINT"]
  assert copies[0] == ["dist/*.tar.gz", "/tmp/trainer/"] and copies[1][:-1] == list(cloud_build.SERVING_FILES)
  image = tmp_path / "image"
  served_from = image / workdir.strip("/")
  copied_to = image / copies[1][-1].strip("/")  # the serving package, where the second COPY puts it
  copied_to.mkdir(parents=True)
  for name in copies[1][:-1]:
    os.link(os.path.join(procs.REPO, name), copied_to / os.path.basename(name))
  site = image / "site-packages"  # where the RUN's pip puts the trainer
  sdist = submit.build_sdist(str(tmp_path / "dist"))
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), sdist], check=True)
  out = tmp_path / "train"
  trained = procs.run_trainer_here([f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={out}",
                                    "--train_steps=40", "--eval_steps=0"])
  assert trained.returncode == 0, trained.stderr[-2000:]
  from scripts import stage_data  # pylint: disable=g-import-not-at-top
  stage_data.upload_tree(str(out / "model"), "gs://test-bucket/serving-image/model")
  port = procs.free_ports(1)[0]
  env = {**procs.trainer_env(), "PYTHONPATH": f"{served_from}:{site}", "AIP_HTTP_PORT": str(port),
         "AIP_STORAGE_URI": "gs://test-bucket/serving-image/model", "AIP_DEPLOYED_MODEL_ID": "789",
         "AIP_HEALTH_ROUTE": "/v1/endpoints/1/deployedModels/789",
         "AIP_PREDICT_ROUTE": "/v1/endpoints/1/deployedModels/789:predict",
         "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"]}
  command = [sys.executable if entrypoint[0] == "python3" else entrypoint[0], *entrypoint[1:],
             "--host=127.0.0.1"]  # the image listens on every interface; a test only on the loopback
  server = subprocess.Popen(command, cwd=str(served_from), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
  try:
    started = json.loads(server.stdout.readline() or "{}")
    assert started.get("listening") == f"http://127.0.0.1:{port}", server.stderr.read()[-3000:]
    import http.client  # pylint: disable=g-import-not-at-top
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", env["AIP_HEALTH_ROUTE"])
    health = connection.getresponse()
    assert health.status == 200 and json.loads(health.read()) == {}
    row = {"tenure_months": 3, "monthly_charges": 95.5, "support_calls": 4, "plan": "basic", "region": "south"}
    connection.request("POST", env["AIP_PREDICT_ROUTE"], body=json.dumps({"instances": [row]}))
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200 and answer["deployedModelId"] == "789", answer
    assert set(answer["predictions"][0]) == {"probabilities", "class_id"}
    connection.close()
  finally:
    server.terminate()
    server.wait(timeout=30)
    server.stdout.close()
    server.stderr.close()


# ----- submission: Cloud Build, the job, Model Registry --------------------------------------------------------


def _bucket(prefix):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  return storage.Client(project="p").bucket("test-bucket"), prefix


def test_build_submit_and_register_are_captured_and_parse_into_the_api_types(gcs, capsys):
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/multi_worker_gpu.yaml", "--project=proj",
                        "--region=europe-west4", "--bucket=test-bucket", "--run_id=c1", "--build_image",
                        "--upload_model", "--args=--train_steps=50", f"--api_endpoint={fake.endpoint}",
                        "--poll_secs=0.05"])
    out = capsys.readouterr().out
    assert code == 0, out
    (build_body,) = fake.created("builds")
    (job_body,) = fake.created("customJobs")
    (upload_body,) = fake.created("models:upload")
    order = [r["collection"] for r in fake.requests if r["method"] == "POST"]
  # The repository made, the image built before the job, the model registered after it.
  assert order == ["repositories", "builds", "customJobs", "models:upload"]

  build = cloudbuild_v1.Build()
  json_format.ParseDict(build_body, build._pb)  # pylint: disable=protected-access
  (image,) = build.images
  assert re.fullmatch(r"europe-west4-docker\.pkg\.dev/proj/vertex-tf-trainer/trainer:src-[0-9a-f]{16}", image)
  assert list(build.steps[0].args) == ["build", "--build-arg", "TF_VERSION=2.21.0", "-t", image, "."]
  bucket, _ = _bucket("")
  context = bucket.blob(build.source.storage_source.object).download_as_bytes()  # the context really is there
  with tarfile.open(fileobj=io.BytesIO(context)) as tar:
    names = sorted(tar.getnames())
  assert names[0] == "Dockerfile" and re.fullmatch(r"dist/vertex-tf-trainer-[\d.]+\.tar\.gz", names[1])

  job = aiplatform_v1.CustomJob()
  json_format.ParseDict(job_body, job._pb)  # pylint: disable=protected-access
  for pool in job.job_spec.worker_pool_specs:  # the job runs exactly the build, by digest
    assert pool.container_spec.image_uri == image.split(":")[0] + "@sha256:" + "ab" * 32
    assert list(pool.container_spec.args)[-1] == "--train_steps=50"
    assert not pool.python_package_spec.package_uris

  request = aiplatform_v1.UploadModelRequest()
  json_format.ParseDict({"parent": "projects/proj/locations/europe-west4", **upload_body},
                        request._pb)  # pylint: disable=protected-access
  model = request.model
  assert model.artifact_uri == "gs://test-bucket/runs/c1/model/"
  # The project's serving image for the training TF (2.21, the trainer image's), on Vertex's container contract.
  assert model.container_spec.image_uri == "europe-west4-docker.pkg.dev/proj/vertex-tf-trainer/serving:tf2.21.0"
  assert [p.container_port for p in model.container_spec.ports] == [8080]
  assert model.predict_schemata.instance_schema_uri == "gs://test-bucket/runs/c1/model/instance_schema.yaml"
  assert model.predict_schemata.prediction_schema_uri == "gs://test-bucket/runs/c1/model/prediction_schema.yaml"
  job_id = job_body.get("name", "") or fake.requests[-2]["path"]
  assert dict(model.labels) == {"vertex-tf-trainer-job": model.labels["vertex-tf-trainer-job"],
                                "vertex-tf-trainer-run": "c1", "training-tf": "2-21"}
  assert model.labels["vertex-tf-trainer-job"].isdigit() and model.labels["vertex-tf-trainer-job"] in out
  del job_id
  assert re.search(r"^registered projects/proj/locations/europe-west4/models/\d+ ", out, re.M)


def test_a_trainer_image_job_registers_with_the_matching_serving_image(capsys, tmp_path):
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/single_cpu.yaml", "--project=proj", "--bucket=bkt", "--run_id=d2",
                        "--upload_model", "--dry_run", f"--rendered_config={tmp_path}/job.yaml",
                        f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests
  assert code == 0
  printed = json.loads(capsys.readouterr().out.partition("\n# config written to ")[0])
  upload = printed["upload_model"]
  request = aiplatform_v1.UploadModelRequest()
  json_format.ParseDict(upload, request._pb)  # pylint: disable=protected-access
  assert request.model.labels["training-tf"] == "2-21"
  # A model trained in the trainer image (the Dockerfile's TF 2.21) is served on TF 2.21.0.
  assert request.model.container_spec.image_uri == "us-central1-docker.pkg.dev/proj/vertex-tf-trainer/serving:tf2.21.0"


def test_the_prebuilt_prediction_image_is_a_choice_with_its_end_of_availability():
  spec, warnings = registry.serving_container("prebuilt", training_tf="2.17", project="p", region="us-central1",
                                              today=datetime.date(2026, 12, 5))
  assert spec == {"imageUri": "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"}
  assert warnings == ["tf2-cpu.2-15:latest reaches its end of availability on 2027-01-14; move to the serving image "
                      "matching TF 2.17 (Dockerfile.serving: omit --serving_image, build it with --build_serving_image)"]
  with pytest.raises(registry.RegistryError, match=r"^--serving_image=prebuilt: tf2-cpu\.2-15:latest is past its end "
                     r"of availability on Vertex \(2027-01-14; Vertex AI's supported-frameworks page, read 2026-12-06\); "
                     r"use the serving image matching TF 2\.21"):
    registry.serving_container("prebuilt", training_tf="2.21", project="p", region="europe-west4",
                               today=datetime.date(2027, 2, 1))
  _, warnings = registry.serving_container("prebuilt", training_tf="2.21", project="p", region="us-central1",
                                           today=datetime.date(2026, 6, 1))
  assert warnings == []
  assert registry.serving_container("gcr.io/p/mine:1", training_tf="2.21", project="p", region="r") == (
      {"imageUri": "gcr.io/p/mine:1"}, [])


def test_the_serving_image_is_built_before_the_job_and_registered_by_digest(gcs, capsys):
  """--build_serving_image: Dockerfile.serving, the sdist and the serving package go to Cloud Build (TF of the
  training image); the model then names exactly that build."""
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/single_cpu.yaml", "--project=proj", "--bucket=test-bucket",
                        "--run_id=s1", "--upload_model", "--build_serving_image", "--args=--train_steps=50",
                        f"--api_endpoint={fake.endpoint}", "--poll_secs=0.05"])
    out = capsys.readouterr().out
    assert code == 0, out
    trainer_build, build_body = fake.created("builds")  # the trainer image, then the serving image
    (upload_body,) = fake.created("models:upload")
    order = [r["collection"] for r in fake.requests if r["method"] == "POST"]
  assert order == ["repositories", "builds", "builds", "customJobs", "models:upload"]
  assert "/trainer:src-" in trainer_build["images"][0]
  build = cloudbuild_v1.Build()
  json_format.ParseDict(build_body, build._pb)  # pylint: disable=protected-access
  image = "us-central1-docker.pkg.dev/proj/vertex-tf-trainer/serving:tf2.21.0"
  assert list(build.steps[0].args) == ["build", "--build-arg", "TF_VERSION=2.21.0", "-t", image, "."]
  bucket, _ = _bucket("")
  context = bucket.blob(build.source.storage_source.object).download_as_bytes()
  with tarfile.open(fileobj=io.BytesIO(context)) as tar:
    names = sorted(tar.getnames())
    dockerfile = tar.extractfile("Dockerfile").read().decode()
  assert dockerfile == open(cloud_build.SERVING_DOCKERFILE).read()
  assert set(cloud_build.SERVING_FILES) <= set(names)
  assert any(re.fullmatch(r"dist/vertex-tf-trainer-[\d.]+\.tar\.gz", name) for name in names)
  request = aiplatform_v1.UploadModelRequest()
  json_format.ParseDict({"parent": "projects/proj/locations/us-central1", **upload_body},
                        request._pb)  # pylint: disable=protected-access
  assert request.model.container_spec.image_uri == image.split(":")[0] + "@sha256:" + "ab" * 32
  assert [p.container_port for p in request.model.container_spec.ports] == [8080]


@pytest.mark.parametrize("args,message", [
    (["--config=cloud_configs/single_gpu.yaml", "--trainer_image=not an image"],
     r"^error: --trainer_image='not an image' is not an image name; expected e\.g\. "
     r"REGION-docker\.pkg\.dev/PROJECT/vertex-tf-trainer/trainer:TAG$"),
    (["--config=cloud_configs/single_gpu.yaml", "--upload_model", "--no_follow"],
     r"^error: --upload_model waits for the job to succeed"),
    (["--config={no_output}", "--upload_model"],
     r"^error: --upload_model needs the job's model dir in Cloud Storage, and \S+ has no "
     r"baseOutputDirectory\.outputUriPrefix"),
])
def test_bad_container_submissions_send_nothing(gcs, capsys, tmp_path, args, message):
  no_output = tmp_path / "no_output.yaml"
  no_output.write_text(CONTAINER.split("baseOutputDirectory")[0])
  args = [a.replace("{no_output}", str(no_output)) for a in args]
  with fake_vertex.running() as fake:
    code = submit.main(args + ["--project=p", "--bucket=test-bucket", f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests
  captured = capsys.readouterr()
  assert code == 2
  assert re.search(message, captured.err, re.M) and len(captured.err.strip().splitlines()) == 1, captured.err


def test_a_registered_model_is_deployed_to_an_endpoint(gcs, capsys):
  """--deploy: a new endpoint, the model on dedicated machines with all its traffic; into an existing endpoint,
  the new model takes --traffic_percent and the models there keep their shares of the rest."""
  common = ["--config=cloud_configs/single_cpu.yaml", "--project=proj", "--bucket=test-bucket", "--upload_model",
            "--deploy",
            "--deploy_machine_type=n1-standard-8", "--min_replicas=1", "--max_replicas=3", "--poll_secs=0.05"]
  with fake_vertex.running() as fake:
    assert submit.main([*common, "--run_id=dep1", f"--api_endpoint={fake.endpoint}"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    (endpoint_body,) = fake.created("endpoints")
    (deploy_body,) = fake.created("endpoints:deployModel")
    order = [r["collection"] for r in fake.requests if r["method"] == "POST"]
    assert order == ["repositories", "builds", "customJobs", "models:upload", "endpoints", "endpoints:deployModel"]
    endpoint = re.search(r"^deployed (\S+) to (\S+) ", out, re.M).group(2)
    # A second model into the same endpoint, with 25% of its traffic.
    assert submit.main([*common, "--run_id=dep2", f"--endpoint={endpoint}", "--traffic_percent=25",
                        f"--api_endpoint={fake.endpoint}"]) == 0, capsys.readouterr()
    second = fake.created("endpoints:deployModel")[-1]
    first_id = fake.resources[endpoint]["deployedModels"][0]["id"]
  assert endpoint_body["displayName"] == "single_cpu-dep1"
  request = aiplatform_v1.DeployModelRequest()
  json_format.ParseDict({"endpoint": endpoint, **deploy_body}, request._pb)  # pylint: disable=protected-access
  deployed = request.deployed_model
  assert re.fullmatch(r"projects/proj/locations/us-central1/models/\d+", deployed.model)
  assert deployed.dedicated_resources.machine_spec.machine_type == "n1-standard-8"
  assert (deployed.dedicated_resources.min_replica_count, deployed.dedicated_resources.max_replica_count) == (1, 3)
  assert dict(request.traffic_split) == {"0": 100}
  assert second["trafficSplit"] == {"0": 25, first_id: 75}


@pytest.mark.parametrize("args,message", [
    (["--deploy"], r"^error: --deploy is for the model --upload_model registers; add --upload_model$"),
    (["--upload_model", "--deploy", "--traffic_percent=30"],
     r"^error: --traffic_percent=30: the endpoint has no other model to take the rest; its only model takes 100 "
     r"\(a share below 100 is for a model added to an existing --endpoint\)$"),
    (["--upload_model", "--deploy", "--min_replicas=3", "--max_replicas=2"],
     r"^error: --min_replicas=3 --max_replicas=2: expected 1 <= min <= max$"),
    (["--upload_model", "--deploy", "--endpoint=my-endpoint"],
     r"^error: --endpoint='my-endpoint': expected projects/P/locations/L/endpoints/N, or the endpoint's number N$"),
    (["--upload_model", "--deploy", "--endpoint=projects/other/locations/us-central1/endpoints/7"],
     r"^error: --endpoint=projects/other/locations/us-central1/endpoints/7: the endpoint is in project other, and "
     r"the model is registered in proj; deploy to an endpoint of proj, or pass --project=other$"),
    (["--upload_model", "--deploy", "--endpoint=projects/proj/locations/europe-west4/endpoints/7"],
     r"^error: --endpoint=projects/proj/locations/europe-west4/endpoints/7: the endpoint is in europe-west4, and "
     r"the model is registered in us-central1; .* pass --region=europe-west4$"),
    (["--upload_model", "--build_serving_image", "--serving_image=prebuilt"],
     r"^error: --build_serving_image builds the project's serving image; --serving_image=prebuilt names another"),
])
def test_bad_deployments_send_nothing(capsys, args, message):
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/single_cpu.yaml", "--project=proj", "--bucket=bkt", *args,
                        f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests
  captured = capsys.readouterr()
  assert code == 2 and re.search(message, captured.err) and len(captured.err.strip().splitlines()) == 1, captured.err
