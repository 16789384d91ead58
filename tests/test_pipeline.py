"""The Vertex AI Pipelines pipeline: compiled YAML, captured submit/schedule requests, a local run."""

import json
import os
import re

import pytest
import yaml

import fake_vertex
import procs
import user_package
from scripts import pipeline
from scripts import registry
from scripts import stage_data
from scripts import vertex_config

CONFIG = "cloud_configs/multi_worker_gpu.yaml"


def test_compiled_training_step_has_the_config_pools(tmp_path, capsys):
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", f"--config={CONFIG}", "--bucket=bkt", "--run_id=r1", f"--output={output}"]) == 0
  compiled = yaml.safe_load(output.read_text())
  tasks = compiled["root"]["dag"]["tasks"]
  assert set(tasks) == {"check-data", "worker-pool-specs", "custom-training-job", "read-metrics"}
  train = tasks["custom-training-job"]
  assert train["inputs"]["parameters"]["worker_pool_specs"]["taskOutputParameter"]["producerTask"] == \
      "worker-pool-specs"
  assert "check-data" in tasks["worker-pool-specs"]["dependentTasks"]
  assert "custom-training-job" in tasks["read-metrics"]["dependentTasks"]
  base_specs = json.loads(tasks["worker-pool-specs"]["inputs"]["parameters"]["base_specs"]["runtimeValue"]["constant"])
  package = re.search(r"stage .* to (gs://\S+) before running", capsys.readouterr().out).group(1)
  expected = vertex_config.load(os.path.join(procs.REPO, CONFIG), {"BUCKET": "bkt", "RUN_ID": "r1",
                                                                      "PACKAGE_URI": package}).body["workerPoolSpecs"]
  assert base_specs == expected  # one source of truth: the cloud config's pools, package and module
  assert [p["replicaCount"] for p in base_specs] == [1, 2]
  assert set(compiled["root"]["inputDefinitions"]["parameters"]) == {
      "project", "location", "train_data", "eval_data", "base_output_dir", "train_steps", "learning_rate",
      "global_batch_size"}


def test_a_model_upload_step_registers_the_trained_model(tmp_path, capsys):
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", "--config=cloud_configs/container_single_gpu.yaml", "--bucket=bkt",
                        "--project=p", "--run_id=r1", "--upload_model", f"--output={output}"]) == 0, capsys.readouterr()
  compiled = yaml.safe_load(output.read_text())
  tasks = compiled["root"]["dag"]["tasks"]
  assert "read-metrics" in tasks["model-artifact"]["dependentTasks"]  # registered only after a good run
  upload = tasks["model-upload"]
  assert upload["inputs"]["artifacts"]["unmanaged_container_model"]["taskOutputArtifact"]["producerTask"] == \
      "model-artifact"
  image = tasks["model-artifact"]["inputs"]["parameters"]["serving_image"]["runtimeValue"]["constant"]
  assert image in registry.prediction_images() and "/tf2-cpu.2-" in image
  executor = compiled["deploymentSpec"]["executors"]["exec-model-upload"]["container"]
  assert "google_cloud_pipeline_components" in " ".join(executor["command"] + executor.get("args", []))
  # A container config's pools take the run's parameters like package pools.
  specs = pipeline.worker_pool_specs.python_func(
      base_specs=json.dumps([{"containerSpec": {"imageUri": "i", "args": ["--a=1"]}}]), train_data="t",
      eval_data="e", train_steps=5, learning_rate=0.1, global_batch_size=8)
  assert specs[0]["containerSpec"]["args"][:2] == ["--a=1", "--train_data=t"]


def test_compiled_training_step_installs_the_users_package(tmp_path, capsys):
  project = user_package.write(str(tmp_path / "churn-models"))
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", f"--config={CONFIG}", "--bucket=bkt", "--run_id=r1", f"--output={output}",
                        f"--extra_package={project}"]) == 0
  tasks = yaml.safe_load(output.read_text())["root"]["dag"]["tasks"]
  base_specs = json.loads(tasks["worker-pool-specs"]["inputs"]["parameters"]["base_specs"]["runtimeValue"]["constant"])
  printed = capsys.readouterr().out
  for pool in base_specs:
    trainer_uri, wheel_uri = pool["pythonPackageSpec"]["packageUris"]
    assert trainer_uri.endswith(".tar.gz") and wheel_uri.endswith("/churn_models-0.1.0-py3-none-any.whl")
    assert f"to {wheel_uri}" in printed  # the compile step says where to stage it


def test_worker_pool_specs_step_appends_run_parameters():
  specs = pipeline.worker_pool_specs.python_func(
      base_specs=json.dumps([{"pythonPackageSpec": {"args": ["--train_steps=1"]}}, {}]), train_data="gs://b/t*",
      eval_data="gs://b/e*", train_steps=7, learning_rate=0.5, global_batch_size=64)
  assert specs[0]["pythonPackageSpec"]["args"] == ["--train_steps=1", "--train_data=gs://b/t*", "--eval_data=gs://b/e*",
                                                   "--train_steps=7", "--learning_rate=0.5", "--global_batch_size=64"]
  assert specs[1] == {}


