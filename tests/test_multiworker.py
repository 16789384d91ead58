"""Real multi-process clusters on 127.0.0.1: MultiWorkerMirroredStrategy, ParameterServerStrategy and the
side-car evaluator. Every process is bounded in time and killed at the end of its test."""

import json
import os
import re

import pytest

import procs
import serving_checks

TIMEOUT = 300


def args_for(churn_data, out, *extra):
  return [f"--train_data={churn_data}/train/*.tfrecord", f"--eval_data={churn_data}/eval/*.tfrecord",
          f"--output_dir={out}", "--global_batch_size=64", "--log_every_steps=50", *extra]


def digest(log):
  found = re.findall(r'"weights_sha256": "([0-9a-f]{64})"', log)
  assert found, log[-3000:]
  return found[-1]


def saved_models(root):
  return sorted(dirpath for dirpath, _, files in os.walk(root) if "saved_model.pb" in files)


@pytest.mark.smoke
def test_multi_worker_mirrored_chief_and_worker(churn_data, tmp_path):
  """Two workers of 2 logical CPU devices each run 4 replicas, as two 2-GPU workers do on Vertex."""
  out = tmp_path / "out"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = args_for(churn_data, out, "--train_steps=100", "--checkpoint_every_steps=50", "--num_cpu_devices=2")
  with procs.cluster(str(tmp_path)) as c:
    c.start("chief", args, {"TF_CONFIG": procs.tf_config(cluster, "chief", 0)})
    c.start("worker", args, {"TF_CONFIG": procs.tf_config(cluster, "worker", 0)})
    codes = c.wait(["chief", "worker"], TIMEOUT)
    assert codes == {"chief": 0, "worker": 0}, c.log("chief")[-2000:] + c.log("worker")[-2000:]
    chief_log, worker_log = c.log("chief"), c.log("worker")
  assert "Strategy: MultiWorkerMirroredStrategy" in chief_log
  assert digest(chief_log) == digest(worker_log)  # weights identical on both workers
  assert saved_models(tmp_path) == [str(out / "model")]  # only the chief's export exists
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["num_replicas"] == 4 and metrics["final_step"] == 100
  # 1000 eval examples in one shard: the workers split its records, 1000 = 15 * 64 + 40, every one counted once.
  assert metrics["eval_examples"] == 1000
  serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")
  assert sorted(os.listdir(out / "checkpoints")) == ["checkpoint", "ckpt-100.data-00000-of-00001",
                                                     "ckpt-100.index", "ckpt-50.data-00000-of-00001",
                                                     "ckpt-50.index", "run_owner.json", "trainer_config.json"]
  with open(out / "checkpoints" / "run_owner.json") as f:
    assert json.load(f)["ended"]  # the chief released the run dir


def test_parameter_server_strategy(churn_data, tmp_path):
  out = tmp_path / "out"
  chief, worker, ps = procs.addresses(3)
  cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
  args = args_for(churn_data, out, "--train_steps=100", "--steps_per_loop=25")
  with procs.cluster(str(tmp_path)) as c:
    c.start("ps", args, {"TF_CONFIG": procs.tf_config(cluster, "ps", 0)})
    c.start("worker", args, {"TF_CONFIG": procs.tf_config(cluster, "worker", 0)})
    c.start("chief", args, {"TF_CONFIG": procs.tf_config(cluster, "chief", 0)})
    codes = c.wait(["chief"], TIMEOUT)
    assert codes == {"chief": 0}, c.log("chief")[-3000:]
    assert c.procs["ps"].poll() is None and c.procs["worker"].poll() is None  # servers run until stopped
    assert "Serving ps:0" in c.log("ps")
    assert "closures of up to 25 steps (--steps_per_loop) over 1 worker(s)" in c.log("chief")
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["strategy"] == "ParameterServerStrategy" and metrics["final_step"] == 100
  assert metrics["eval_accuracy"] > 0.8 and metrics["eval_examples"] == 1000
  serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")


def test_sidecar_evaluator_follows_the_chief(churn_data, tmp_path):
  out = tmp_path / "out"
  (chief,) = procs.addresses(1)
  cluster = {"chief": [chief]}
  args = args_for(churn_data, out, "--train_steps=300", "--checkpoint_every_steps=100", "--eval_steps=4")
  with procs.cluster(str(tmp_path)) as c:
    c.start("evaluator", args, {"TF_CONFIG": procs.tf_config(cluster, "evaluator", 0)})
    c.start("chief", args, {"TF_CONFIG": procs.tf_config(cluster, "chief", 0)})
    codes = c.wait(["chief", "evaluator"], TIMEOUT)
    assert codes == {"chief": 0, "evaluator": 0}, c.log("evaluator")[-3000:]
    log = c.log("evaluator")
  assert "Strategy: default (evaluator task" in log
  assert "Evaluator: step 300 " in log
  assert saved_models(tmp_path) == [str(out / "model")]


