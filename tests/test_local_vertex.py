"""Local Vertex: cloud_configs jobs run replica by replica on this machine against the emulator."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

import procs
import user_package
from scripts import local_vertex
from scripts.localrun import planning
from scripts import stage_data
from scripts import vertex_config
from trainer.distribute import cluster

VALUES = {"PROJECT": "p", "REGION": "r", "BUCKET": "b", "PACKAGE_URI": "gs://b/s/t.tar.gz", "RUN_ID": "x"}


def _config(name):
  return vertex_config.load(os.path.join(procs.REPO, "cloud_configs", name), VALUES).body


def test_each_replica_sees_vertex_contract(tmp_path):
  body = _config("parameter_server.yaml")
  replicas = planning.plan_replicas(body, job_id="j1", job_dir=str(tmp_path), ports=list(range(7000, 7004)),
                                        extra_env={})
  assert [r.name for r in replicas] == ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool2-0"]
  for replica in replicas:
    from_tf_config = cluster.parse_tf_config(replica.env["TF_CONFIG"])
    from_cluster_spec = cluster.parse_cluster_spec(replica.env["CLUSTER_SPEC"])
    assert from_tf_config == dataclass_without_source(from_cluster_spec, from_tf_config.source)
    assert (from_tf_config.task_type, from_tf_config.task_index) == (replica.task_type, replica.index)
    assert from_tf_config.tf_cluster_dict() == {"chief": ["127.0.0.1:7000"],
                                                "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
                                                "ps": ["127.0.0.1:7003"]}
    assert replica.env["AIP_MODEL_DIR"] == "gs://b/runs/x/model/"
    assert replica.env["AIP_CHECKPOINT_DIR"] == "gs://b/runs/x/checkpoints/"
    assert replica.env["AIP_TENSORBOARD_LOG_DIR"] == "gs://b/runs/x/logs/"
    assert replica.env["CLOUD_ML_JOB_ID"] == "j1"


def dataclass_without_source(role, source):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(role, source=source)


def test_accelerators_become_logical_devices(tmp_path):
  replicas = planning.plan_replicas(_config("single_multi_gpu.yaml"), job_id="j", job_dir=str(tmp_path),
                                        ports=[7100], extra_env={})
  assert replicas[0].args[-1] == "--num_cpu_devices=4"
  # Two 2-GPU workers: a chief and a worker of 2 logical devices each, 4 replicas in one MultiWorkerMirrored job,
  # as on Vertex. tests/test_multiworker.py runs that job (its chief and worker, TF_CONFIG as planned here) and
  # checks its 4 replicas; the local runner's own multi-worker launch runs in the preemption and crash tests below.
  body = _config("multi_worker_gpu.yaml")
  body["workerPoolSpecs"][1]["replicaCount"] = 1  # --replica_count=1=1
  chief, worker = planning.plan_replicas(body, job_id="j", job_dir=str(tmp_path), ports=[7100, 7101], extra_env={})
  assert [(r.task_type, r.args[-1]) for r in (chief, worker)] == [("chief", "--num_cpu_devices=2"),
                                                                  ("worker", "--num_cpu_devices=2")]
  assert json.loads(worker.env["TF_CONFIG"])["cluster"] == {"chief": ["127.0.0.1:7100"], "worker": ["127.0.0.1:7101"]}
  # One GPU is one device, as one CPU is: the same replica as single_cpu.yaml's, which runs end to end below.
  one_gpu, one_cpu = (planning.plan_replicas(_config(name), job_id="j", job_dir=str(tmp_path), ports=[7100],
                                             extra_env={})
                      for name in ("single_gpu.yaml", "single_cpu.yaml"))
  assert len(one_gpu) == len(one_cpu) == 1
  assert [a for a in one_gpu[0].args if not a.startswith("--global_batch_size")] == \
      [a for a in one_cpu[0].args if not a.startswith("--global_batch_size")]
  assert not any(a.startswith("--num_cpu_devices") for a in one_gpu[0].args)


def test_evaluator_pool_is_not_in_tf_config(tmp_path):
  body = _config("single_cpu.yaml")
  body["workerPoolSpecs"] += [{}, {}, json.loads(json.dumps(body["workerPoolSpecs"][0]))]
  replicas = planning.plan_replicas(body, job_id="j", job_dir=str(tmp_path), ports=[7200, 7201], extra_env={})
  evaluator = replicas[-1]
  assert evaluator.task_type == "evaluator"
  tf_config = json.loads(evaluator.env["TF_CONFIG"])
  assert tf_config["task"] == {"type": "evaluator", "index": 0} and "evaluator" not in tf_config["cluster"]
  assert "workerpool3" in json.loads(evaluator.env["CLUSTER_SPEC"])["cluster"]


@pytest.fixture(scope="module")
def staged(gcs, churn_data):
  for split in ("train", "eval"):
    stage_data.upload_tree(f"{churn_data}/{split}", f"gs://test-bucket/data/{split}")
  return "test-bucket"


def _children_of(job_dir):
  out = subprocess.run(["pgrep", "-f", job_dir], capture_output=True, text=True, check=False).stdout
  return [p for p in out.split() if int(p) != os.getpid()]


def _run(tmp_path, *args):
  job_dir = str(tmp_path / "job")
  code = local_vertex.main(["--timeout_secs=400", *args, "--bucket=test-bucket", f"--job_dir={job_dir}",
                            "--quiet"])
  assert not _children_of(job_dir)  # no process is left behind
  return code, job_dir


# Plumbing, not learning: 20 steps and one evaluation batch show the job ran as Vertex would run it.
@pytest.mark.parametrize("config,extra,strategy,replicas,users_package", [
    # The trainer image's pools: the container's command (or the image's ENTRYPOINT) and args, no Docker.
    # (single_gpu.yaml plans the same one-device replica, multi_worker_gpu.yaml a chief and a worker of 2 logical
    # devices each: test_accelerators_become_logical_devices.) Its model is a user's package (--extra_package):
    # built into a wheel, staged to the bucket and installed beside the trainer, as the trainer image holds it
    # (submit builds it into the image); the replica imports its build_fn from there.
    ("single_cpu.yaml", [], "default", 1, True),
    # A chief, a worker and a parameter server, each running the trainer installed from the bucket.
    ("parameter_server.yaml", ["--replica_count=1=1"], "ParameterServerStrategy", 1, False),
])
def test_local_run_end_to_end(staged, tmp_path, capsys, config, extra, strategy, replicas, users_package):
  if users_package:
    extra = [*extra, f"--extra_package={user_package.write(str(tmp_path / 'churn-models'))}",
             f"--args={user_package.MODEL_FLAG}"]
  code, job_dir = _run(tmp_path, f"--config=cloud_configs/{config}", "--run_id=" + config.split(".")[0], *extra,
                       "--args=--train_steps=20", "--args=--global_batch_size=64", "--args=--eval_steps=1")
  out = capsys.readouterr().out
  assert code == 0, out + open(f"{job_dir}/workerpool0-0.log").read()[-3000:]
  assert "eval metrics:" in out and f"model: gs://test-bucket/runs/{config.split('.')[0]}/model/" in out
  chief_log = open(f"{job_dir}/workerpool0-0.log").read()
  assert f'"strategy": "{strategy}"' in chief_log and f'"num_replicas": {replicas}' in chief_log
  assert "from TF_CONFIG" in chief_log
  assert f"from {job_dir}/site/trainer\n" in chief_log  # the package installed from the bucket ran
  assert re.search(r"replica\(s\), container \S+/vertex-tf-trainer/trainer:\S+ as python3 -m trainer.task", out)
  assert "scheduling.strategy" not in out, out  # said only for a config that sets one (below)
  if users_package:
    _assert_the_users_package_ran(job_dir, ["workerpool0-0"])


def test_a_flex_start_job_plans_eight_replicas_and_says_it_would_queue(staged, tmp_path, capsys):
  """One 8 x H200 host under Dynamic Workload Scheduler, run as --dry_run (the replica prints its plan and exits:
  8 logical devices, one replica each, in one MirroredStrategy; the batch divides among them). What Vertex's
  scheduling would do that a local run does not is said, not silently ignored."""
  code, job_dir = _run(tmp_path, "--config=cloud_configs/h200_flex_start.yaml", "--run_id=flex", "--args=--dry_run")
  out = capsys.readouterr().out
  log = open(f"{job_dir}/workerpool0-0.log").read()
  assert code == 0, out + log[-3000:]
  assert re.search(r"^scheduling\.strategy FLEX_START: Vertex would queue the job for its machines for up to "
                   r"7200s \(Dynamic Workload Scheduler\); here it starts at once$", out, re.M), out
  (plan,) = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
  assert (plan["strategy"], plan["num_replicas"], plan["cluster_source"]) == ("MirroredStrategy", 8, "TF_CONFIG"), plan


def _assert_the_users_package_ran(job_dir, replicas):
  for replica in replicas:
    log = open(f"{job_dir}/{replica}.log").read()
    assert f"churn_models: built from {job_dir}/site/churn_models/__init__.py" in log, log[-3000:]
    assert f"I Model {user_package.MODEL_FLAG.split('=', 1)[1]} from {job_dir}/site/churn_models/__init__.py\n" in log
    assert "Traceback" not in log
  assert os.path.exists(f"{job_dir}/site/churn_models/__init__.py")  # installed beside the trainer
  staged_wheels = [b.name for b in _bucket_blobs("staging/") if b.name.endswith("churn_models-0.1.0-py3-none-any.whl")]
  assert staged_wheels, "the wheel was not staged"


def test_crashing_replica_fails_the_job_quickly(staged, gcs, tmp_path):
  job_dir = str(tmp_path / "job")
  job = subprocess.Popen(
      [sys.executable, "-m", "scripts.local_vertex", "--config=cloud_configs/multi_worker_gpu.yaml",
       "--replica_count=1=1", "--args=--train_steps=100000", "--args=--log_every_steps=10", "--bucket=test-bucket",
       f"--job_dir={job_dir}", "--quiet", "--timeout_secs=400", "--restart_failed=0"],
      cwd=procs.REPO, env=procs.trainer_env(gcs.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  try:
    deadline = time.monotonic() + 240
    log = f"{job_dir}/workerpool0-0.log"
    while not (os.path.exists(log) and "step 10/" in open(log).read()):
      assert time.monotonic() < deadline and job.poll() is None, "training never started"
      time.sleep(0.2)
    for pid in subprocess.run(["pgrep", "-f", "trainer.task"], capture_output=True, text=True).stdout.split():
      with open(f"/proc/{pid}/environ", "rb") as f:
        if b'"type": "workerpool1"' in f.read():
          os.kill(int(pid), 9)  # the worker crashes
    killed_at = time.monotonic()
    out, err = job.communicate(timeout=120)
  finally:
    if job.poll() is None:
      os.killpg(job.pid, 9)
      job.wait()
  assert time.monotonic() - killed_at < 60
  assert job.returncode == 2
  assert "workerpool1-0 (worker) failed with exit code 137" in err, err[-2000:]  # 128 + SIGKILL, as Vertex says
  assert "--- last lines of workerpool1-0" in err
  assert not _children_of(job_dir)


def _bucket_blobs(prefix):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top  (the session emulator: STORAGE_EMULATOR_HOST)

  return list(storage.Client(project="p").list_blobs("test-bucket", prefix=prefix))


def test_bad_inputs_start_nothing(staged, tmp_path, capsys):
  bad = tmp_path / "bad.yaml"
  bad.write_text(open(os.path.join(procs.REPO, "cloud_configs", "single_cpu.yaml")).read()
                 .replace("imageUri: ${TRAINER_IMAGE}", "imageUri: ${TRAINER_IMAGE}\n      command: [python3, -m, trainer.nope]"))
  cases = [
      ([f"--config={bad}"], r"containerSpec\.command \['python3', '-m', 'trainer\.nope'\] is not the trainer"),
      (["--config=cloud_configs/single_cpu.yaml", "--args=--no_such_flag=1"],
       r"workerpool0-0: trainer args rejected: Unknown command line flag 'no_such_flag'"),
      (["--config=cloud_configs/single_cpu.yaml", "--replica_count=0=2"], r"--replica_count='0=2': expected"),
      (["--config=cloud_configs/single_cpu.yaml", "--args=--train_steps=-1"],
       r"^error: workerpool0-0: trainer args rejected: --train_steps must be a positive integer, got -1$"),
      (["--config=cloud_configs/single_cpu.yaml", "--base_port=70000"],
       r"^error: --base_port=70000: expected a port in 1024\.\.65535, or omit it"),
      (["--config=cloud_configs/multi_worker_gpu.yaml", "--base_port=65535"],
       r"^error: --base_port=65535: the job needs \d+ consecutive ports, which would pass 65535$"),
      (["--config=cloud_configs/single_cpu.yaml", "--bucket=gs://b"],
       r"^error: --bucket='gs://b' is not a Cloud Storage bucket name: expected 3-63 lowercase letters"),
      (["--config=cloud_configs/single_cpu.yaml", "--bucket=Bad Bucket!"],
       r"^error: --bucket='Bad Bucket!' is not a Cloud Storage bucket name"),
      (["--config=cloud_configs/single_cpu.yaml", "--restart_failed=-1"],
       r"^error: --restart_failed=-1: expected a count >= 0"),
      (["--config=cloud_configs/single_cpu.yaml", "--preempt=workerpool1-0@10"],
       r"^error: --preempt='workerpool1-0@10': expected REPLICA@SECONDS or REPLICA@step=N with REPLICA one of "
       r"workerpool0-0, "),
      (["--config=cloud_configs/single_cpu.yaml", "--preempt=workerpool0-0@step=0"],
       r"^error: --preempt='workerpool0-0@step=0': .* and N >= 1$"),
      (["--config=cloud_configs/single_cpu.yaml", "--preempt=workerpool0-0@90", "--timeout_secs=60"],
       r"^error: --preempt='workerpool0-0@90': .* 0 <= SECONDS < --timeout_secs=60 and N >= 1$"),
      (["--config=cloud_configs/single_cpu.yaml", "--preempt=workerpool0-0"],
       r"^error: --preempt='workerpool0-0': expected REPLICA@SECONDS"),
      (["--config=cloud_configs/single_cpu.yaml", "--preempt_grace_secs=-1"],
       r"^error: --preempt_grace_secs=-1.0: expected seconds >= 0"),
      (["--config=cloud_configs/single_cpu.yaml", f"--extra_package={tmp_path}/no-such-package"],
       r"^error: --extra_package=.*/no-such-package: no such file or directory$"),
      (["--config=cloud_configs/single_cpu.yaml", f"--extra_package={procs.REPO}/tests"],
       r"^error: --extra_package=.*/tests: the directory has no pyproject.toml or setup.py to build it from$"),
  ]
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    taken = s.getsockname()[1]
    cases.append((["--config=cloud_configs/single_cpu.yaml", f"--base_port={taken}"],
                  rf"--base_port={taken}: port {taken} on 127.0.0.1 cannot be bound"))
    import re  # pylint: disable=g-import-not-at-top
    for args, message in cases:
      job_dir = tmp_path / f"job{len(args)}{abs(hash(message))}"
      code = local_vertex.main(["--bucket=test-bucket", *args, f"--job_dir={job_dir}", "--quiet"])
      err = capsys.readouterr().err
      assert code == 2 and re.search(message, err, re.M) and len(err.strip().splitlines()) == 1, (args, err)
      assert not os.path.exists(job_dir / "workerpool0-0.log")  # nothing started
      assert not _children_of(str(job_dir))


def test_restarted_replica_resumes_from_its_checkpoint(staged, gcs, tmp_path):
  """--restart_failed restarts a crashed replica as Vertex does; checkpoints in the bucket make it resume."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  job_dir = str(tmp_path / "job")
  base = "gs://test-bucket/runs/restart"
  job = subprocess.Popen(
      [sys.executable, "-m", "scripts.local_vertex", "--config=cloud_configs/single_cpu.yaml", "--run_id=restart",
       "--restart_failed=1", "--args=--train_steps=1000", "--args=--checkpoint_every_steps=200",
       "--args=--global_batch_size=32", "--args=--eval_steps=4", "--bucket=test-bucket", f"--job_dir={job_dir}",
       "--quiet", "--timeout_secs=400"],
      cwd=procs.REPO, env=procs.trainer_env(gcs.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  try:
    deadline = time.monotonic() + 240
    while not tf.io.gfile.exists(f"{base}/checkpoints/checkpoint"):
      assert time.monotonic() < deadline and job.poll() is None, "no checkpoint before the deadline"
      time.sleep(0.2)
    for pid in subprocess.run(["pgrep", "-f", "trainer.task"], capture_output=True, text=True).stdout.split():
      with open(f"/proc/{pid}/environ", "rb") as f:
        if b"CLOUD_ML_JOB_ID=restart\0" in f.read():
          os.kill(int(pid), 9)  # this job's chief crashes once
    out, err = job.communicate(timeout=300)
  finally:
    if job.poll() is None:
      os.killpg(job.pid, 9)
      job.wait()
  assert job.returncode == 0, out[-2000:] + err[-2000:]
  assert "workerpool0-0 exited with 137; restarting it (1/1)" in out  # 128 + SIGKILL, as a container reports it
  with tf.io.gfile.GFile(f"{base}/model/eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["resumed_from_step"] >= 200 and metrics["final_step"] == 1000
  assert not _children_of(job_dir)


def test_timeout_stops_every_child(staged, tmp_path, capsys):
  """Both replicas are still starting or training when the job's time is up (whichever: every child is stopped)."""
  code, job_dir = _run(tmp_path, "--config=cloud_configs/multi_worker_gpu.yaml", "--replica_count=1=1",
                       "--args=--train_steps=1000000", "--timeout_secs=8")
  assert code == 2
  assert re.search(r"error: job \S+ failed: timed out after 8 s", capsys.readouterr().err)
  assert not _children_of(job_dir)


@pytest.mark.long
def test_preemptions_in_a_row_lose_no_step(staged, gcs, tmp_path):
  """Spot preemptions of a multi-worker job, the worker's VM and then the chief's, with local_vertex's defaults:
  each replica saves on SIGTERM, its peer stops with it (one MultiWorkerMirrored job), both restart, and the job ends at exactly the
  configured step with one complete export; the summary shows each saved step equal to the step resumed at.
  Preempted by step, not by second, so that a loaded machine moves the preemptions, not the test's outcome."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  job_dir = str(tmp_path / "job")
  base = "gs://test-bucket/runs/preempted"
  result = subprocess.run(
      [sys.executable, "-m", "scripts.local_vertex", "--config=cloud_configs/multi_worker_gpu.yaml",
       "--replica_count=1=1", "--run_id=preempted", "--preempt=workerpool1-0@step=150",
       "--preempt=workerpool0-0@step=300", "--preempt_grace_secs=30", "--args=--train_steps=450",
       "--args=--num_cpu_devices=1", "--args=--log_every_steps=10",
       "--args=--steps_per_loop=10", "--args=--checkpoint_every_steps=100000", "--args=--global_batch_size=32",
       "--args=--eval_steps=4", "--bucket=test-bucket", f"--job_dir={job_dir}", "--quiet", "--timeout_secs=600"],
      cwd=procs.REPO, env=procs.trainer_env(gcs.env), capture_output=True, text=True, timeout=650, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  # Each preempted replica exits 143 by itself within the grace (never SIGKILLed), also when the trainer's exit
  # deadline ends it after the save (a MultiWorkerMirrored chief whose peer already stopped hangs in TensorFlow's
  # clean-up; see trainer/distribute/preemption.py). The peer that stopped with it restarts under the default
  # --restart_failed (5, as on Vertex): no flag is needed for the job to survive its preemptions.
  lines = re.findall(r"^  (workerpool\d-0) @ step (\d+): exit 143 after [\d.]+ s, saved step (\d+); resumed at "
                     r"step (\d+)$", result.stdout, re.M)
  assert [(name, at) for name, at, _, _ in lines] == [("workerpool1-0", "150"), ("workerpool0-0", "300")], \
      result.stdout[-3000:]
  assert all(saved == resumed for _, _, saved, resumed in lines)  # 0 steps lost per preemption
  assert 150 <= int(lines[0][2]) < int(lines[1][2]) < 450, lines  # each came where its step said
  with tf.io.gfile.GFile(f"{base}/model/eval_metrics.json") as f:
    metrics = json.load(f)
  assert metrics["final_step"] == 450 and metrics["resumed_from_step"] == int(lines[-1][3])
  assert not _children_of(job_dir)


def test_the_job_is_the_chiefs_a_peer_failing_after_it_does_not_fail_it(tmp_path, capsys):
  """As Vertex judges a job: the chief exits 0, then a worker (say, mid-collective when the chief left) exits 1:
  the job succeeds and the summary says what the worker did. A worker failing before the chief is done still
  fails the job."""
  from scripts.localrun.supervise import supervise  # pylint: disable=g-import-not-at-top

  def replicas(worker_code, worker_secs):
    made = []
    for pool, (task, code, secs) in enumerate([("chief", 0, 0.5), ("worker", worker_code, worker_secs)]):
      made.append(planning.Replica(pool=pool, index=0, task_type=task, args=[], env={},
                                   log_path=str(tmp_path / f"{task}-{worker_secs}.log"),
                                   command=("python3", "-c", f"import sys, time; time.sleep({secs}); sys.exit({code})")))
    return made

  ok, reason, failed = supervise(replicas(1, 2.0), site=str(tmp_path), base_env=dict(os.environ), timeout_secs=60,
                                 restart_failed=0, quiet=True)
  assert (ok, reason, failed) == (True, "the chief succeeded", None)
  assert "after the chief succeeded: workerpool1-0 exited 1; the job succeeds, as on Vertex" in capsys.readouterr().out
  early = replicas(1, 0.0)
  ok, reason, failed = supervise(early, site=str(tmp_path), base_env=dict(os.environ), timeout_secs=60,
                                 restart_failed=0, quiet=True)
  assert not ok and failed is early[1] and reason == "workerpool1-0 (worker) failed with exit code 1"


def test_failed_replicas_restart_as_on_vertex_but_bad_input_fails_at_once(tmp_path, capsys):
  """The default --restart_failed is Vertex's 5 restarts per replica; the trainer's bad-input exit 2 is not
  restarted (the same input fails the same way); a process ended by a signal reports as a container does."""
  from scripts.localrun.supervise import supervise  # pylint: disable=g-import-not-at-top
  from scripts import local_vertex  # pylint: disable=g-import-not-at-top

  assert local_vertex.build_parser().parse_args([]).restart_failed == 5

  def job(worker_code, name):
    counter = tmp_path / f"{name}.count"
    # The worker fails until its third start, then succeeds; the chief waits for it to have succeeded.
    worker = (f"import os, sys; p = {str(counter)!r}; n = int(open(p).read()) + 1 if os.path.exists(p) else 1; "
              f"open(p, 'w').write(str(n)); sys.exit({worker_code} if n < 3 else 0)")
    chief = f"import os, time\nwhile not os.path.exists({str(counter)!r}) or open({str(counter)!r}).read() != '3': time.sleep(0.05)"
    return [planning.Replica(pool=pool, index=0, task_type=task, args=[], env={},
                             log_path=str(tmp_path / f"{name}-{task}.log"), command=("python3", "-c", code))
            for pool, (task, code) in enumerate([("chief", chief), ("worker", worker)])]

  ok, reason, _ = supervise(job(1, "crash"), site=str(tmp_path), base_env=dict(os.environ), timeout_secs=60,
                            restart_failed=5, quiet=True)
  assert (ok, reason) == (True, "the chief succeeded")
  assert "workerpool1-0 exited with 1; restarting it (2/5)" in capsys.readouterr().out
  replicas = job(2, "bad-input")
  ok, reason, failed = supervise(replicas, site=str(tmp_path), base_env=dict(os.environ), timeout_secs=60,
                                 restart_failed=5, quiet=True)
  assert not ok and failed is replicas[1] and reason == "workerpool1-0 (worker) failed with exit code 2 (bad input)"
  replicas = job(-9, "killed")
  replicas[1].command = ("python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
  ok, reason, _ = supervise(replicas, site=str(tmp_path), base_env=dict(os.environ), timeout_secs=60,
                            restart_failed=0, quiet=True)
  assert not ok and reason == "workerpool1-0 (worker) failed with exit code 137"


def test_a_preempted_replica_and_its_peer_ending_together_are_told_apart(tmp_path, capsys):
  """With scheduling.restartJobOnWorkerRestart, the preempted worker and the chief that stops with it end within
  one poll: the worker's exit is its preemption's (143, not a failure restart of the chief), every replica
  restarts once, and no stale SIGKILL timer hits the restarted worker later (seen by a newcomer: a healthy
  restarted replica SIGKILLed 30 s after the first preemption, and a wrong saved/resumed step in the summary)."""
  from scripts.localrun.supervise import supervise  # pylint: disable=g-import-not-at-top

  stopped = tmp_path / "stopped"
  # First start: the worker, on SIGTERM, marks `stopped` and exits 143 a moment after the chief, which exits 143
  # (a preempted peer) as soon as it sees the mark. Second start: both succeed, the worker after 1.5 s.
  worker = (f"import os, signal, sys, time\np = {str(stopped)!r}\nif os.path.exists(p):\n  time.sleep(1.5); sys.exit(0)\n"
            "def term(*_):\n  open(p, 'w').close(); time.sleep(0.05); sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, term)\nwhile True: time.sleep(0.01)")
  chief = (f"import os, sys, time\np = {str(stopped)!r}\nif os.path.exists(p):\n  time.sleep(1.5); sys.exit(0)\n"
           "while not os.path.exists(p): time.sleep(0.005)\nsys.exit(143)")
  replicas = [planning.Replica(pool=pool, index=0, task_type=task, args=[], env={},
                               log_path=str(tmp_path / f"{task}.log"), command=("python3", "-c", code))
              for pool, (task, code) in enumerate([("chief", chief), ("worker", worker)])]
  preemption = planning.Preemption(replica="workerpool1-0", at_secs=0.5)
  ok, reason, _ = supervise(replicas, site=str(tmp_path), base_env=dict(os.environ), timeout_secs=60,
                            restart_failed=5, quiet=True, preemptions=[preemption], grace_secs=1.0,
                            restart_job=True)
  out = capsys.readouterr().out
  assert (ok, reason) == (True, "the chief succeeded"), out
  assert preemption.exit_code == 143 and not preemption.killed, out
  assert "still running" not in out and "restarting it (1/5)" not in out, out
