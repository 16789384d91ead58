"""Packaging and submission: the sdist, cloud_configs validation, captured submissions, gcloud lines."""

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
import yaml
from google.cloud import aiplatform_v1
from google.protobuf import json_format

import fake_vertex
import procs
import user_package
from scripts import submit
from scripts import vertex_config

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

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
    containerSpec:
      imageUri: ${TRAINER_IMAGE}
"""
# A config of one's own on a prebuilt image, judged on a day its image was still offered.
PACKAGE = """
workerPoolSpecs:
  - machineSpec: {machineType: n1-standard-4}
    replicaCount: 1
    pythonPackageSpec:
      executorImageUri: ${CPU_IMAGE}
      packageUris: [${PACKAGE_URI}]
      pythonModule: trainer.task
"""
BEFORE_THE_END = datetime.date(2026, 1, 5)


@pytest.mark.parametrize("text,message", [
    (GOOD.replace("replicaCount", "replicaCont"),
     r'Message type "google.cloud.aiplatform.v1.WorkerPoolSpec" has no field named "replicaCont"'),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: n1-standard-4, acceleratorType: NVIDIA_TESLA_T5, acceleratorCount: 1}"),
     r"workerPoolSpecs\[0\]\.machineSpec\.acceleratorType 'NVIDIA_TESLA_T5' is not an accelerator Vertex names; "
     r"expected one of NVIDIA_TESLA_K80, .*NVIDIA_H200_141GB, NVIDIA_B200, NVIDIA_GB200, NVIDIA_RTX_PRO_6000, "),
    (GOOD.replace("replicaCount: 1", "replicaCount: 2"),
     r"workerPoolSpecs\[0\]\.replicaCount is 2; the chief pool must have exactly 1 replica$"),
    (GOOD + "  - {}\n  - machineSpec: {machineType: n1-highmem-4}\n    replicaCount: 1\n    containerSpec:\n"
            "      imageUri: ${TRAINER_IMAGE}\n",
     r"workerPoolSpecs\[2\] \(parameter servers\) needs workers in workerPoolSpecs\[1\]"),
    ("workerPoolSpecs: [unclosed", r"not valid YAML at line 1"),
    ("- just\n- a list\n", r"expected a YAML mapping \(a CustomJobSpec\), got list"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: n1-standard-4, acceleratorType: NVIDIA_TESLA_T4, acceleratorCount: 3}"),
     r"acceleratorCount 3 is not valid for NVIDIA_TESLA_T4 on n1-standard-4; allowed: 1, 2, 4$"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: a2-highgpu-2g, acceleratorType: NVIDIA_TESLA_A100, acceleratorCount: 1}"),
     r"a2-highgpu-2g comes with 2 x NVIDIA_TESLA_A100; got 1 x NVIDIA_TESLA_A100$"),
    # Surely wrong pairs stay errors: an H200 comes on its own machine, never on n1; a CPU-only family takes none.
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: n1-standard-8, acceleratorType: NVIDIA_H200_141GB, acceleratorCount: 8}"),
     r"NVIDIA_H200_141GB cannot attach to n1-standard-8; n1 machines take NVIDIA_TESLA_T4, NVIDIA_TESLA_V100, "
     r"NVIDIA_TESLA_P100, NVIDIA_TESLA_P4 \(an NVIDIA_H200_141GB comes with its own machine type: a3-ultragpu-8g\)$"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: e2-standard-8, acceleratorType: NVIDIA_L4, acceleratorCount: 1}"),
     r"e2-standard-8 takes no GPUs \(1 x NVIDIA_L4 requested\)"),
    (GOOD.replace("{machineType: n1-standard-4}", "{machineType: a3-ultragpu-8g}"),
     r"a3-ultragpu-8g comes with 8 x NVIDIA_H200_141GB; give acceleratorType NVIDIA_H200_141GB and "
     r"acceleratorCount 8$"),
    (GOOD.replace("{machineType: n1-standard-4}",
                  "{machineType: a4-highgpu-4g, acceleratorType: NVIDIA_B200, acceleratorCount: 4}"),
     r"a4-highgpu-4g is not a machine type Vertex lists in the a4 family, which has a4-highgpu-8g$"),
    (GOOD + "scheduling: {strategy: FLEX_START, timeout: 700000s}\n",
     r"scheduling\.timeout 700000s is over FLEX_START's 7 days \(604800s\)$"),
    (GOOD + "scheduling: {strategy: SPOT, maxWaitDuration: 600s}\n",
     r"scheduling\.maxWaitDuration applies to strategy FLEX_START \(Dynamic Workload Scheduler\), got strategy SPOT$"),
    (GOOD.replace("${TRAINER_IMAGE}", "${TRAINER}"), r"unknown placeholder\(s\) \$\{TRAINER\}"),
])
def test_bad_configs(tmp_path, text, message):
  _refused_in_one_line(tmp_path, text, message)


def _refused_in_one_line(tmp_path, text: str, message: str, **load_kwargs) -> None:
  path = tmp_path / "job.yaml"
  path.write_text(text)
  with pytest.raises(vertex_config.ConfigError, match=message) as raised:
    vertex_config.load(str(path), VALUES, **load_kwargs)
  assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


@pytest.mark.parametrize("machine,accelerator,count", [
    ("a3-ultragpu-8g", "NVIDIA_H200_141GB", 8), ("a4-highgpu-8g", "NVIDIA_B200", 8),
    ("a4x-highgpu-4g", "NVIDIA_GB200", 4), ("a2-megagpu-16g", "NVIDIA_TESLA_A100", 16),
    ("a3-edgegpu-8g", "NVIDIA_H100_80GB", 8), ("g4-standard-48", "NVIDIA_RTX_PRO_6000", 1),
    ("ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4),
])
def test_todays_machines_validate(tmp_path, machine, accelerator, count):
  path = tmp_path / "job.yaml"
  path.write_text(GOOD.replace("{machineType: n1-standard-4}", "{machineType: %s, acceleratorType: %s, "
                               "acceleratorCount: %d}" % (machine, accelerator, count)))
  assert vertex_config.load(str(path), VALUES).warnings == ()


def test_an_unknown_machine_family_is_a_warning_for_vertex_to_judge(tmp_path):
  path = tmp_path / "job.yaml"
  path.write_text(GOOD.replace("{machineType: n1-standard-4}",
                               "{machineType: a5-highgpu-8g, acceleratorType: NVIDIA_GB200, acceleratorCount: 8}"))
  (warning,) = vertex_config.load(str(path), VALUES).warnings
  assert warning == (f"{path}: workerPoolSpecs[0].machineSpec: a5-highgpu-8g is a machine family this project's "
                     "table (scripts/vertex_config.py, read 2026-12-06) does not know; Vertex will judge 8 x "
                     "NVIDIA_GB200 on it")


def _refused_before_anything_is_built(path, capsys) -> str:
  """Submits `path` against a captured Vertex: exit 2, no request sent, nothing built or staged; its stderr."""
  before = _list("")
  with fake_vertex.running() as fake:
    assert submit.main([f"--config={path}", "--project=p", "--bucket=test-bucket",
                        f"--api_endpoint={fake.endpoint}"]) == 2
    assert not fake.requests
  assert _list("") == before
  return capsys.readouterr().err


def test_an_arm_host_is_refused_the_x86_trainer_image_before_anything_is_built(tmp_path, gcs, capsys):
  """GB200 (A4X) hosts are NVIDIA Grace, Arm: the Dockerfile's x86-64 image would fail there with "exec format
  error" after the job waited for its machines. The config validates; submitting it with the default image is
  refused in one line; an image of the user's own (arm64) is taken, with a warning."""
  path = tmp_path / "gb200.yaml"
  path.write_text(GOOD.replace("{machineType: n1-standard-4}",
                               "{machineType: a4x-highgpu-4g, acceleratorType: NVIDIA_GB200, acceleratorCount: 4}"))
  assert vertex_config.load(str(path), VALUES).warnings == ()
  err = _refused_before_anything_is_built(path, capsys)
  assert err.startswith(f"error: {path}: workerPoolSpecs[0] runs on a4x-highgpu-4g, an Arm (aarch64) host; the "
                        "trainer image (Dockerfile, FROM tensorflow/tensorflow:2.21.x-gpu) is built for x86-64")
  assert "--trainer_image=" in err and err.count("\n") == 1
  own = "us-central1-docker.pkg.dev/p/images/trainer-arm64:1"
  assert submit.main([f"--config={path}", "--project=p", "--bucket=test-bucket", f"--trainer_image={own}",
                      "--dry_run", f"--rendered_config={tmp_path / 'rendered.yaml'}"]) == 0
  captured = capsys.readouterr()
  assert (f"warning: workerPoolSpecs[0] runs on a4x-highgpu-4g, an Arm host: --trainer_image={own} must be built "
          "for linux/arm64") in captured.err
  assert f'"imageUri": "{own}"' in captured.out


