"""Packaging and submission: the sdist, cloud_configs validation, captured submissions, gcloud lines."""

import glob
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest
import yaml
from google.cloud import aiplatform_v1
from google.protobuf import json_format

import fake_vertex
import procs
import user_package
from scripts import submit
from scripts import vertex_config

CONFIGS = sorted(glob.glob(os.path.join(procs.REPO, "cloud_configs", "*.yaml")))
VALUES = {"PROJECT": "p", "REGION": "us-central1", "BUCKET": "b", "PACKAGE_URI": "gs://b/staging/t.tar.gz",
          "RUN_ID": "r1"}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_cloud_config_validates(path):
  with open(path) as f:
    first = f.readline()
  assert first.startswith("# ")  # each opens with what it is and the command that uses it
  assert "python -m scripts.submit --config=cloud_configs/" + os.path.basename(path) in open(path).read()
  config = vertex_config.load(path, VALUES)
  assert config.job_spec["workerPoolSpecs"][0]["replicaCount"] == 1


def test_configs_cover_every_topology():
  kinds = {os.path.basename(p) for p in CONFIGS}
  assert {"single_cpu.yaml", "single_multi_gpu.yaml", "multi_worker_gpu.yaml", "multi_worker_reduction_server.yaml",
          "parameter_server.yaml", "spot_multi_worker.yaml", "hp_tuning.yaml"} <= kinds


GOOD = """
workerPoolSpecs:
  - machineSpec: {machineType: n1-standard-4}
    replicaCount: 1
    pythonPackageSpec:
      executorImageUri: ${CPU_IMAGE}
      packageUris: [${PACKAGE_URI}]
      pythonModule: trainer.task
"""


@pytest.mark.parametrize("text,message", [
    (GOOD.replace("replicaCount", "replicaCont"),
     r'Message type "google.cloud.aiplatform.v1.WorkerPoolSpec" has no field named "replicaCont"'),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: n1-standard-4, acceleratorType: NVIDIA_TESLA_T5, acceleratorCount: 1}"),
     r'Invalid enum value NVIDIA_TESLA_T5 for enum type google.cloud.aiplatform.v1.AcceleratorType'),
    (GOOD.replace("      pythonModule: trainer.task\n", ""),
     r"workerPoolSpecs\[0\]\.pythonPackageSpec\.pythonModule is required$"),
    (GOOD.replace("replicaCount: 1", "replicaCount: 2"),
     r"workerPoolSpecs\[0\]\.replicaCount is 2; the chief pool must have exactly 1 replica$"),
    (GOOD + "  - {}\n  - machineSpec: {machineType: n1-highmem-4}\n    replicaCount: 1\n    pythonPackageSpec:\n"
            "      executorImageUri: ${CPU_IMAGE}\n      packageUris: [${PACKAGE_URI}]\n      pythonModule: trainer.task\n",
     r"workerPoolSpecs\[2\] \(parameter servers\) needs workers in workerPoolSpecs\[1\]"),
    ("workerPoolSpecs: [unclosed", r"not valid YAML at line 1"),
    ("- just\n- a list\n", r"expected a YAML mapping \(a CustomJobSpec\), got list"),
    (GOOD.replace("${CPU_IMAGE}", "python:3.10"),
     r"executorImageUri 'python:3.10' is not a Vertex prebuilt TensorFlow training image"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: n1-standard-4, acceleratorType: NVIDIA_TESLA_T4, acceleratorCount: 3}"),
     r"acceleratorCount 3 is not valid for NVIDIA_TESLA_T4 on n1-standard-4; allowed: 1, 2, 4$"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: a2-highgpu-2g, acceleratorType: NVIDIA_TESLA_A100, acceleratorCount: 1}"),
     r"a2-highgpu-2g comes with 2 x NVIDIA_TESLA_A100; got 1 x NVIDIA_TESLA_A100$"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: n1-standard-4, acceleratorType: NVIDIA_TESLA_T4, acceleratorCount: 1}"),
     r"has NVIDIA_TESLA_T4 but the CPU image .* use a tf-gpu image$"),
    (GOOD.replace("${PACKAGE_URI}", "${PACKAGE}"), r"unknown placeholder\(s\) \$\{PACKAGE\}"),
])
def test_bad_configs(tmp_path, text, message):
  path = tmp_path / "job.yaml"
  path.write_text(text)
  with pytest.raises(vertex_config.ConfigError, match=message) as raised:
    vertex_config.load(str(path), VALUES)
  assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