def test_submit_and_schedule_are_captured(gcs, capsys):
  with fake_vertex.running() as fake:
    common = [f"--config={CONFIG}", "--project=proj", "--region=europe-west4", "--bucket=test-bucket",
              f"--api_endpoint={fake.endpoint}", "--param=train_steps=321", "--param=learning_rate=0.01"]
    assert pipeline.main(["submit", *common, "--run_id=s1"]) == 0, capsys.readouterr().err
    assert pipeline.main(["schedule", *common, "--run_id=s2", "--cron=30 2 * * 1-5", "--time_zone=Europe/Paris",
                          "--max_concurrent_runs=2", "--start_time=2027-01-01T00:00:00Z",
                          "--end_time=2027-06-01T00:00:00Z", "--max_runs=50"]) == 0, capsys.readouterr().err
    (job,) = fake.created("pipelineJobs")
    (schedule,) = fake.created("schedules")
  params = job["runtimeConfig"]["parameterValues"]
  assert params["train_steps"] == 321 and params["learning_rate"] == 0.01 and params["project"] == "proj"
  assert params["train_data"] == "gs://test-bucket/data/train/*.tfrecord"
  assert job["runtimeConfig"]["gcsOutputDirectory"] == "gs://test-bucket/pipeline-root"
  assert job["pipelineSpec"]["pipelineInfo"]["name"] == "vertex-tf-trainer"
  assert schedule["cron"] == "TZ=Europe/Paris 30 2 * * 1-5"
  assert schedule["maxConcurrentRunCount"] == "2" or schedule["maxConcurrentRunCount"] == 2
  assert schedule["startTime"].startswith("2027-01-01T00:00:00") and schedule["endTime"].startswith("2027-06-01")
  assert int(schedule["maxRunCount"]) == 50
  scheduled = schedule["createPipelineJobRequest"]["pipelineJob"]
  assert scheduled["runtimeConfig"]["parameterValues"]["train_steps"] == 321


@pytest.mark.parametrize("args,message", [
    (["schedule", "--cron=0 25 * * *"], r"--cron='0 25 \* \* \*' is not a 5-field cron expression"),
    (["schedule", "--cron=every day"], r"--cron='every day' is not a 5-field cron expression"),
    (["schedule", "--cron=0 3 * * *", "--time_zone=Mars/Olympus"], r"--time_zone='Mars/Olympus' is not an IANA"),
    (["schedule", "--cron=0 3 * * *", "--start_time=2027-02-01T00:00:00Z", "--end_time=2027-01-01T00:00:00Z"],
     r"--end_time=2027-01-01T00:00:00Z is not after --start_time"),
    (["submit", "--param=epochs=3"], r"--param 'epochs=3': unknown parameter; expected NAME=VALUE with NAME one of "
                                     r"train_data, eval_data, base_output_dir, train_steps"),
    (["submit", "--param=train_steps=many"], r"--param train_steps='many': expected a int"),
    (["compile", "--config=cloud_configs/hp_tuning.yaml"], r"takes a custom-job config, not hp_tuning"),
])
def test_bad_input_compiles_and_sends_nothing(tmp_path, capsys, args, message):
  output = tmp_path / "p.yaml"
  argv = args + ([] if any(a.startswith("--config") for a in args) else [f"--config={CONFIG}"])
  with fake_vertex.running() as fake:
    code = pipeline.main(argv + ["--project=p", "--bucket=b", f"--output={output}", f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests
  assert code == 2
  assert re.search(message, capsys.readouterr().err)
  assert not output.exists()


def test_invalid_cloud_config_compiles_nothing(tmp_path, capsys):
  bad = tmp_path / "bad.yaml"
  bad.write_text(open(os.path.join(procs.REPO, CONFIG)).read().replace("replicaCount: 2", "replicaCont: 2"))
  output = tmp_path / "p.yaml"
  assert pipeline.main(["compile", f"--config={bad}", "--bucket=b", f"--output={output}"]) == 2
  assert 'has no field named "replicaCont"' in capsys.readouterr().err
  assert not output.exists()


def test_local_pipeline_run_on_the_emulator(gcs, churn_data, capsys):
  for split in ("train", "eval"):
    stage_data.upload_tree(f"{churn_data}/{split}", f"gs://test-bucket/pipe/{split}")
  code = pipeline.main(["local", f"--config={CONFIG}", "--bucket=test-bucket", "--run_id=local1",
                        "--param=train_data=gs://test-bucket/pipe/train/*.tfrecord",
                        "--param=eval_data=gs://test-bucket/pipe/eval/*.tfrecord", "--param=train_steps=60",
                        "--param=global_batch_size=64", "--local_arg=--replica_count=1=1", "--local_arg=--quiet"])
  out = capsys.readouterr().out
  assert code == 0, out[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  assert result["check_data"] == 4  # four training shards found
  assert result["metric"] > 0.8 and result["metrics"]["eval_accuracy"] == result["metric"]


def test_local_pipeline_check_data_fails_on_missing_data(gcs, capsys):
  with pytest.raises(RuntimeError):
    pipeline.main(["local", f"--config={CONFIG}", "--bucket=test-bucket", "--run_id=local2",
                   "--param=train_data=gs://test-bucket/absent/*.tfrecord"])
