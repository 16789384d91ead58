"""A run dir belongs to one job: a second live job is refused in one line, a restart of the same job (or of a
run whose process is gone) continues it."""

import json
import os
import signal
import subprocess
import time

import procs
from trainer.distribute import ownership

NOW = 1_000_000.0


def _owner(**changes):
  fields = {"job_id": "111", "host": "vm-a", "pid": 42, "heartbeat": NOW - 5, "ended": False, **changes}
  return ownership.Owner(**fields)


def _why(holder, job_id="222", host="vm-b", alive=True):
  return ownership.why_not_free(holder, job_id=job_id, host=host, now=NOW, pid_alive=lambda pid: alive)


def test_who_may_take_a_run_dir():
  assert _why(None) is None  # nobody holds it
  assert _why(_owner(ended=True)) is None  # the holder ended
  assert _why(_owner(), job_id="111") is None  # the same Vertex job, restarted
  assert _why(_owner(), host="vm-a", alive=False) is None  # a local run killed with -9, started again
  assert _why(_owner(heartbeat=NOW - ownership.STALE_AFTER_SECS - 1)) is None  # a chief elsewhere that died
  assert _why(_owner()) == "job 111 (pid 42 on vm-a, last seen 5 s ago)"  # another job, alive
  assert _why(_owner(job_id=None), job_id=None, host="vm-a", alive=True) == (
      "a run with no CLOUD_ML_JOB_ID (pid 42 on vm-a, last seen 5 s ago)")  # two plain runs at once


def test_a_claim_beats_while_held_and_is_marked_ended(tmp_path, monkeypatch):
  monkeypatch.setattr(ownership, "HEARTBEAT_SECS", 0.05)
  with ownership.Claim(str(tmp_path), job_id="333"):
    first = json.loads((tmp_path / ownership.OWNER_FILE).read_text())
    time.sleep(0.3)
    later = json.loads((tmp_path / ownership.OWNER_FILE).read_text())
    assert first["job_id"] == "333" and first["pid"] == os.getpid() and not first["ended"]
    assert later["heartbeat"] > first["heartbeat"]
  assert json.loads((tmp_path / ownership.OWNER_FILE).read_text())["ended"]


def _args(churn_data, out, steps):
  return [f"--train_data={churn_data}/train/*.tfrecord", f"--output_dir={out}", "--global_batch_size=64",
          f"--train_steps={steps}", "--checkpoint_every_steps=100000", "--log_every_steps=50", "--eval_steps=0"]


def test_a_second_job_on_a_live_run_dir_is_refused_and_the_same_job_continues(churn_data, tmp_path, capsys):
  out = tmp_path / "out"
  log_path = tmp_path / "first.log"
  with open(log_path, "w") as log:
    first = subprocess.Popen(procs.trainer_cmd(_args(churn_data, out, 1000000)),
                             env=procs.trainer_env({"CLOUD_ML_JOB_ID": "1001"}), cwd=procs.REPO, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
  try:
    deadline = time.monotonic() + 120
    while "step 50/" not in log_path.read_text():
      assert first.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
      time.sleep(0.2)
    # The second job is refused before it touches TensorFlow's devices: run in this process, as the CLI would.
    code = procs.run_trainer_in_process(_args(churn_data, out, 100), env={"CLOUD_ML_JOB_ID": "2002"})
    stderr = capsys.readouterr().err
    messages = [json.loads(line)["message"] if line.startswith("{") else line for line in stderr.splitlines()]
    errors = [m for m in messages if m.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith(f"error: --checkpoint_dir: {out}/checkpoints is in use by job 1001 (pid "
                                f"{first.pid} on ")
    os.kill(first.pid, signal.SIGTERM)  # preempted: saves, exits 143
    assert first.wait(timeout=30) == 143
  finally:
    if first.poll() is None:
      os.killpg(first.pid, signal.SIGKILL)
      first.wait()
  assert json.loads((out / "checkpoints" / ownership.OWNER_FILE).read_text())["ended"]  # released on exit
  step = max(int(name.split("-")[1].split(".")[0]) for name in os.listdir(out / "checkpoints")
             if name.endswith(".index"))
  again = procs.run_trainer_here(_args(churn_data, out, step + 20), env={"CLOUD_ML_JOB_ID": "1001"})
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Resuming at step {step} of {step + 20}" in again.stderr


def test_a_model_dir_holding_another_runs_export_is_refused(churn_data, tmp_path):
  """--model_dir is claimed like the checkpoint dir: another run's export there is refused in one line before
  anything is trained (it was replaced, exit 0); the same run (its checkpoint dir) may export there again."""
  model_dir = tmp_path / "serving"
  common = [f"--train_data={churn_data}/train/*.tfrecord", f"--eval_data={churn_data}/eval/*.tfrecord",
            "--eval_steps=2", f"--model_dir={model_dir}"]
  first = procs.run_trainer_here(common + [f"--output_dir={tmp_path}/a", "--train_steps=20"])
  assert first.returncode == 0, first.stderr[-3000:]
  exported = (model_dir / "eval_metrics.json").read_text()
  second = procs.run_trainer_here(common + [f"--output_dir={tmp_path}/b", "--train_steps=20"])
  errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
  assert second.returncode == 2 and errors == [
      f"error: --model_dir: {model_dir} holds the export of another run (its checkpoints in {tmp_path}/a/checkpoints);"
      " this run would replace it: give this run its own --model_dir (or --output_dir), or remove that export "
      "first"], second.stderr[-3000:]
  assert (model_dir / "eval_metrics.json").read_text() == exported and not (tmp_path / "b").exists()
  again = procs.run_trainer_here(common + [f"--output_dir={tmp_path}/a", "--train_steps=40"])  # the same run, further
  assert again.returncode == 0, again.stderr[-3000:]
  assert json.loads((model_dir / "eval_metrics.json").read_text())["final_step"] == 40
