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
from scripts import submit
from scripts import registry
from scripts import stage_data
from scripts import vertex_config

CONFIG = "cloud_configs/multi_worker_gpu.yaml"


def _compiled_spec(tasks) -> dict:
  return json.loads(tasks["training-spec"]["inputs"]["parameters"]["job_spec"]["runtimeValue"]["constant"])


def test_compiled_training_step_has_the_config_pools(tmp_path, capsys):
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", f"--config={CONFIG}", "--bucket=bkt", "--run_id=r1", f"--output={output}"]) == 0
  compiled = yaml.safe_load(output.read_text())
  tasks = compiled["root"]["dag"]["tasks"]
  assert set(tasks) == {"training-spec", "check-data", "custom-training-job", "read-metrics"}
  train = tasks["custom-training-job"]
  for name in ("worker_pool_specs", "base_output_directory"):
    assert train["inputs"]["parameters"][name]["taskOutputParameter"]["producerTask"] == "training-spec"
  assert "check-data" in train["dependentTasks"]
  assert "custom-training-job" in tasks["read-metrics"]["dependentTasks"]
  spec = _compiled_spec(tasks)
  printed = capsys.readouterr().out
  # The training step runs the trainer image named by its source, as scripts.submit builds and tags it.
  image = re.search(r"it runs the trainer image (\S+), which python -m scripts.submit --config=\S+ builds \(or finds\) "
                    r"under that tag", printed).group(1)
  assert re.fullmatch(r"us-central1-docker\.pkg\.dev/local-project/vertex-tf-trainer/trainer:src-[0-9a-f]{16}", image)
  expected = vertex_config.load(os.path.join(procs.REPO, CONFIG), {"BUCKET": "bkt", "RUN_ID": "${RUN_ID}",
                                                                      "TRAINER_IMAGE": image}).body
  assert spec["workerPoolSpecs"] == expected["workerPoolSpecs"]  # one source of truth: the cloud config
  assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://bkt/runs/${RUN_ID}"}  # filled per run
  assert tasks["training-spec"]["inputs"]["parameters"]["run_name"]["runtimeValue"]["constant"] == \
      "{{$.pipeline_job_name}}"
  assert [p["replicaCount"] for p in spec["workerPoolSpecs"]] == [1, 2]
  parameters = compiled["root"]["inputDefinitions"]["parameters"]
  assert set(parameters) == {"project", "location", "trainer_flags", "base_output_dir"}
  assert parameters["trainer_flags"]["defaultValue"] == {} and parameters["base_output_dir"]["defaultValue"] == ""


def test_the_training_step_runs_as_the_service_account_into_vertex_tensorboard(tmp_path, capsys):
  """--service_account and --tensorboard reach the training step's CustomJob as scripts.submit sets them."""
  output = tmp_path / "pipeline.yaml"
  board = "projects/p/locations/europe-west4/tensorboards/9"
  assert pipeline.main(["compile", f"--config={CONFIG}", "--bucket=bkt", "--region=europe-west4", f"--output={output}",
                        "--service_account=trainer@p.iam.gserviceaccount.com", f"--tensorboard={board}"]) == 0, \
      capsys.readouterr().err
  train = yaml.safe_load(output.read_text())["root"]["dag"]["tasks"]["custom-training-job"]["inputs"]["parameters"]
  assert train["service_account"]["runtimeValue"]["constant"] == "trainer@p.iam.gserviceaccount.com"
  assert train["tensorboard"]["runtimeValue"]["constant"] == board
  # submit --dry_run prints the PipelineJob request, which has no such fields: it names them beside it.
  capsys.readouterr()
  assert pipeline.main(["submit", f"--config={CONFIG}", "--bucket=bkt", "--region=europe-west4", "--project=p",
                        f"--output={output}", "--dry_run", "--service_account=trainer@p.iam.gserviceaccount.com",
                        f"--tensorboard={board}"]) == 0
  err = capsys.readouterr().err
  assert (f"the pipeline's training step runs as trainer@p.iam.gserviceaccount.com and logs to TensorBoard "
          f"{board}") in err, err