@pytest.mark.parametrize("text,message", [
    (PACKAGE.replace("      pythonModule: trainer.task\n", ""),
     r"workerPoolSpecs\[0\]\.pythonPackageSpec\.pythonModule is required$"),
    (PACKAGE.replace("${CPU_IMAGE}", "python:3.10"),
     r"executorImageUri 'python:3.10' is not a Vertex prebuilt TensorFlow training image"),
    (PACKAGE.replace("{machineType: n1-standard-4}",
                     "{machineType: n1-standard-4, acceleratorType: NVIDIA_TESLA_T4, acceleratorCount: 1}"),
     r"has NVIDIA_TESLA_T4 but the CPU image .* use a tf-gpu image$"),
    (PACKAGE.replace("${PACKAGE_URI}", "${PACKAGE}"), r"unknown placeholder\(s\) \$\{PACKAGE\}"),
])
def test_bad_package_configs(tmp_path, text, message):
  _refused_in_one_line(tmp_path, text, message, today=BEFORE_THE_END)


def test_a_prebuilt_training_image_past_its_end_of_availability_is_refused(tmp_path, gcs, capsys):
  path = tmp_path / "own.yaml"
  path.write_text(PACKAGE.replace("{machineType: n1-standard-4}", "{machineType: n1-standard-8, acceleratorType: "
                                  "NVIDIA_TESLA_T4, acceleratorCount: 1}").replace("${CPU_IMAGE}", "${GPU_IMAGE}"))
  assert vertex_config.load(str(path), VALUES, today=datetime.date(2026, 7, 11)).warnings == (
      f"{path}: workerPoolSpecs[0].pythonPackageSpec.executorImageUri: tf-gpu.2-17.py310:latest (TF 2.17) reaches its "
      "end of availability on 2026-07-11; move to the trainer image (containerSpec, ${TRAINER_IMAGE})",)
  err = _refused_before_anything_is_built(path, capsys)
  assert err == (f"error: {path}: workerPoolSpecs[0].pythonPackageSpec.executorImageUri: tf-gpu.2-17.py310:latest "
                 "(TF 2.17) reached its end of availability on 2026-07-11 (Vertex AI's supported-frameworks page, read "
                 "2026-12-06) and Vertex no longer runs it; run the trainer image instead: a containerSpec with imageUri "
                 "${TRAINER_IMAGE}, as every config in cloud_configs/ has (python -m scripts.submit builds it from the "
                 "Dockerfile)\n")