def test_sdist_holds_the_trainer_alone(tmp_path):
  archive = submit.build_sdist(str(tmp_path))
  with tarfile.open(archive) as tar:
    files = sorted(m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile())
  assert all(n.startswith(("trainer/", "vertex_tf_trainer.egg-info/")) or n in ("setup.py", "setup.cfg", "PKG-INFO",
                                                                                "MANIFEST.in", "README.md")
             for n in files), files
  assert "trainer/task.py" in files and not [n for n in files if n.startswith(("tests", "scripts", "cloud_configs"))]
  with tarfile.open(archive) as tar:
    requires = [m for m in tar.getmembers() if m.name.endswith("requires.txt")]
    text = tar.extractfile(requires[0]).read().decode() if requires else ""
  assert "tensorflow" not in text.split("[")[0]  # only in the optional [tf] extra


def _versions(python: str) -> dict:
  code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
          "('tensorflow', 'keras', 'protobuf', 'absl-py')}))")
  return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_sdist_installs_into_a_prebuilt_like_image_without_touching_tf(tmp_path, churn_data):
  """A fresh venv that already has TensorFlow (ours, linked in with a .pth file, as an image's would be)."""
  archive = submit.build_sdist(str(tmp_path / "dist"))
  venv = tmp_path / "image"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = str(venv / "bin" / "python")
  site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        capture_output=True, text=True, check=True).stdout.strip()
  ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(site, "preinstalled.pth"), "w") as f:
    f.write(ours + "\n")
  before = _versions(python)
  listing_before = set(os.listdir(site))
  result = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", archive],
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert _versions(python) == before  # tensorflow, keras, protobuf, absl untouched
  added = set(os.listdir(site)) - listing_before
  assert {a for a in added if not a.startswith(("vertex_tf_trainer", "trainer"))} == set(), added
  elsewhere = str(tmp_path)  # run from outside the repo: the installed package is what runs
  env = procs.trainer_env()
  env.pop("PYTHONPATH")
  help_text = subprocess.run([python, "-m", "trainer.task", "--help"], cwd=elsewhere, env=env, capture_output=True,
                             text=True, check=False)
  # absl exits 1 after --help by design; the usage text is what matters.
  assert "--train_data" in help_text.stdout + help_text.stderr, help_text.stderr[-2000:]
  where = subprocess.run([python, "-c", "import trainer; print(trainer.__file__)"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
  assert where.startswith(site)  # the installed copy, not the repo's
  run = subprocess.run([python, "-m", "trainer.task", f"--train_data={churn_data}/train/*.tfrecord",
                        f"--output_dir={tmp_path}/out", "--train_steps=20"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=240, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  assert os.path.exists(f"{tmp_path}/out/model/saved_model.pb")


def _list(bucket_prefix):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  return [b.name for b in storage.Client(project="p").list_blobs("test-bucket", prefix=bucket_prefix)]


def test_submission_is_captured_and_parses_into_the_api_type(gcs, capsys):
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/multi_worker_gpu.yaml", "--project=proj", "--region=europe-west4",
                        "--bucket=test-bucket", "--run_id=t1", "--args=--train_steps=50", "--env=MODE=test",
                        f"--api_endpoint={fake.endpoint}", "--poll_secs=0.05"])
    out = capsys.readouterr().out
    assert code == 0, out
    (body,) = fake.created("customJobs")
  job = aiplatform_v1.CustomJob()
  json_format.ParseDict(body, job._pb)  # pylint: disable=protected-access
  pools = job.job_spec.worker_pool_specs
  assert [p.replica_count for p in pools] == [1, 2]
  assert pools[1].machine_spec.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_TESLA_T4
  assert pools[1].machine_spec.accelerator_count == 2
  package = pools[0].python_package_spec
  assert package.python_module == "trainer.task"
  assert package.executor_image_uri.endswith("tf-gpu.2-17.py310:latest")
  assert list(package.args)[-1] == "--train_steps=50" and list(pools[1].python_package_spec.args) == list(package.args)
  assert [(e.name, e.value) for e in package.env] == [("MODE", "test")]
  (uri,) = package.package_uris
  assert uri.startswith("gs://test-bucket/staging/vertex-tf-trainer-") and uri.endswith(".tar.gz")
  assert uri[len("gs://test-bucket/"):] in _list("staging/")  # the sdist really went to the (emulated) bucket
  assert job.job_spec.base_output_directory.output_uri_prefix == "gs://test-bucket/runs/t1"
  assert "JOB_STATE_SUCCEEDED" in out


def test_extra_packages_are_staged_and_listed_after_the_trainer(gcs, capsys, tmp_path):
  project = user_package.write(str(tmp_path / "churn-models"))
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/multi_worker_gpu.yaml", "--project=proj", "--bucket=test-bucket",
                        "--run_id=t2", f"--extra_package={project}", f"--args={user_package.MODEL_FLAG}",
                        f"--api_endpoint={fake.endpoint}", "--no_follow"])
    assert code == 0, capsys.readouterr()
    (body,) = fake.created("customJobs")
  job = aiplatform_v1.CustomJob()
  json_format.ParseDict(body, job._pb)  # pylint: disable=protected-access
  for pool in job.job_spec.worker_pool_specs:
    trainer_uri, wheel_uri = pool.python_package_spec.package_uris
    assert trainer_uri.endswith(".tar.gz") and "/vertex-tf-trainer-" in trainer_uri
    assert wheel_uri.endswith("/churn_models-0.1.0-py3-none-any.whl")  # pip parses a wheel's name: kept as is
    assert wheel_uri[len("gs://test-bucket/"):] in _list("staging/")


