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
import serving_checks
import test_multiworker

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


def _preempt_and_resume(args, tmp_path, *, env=None, full_eval=False, resume_extra=()):
  """Trains far, SIGTERMs after step 100, checks the save and exit code, then resumes 50 steps further (with
  `full_eval`, evaluating one whole pass over the eval data instead of --eval_steps; `resume_extra`: more args for
  the resumed run)."""
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
  # The resumed run in this process where nothing needs a process of its own (a parameter-server coordinator
  # and tf_keras, read at import, do).
  run = procs.run_trainer_here if env is None else procs.run_trainer
  resume = (_one_eval_pass(args) if full_eval else list(args)) + list(resume_extra)
  result = run(resume + [f"--output_dir={out}", f"--train_steps={step + 50}"], env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Resuming at step {step} of {step + 50}" in result.stderr  # 0 steps lost
  with open(out / "model" / "eval_metrics.json") as f:
    metrics = json.load(f)
  assert (metrics["resumed_from_step"], metrics["final_step"]) == (step, step + 50)
  return metrics


def _one_eval_pass(args):
  """`args` without --eval_steps: the run evaluates one whole pass over the eval data (1000 examples)."""
  return [a for a in args if not a.startswith("--eval_steps=")]


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
  save comes at the end of the running epoch, where the actions fire there. The resumed job is also the
  parameter-server job's check as a whole: closures, learning, one exact evaluation pass, an export that serves;
  under `fit`, where Keras runs no batch-level callbacks, logs, evaluations and checkpoints land on the steps
  their flags name (epochs end on each of them)."""
  out = tmp_path / "out"
  chief, worker, ps = procs.addresses(3)
  cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
  args = _args(churn_data, "--steps_per_loop=25", f"--loop={loop}")
  legacy = {"TF_USE_LEGACY_KERAS": "1"} if loop == "fit" else {}
  cadences = ["--log_every_steps=20", "--eval_every_steps=40", "--checkpoint_every_steps=50"] if loop == "fit" else []
  servers = [{"TF_CONFIG": procs.tf_config(cluster, name, 0), **legacy} for name in ("ps", "worker")]
  with procs.cluster(str(tmp_path)) as c:
    for name, env in zip(("ps", "worker"), servers):
      c.start(name, args + [f"--output_dir={out}"], env)
    metrics = _preempt_and_resume(args, tmp_path, env={"TF_CONFIG": procs.tf_config(cluster, "chief", 0), **legacy},
                                  full_eval=True, resume_extra=cadences)
    assert c.procs["ps"].poll() is None and c.procs["worker"].poll() is None  # servers run until stopped
    assert "Serving ps:0" in c.log("ps")
  assert metrics["strategy"] == "ParameterServerStrategy"
  assert metrics["eval_accuracy"] > 0.8 and metrics["eval_examples"] == 1000, metrics
  serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")  # under fit, tf_keras's
  if loop == "custom":
    assert "closures of up to 25 steps (--steps_per_loop) over 1 worker(s)" in open(tmp_path / "first.log").read()
  else:
    import test_training  # pylint: disable=g-import-not-at-top

    start, end = metrics["resumed_from_step"], metrics["final_step"]
    resumed = range(start + 1, end + 1)  # each action also fires at the final step
    assert [s for s in test_training.train_steps_logged(out) if s > start] == [s for s in resumed if s % 20 == 0 or
                                                                               s == end]
    assert [s for s in test_training.train_steps_logged(out, split="eval") if s > start] == \
        [s for s in resumed if s % 40 == 0 or s == end]
    assert [s for s in test_training.checkpoint_steps(out) if s > start] == [s for s in resumed if s % 50 == 0 or s == end]


@pytest.mark.parametrize("loop", ["fit"])  # the custom loop: tests/test_local_vertex.py, preemptions in a row
def test_sigterm_to_one_multi_worker_replica_saves_on_all(churn_data, tmp_path, loop):
  """A Spot VM is reclaimed: only the worker gets SIGTERM. The workers agree on the step, all save it and exit
  143 (the job cannot go on without the preempted one), and the restarted job resumes there, in sync. `fit`
  runs under tf_keras (Keras 3's fit fails under this strategy); the resumed job is also the check that
  MultiWorkerMirrored `fit` learns, evaluates one exact pass, exports once (the chief) and serves."""
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
  resume = _one_eval_pass(args)
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, resume + [f"--train_steps={step + 50}"], envs[name])
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
  assert digests[0] == digests[1]  # weights identical on both workers
  assert "Keras 2.21" in chief_log  # tf_keras really was the Keras in use
  assert metrics["eval_accuracy"] > 0.8 and metrics["eval_examples"] == 1000, metrics
  assert test_multiworker.saved_models(tmp_path) == [str(out / "model")]  # only the chief's export exists
  serving_checks.assert_loaders_agree(out / "model", f"{churn_data}/eval/*.tfrecord")  # a tf_keras export


def _checkpoint_at(churn_data, out, step):
  """A run that saved at `step` (one process), for the multi-worker runs below to restore."""
  result = procs.run_trainer_here(_args(churn_data) + [f"--output_dir={out}", f"--train_steps={step}"])
  assert result.returncode == 0, result.stderr[-3000:]


def _trained_steps(log):
  return [int(s) for s in re.findall(r"\bstep (\d+)/", log)]


@pytest.mark.parametrize("when", ["start", "waiting for the chief", "restore"])
def test_sigterm_during_multi_worker_start_up_is_honoured(churn_data, tmp_path, when):
  """A SIGTERM anywhere in a MultiWorkerMirrored replica's start-up (imports and pre-flight, the strategy's wait for
  its peers, where TensorFlow's coordination service installs a handler that swallows it, the restore) ends it
  within seconds without training a step: 0 steps lost, where before it trained on and lost them to the SIGKILL."""
  out = tmp_path / "out"
  _checkpoint_at(churn_data, out, 100)
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = _args(churn_data, "--steps_per_loop=10", "--peer_timeout_secs=120") + [f"--output_dir={out}",
                                                                                "--train_steps=1000000"]
  envs = {name: {"TF_CONFIG": procs.tf_config(cluster, name, 0)} for name in ("chief", "worker")}
  worker_log = os.path.join(tmp_path, "worker.log")
  with procs.cluster(str(tmp_path)) as c:
    c.start("worker", args, envs["worker"])
    if when == "start":
      time.sleep(1.0)  # Python and TensorFlow are still importing: the trainer holds SIGTERM from its first line
    elif when == "waiting for the chief":
      _wait_for(worker_log, "Config: ", c.procs["worker"])
      time.sleep(6)  # pre-flight of this data takes about a second: the worker now waits for the chief to join
    else:
      c.start("chief", args, envs["chief"])
      _wait_for(worker_log, "Resuming at step 100 of 1000000", c.procs["worker"])
    signaled = time.monotonic()
    os.kill(c.procs["worker"].pid, signal.SIGTERM)
    code = c.wait(["worker"], 25)["worker"]  # Spot gives about 30 s before the SIGKILL
    took = time.monotonic() - signaled
    log = c.log("worker")
  assert took < 15, f"the worker ended {took:.1f} s after SIGTERM\n{log[-3000:]}"
  if when == "waiting for the chief":  # held back inside TensorFlow's wait: the watchdog ends it, saying why
    assert code == -signal.SIGKILL and "got SIGTERM while it waited for the peers to join" in log, log[-3000:]
  else:
    assert code in (143, -signal.SIGTERM), log[-3000:]
  if when == "start" and code == 143:  # held from the entry's first line, delivered once pre-flight is done
    assert "SIGTERM arrived during pre-flight: nothing was trained since the last checkpoint" in log, log[-3000:]
  assert not [s for s in _trained_steps(log) if s > 100], log[-3000:]  # nothing trained after the SIGTERM
  assert "Traceback" not in log, log[-3000:]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-100")


@pytest.mark.long
def test_chief_preempted_in_the_final_evaluation_the_job_still_succeeds(churn_data, tmp_path):
  """The chief of a MultiWorkerMirrored job is preempted after its final checkpoint, inside the final evaluation
  (made long here: eager, 150 batches of 8). The worker, blocked in the
  evaluation's collective, stops as a preempted peer (exit 143, no traceback); both restart as Vertex restarts
  them, the chief exports alone from the final checkpoint and exits 0, the worker has nothing left to do."""
  out = tmp_path / "out"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = [f"--train_data={churn_data}/train/*.tfrecord", f"--eval_data={churn_data}/train/*.tfrecord",
          "--global_batch_size=8", "--train_steps=60", "--steps_per_loop=10", "--log_every_steps=10",
          "--run_eagerly", "--eval_steps=150", "--peer_timeout_secs=120", f"--output_dir={out}"]
  envs = {name: {"TF_CONFIG": procs.tf_config(cluster, name, 0)} for name in ("chief", "worker")}
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args, envs[name])
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(out / "checkpoints" / "ckpt-60.index"):  # the final checkpoint: the evaluation follows
      assert time.monotonic() < deadline and c.procs["chief"].poll() is None, c.log("chief")[-3000:]
      time.sleep(0.02)
    time.sleep(0.5)
    os.kill(c.procs["chief"].pid, signal.SIGTERM)
    codes = c.wait(["chief", "worker"], 60)
    first_chief, first_worker = c.log("chief"), c.log("worker")
  assert codes["chief"] == -signal.SIGTERM, first_chief[-3000:]  # ended at once: nothing left unsaved
  assert "Final metrics" not in first_chief and not os.path.exists(out / "model")
  assert codes["worker"] == 143, first_worker[-3000:]
  assert re.search(r"Preempted \(a peer replica stopped during training or evaluation", first_worker), \
      first_worker[-3000:]
  assert "Traceback" not in first_worker, first_worker[-3000:]
  with procs.cluster(str(tmp_path)) as c:  # Vertex restarts both
    for name in ("chief", "worker"):
      c.start(name, args, envs[name])
    codes = c.wait(["chief", "worker"], TIMEOUT)
    chief_log, worker_log = c.log("chief"), c.log("worker")
  assert codes == {"chief": 0, "worker": 0}, chief_log[-3000:] + worker_log[-3000:]
  assert "evaluating and exporting alone" in chief_log and "has nothing left to do" in worker_log
  assert json.load(open(out / "model" / "eval_metrics.json"))["final_step"] == 60
  assert [p for p in os.listdir(tmp_path / "out") if ".staging-" in p] == []


@pytest.mark.long
def test_an_epochs_chief_killed_in_the_export_exports_alone_when_restarted(churn_data, tmp_path):
  """--epochs, kill -9 of the MultiWorkerMirrored chief inside its export (its staging dir exists): restarted, the
  chief takes the final step from the run record written when the run started and exports alone within 60 s
  (before: it waited 900 s for peers that had finished, again on every restart); the restarted worker has nothing
  left to do; the staging dir the kill left is gone."""
  out = tmp_path / "out"
  chief, worker = procs.addresses(2)
  cluster = {"chief": [chief], "worker": [worker]}
  args = _args(churn_data, "--steps_per_loop=10", "--peer_timeout_secs=600") + [f"--output_dir={out}",
                                                                                "--epochs=2"]
  envs = {name: {"TF_CONFIG": procs.tf_config(cluster, name, 0)} for name in ("chief", "worker")}
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args, envs[name])
    deadline = time.monotonic() + TIMEOUT
    while not (out.exists() and [p for p in os.listdir(out) if p.startswith("model.staging-")]):
      assert time.monotonic() < deadline and c.procs["chief"].poll() is None, c.log("chief")[-3000:]
      time.sleep(0.01)
    c.kill("chief")  # SIGKILL inside the export
    c.wait(["worker"], 60)
  assert [p for p in os.listdir(out) if p.startswith("model.staging-")], "the kill came after the export"
  assert not (out / "model" / "eval_metrics.json").exists()
  restarted = time.monotonic()
  with procs.cluster(str(tmp_path)) as c:
    for name in ("chief", "worker"):
      c.start(name, args, envs[name])
    codes = c.wait(["chief", "worker"], 60)
    took = time.monotonic() - restarted
    chief_log, worker_log = c.log("chief"), c.log("worker")
  assert codes == {"chief": 0, "worker": 0}, chief_log[-3000:] + worker_log[-3000:]
  assert "evaluating and exporting alone" in chief_log and "has nothing left to do" in worker_log
  metrics = json.load(open(out / "model" / "eval_metrics.json"))
  assert metrics["final_step"] == 2 * 4000 // 64 and metrics["strategy"] == "default"
  assert [p for p in os.listdir(out) if ".staging-" in p] == []
  assert took < 60


def test_what_counts_as_a_lost_peer():
  """Only a collective or coordination error that says a peer went away; a storage outage or a bug passes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.distribute import preemption  # pylint: disable=g-import-not-at-top

  aborted = tf.errors.UnavailableError(None, None, "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1}}"
                                       " Collective ops is aborted by: recvmsg:Connection reset by peer")
  lost = preemption.peer_lost(aborted, where="the evaluation")
  assert str(lost) == ("a peer replica stopped during the evaluation (Collective ops is aborted by: "
                       "recvmsg:Connection reset by peer)")
  outage = tf.errors.UnavailableError(None, None, "Error executing an HTTP request: libcurl code 7 ... when "
                                      "reading gs://bucket/data/train-0.tfrecord")
  assert preemption.peer_lost(outage, where="training") is None
  assert preemption.peer_lost(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [8] vs. [4]"),
                              where="training") is None