def test_every_shipped_config_runs_the_trainer_image():
  for path in CONFIGS:
    config = vertex_config.load(path, VALUES)
    for pool in config.job_spec["workerPoolSpecs"]:
      if vertex_config.trainer_spec(pool):
        assert pool["containerSpec"]["imageUri"] == "us-central1-docker.pkg.dev/p/vertex-tf-trainer/trainer:0.1.0"
    assert config.warnings == (), path


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


def test_the_same_tree_builds_the_same_sdist_bytes(tmp_path):
  """Content-addressed staging reuses an upload only if a rebuild of the same code gives the same bytes: the
  files' times (a fresh clone, a touched file) and the build's time must not reach the archive."""
  import hashlib  # pylint: disable=g-import-not-at-top

  def digest(archive: str) -> str:
    with open(archive, "rb") as f:
      return hashlib.sha256(f.read()).hexdigest()

  first = submit.build_sdist(str(tmp_path / "first"))
  task = os.path.join(procs.REPO, "trainer", "task.py")
  stat = os.stat(task)
  os.utime(task, (stat.st_atime, stat.st_mtime + 3600))  # as a fresh clone or an editor's save would
  try:
    second = submit.build_sdist(str(tmp_path / "second"))
  finally:
    os.utime(task, (stat.st_atime, stat.st_mtime))
  assert digest(first) == digest(second)
  with tarfile.open(second) as tar:
    members = tar.getmembers()
  assert [m.name for m in members] == sorted(m.name for m in members)
  assert {m.mtime for m in members} == {int(os.environ.get("SOURCE_DATE_EPOCH", 315532800))}
  assert {(m.uid, m.uname) for m in members} == {(0, "")}
  assert submit.package_uri("b", first) == submit.package_uri("b", second)


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