def test_compile_params_become_the_run_defaults(tmp_path, capsys):
  output = tmp_path / "not" / "made" / "yet" / "pipeline.yaml"  # compile makes the folder it is told to write to
  assert pipeline.main(["compile", f"--config={CONFIG}", "--bucket=bkt", f"--output={output}",
                        "--param=train_steps=600", "--param=model=pkg.mod:build"]) == 0
  parameters = yaml.safe_load(output.read_text())["root"]["inputDefinitions"]["parameters"]
  assert parameters["trainer_flags"]["defaultValue"] == {"train_steps": "600", "model": "pkg.mod:build"}
  assert "run parameters default to --train_steps=600 --model=pkg.mod:build" in capsys.readouterr().out


def test_a_model_upload_step_registers_the_trained_model(tmp_path, capsys):
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", "--config=cloud_configs/single_gpu.yaml", "--bucket=bkt",
                        "--project=p", "--run_id=r1", "--upload_model", f"--output={output}"]) == 0, capsys.readouterr()
  compiled = yaml.safe_load(output.read_text())
  tasks = compiled["root"]["dag"]["tasks"]
  assert "read-metrics" in tasks["model-artifact"]["dependentTasks"]  # registered only after a good run
  upload = tasks["model-upload"]
  assert upload["inputs"]["artifacts"]["unmanaged_container_model"]["taskOutputArtifact"]["producerTask"] == \
      "model-artifact"
  container = tasks["model-artifact"]["inputs"]["parameters"]["container_spec"]["runtimeValue"]["constant"]
  # The project's serving image at the training TF (the trainer image's, here), on Vertex's container contract.
  assert container == {"imageUri": "us-central1-docker.pkg.dev/p/vertex-tf-trainer/serving:tf2.21.0",
                       "ports": [{"containerPort": 8080}]}
  assert pipeline.main(["compile", "--config=cloud_configs/single_gpu.yaml", "--bucket=bkt",
                        "--project=p", "--upload_model", "--serving_image=prebuilt", f"--output={output}"]) == 0
  tasks = yaml.safe_load(output.read_text())["root"]["dag"]["tasks"]
  image = tasks["model-artifact"]["inputs"]["parameters"]["container_spec"]["runtimeValue"]["constant"]["imageUri"]
  assert image in registry.prediction_images() and "/tf2-cpu.2-15" in image
  assert "tf2-cpu.2-15:latest reaches its end of availability on 2027-01-14" in capsys.readouterr().err
  executor = compiled["deploymentSpec"]["executors"]["exec-model-upload"]["container"]
  assert "google_cloud_pipeline_components" in " ".join(executor["command"] + executor.get("args", []))
  # A container config's pools take the run's parameters like package pools.
  run = _spec([{"containerSpec": {"imageUri": "i", "args": ["--a=1"]}}], {"train_data": "t"})
  assert run.worker_pool_specs[0]["containerSpec"]["args"] == ["--a=1", "--train_data=t"]


