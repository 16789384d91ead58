"""Peers that fail: a lost parameter-server worker is survived with the step count exact, a lost parameter
server ends the chief in one line, and a peer that never comes up ends the wait in one line naming it. Every
process is bounded and killed at the end of its test."""

import json
import os
import re
import signal
import threading
import time

import pytest

import procs
from trainer.distribute import cluster as cluster_lib
from trainer.distribute import peers

TIMEOUT = 240


def _args(churn_data, out, *extra):
  return [f"--train_data={churn_data}/train/*.tfrecord", f"--eval_data={churn_data}/eval/*.tfrecord",
          f"--output_dir={out}", "--global_batch_size=64", "--log_every_steps=50", "--eval_steps=2", *extra]


def _wait_for(c, name, text, timeout=TIMEOUT):
  deadline = time.monotonic() + timeout
  while text not in c.log(name):
    assert c.procs[name].poll() is None, c.log(name)[-3000:]
    assert time.monotonic() < deadline, f"no {text!r} in {name} within {timeout} s"
    time.sleep(0.1)


def _ps_cluster(c, churn_data, out, train_steps):
  chief, w0, w1, ps = procs.addresses(4)
  cluster = {"chief": [chief], "worker": [w0, w1], "ps": [ps]}
  args = _args(churn_data, out, f"--train_steps={train_steps}", "--steps_per_loop=25")
  envs = {"ps": procs.tf_config(cluster, "ps", 0), "w0": procs.tf_config(cluster, "worker", 0),
          "w1": procs.tf_config(cluster, "worker", 1), "chief": procs.tf_config(cluster, "chief", 0)}
  for name, tf_config in envs.items():
    c.start(name, args, {"TF_CONFIG": tf_config})
  return args, envs, ps


def test_a_lost_parameter_server_worker_is_survived_and_the_step_count_stays_exact(churn_data, tmp_path):
  """kill -9 of a worker mid-closure: the coordinator runs that closure again elsewhere, and Vertex restarts the
  worker. The step count is the steps scheduled (a counter on the parameter servers would say otherwise: the
  lost closure's applied steps, and Keras 3's racy read-then-write increments from 2 workers)."""
  out = tmp_path / "out"
  with procs.cluster(str(tmp_path)) as c:
    args, envs, _ = _ps_cluster(c, churn_data, out, 600)
    _wait_for(c, "chief", "step 100/")
    c.kill("w1")
    time.sleep(1)
    c.start("w1-restarted", args, {"TF_CONFIG": envs["w1"]})  # same host and port, as Vertex restarts it
    codes = c.wait(["chief"], TIMEOUT)
    chief_log = c.log("chief")
  assert codes == {"chief": 0}, chief_log[-3000:]
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["final_step"] == 600
  assert sorted(int(s) for s in re.findall(r"ckpt-(\d+)\.index", " ".join(
      p.name for p in (out / "checkpoints").iterdir()))) == [200, 400, 600]