def _job(body: dict) -> "aiplatform_v1.CustomJob":
  job = aiplatform_v1.CustomJob()
  json_format.ParseDict(body, job._pb)  # pylint: disable=protected-access
  return job


def _context_names(fake, build_body: dict) -> list[str]:
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  source = build_body["source"]["storageSource"]
  data = storage.Client(project="p").bucket(source["bucket"]).blob(source["object"]).download_as_bytes()
  with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    return sorted(tar.getnames())


def test_submission_builds_the_trainer_image_once_and_reuses_it_by_source(gcs, capsys):
  """The first submission makes the repository, builds the image tagged by its source and runs it by digest; a
  second submission of the same source finds the tag and builds nothing."""
  common = ["--config=cloud_configs/multi_worker_gpu.yaml", "--project=proj", "--region=europe-west4",
            "--bucket=test-bucket", "--args=--train_steps=50", "--env=MODE=test", "--poll_secs=0.05",
            "--service_account=trainer@proj.iam.gserviceaccount.com",
            "--tensorboard=projects/proj/locations/europe-west4/tensorboards/42"]
  staged_before = set(_list("staging/"))
  with fake_vertex.running() as fake:
    code = submit.main([*common, "--run_id=t1", f"--api_endpoint={fake.endpoint}"])
    out = capsys.readouterr().out
    assert code == 0, out
    (build,) = fake.created("builds")
    (body,) = fake.created("customJobs")
    assert [r["collection"] for r in fake.requests if r["method"] == "POST"] == ["repositories", "builds", "customJobs"]
    context = _context_names(fake, build)
    code = submit.main([*common, "--run_id=t2", f"--api_endpoint={fake.endpoint}", "--no_follow"])
    again = capsys.readouterr().out
    assert code == 0, again
    assert len(fake.created("builds")) == 1  # the same source: reused
    second = fake.created("customJobs")[1]
  (image,) = build["images"]
  assert re.fullmatch(r"europe-west4-docker\.pkg\.dev/proj/vertex-tf-trainer/trainer:src-[0-9a-f]{16}", image)
  assert "created the Artifact Registry repository projects/proj/locations/europe-west4/repositories/" \
      "vertex-tf-trainer" in out
  assert context[0] == "Dockerfile" and re.fullmatch(r"dist/vertex-tf-trainer-[\d.]+\.tar\.gz", context[1])
  by_digest = image.split(":")[0] + "@sha256:" + "ab" * 32
  assert f"reusing {by_digest} ({image}: built from the same source)" in again
  job = _job(body)
  pools = job.job_spec.worker_pool_specs
  assert [p.replica_count for p in pools] == [1, 2]
  assert pools[1].machine_spec.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_TESLA_T4
  assert pools[1].machine_spec.accelerator_count == 2
  for pool in pools:  # the job runs exactly the build, by digest; nothing is installed from the bucket
    assert pool.container_spec.image_uri == by_digest and not pool.python_package_spec.package_uris
    assert list(pool.container_spec.args)[-1] == "--train_steps=50"
    assert [(e.name, e.value) for e in pool.container_spec.env] == [("MODE", "test")]
  assert job.job_spec.service_account == "trainer@proj.iam.gserviceaccount.com"
  # Vertex streams AIP_TENSORBOARD_LOG_DIR (scalars, profiler traces) into this instance as the job runs.
  assert job.job_spec.tensorboard == "projects/proj/locations/europe-west4/tensorboards/42"
  assert job.job_spec.base_output_directory.output_uri_prefix == "gs://test-bucket/runs/t1"
  assert _job(second).job_spec.worker_pool_specs[0].container_spec.image_uri == by_digest
  job_id = re.search(r"^submitted projects/proj/locations/europe-west4/customJobs/(\d+)$", out, re.M).group(1)
  assert f"console: https://console.cloud.google.com/agent-platform/locations/europe-west4/training/{job_id}" \
      "?project=proj" in out
  assert "JOB_STATE_SUCCEEDED" in out
  # Only the image's build context went to the bucket: a container holds its packages, nothing installs an sdist.
  assert [n.split("/")[-1].split("-context-")[0] for n in set(_list("staging/")) - staged_before] == ["trainer-image"]


