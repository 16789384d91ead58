"""SIGTERM (a Spot preemption) costs no step: the trainer saves at the step reached, exits 143 (not 0: Vertex
would count a chief's 0 as success), and the restarted run resumes exactly there. Every process is bounded."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

import procs

TIMEOUT = 120


def _start(args, log_path, env=None):
  log = open(log_path, "w")  # pylint: disable=consider-using-with
  proc = subprocess.Popen(procs.trainer_cmd(args), env=procs.trainer_env(env), cwd=procs.REPO, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
  log.close()
  return proc


def _wait_for(log_path, text, proc, timeout=TIMEOUT):
  deadline = time.monotonic() + timeout
  while text not in open(log_path).read():
    assert proc.poll() is None, open(log_path).read()[-3000:]
    assert time.monotonic() < deadline, f"no {text!r} within {timeout} s"
    time.sleep(0.1)


def _preempt_and_resume(args, tmp_path, *, env=None):
  """Trains far, SIGTERMs after step 100, checks the save and exit code, then resumes 50 steps further."""
  out = tmp_path / "out"
  log = tmp_path / "first.log"
  proc = _start(args + [f"--output_dir={out}", "--train_steps=1000000"], log, env)
  try:
    _wait_for(str(log), "step 100/", proc)
    signaled = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=30)  # Spot gives about 30 s before the SIGKILL
    took = time.monotonic() - signaled
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  text = open(log).read()
  assert code == 143, text[-3000:]
  (saved,) = re.findall(r"Preempted \(SIGTERM: saved checkpoint \S+ckpt-(\d+) at step (\d+)\)", text)
  step = int(saved[1])
  assert int(saved[0]) == step >= 100 and os.path.exists(out / "checkpoints" / f"ckpt-{step}.index")
  assert took < 25, f"saving took {took:.1f} s"
  assert json.load(open(out / "checkpoints" / "trainer_config.json"))["config"]["train"]["train_steps"] == 1000000
  assert not os.path.exists(out / "model")  # a preempted run exports nothing
  result = procs.run_trainer(args + [f"--output_dir={out}", f"--train_steps={step + 50}"], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Resuming at step {step} of {step + 50}" in result.stderr  # 0 steps lost
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert (metrics["resumed_from_step"], metrics["final_step"]) == (step, step + 50)
  return metrics


def _args(churn_data, *extra):
  return [f"--train_data={churn_data}/train/*.tfrecord", "--global_batch_size=64", "--log_every_steps=50",
          "--checkpoint_every_steps=100000", "--eval_steps=2", f"--eval_data={churn_data}/eval/*.tfrecord", *extra]


@pytest.mark.parametrize("extra,strategy", [([], "default"), (["--num_cpu_devices=2"], "MirroredStrategy"),
                                            (["--loop=fit", "--steps_per_loop=10"], "default")])
def test_sigterm_saves_and_the_restart_loses_no_step(churn_data, tmp_path, extra, strategy):
  assert _preempt_and_resume(_args(churn_data, *extra), tmp_path)["strategy"] == strategy


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_sigterm_to_the_parameter_server_coordinator(churn_data, tmp_path, loop):
  """The chief (coordinator) saves; the workers and parameter servers keep serving, and the restarted chief
  resumes at the saved step on the same cluster. Under `fit` (tf_keras: Keras 3 has no parameter-server fit) the
  save comes at the end of the running epoch, where the actions fire there."""
  chief, worker, ps = procs.addresses(3)
  cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
  args = _args(churn_data, "--steps_per_loop=25", f"--loop={loop}")
  legacy = {"TF_USE_LEGACY_KERAS": "1"} if loop == "fit" else {}
  servers = [{"TF_CONFIG": procs.tf_config(cluster, name, 0), **legacy} for name in ("ps", "worker")]
  with procs.cluster(str(tmp_path)) as c:
    for name, env in zip(("ps", "worker"), servers):
      c.start(name, args + [f"--output_dir={tmp_path}/out"], env)
    metrics = _preempt_and_resume(args, tmp_path, env={"TF_CONFIG": procs.tf_config(cluster, "chief", 0), **legacy})
    assert c.procs["ps"].poll() is None and c.procs["worker"].poll() is None
  assert metrics["strategy"] == "ParameterServerStrategy"


@pytest.mark.parametrize("loop", ["fit"])  # the custom loop: tests/test_local_vertex.py, preemptions in a row
def test_sigterm_to_one_multi_worker_replica_saves_on_all(churn_data, tmp_path, loop):
  """A Spot VM is reclaimed: only the worker gets SIGTERM. The workers agree on the step, all save it and exit
  143 (the job cannot go on without the preempted one), and the restarted job resumes there, in sync. `fit`
  runs under tf_keras (Keras 3's fit fails under this strategy)."""
  out = tmp_path / "out"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = _args(churn_data, "--steps_per_loop=10", f"--loop={loop}") + [f"--output_dir={out}"]
  legacy = {"TF_USE_LEGACY_KERAS": "1"} if loop == "fit" else {}
  envs = {name: {"TF_CONFIG": procs.tf_config(cluster, name, 0), **legacy} for name in ("chief", "worker")}
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args + ["--train_steps=1000000"], envs[name])
    _wait_for(os.path.join(tmp_path, "chief.log"), "step 100/", c.procs["chief"])
    os.kill(c.procs["worker"].pid, signal.SIGTERM)
    codes = c.wait(["chief", "worker"], 30)  # Spot gives about 30 s before the SIGKILL
    chief_log, worker_log = c.log("chief"), c.log("worker")
  assert codes == {"chief": 143, "worker": 143}, chief_log[-2000:] + worker_log[-2000:]
  (saved,) = re.findall(r"Preempted \(SIGTERM on a peer replica: saved checkpoint \S+ckpt-(\d+) at step (\d+)\)",
                        chief_log)
  step = int(saved[1])
  assert int(saved[0]) == step >= 100 and os.path.exists(out / "checkpoints" / f"ckpt-{step}.index")
  assert re.search(rf"Preempted \(SIGTERM: saved checkpoint .*ckpt-{step} at step {step}\)", worker_log)
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args + [f"--train_steps={step + 50}"], envs[name])
    codes = c.wait(["chief", "worker"], TIMEOUT)
    chief_log, worker_log = c.log("chief"), c.log("worker")
  assert codes == {"chief": 0, "worker": 0}, chief_log[-2000:] + worker_log[-2000:]
  assert f"Resuming at step {step} of {step + 50}" in chief_log  # 0 steps lost
  assert f"Resuming at step {step} of {step + 50}" in worker_log
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert (metrics["strategy"], metrics["resumed_from_step"], metrics["final_step"]) == (
      "MultiWorkerMirroredStrategy", step, step + 50)
  digests = [re.findall(r'"weights_sha256": "([0-9a-f]{64})"', log)[-1] for log in (chief_log, worker_log)]
  assert digests[0] == digests[1]