def test_a_lost_parameter_server_ends_the_chief_in_one_line(churn_data, tmp_path):
  out = tmp_path / "out"
  with procs.cluster(str(tmp_path)) as c:
    _, _, ps_address = _ps_cluster(c, churn_data, out, 1000000)
    _wait_for(c, "chief", "step 100/")
    c.kill("ps")
    codes = c.wait(["chief"], 60)
    chief_log = c.log("chief")
  assert codes == {"chief": 1}, chief_log[-3000:]
  errors = [line for line in chief_log.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, chief_log[-3000:]
  assert f"parameter server ps:0 ({ps_address}) was lost after step" in errors[0]
  assert "resumes from the last checkpoint" in errors[0]
  assert not (out / "model").exists()


def test_a_peer_that_never_comes_up_ends_the_wait_naming_it(churn_data, tmp_path):
  """A MultiWorkerMirroredStrategy chief whose worker never starts (a bad image, a quota) would wait in the
  strategy's start-up until the job's timeout; --peer_timeout_secs ends it with the worker named."""
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  started = time.monotonic()
  result = procs.run_trainer(_args(churn_data, tmp_path / "out", "--train_steps=10", "--peer_timeout_secs=10"),
                             env={"TF_CONFIG": procs.tf_config(cluster, "chief", 0)}, timeout=120)
  took = time.monotonic() - started
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == -signal.SIGKILL and len(errors) == 1, result.stderr[-3000:]
  assert errors[0].startswith("error: chief:0 waited 1") and f"worker:0 ({worker}) not reachable" in errors[0]
  assert "--peer_timeout_secs" in errors[0]
  assert took < 90


def test_the_watchdog_is_fed_by_progress_and_kills_once_when_starved():
  cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
  role = cluster_lib.ClusterRole(task_type="chief", task_index=0, cluster=cluster, source="test")
  read_end, write_end = os.pipe()
  killed = []

  def feed_for_a_while():
    for _ in range(6):  # fed every 0.1 s for 0.6 s: longer than the timeout in all, never starved
      time.sleep(0.1)
      os.write(write_end, b"the next training chunk\n")

  feeder = threading.Thread(target=feed_for_a_while)
  feeder.start()
  started = time.monotonic()
  with os.fdopen(read_end, "rb", buffering=0) as feeds:
    assert peers.watch(12345, 0.4, role, feeds, kill=killed.append) is True
  feeder.join()
  assert killed == [12345] and time.monotonic() - started >= 0.6 + 0.4
  os.close(write_end)


def test_the_watchdog_ends_quietly_when_its_process_ends():
  role = cluster_lib.ClusterRole(task_type="chief", task_index=0, cluster={"chief": ["127.0.0.1:1"]}, source="t")
  read_end, write_end = os.pipe()
  os.write(write_end, b"the first training chunk\n")
  os.close(write_end)
  with os.fdopen(read_end, "rb", buffering=0) as feeds:
    assert peers.watch(12345, 30, role, feeds, kill=lambda pid: pytest.fail("killed")) is False


def test_the_timeout_message_names_the_wait_and_the_missing_peers():
  role = cluster_lib.ClusterRole(task_type="worker", task_index=1, cluster={}, source="t")
  assert peers.timeout_message(role, 12.3, "the next training chunk", ["chief:0 (10.0.0.2:2222)"]) == (
      "worker:1 waited 12 s for the next training chunk: chief:0 (10.0.0.2:2222) not reachable; raise "
      "--peer_timeout_secs if replicas start this far apart")
  assert "every peer accepts connections" in peers.timeout_message(role, 5, "the peers to join", [])


def test_a_sigterm_held_back_in_a_wait_for_peers_ends_the_process(capfd):
  """The trainer holds SIGTERM until its strategy exists (TensorFlow's coordination service would swallow it);
  a replica stuck in the strategy's wait for peers is ended by the watchdog 2 s after the signal, not 30 s
  later by the SIGKILL. A real process with SIGTERM blocked shows the pending signal as /proc reports it."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  held = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, "
                           "{signal.SIGTERM}); print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
  try:
    assert held.stdout.readline() == b"held\n"
    assert not peers.sigterm_pending(held.pid)
    os.kill(held.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert peers.sigterm_pending(held.pid) and held.poll() is None  # blocked: it waits, the process runs on
    role = cluster_lib.ClusterRole(task_type="worker", task_index=0, cluster={"worker": ["127.0.0.1:1"]}, source="t")
    read_end, write_end = os.pipe()
    started = time.monotonic()
    with os.fdopen(read_end, "rb", buffering=0) as feeds:
      assert peers.watch(held.pid, 600, role, feeds) is True
    os.close(write_end)
    assert held.wait(timeout=10) == -signal.SIGKILL
    assert peers.SIGTERM_WAIT_SECS <= time.monotonic() - started < peers.SIGTERM_WAIT_SECS + 2
    assert "worker:0 got SIGTERM while it waited for the peers to join: nothing was trained" in capfd.readouterr().err
  finally:
    held.kill()
    held.wait()