def test_a_repository_that_cannot_be_made_is_refused_with_the_command_that_makes_it(gcs, capsys, monkeypatch):
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from scripts import artifact_registry  # pylint: disable=g-import-not-at-top

  class NoPermission:
    def get_repository(self, name):
      raise exceptions.NotFound(name)

    def create_repository(self, **kwargs):
      raise exceptions.PermissionDenied("artifactregistry.repositories.create denied")

  monkeypatch.setattr(artifact_registry, "client", lambda api_endpoint: NoPermission())
  with fake_vertex.running() as fake:
    assert submit.main(["--config=cloud_configs/single_cpu.yaml", "--project=proj", "--bucket=test-bucket",
                        f"--api_endpoint={fake.endpoint}"]) == 2
    assert not fake.created("builds") and not fake.created("customJobs")
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err == ("error: cannot create the Artifact Registry repository projects/proj/locations/us-central1/"
                 "repositories/vertex-tf-trainer (artifactregistry.repositories.create denied); create it with: "
                 "gcloud artifacts repositories create vertex-tf-trainer --repository-format=docker "
                 "--location=us-central1 --project=proj")


def test_the_project_comes_from_the_users_gcloud_setup(gcs, capsys, monkeypatch, tmp_path):
  """No --project: GOOGLE_CLOUD_PROJECT, else gcloud's active configuration (project and ai/region)."""
  config_dir = tmp_path / "gcloud"
  (config_dir / "configurations").mkdir(parents=True)
  (config_dir / "active_config").write_text("work\n")
  (config_dir / "configurations" / "config_work").write_text("[core]\nproject = from-gcloud\n[ai]\nregion = asia-east1\n")
  for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "PROJECT", "CLOUDSDK_AI_REGION", "REGION"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(config_dir))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
  assert submit.main([f"--config={procs.REPO}/cloud_configs/single_cpu.yaml", "--bucket=bkt", "--dry_run",
                      "--run_id=g1"]) == 0
  captured = capsys.readouterr()
  assert "project from-env (from GOOGLE_CLOUD_PROJECT), region asia-east1 (from gcloud configuration 'work' " \
      "ai/region)" in captured.err
  assert "gcloud ai custom-jobs create --project=from-env --region=asia-east1 " in captured.out
  monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
  assert submit.main([f"--config={procs.REPO}/cloud_configs/single_cpu.yaml", "--bucket=bkt", "--dry_run",
                      "--run_id=g2"]) == 0
  captured = capsys.readouterr()
  assert "project from-gcloud (from gcloud configuration 'work' core/project)" in captured.err
  assert "asia-east1-docker.pkg.dev/from-gcloud/vertex-tf-trainer/trainer:src-" in captured.out