def test_compiled_training_step_runs_the_image_holding_the_users_package(tmp_path, capsys):
  """With --extra_package the training step runs the trainer image built from the sdist and that package, under
  the tag scripts.submit gives it (the source's digest); compile says which command builds it."""
  from scripts import cloud_build  # pylint: disable=g-import-not-at-top
  project = user_package.write(str(tmp_path / "churn-models"))
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", f"--config={CONFIG}", "--bucket=bkt", "--project=p", "--run_id=r1",
                        f"--output={output}", f"--extra_package={project}",
                        f"--param={user_package.MODEL_FLAG[2:]}"]) == 0
  compiled = yaml.safe_load(output.read_text())
  tasks = compiled["root"]["dag"]["tasks"]
  printed = capsys.readouterr().out
  wheel = submit.build_extra_package(project, str(tmp_path))
  archive = submit.build_sdist(str(tmp_path / "dist"))
  image = f"us-central1-docker.pkg.dev/p/vertex-tf-trainer/trainer:src-{cloud_build.source_digest(archive, extras=(wheel,))}"
  for pool in _compiled_spec(tasks)["workerPoolSpecs"]:
    assert pool["containerSpec"]["imageUri"] == image and "pythonPackageSpec" not in pool
  assert f"it runs the trainer image {image}, which python -m scripts.submit --config={CONFIG} " \
      f"--extra_package={project} builds (or finds) under that tag" in printed
  assert compiled["root"]["inputDefinitions"]["parameters"]["trainer_flags"]["defaultValue"] == {
      "model": "churn_models:build"}  # the package is in the image and used


def _spec(pools, trainer_flags, *, base_output_dir="", run_name="run-7"):
  return pipeline.training_spec.python_func(
      job_spec=json.dumps({"workerPoolSpecs": pools, "baseOutputDirectory": {"outputUriPrefix": "gs://b/r/${RUN_ID}"}}),
      run_name=run_name, trainer_flags=trainer_flags, base_output_dir=base_output_dir,
      boolean_flags=pipeline.boolean_flags())


def test_training_spec_runs_the_config_as_written_unless_overridden():
  config_args = ["--train_data=gs://b/t*", "--train_steps", "600", "--global_batch_size=32", "--nojit_compile",
                 "--output_dir=gs://b/out/${RUN_ID}", "--label=churned"]
  pools = [{"pythonPackageSpec": {"args": config_args}}, {"pythonPackageSpec": {"args": list(config_args)}},
           {"containerSpec": {"imageUri": "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"}}]
  unchanged = _spec(pools, {})
  assert unchanged.worker_pool_specs[0]["pythonPackageSpec"]["args"] == [
      a.replace("${RUN_ID}", "run-7") for a in config_args]  # nothing added by default
  assert unchanged.base_output_dir == "gs://b/r/run-7" and unchanged.train_data == "gs://b/t*"
  assert unchanged.eval_data == ""  # none in the args: the data check leaves it alone
  run = _spec(pools, {"train_steps": 50, "jit_compile": "true", "model": "pkg.m:build", "eval_data": "gs://b/e*"},
              base_output_dir="gs://b/elsewhere/${RUN_ID}")
  for pool in run.worker_pool_specs[:2]:
    assert pool["pythonPackageSpec"]["args"] == [
        "--train_data=gs://b/t*", "--train_steps=50", "--global_batch_size=32", "--jit_compile=true",
        "--output_dir=gs://b/out/run-7", "--label=churned", "--model=pkg.m:build", "--eval_data=gs://b/e*"]
  assert run.worker_pool_specs[2] == pools[2]  # the Reduction Server's container is not the trainer
  assert run.base_output_dir == "gs://b/elsewhere/run-7" and run.eval_data == "gs://b/e*"


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
    (build,) = fake.created("builds")  # the trainer image built for the run, reused for the schedule
  image = build["images"][0].split(":")[0] + "@sha256:" + "ab" * 32
  assert image in json.dumps(job["pipelineSpec"]) and image in json.dumps(schedule)  # the step runs it by digest
  params = job["runtimeConfig"]["parameterValues"]
  assert params == {"project": "proj", "location": "europe-west4",
                    "trainer_flags": {"train_steps": "321", "learning_rate": "0.01"}}
  assert job["runtimeConfig"]["gcsOutputDirectory"] == "gs://test-bucket/pipeline-root"
  assert job["pipelineSpec"]["pipelineInfo"]["name"] == "vertex-tf-trainer"
  assert schedule["cron"] == "TZ=Europe/Paris 30 2 * * 1-5"
  assert schedule["maxConcurrentRunCount"] == "2" or schedule["maxConcurrentRunCount"] == 2
  assert schedule["startTime"].startswith("2027-01-01T00:00:00") and schedule["endTime"].startswith("2027-06-01")
  assert int(schedule["maxRunCount"]) == 50
  scheduled = schedule["createPipelineJobRequest"]["pipelineJob"]
  assert scheduled["runtimeConfig"]["parameterValues"]["trainer_flags"] == {"train_steps": "321",
                                                                            "learning_rate": "0.01"}


