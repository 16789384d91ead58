"""Test helpers: free ports, trainer subprocesses with bounded lifetimes, and clusters of them."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterator, Mapping, Sequence

from scripts import loopback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every test process stays on loopback: no metadata server, no real Google host.
SAFE_ENV = {
    **loopback.LOOPBACK_ENV,
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONUNBUFFERED": "1",
}


def free_ports(count: int) -> list[int]:
  """Ports the OS says are free now (the local Vertex runner's own chooser)."""
  from scripts.localrun import planning  # pylint: disable=g-import-not-at-top

  return planning.reserve_ports(count, None)


def trainer_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "CLUSTER_SPEC") and not k.startswith("AIP_")}
  env.update(SAFE_ENV)
  extra = dict(extra or {})
  # The trainer image's imports: no scikit-learn (tests/trainer_image/sklearn says why). A PYTHONPATH in `extra`
  # (a test's plug-in modules) comes first.
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra.pop("PYTHONPATH", None), REPO,
                                                    os.path.join(REPO, "tests", "trainer_image"),
                                                    env.get("PYTHONPATH")]))
  env.update(extra)
  return env


def run_trainer_in_process(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
  """`python -m trainer.task ARGS` as this process's `task.run_command` (fresh flags, the given environment on
  top of the loopback settings); returns the exit code. For cases where no process boundary is the point."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top
  from trainer import task  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()
  trainer_flags.define_flags(values)
  # What a run sets for its whole process is put back after it, so that the next test in this process (which may
  # build a model itself) does not inherit a run's --precision or --run_eagerly.
  policy, eager = tf.keras.mixed_precision.global_policy(), tf.config.functions_run_eagerly()
  try:
    return task.run_command(["trainer.task", *args], {**SAFE_ENV, **(env or {})}, flag_values=values)
  finally:
    tf.keras.mixed_precision.set_global_policy(policy)
    tf.config.run_functions_eagerly(eager)


def run_trainer_here(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
  """`run_trainer` in this process (no TensorFlow import to pay for: 5 s of CPU a process here), for cases where
  no process boundary is the point: the exit code and stderr as the command's process would show them (its
  `error:` line and its log lines, absl's INFO ones included). Its own collective keys, as every in-process run."""
  import io  # pylint: disable=g-import-not-at-top
  import logging  # pylint: disable=g-import-not-at-top

  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

  buffer = io.StringIO()
  handler = logging.StreamHandler(buffer)
  handler.setFormatter(logging.Formatter("%(levelname).1s %(message)s"))
  absl_logger = absl_logging.get_absl_logger()
  saved_level = absl_logger.level
  absl_logger.addHandler(handler)
  absl_logger.setLevel(logging.INFO)
  try:
    with contextlib.redirect_stderr(buffer), fresh_collective_keys():
      code = run_trainer_in_process(args, env=env)
  finally:
    absl_logger.removeHandler(handler)
    absl_logger.setLevel(saved_level)
  return subprocess.CompletedProcess(["trainer.task", *args], code, "", buffer.getvalue())


def trainer_cmd(args: Sequence[str]) -> list[str]:
  return [sys.executable, "-m", "trainer.task", *args]


def run_trainer(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 240,
                cwd: str | None = None) -> subprocess.CompletedProcess:
  """Runs one trainer process to completion (killed after `timeout` seconds)."""
  return subprocess.run(trainer_cmd(args), env=trainer_env(env), cwd=cwd or REPO, capture_output=True,
                        text=True, timeout=timeout, check=False)


class Cluster:
  """Trainer processes started together; every one is killed when the context exits."""

  def __init__(self, log_dir: str):
    self.log_dir = log_dir
    self.procs: dict[str, subprocess.Popen] = {}

  def start(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    log = open(os.path.join(self.log_dir, f"{name}.log"), "w")  # pylint: disable=consider-using-with
    proc = subprocess.Popen(trainer_cmd(args), env=trainer_env(env), cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    self.procs[name] = proc
    return proc

  def wait(self, names: Sequence[str], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    codes = {}
    for name in names:
      remaining = max(0.1, deadline - time.monotonic())
      try:
        codes[name] = self.procs[name].wait(timeout=remaining)
      except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} still running after {timeout}s; log:\n{self.log(name)[-3000:]}") from None
    return codes

  def log(self, name: str) -> str:
    with open(os.path.join(self.log_dir, f"{name}.log")) as f:
      return f.read()

  def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
    proc = self.procs[name]
    if proc.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
      proc.wait(timeout=30)

  def close(self) -> None:
    for name in list(self.procs):
      self.kill(name)


@contextlib.contextmanager
def cluster(log_dir: str) -> Iterator[Cluster]:
  c = Cluster(log_dir)
  try:
    yield c
  finally:
    c.close()


def tf_config(cluster_dict: Mapping[str, list[str]], task_type: str, index: int) -> str:
  return json.dumps({"cluster": cluster_dict, "task": {"type": task_type, "index": index}})


def addresses(count: int) -> list[str]:
  return [f"127.0.0.1:{p}" for p in free_ports(count)]


def run_chief_and_worker(log_dir: str, args: Sequence[str], *, env: Mapping[str, str] | None = None,
                         timeout: float = 240) -> dict[str, str]:
  """A 2-process MultiWorkerMirrored job (a chief and a worker on free local ports) run to its end; asserts both
  exited 0 and returns their logs by task. The processes are killed if they outlive `timeout`."""
  chief, worker = addresses(2)
  cluster_dict = {"chief": [chief], "worker": [worker]}
  with cluster(log_dir) as c:
    for task in ("chief", "worker"):
      c.start(task, args, {**(env or {}), "TF_CONFIG": tf_config(cluster_dict, task, 0)})
    codes = c.wait(["chief", "worker"], timeout)
    assert codes == {"chief": 0, "worker": 0}, c.log("chief")[-3000:] + c.log("worker")[-3000:]
    return {task: c.log(task) for task in ("chief", "worker")}


_in_process_runs = itertools.count(1)


@contextlib.contextmanager
def fresh_collective_keys():
  """Collective keys of their own for the strategies of one in-process run. TensorFlow caches a collective's
  parameters by (group key, instance key) for the life of the process, and every MirroredStrategy (and
  MultiWorkerMirroredStrategy) numbers its collectives from the same start; so a second run in this process with
  other gradient shapes fails ("Shape mismatch in the collective instance 100 ... expected shape [3267] but
  another member in the group expected shape [2499]"). One trainer process builds one strategy, so only tests
  meet this; TensorFlow's own tests move `_collective_key_base` ("Only set this in tests")."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  classes = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
  saved = [cls.__dict__.get("_collective_key_base") for cls in classes]
  base = 1_000_000 + next(_in_process_runs) * 100_000
  for cls in classes:
    cls._collective_key_base = base  # pylint: disable=protected-access
  try:
    yield
  finally:
    for cls, value in zip(classes, saved):
      if value is None:
        del cls._collective_key_base
      else:
        cls._collective_key_base = value  # pylint: disable=protected-access
