"""Real multi-process clusters on 127.0.0.1: MultiWorkerMirroredStrategy, ParameterServerStrategy and the
side-car evaluator. Every process is bounded in time and killed at the end of its test.

One real run per behaviour: the parameter-server jobs that learn, evaluate one exact pass and serve (the custom
loop, and `fit` under tf_keras with its cadences) are tests/test_preemption.py's preempted coordinators' resumed
runs, and MultiWorkerMirrored `fit` under tf_keras is its preempted worker's resumed job."""

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
  # Each restarted alone (the other is not running), in this process: a restart that waited for its peers would
  # hang here until pytest's timeout, and the process boundary is not what is tested.
  restarted = {name: procs.run_trainer_here(args, env=envs[name]) for name in ("chief", "worker")}
  for name, result in restarted.items():
    assert result.returncode == 0, (name, result.stderr[-3000:])
  assert "training finished at step 40" in restarted["chief"].stderr
  assert "training is done, worker:0 has nothing left to do" in restarted["worker"].stderr
  metrics = json.load(open(out / "model" / "eval_metrics.json"))
  assert (metrics["final_step"], metrics["weights_sha256"]) == (40, digest_before)  # the same model, exported
  assert metrics["eval_examples"] == 1000