@pytest.mark.parametrize("args,message", [
    (["schedule", "--cron=0 25 * * *"], r"--cron='0 25 \* \* \*' is not a 5-field cron expression"),
    (["schedule", "--cron=every day"], r"--cron='every day' is not a 5-field cron expression"),
    (["schedule", "--cron=0 3 * * *", "--time_zone=Mars/Olympus"], r"--time_zone='Mars/Olympus' is not an IANA"),
    (["schedule", "--cron=0 3 * * *", "--start_time=2027-02-01T00:00:00Z", "--end_time=2027-01-01T00:00:00Z"],
     r"--end_time=2027-01-01T00:00:00Z is not after --start_time"),
    (["submit", "--param=epoch=3"], r"^error: --param epoch='3': 'epoch' is not a trainer flag \(python -m "
                                    r"trainer.task --helpfull lists them\) nor base_output_dir$"),
    (["submit", "--param=train_steps"], r"^error: --param 'train_steps': expected NAME=VALUE"),
    (["submit", "--param=train_steps=many"], r"^error: workerpool0: trainer args rejected: .*train_steps.*many"),
    (["submit", "--param=base_output_dir=runs/x"], r"--param base_output_dir='runs/x': expected a gs:// URI"),
    (["schedule", "--cron=0 3 * * *", "--param=base_output_dir=gs://b/fixed"],
     r"^error: every scheduled run would write to gs://b/fixed, and a later run would find the earlier run's final "
     r"checkpoint and not train; put \$\{RUN_ID\} in "),
    (["submit"], r"^error: --project is required"),
    (["compile", "--tensorboard=projects/p/locations/us-central1/tensorboards/9"],
     r"^error: --tensorboard needs --service_account"),
    (["compile", "--config=cloud_configs/hp_tuning.yaml"], r"takes a custom-job config, not hp_tuning"),
    (["submit", "--tuning_config=cloud_configs/single_cpu.yaml"],
     r"^error: --tuning_config=cloud_configs/single_cpu.yaml: expected a hyperparameter-tuning config"),
    (["submit", "--tuning_config=cloud_configs/hp_tuning.yaml", "--param=learning_rate=0.01"],
     r"^error: --param learning_rate=\.\.\.: cloud_configs/hp_tuning.yaml's study tunes 'learning_rate'; a run "
     r"parameter would fix it in every trial"),
    (["submit", "--tuning_config=cloud_configs/hp_tuning.yaml", "--param=dropout=0.2"],
     r"^error: --param dropout=\.\.\.: .*study tunes 'dropout'"),
])
def test_bad_input_compiles_and_sends_nothing(tmp_path, capsys, args, message):
  output = tmp_path / "p.yaml"
  argv = args + ([] if any(a.startswith("--config") for a in args) else [f"--config={CONFIG}"])
  with fake_vertex.running() as fake:
    project = [] if argv == ["submit", f"--config={CONFIG}"] else ["--project=p"]
    code = pipeline.main(argv + project + ["--bucket=bkt", f"--output={output}", f"--api_endpoint={fake.endpoint}"])
    assert not fake.requests
  assert code == 2
  err = capsys.readouterr().err
  assert re.search(message, err, re.M) and len(err.strip().splitlines()) == 1, err
  assert not output.exists() and not os.path.exists(f"{output}.packages")