def test_hp_tuning_submission(gcs, capsys):
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/hp_tuning.yaml", "--project=proj", "--bucket=test-bucket",
                        f"--api_endpoint={fake.endpoint}", "--no_follow"])
    assert code == 0, capsys.readouterr()
    (body,) = fake.created("hyperparameterTuningJobs")
  job = aiplatform_v1.HyperparameterTuningJob()
  json_format.ParseDict(body, job._pb)  # pylint: disable=protected-access
  assert job.max_trial_count == 12 and job.parallel_trial_count == 3
  assert job.study_spec.metrics[0].metric_id == "accuracy"
  assert "--hypertune_metric=accuracy" in job.trial_job_spec.worker_pool_specs[0].python_package_spec.args


def test_a_study_the_trainer_cannot_run_is_not_sent(gcs, capsys, tmp_path):
  """The study's parameters are checked as the trainer will read them, before anything is uploaded or sent:
  a name nothing reads, a range the trainer refuses. A conditional spec that passes goes out whole."""
  shipped = open(os.path.join(procs.REPO, "cloud_configs", "hp_tuning.yaml")).read()
  cases = [(shipped.replace("parameterId: dropout", "parameterId: drop_out"),
            r"^error: studySpec parameter 'drop_out' \(0\.\.0\.4\): --drop_out=0\.0 is refused by the trainer: "
            r"Unknown command line flag 'drop_out'"),
           (shipped.replace("{minValue: 0.0, maxValue: 0.4}", "{minValue: 0.0, maxValue: 1.0}"),
            r"^error: studySpec parameter 'dropout' \(0\.\.1\): --dropout=1\.0 is refused by the trainer: "
            r"--dropout must be in \[0, 1\), got 1\.0$")]
  before = _list("")
  for i, (text, message) in enumerate(cases):
    path = tmp_path / f"bad{i}.yaml"
    path.write_text(text)
    with fake_vertex.running() as fake:
      assert submit.main([f"--config={path}", "--project=p", "--bucket=test-bucket",
                          f"--api_endpoint={fake.endpoint}"]) == 2
      assert not fake.requests
    err = capsys.readouterr().err
    assert re.search(message, err, re.M) and len(err.strip().splitlines()) == 1, err
  assert _list("") == before
  conditional = tmp_path / "conditional.yaml"
  conditional.write_text(shipped.replace("""    - parameterId: global_batch_size""", """    - parameterId: optimizer
      categoricalValueSpec: {values: ["adam", "adamw"]}
      conditionalParameterSpecs:
        - parentCategoricalValues: {values: ["adamw"]}
          parameterSpec:
            parameterId: weight_decay
            doubleValueSpec: {minValue: 0.0001, maxValue: 0.01}
            scaleType: UNIT_LOG_SCALE
    - parameterId: global_batch_size"""))
  with fake_vertex.running() as fake:
    assert submit.main([f"--config={conditional}", "--project=proj", "--bucket=test-bucket",
                        f"--api_endpoint={fake.endpoint}", "--no_follow"]) == 0, capsys.readouterr()
    (body,) = fake.created("hyperparameterTuningJobs")
  job = aiplatform_v1.HyperparameterTuningJob()
  json_format.ParseDict(body, job._pb)  # pylint: disable=protected-access
  optimizer = next(p for p in job.study_spec.parameters if p.parameter_id == "optimizer")
  child = optimizer.conditional_parameter_specs[0]
  assert child.parent_categorical_values.values == ["adamw"] and child.parameter_spec.parameter_id == "weight_decay"