def test_the_project_of_application_default_credentials(monkeypatch, tmp_path):
  """A service-account key file's project, read by google.auth.default() without any network."""
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives.asymmetric import rsa  # pylint: disable=g-import-not-at-top
  from scripts import gcp_context  # pylint: disable=g-import-not-at-top

  key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
      serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
  key_file = tmp_path / "key.json"
  key_file.write_text(json.dumps({"type": "service_account", "project_id": "adc-project", "private_key_id": "1",
                                  "private_key": key, "client_email": "sa@adc-project.iam.gserviceaccount.com",
                                  "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}))
  environ = {"CLOUDSDK_CONFIG": str(tmp_path / "none"), "GOOGLE_APPLICATION_CREDENTIALS": str(key_file)}
  monkeypatch.setattr(os, "environ", {**os.environ, **environ})
  for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "PROJECT"):
    os.environ.pop(name, None)
  found = gcp_context.project(None, os.environ)
  assert (found.value, found.source) == ("adc-project", f"Application Default Credentials ({key_file})")
  assert gcp_context.project(None, {"CLOUDSDK_CONFIG": str(tmp_path / "none")}) is None
  assert str(gcp_context.region(None, {"CLOUDSDK_CONFIG": str(tmp_path / "none")})) == \
      "us-central1 (from the default region)"


def test_extra_packages_are_built_into_the_trainer_image(gcs, capsys, tmp_path):
  project = user_package.write(str(tmp_path / "churn-models"))
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/multi_worker_gpu.yaml", "--project=proj", "--bucket=test-bucket",
                        "--run_id=t2", f"--extra_package={project}", f"--args={user_package.MODEL_FLAG}",
                        f"--api_endpoint={fake.endpoint}", "--no_follow"])
    assert code == 0, capsys.readouterr()
    (build,) = fake.created("builds")
    context = _context_names(fake, build)
    (body,) = fake.created("customJobs")
  assert "dist/extra/churn_models-0.1.0-py3-none-any.whl" in context  # the Dockerfile installs dist/extra/*
  for pool in _job(body).job_spec.worker_pool_specs:
    assert not pool.python_package_spec.package_uris and "@sha256:" in pool.container_spec.image_uri
  # The image's tag names its source: another package, another tag.
  archive = submit.build_sdist(str(tmp_path / "dist"))
  wheel = submit.build_extra_package(project, str(tmp_path))
  from scripts import cloud_build  # pylint: disable=g-import-not-at-top
  assert cloud_build.source_digest(archive) != cloud_build.source_digest(archive, extras=(wheel,))
  assert build["images"][0].endswith(cloud_build.source_digest(archive, extras=(wheel,)))