def test_invalid_cloud_config_compiles_nothing(tmp_path, capsys):
  bad = tmp_path / "bad.yaml"
  bad.write_text(open(os.path.join(procs.REPO, CONFIG)).read().replace("replicaCount: 2", "replicaCont: 2"))
  output = tmp_path / "p.yaml"
  assert pipeline.main(["compile", f"--config={bad}", "--bucket=bkt", f"--output={output}"]) == 2
  assert 'has no field named "replicaCont"' in capsys.readouterr().err
  assert not output.exists()


def test_local_pipeline_runs_the_configs_args_and_the_users_model(gcs, churn_data, tmp_path, capsys):
  """The pipeline run locally on the emulator: check-data finds the shards, the config's own args (none of them
  the old pipeline defaults) are what trains, a --param adds the user's --model from their --extra_package, the
  run ends at exactly the config's step and batch, and read-metrics returns what the model reached."""
  for split in ("train", "eval"):
    stage_data.upload_tree(f"{churn_data}/{split}", f"gs://test-bucket/own/{split}")
  config = tmp_path / "own_args.yaml"
  config.write_text(open(os.path.join(procs.REPO, "cloud_configs", "single_cpu.yaml")).read()
                    .replace("gs://${BUCKET}/data/", "gs://${BUCKET}/own/")
                    .replace("--train_steps=1000", "--train_steps=70")
                    .replace("--global_batch_size=256", "--global_batch_size=48\n        - --learning_rate=0.003"))
  project = user_package.write(str(tmp_path / "churn-models"))
  job_dir = tmp_path / "job"
  code = pipeline.main(["local", f"--config={config}", "--bucket=test-bucket", "--run_id=own1",
                        f"--extra_package={project}", f"--param={user_package.MODEL_FLAG[2:]}",
                        f"--local_arg=--job_dir={job_dir}", "--local_arg=--quiet"])
  out = capsys.readouterr().out
  log = open(job_dir / "workerpool0-0.log").read()
  assert code == 0, out[-2000:] + log[-3000:]
  assert "churn_models: built from" in log  # the user's build_fn, from the installed package
  result = json.loads(out.strip().splitlines()[-1])
  assert result["check_data"] == 4  # four training shards found
  assert result["base_output_dir"] == "gs://test-bucket/runs/own1"  # the config's, ${RUN_ID} the run's name
  assert result["metric"] > 0.8 and result["metrics"]["eval_accuracy"] == result["metric"], result
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  model_dir = "gs://test-bucket/runs/own1/model"
  with tf.io.gfile.GFile(f"{model_dir}/eval_metrics.json") as f:
    assert json.load(f)["final_step"] == 70
  with tf.io.gfile.GFile(f"{model_dir}/trainer_config.json") as f:
    train = json.load(f)["config"]["train"]
  assert train["global_batch_size"] == 48 and train["learning_rate"] == 0.003
  assert json.load(tf.io.gfile.GFile(f"{model_dir}/trainer_config.json"))["config"]["model"]["name"] == \
      "churn_models:build"