def test_a_study_of_a_users_model_checks_it_and_sends_it_to_every_trial(gcs, capsys, tmp_path):
  """--extra_package with a tuning config: the built package is installed to read the model as the trials will
  (its HPARAMS decide which names a study may tune), and it is listed in the trial spec's packageUris."""
  project = user_package.write(str(tmp_path / "churn-models"))
  shipped = open(os.path.join(procs.REPO, "cloud_configs", "hp_tuning.yaml")).read()
  common = ["--project=proj", "--bucket=test-bucket", f"--extra_package={project}", f"--args={user_package.MODEL_FLAG}"]
  with fake_vertex.running() as fake:
    # The shipped study tunes --dropout, which this model (no HPARAMS) does not read.
    assert submit.main(["--config=cloud_configs/hp_tuning.yaml", *common, f"--api_endpoint={fake.endpoint}"]) == 2
    assert not fake.requests
  err = capsys.readouterr().err
  assert re.search(r"^error: studySpec parameter 'dropout' .*--dropout is read by the built-in models only; "
                   r"--model=churn_models:build does not read it", err, re.M) and len(err.strip().splitlines()) == 1, err
  no_dropout = tmp_path / "no_dropout.yaml"
  no_dropout.write_text(shipped.replace("""    - parameterId: dropout
      doubleValueSpec: {minValue: 0.0, maxValue: 0.4}
      scaleType: UNIT_LINEAR_SCALE
""", ""))
  with fake_vertex.running() as fake:
    assert submit.main([f"--config={no_dropout}", *common, f"--api_endpoint={fake.endpoint}", "--no_follow"]) == 0, \
        capsys.readouterr()
    (body,) = fake.created("hyperparameterTuningJobs")
  uris = body["trialJobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]["packageUris"]
  assert len(uris) == 2 and uris[1].endswith("churn_models-0.1.0-py3-none-any.whl"), uris
  assert "not importable here" not in capsys.readouterr().err


def test_dry_run_prints_request_and_an_equivalent_gcloud_command(capsys):
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/parameter_server.yaml", "--project=proj", "--bucket=bkt",
                        "--run_id=d1", "--dry_run", f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests  # nothing sent
  out = capsys.readouterr().out
  assert code == 0
  json_part, _, rest = out.partition("\n# config written to ")
  printed = json.loads(json_part)
  command = rest.strip().splitlines()[-1]
  assert command.startswith("gcloud ai custom-jobs create --project=proj --region=us-central1 "
                            "--display-name=parameter_server-d1 --config=")
  with open(command.split("--config=")[1]) as f:
    rendered = yaml.safe_load(f)
  assert rendered == printed["request"]["jobSpec"]  # the gcloud command carries the same spec
  assert [p["replicaCount"] for p in rendered["workerPoolSpecs"]] == [1, 2, 1]


@pytest.mark.parametrize("args,message", [
    (["--config=cloud_configs/single_cpu.yaml", "--project=p"], r"^error: --bucket is required"),
    (["--config=cloud_configs/single_cpu.yaml", "--bucket=test-bucket"], r"^error: --project is required"),
    (["--config=cloud_configs/nope.yaml", "--project=p", "--bucket=test-bucket"],
     r"^error: cloud_configs/nope.yaml: cannot read"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--bucket=test-bucket", "--env=NOEQUALS"],
     r"^error: --env expects KEY=VALUE, got 'NOEQUALS'"),
    # A dry run printed a ready-to-run gcloud command for these; the job would fail only on Vertex.
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--bucket=test-bucket", "--dry_run",
      "--args=--no_such_flag=1"], r"^error: workerpool0: trainer args rejected: Unknown command line flag 'no_such_flag'"),
    (["--config=cloud_configs/parameter_server.yaml", "--project=p", "--bucket=test-bucket", "--dry_run",
      "--args=--train_steps=-1"],
     r"^error: workerpool0: trainer args rejected: --train_steps must be a positive integer, got -1$"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--bucket=test-bucket",
      "--extra_package=setup.py"],
     r"^error: --extra_package=setup.py: not a package archive; expected a directory with pyproject.toml or "
     r"setup.py, or a built .tar.gz, .zip, .whl$"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--bucket=Bad Bucket!"],
     r"^error: --bucket='Bad Bucket!' is not a Cloud Storage bucket name"),
])
def test_bad_submissions_upload_nothing(gcs, capsys, args, message):
  before = _list("")
  with fake_vertex.running() as fake:
    assert submit.main(args + [f"--api_endpoint={fake.endpoint}"]) == 2
    assert not fake.requests
  import re  # pylint: disable=g-import-not-at-top
  captured = capsys.readouterr()
  assert re.search(message, captured.err, re.M) and len(captured.err.strip().splitlines()) == 1, captured.err
  assert not captured.out  # no request or gcloud command printed
  assert _list("") == before


def test_invalid_config_uploads_nothing(gcs, tmp_path, capsys):
  bad = tmp_path / "bad.yaml"
  bad.write_text(GOOD.replace("replicaCount: 1", "replicaCount: 2"))
  before = _list("")
  assert submit.main([f"--config={bad}", "--project=p", "--bucket=test-bucket"]) == 2
  assert "the chief pool must have exactly 1 replica" in capsys.readouterr().err
  assert _list("") == before


def test_hypertune_metric_line(tmp_path):
  from trainer import hypertune  # pylint: disable=g-import-not-at-top
  path = tmp_path / "hypertune" / "output.metrics"
  line = hypertune.report({"eval_accuracy": 0.91, "eval_loss": 0.2}, metric="accuracy", trial="3", step=100,
                          path=str(path), clock=lambda: 1700000000.0)
  assert json.loads(path.read_text()) == line == {"timestamp": 1700000000.0, "trial": "3", "accuracy": "0.91",
                                                  "global_step": "100", "checkpoint_path": ""}
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match=r"^--hypertune_metric='auc' was not computed; available: accuracy, loss"):
    hypertune.report({"eval_accuracy": 0.9, "eval_loss": 0.2}, metric="auc", trial=None, step=1, path=str(path))