def test_hp_tuning_submission(gcs, capsys):
  """Every trial runs as the service account and streams its logs into the TensorBoard instance given."""
  with fake_vertex.running() as fake:
    code = submit.main(["--config=cloud_configs/hp_tuning.yaml", "--project=proj", "--bucket=test-bucket",
                        "--region=us-central1", "--service_account=tuner@proj.iam.gserviceaccount.com",
                        "--tensorboard=projects/proj/locations/us-central1/tensorboards/7",
                        f"--api_endpoint={fake.endpoint}", "--no_follow"])
    assert code == 0, capsys.readouterr()
    (body,) = fake.created("hyperparameterTuningJobs")
  job = aiplatform_v1.HyperparameterTuningJob()
  json_format.ParseDict(body, job._pb)  # pylint: disable=protected-access
  assert job.max_trial_count == 12 and job.parallel_trial_count == 3
  assert job.study_spec.metrics[0].metric_id == "accuracy"
  trial_pool = job.trial_job_spec.worker_pool_specs[0]
  assert "--hypertune_metric=accuracy" in trial_pool.container_spec.args and "@sha256:" in trial_pool.container_spec.image_uri
  assert (job.trial_job_spec.service_account, job.trial_job_spec.tensorboard) == (
      "tuner@proj.iam.gserviceaccount.com", "projects/proj/locations/us-central1/tensorboards/7")


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
    context = _context_names(fake, fake.created("builds")[0])
  assert "dist/extra/churn_models-0.1.0-py3-none-any.whl" in context  # every trial runs the image holding it
  assert "@sha256:" in body["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["imageUri"]
  assert "not importable here" not in capsys.readouterr().err


def test_dry_run_prints_request_and_an_equivalent_gcloud_command(capsys, monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)  # the config lands in vertex_jobs/ under the current directory
  with fake_vertex.running() as fake:
    code = submit.main([f"--config={procs.REPO}/cloud_configs/parameter_server.yaml", "--project=proj", "--bucket=bkt",
                        "--run_id=d1", "--dry_run", f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests  # nothing sent
  out = capsys.readouterr().out
  assert code == 0
  json_part, _, rest = out.partition("\n# config written to ")
  printed = json.loads(json_part)
  header, build, command = rest.strip().splitlines()
  assert header.startswith("vertex_jobs/parameter_server-d1.yaml, the trainer image's build context to "
                           "vertex_jobs/parameter_server-d1-trainer-image/; by hand")
  image = printed["trainer_image"]["image"]
  assert build == ("gcloud builds submit vertex_jobs/parameter_server-d1-trainer-image --project=proj "
                   f"--region=us-central1 --tag={image}")
  assert command == ("gcloud ai custom-jobs create --project=proj --region=us-central1 "
                     "--display-name=parameter_server-d1 --config=vertex_jobs/parameter_server-d1.yaml")
  with open(command.split("--config=")[1]) as f:
    rendered = yaml.safe_load(f)
  assert rendered == printed["request"]["jobSpec"]  # the gcloud command carries the same spec
  assert [p["replicaCount"] for p in rendered["workerPoolSpecs"]] == [1, 2, 1]
  # The context a hand-run `gcloud builds submit` sends is the one Cloud Build would get: the Dockerfile and the
  # trainer's sdist (what the image installs), nothing else.
  context = tmp_path / "vertex_jobs" / "parameter_server-d1-trainer-image"
  with open(os.path.join(procs.REPO, "Dockerfile"), "rb") as f:
    assert (context / "Dockerfile").read_bytes() == f.read()
  (sdist,) = (context / "dist").iterdir()
  assert sdist.name.startswith("vertex-tf-trainer-") and sdist.name.endswith(".tar.gz")
  assert sorted(p.name for p in context.iterdir()) == ["Dockerfile", "dist"]


@pytest.mark.parametrize("args,message", [
    (["--config=cloud_configs/single_cpu.yaml", "--project=p"], r"^error: --bucket is required"),
    (["--config=cloud_configs/single_cpu.yaml", "--bucket=test-bucket"],
     r"^error: no Google Cloud project: pass --project, set GOOGLE_CLOUD_PROJECT, or run `gcloud config set project "
     r"PROJECT_ID` \(or set PROJECT\)$"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--bucket=test-bucket", "--service_account=me"],
     r"^error: --service_account='me' is not a service account e-mail; expected NAME@PROJECT.iam.gserviceaccount.com$"),
    (["--config=cloud_configs/nope.yaml", "--project=p", "--bucket=test-bucket"],
     r"^error: cloud_configs/nope.yaml: cannot read"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--region=us-central1", "--bucket=test-bucket",
      "--tensorboard=projects/p/locations/us-central1/tensorboards/1"],
     r"^error: --tensorboard needs --service_account: Vertex AI uploads a job's TensorBoard logs only as a service "
     r"account of the job's own"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--region=europe-west4", "--bucket=test-bucket",
      "--service_account=t@p.iam.gserviceaccount.com", "--tensorboard=projects/p/locations/us-central1/tensorboards/1"],
     r"^error: --tensorboard='projects/p/locations/us-central1/tensorboards/1' is in us-central1, the job runs in "
     r"europe-west4: a job writes only to a TensorBoard instance of its own region$"),
    (["--config=cloud_configs/single_cpu.yaml", "--project=p", "--bucket=test-bucket",
      "--service_account=t@p.iam.gserviceaccount.com", "--tensorboard=1234"],
     r"^error: --tensorboard='1234': expected projects/PROJECT/locations/REGION/tensorboards/ID"),
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
def test_bad_submissions_upload_nothing(gcs, capsys, monkeypatch, tmp_path, args, message):
  for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
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
  from trainer.core import hypertune  # pylint: disable=g-import-not-at-top
  path = tmp_path / "hypertune" / "output.metrics"
  line = hypertune.report({"eval_accuracy": 0.91, "eval_loss": 0.2}, metric="accuracy", trial="3", step=100,
                          path=str(path), clock=lambda: 1700000000.0)
  assert json.loads(path.read_text()) == line == {"timestamp": 1700000000.0, "trial": "3", "accuracy": "0.91",
                                                  "global_step": "100", "checkpoint_path": ""}
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match=r"^--hypertune_metric='auc' was not computed; available: accuracy, loss"):
    hypertune.report({"eval_accuracy": 0.9, "eval_loss": 0.2}, metric="auc", trial=None, step=1, path=str(path))