def test_local_pipeline_needs_the_emulator_started(tmp_path, capsys, monkeypatch):
  monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
  assert pipeline.main(["local", f"--config={CONFIG}", "--bucket=test-bucket", "--run_id=noemu"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: local runs every step against the emulated bucket: start it first with eval ") and \
      len(err.strip().splitlines()) == 1, err


def test_local_pipeline_check_data_fails_on_missing_data(gcs, capsys):
  with pytest.raises(RuntimeError):
    pipeline.main(["local", f"--config={CONFIG}", "--bucket=test-bucket", "--run_id=local2",
                   "--param=train_data=gs://test-bucket/absent/*.tfrecord"])


def test_a_tuning_step_compiles_before_training(tmp_path, capsys):
  """--tuning_config: the study's trial pools (the run's flags applied) go to Vertex's tuning job, its trials are
  read back, and the training step gets the best trial's parameters over the run's trainer flags."""
  output = tmp_path / "pipeline.yaml"
  assert pipeline.main(["compile", f"--config={CONFIG}", "--tuning_config=cloud_configs/hp_tuning.yaml",
                        "--bucket=bkt", f"--output={output}", "--param=train_steps=600"]) == 0, capsys.readouterr()
  assert "a tuning study from cloud_configs/hp_tuning.yaml first" in capsys.readouterr().out
  keyed = yaml.safe_load(output.read_text())["root"]["dag"]["tasks"]
  tasks = {task["taskInfo"]["name"]: task for task in keyed.values()}  # as the console shows them
  assert set(tasks) == {"tuning-spec", "check-tuning-data", "hyperparameter-tuning-job", "tuning-trials",
                        "best-trial-flags", "training-spec", "check-data", "custom-training-job", "read-metrics"}
  names = {key: task["taskInfo"]["name"] for key, task in keyed.items()}
  tuning = tasks["hyperparameter-tuning-job"]["inputs"]["parameters"]
  config = vertex_config.load(os.path.join(procs.REPO, "cloud_configs", "hp_tuning.yaml"),
                              {"BUCKET": "bkt", "RUN_ID": "${RUN_ID}", "TRAINER_IMAGE": "i"}).body
  assert tuning["study_spec_parameters"]["runtimeValue"]["constant"] == config["studySpec"]["parameters"]
  assert tuning["max_trial_count"]["runtimeValue"]["constant"] == 12
  assert names[tuning["worker_pool_specs"]["taskOutputParameter"]["producerTask"]] == "tuning-spec"
  flags = tasks["training-spec"]["inputs"]["parameters"]["trainer_flags"]["taskOutputParameter"]
  assert flags == {"producerTask": "best-trial-flags", "outputParameterKey": "Output"}
  assert "check-tuning-data" in {names[k] for k in tasks["hyperparameter-tuning-job"]["dependentTasks"]}
  trial_spec = json.loads(tasks["tuning-spec"]["inputs"]["parameters"]["job_spec"]["runtimeValue"]["constant"])
  # The trials' pools as the tuning config has them (the run's flags are applied by tuning-spec at run time).
  assert trial_spec["workerPoolSpecs"][0]["containerSpec"]["args"] == \
      config["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
  assert trial_spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://bkt/tuning/${RUN_ID}"}


def test_the_best_trial_read_from_vertex_becomes_the_training_flags():
  """tuning-trials reads the finished job's trials through the API (a stand-in for Vertex here); best-trial-flags
  picks the best succeeded one for the study's goal and puts its values over the run's flags."""
  trials = [
      {"id": "1", "state": "SUCCEEDED", "parameters": [{"parameterId": "learning_rate", "value": 0.01},
                                                       {"parameterId": "global_batch_size", "value": 256.0}],
       "finalMeasurement": {"stepCount": "1000", "metrics": [{"metricId": "accuracy", "value": 0.91}]}},
      {"id": "2", "state": "SUCCEEDED", "parameters": [{"parameterId": "learning_rate", "value": 0.003},
                                                       {"parameterId": "global_batch_size", "value": 128.0}],
       "finalMeasurement": {"stepCount": "1000", "metrics": [{"metricId": "accuracy", "value": 0.93}]}},
      {"id": "3", "state": "INFEASIBLE", "parameters": [{"parameterId": "learning_rate", "value": 0.5}],
       "infeasibleReason": "exit 1"},
  ]
  with fake_vertex.running() as fake:
    name = "projects/p/locations/us-central1/hyperparameterTuningJobs/77"
    fake.resources[name] = {"name": name, "displayName": "t", "state": "JOB_STATE_SUCCEEDED", "trials": trials}
    resources = json.dumps({"resources": [{"resourceType": "HyperparameterTuningJob",
                                           "resourceUri": f"https://us-central1-aiplatform.googleapis.com/v1/{name}"}]})
    read = pipeline.tuning_trials.python_func(gcp_resources=resources, api_endpoint=fake.endpoint)
  assert [t["id"] for t in read] == ["1", "2", "3"] and read[1]["finalMeasurement"]["metrics"][0]["value"] == 0.93
  best = pipeline.best_trial_flags.python_func(trials=read, metric_id="accuracy", goal="MAXIMIZE",
                                               trainer_flags={"train_steps": "600", "learning_rate": "0.1"})
  assert best == {"train_steps": "600", "learning_rate": 0.003, "global_batch_size": 128.0}
  assert pipeline.best_trial_flags.python_func(trials=read, metric_id="accuracy", goal="MINIMIZE",
                                               trainer_flags={})["learning_rate"] == 0.01
  with pytest.raises(RuntimeError, match=r"no succeeded trial reported 'loss'"):
    pipeline.best_trial_flags.python_func(trials=read, metric_id="loss", goal="MINIMIZE", trainer_flags={})
  # The training spec writes the trial's DISCRETE float as the integer flag it is.
  spec = _spec([{"replicaCount": 1, "pythonPackageSpec": {"args": ["--global_batch_size=64"]}}], best)
  assert spec.worker_pool_specs[0]["pythonPackageSpec"]["args"][0] == "--global_batch_size=128"


def test_local_pipeline_tunes_then_trains_with_the_best_trial(gcs, churn_data, tmp_path, capsys):
  """`local --tuning_config`: a two-trial study on the emulator, then training with the best trial's learning
  rate, read back from the trained model's run record."""
  for split in ("train", "eval"):
    stage_data.upload_tree(f"{churn_data}/{split}", f"gs://test-bucket/tune/{split}")
  study = tmp_path / "study.yaml"
  study.write_text(open(os.path.join(procs.REPO, "cloud_configs", "hp_tuning.yaml")).read()
                   .replace("gs://${BUCKET}/data/", "gs://${BUCKET}/tune/")
                   .replace("--train_steps=1000", "--train_steps=40\n          - --global_batch_size=64")
                   .replace("""    - parameterId: dropout
      doubleValueSpec: {minValue: 0.0, maxValue: 0.4}
      scaleType: UNIT_LINEAR_SCALE
    - parameterId: global_batch_size
      discreteValueSpec: {values: [128, 256, 512]}
""", ""))
  config = tmp_path / "train.yaml"
  config.write_text(open(os.path.join(procs.REPO, "cloud_configs", "single_cpu.yaml")).read()
                    .replace("gs://${BUCKET}/data/", "gs://${BUCKET}/tune/").replace("--train_steps=1000",
                                                                                      "--train_steps=50"))
  code = pipeline.main(["local", f"--config={config}", f"--tuning_config={study}", "--bucket=test-bucket",
                        "--run_id=tuned1", "--local_arg=--max_trials=2", "--local_arg=--quiet"])
  out = capsys.readouterr().out
  assert code == 0, out[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  record = json.load(open(result["tuning"]["study"]))
  done = [t for t in record["trials"] if t["state"] == "SUCCEEDED"]
  best = max(done, key=lambda t: t["finalMeasurement"]["metrics"][0]["value"])
  assert len(record["trials"]) == 2 and record["bestTrial"] == best["id"]
  best_rate = best["parameters"][0]["value"]
  assert result["tuning"]["trainer_flags"] == {"learning_rate": best_rate}
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with tf.io.gfile.GFile("gs://test-bucket/runs/tuned1/model/trainer_config.json") as f:
    train = json.load(f)["config"]["train"]
  assert train["learning_rate"] == pytest.approx(best_rate) and train["train_steps"] == 50
  # The trials wrote under the study's own output, one dir per trial.
  assert tf.io.gfile.exists("gs://test-bucket/tuning/tuned1/1/model/trainer_config.json")
  assert tf.io.gfile.exists("gs://test-bucket/tuning/tuned1/2/model/trainer_config.json")