def test_fit_under_multi_worker_with_legacy_keras(churn_data, tmp_path):
  """Keras 3's fit breaks under MultiWorkerMirroredStrategy; tf_keras (TF_USE_LEGACY_KERAS=1) runs it."""
  out = tmp_path / "out"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = args_for(churn_data, out, "--loop=fit", "--train_steps=100", "--checkpoint_every_steps=50",
                  "--steps_per_loop=10")
  legacy = {"TF_USE_LEGACY_KERAS": "1"}
  with procs.cluster(str(tmp_path)) as c:
    c.start("chief", args, {**legacy, "TF_CONFIG": procs.tf_config(cluster, "chief", 0)})
    c.start("worker", args, {**legacy, "TF_CONFIG": procs.tf_config(cluster, "worker", 0)})
    codes = c.wait(["chief", "worker"], TIMEOUT)
    assert codes == {"chief": 0, "worker": 0}, c.log("chief")[-3000:] + c.log("worker")[-3000:]
    chief_log, worker_log = c.log("chief"), c.log("worker")
  assert "Keras 2.21" in chief_log  # tf_keras really was the Keras in use
  assert digest(chief_log) == digest(worker_log)
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["strategy"] == "MultiWorkerMirroredStrategy" and metrics["final_step"] == 100
  assert metrics["eval_accuracy"] > 0.8 and metrics["eval_examples"] == 1000
  assert saved_models(tmp_path) == [str(out / "model")]
  serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")  # a tf_keras export


def test_fit_under_parameter_servers_with_legacy_keras(churn_data, tmp_path):
  """Keras runs no batch-level callbacks under parameter servers: the standard actions fire at epoch ends, and
  epochs end on every step a cadence names, so logs, evaluations and checkpoints land where the flags say."""
  out = tmp_path / "out"
  chief, worker, ps = procs.addresses(3)
  cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
  args = args_for(churn_data, out, "--loop=fit", "--train_steps=100", "--checkpoint_every_steps=50",
                  "--steps_per_loop=10", "--log_every_steps=20", "--eval_every_steps=40")
  legacy = {"TF_USE_LEGACY_KERAS": "1"}
  with procs.cluster(str(tmp_path)) as c:
    c.start("ps", args, {**legacy, "TF_CONFIG": procs.tf_config(cluster, "ps", 0)})
    c.start("worker", args, {**legacy, "TF_CONFIG": procs.tf_config(cluster, "worker", 0)})
    c.start("chief", args, {**legacy, "TF_CONFIG": procs.tf_config(cluster, "chief", 0)})
    codes = c.wait(["chief"], TIMEOUT)
    assert codes == {"chief": 0}, c.log("chief")[-3000:]
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["strategy"] == "ParameterServerStrategy" and metrics["final_step"] == 100
  assert metrics["eval_accuracy"] > 0.8 and metrics["eval_examples"] == 1000
  import test_training  # pylint: disable=g-import-not-at-top

  assert test_training.train_steps_logged(out) == [20, 40, 60, 80, 100]
  assert test_training.train_steps_logged(out, split="eval") == [40, 80, 100]
  assert test_training.checkpoint_steps(out) == [50, 100]
  serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")


def test_a_replica_restarted_after_training_finished_does_not_wait_for_peers(churn_data, tmp_path):
  """Vertex restarts a chief that died during its final export; its workers had exited 0. The restarted chief
  used to block forever in MultiWorkerMirroredStrategy() waiting for them; now it exports from the final
  checkpoint alone, and a restarted worker exits at once."""
  import shutil  # pylint: disable=g-import-not-at-top
  out = tmp_path / "out"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = args_for(churn_data, out, "--train_steps=40", "--checkpoint_every_steps=20")
  envs = {name: {"TF_CONFIG": procs.tf_config(cluster, name, 0)} for name in ("chief", "worker")}
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args, envs[name])
    assert c.wait(["chief", "worker"], TIMEOUT) == {"chief": 0, "worker": 0}, c.log("chief")[-3000:]
  digest_before = json.load(open(out / "model" / "eval_metrics.json"))["weights_sha256"]
  shutil.rmtree(out / "model")  # as if the chief died mid-export
  with procs.cluster(str(tmp_path / "again")) as c:
    os.makedirs(c.log_dir, exist_ok=True)
    for name in ("chief", "worker"):
      c.start(name, args, envs[name])  # each alone: the other is not running
      assert c.wait([name], 120) == {name: 0}, c.log(name)[-3000:]
    assert "training finished at step 40" in c.log("chief")
    assert "training is done, worker:0 has nothing left to do" in c.log("worker")
  metrics = json.load(open(out / "model" / "eval_metrics.json"))
  assert (metrics["final_step"], metrics["weights_sha256"]) == (40, digest_before)  # the same model, exported
  assert metrics["eval_examples"] == 1000
