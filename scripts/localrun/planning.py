"""The job's worker pools as replicas: ports, TF_CONFIG / CLUSTER_SPEC / AIP_* environment, args, logs; and the
checks that need no process (trainer args, free ports)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from typing import Any

from scripts import vertex_config
from trainer.distribute import cluster as cluster_lib

POOL_TYPES = tuple(cluster_lib.VERTEX_POOLS.values())  # pool index -> TF_CONFIG task type


class LocalRunError(RuntimeError):
  """A one-line reason the job cannot start or failed."""


@dataclasses.dataclass
class Replica:
  pool: int
  index: int
  task_type: str
  args: list[str]
  env: dict[str, str]
  log_path: str
  command: tuple[str, ...] = ("python3", "-m", "trainer.task")  # the pool's, before `args`
  process: subprocess.Popen | None = None
  started: float = 0.0
  ended: float | None = None
  exit_code: int | None = None
  restarts: int = 0
  streamer: Any = None  # the thread copying its output to the log
  last_step: int = 0  # the last `step N/M` progress line it printed (a preemption by step waits for it)

  @property
  def name(self) -> str:
    return f"workerpool{self.pool}-{self.index}"


def plan_replicas(spec: dict, *, job_id: str, job_dir: str, ports: list[int], extra_env: dict[str, str],
                  trial: str | None = None) -> list[Replica]:
  """Every replica of every trainer pool with the environment Vertex would give it (pure, given the ports); a
  tuning trial's replicas also get its id (TF_CONFIG task.trial, CLOUD_ML_TRIAL_ID) and its own output dirs."""
  pools = spec["workerPoolSpecs"]
  trainer_pools = [i for i, p in enumerate(pools) if vertex_config.trainer_spec(p)]
  addresses: dict[int, list[str]] = {}
  port_iter = iter(ports)
  for i in trainer_pools:
    addresses[i] = [f"127.0.0.1:{next(port_iter)}" for _ in range(pools[i]["replicaCount"])]
  cluster_spec = {f"workerpool{i}": a for i, a in addresses.items()}
  tf_cluster = {POOL_TYPES[i]: a for i, a in addresses.items() if i != 3}  # the evaluator is never listed
  base = spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
  if base and trial is not None:
    base = f"{base}/{trial}"  # Vertex: AIP_MODEL_DIR=<base>/<trial id>/model/, and so on
  replicas = []
  for i in trainer_pools:
    package = vertex_config.trainer_spec(pools[i])  # pythonPackageSpec or containerSpec: args and env
    command = tuple(vertex_config.trainer_command(pools[i]))
    job = ({"python_module": package["pythonModule"]} if "pythonModule" in package
           else {"image_uri": package.get("imageUri", "")})
    args = list(package.get("args", []))
    accelerators = pools[i].get("machineSpec", {}).get("acceleratorCount", 0)
    if accelerators > 1 and not any(a.startswith("--num_cpu_devices") for a in args):
      args.append(f"--num_cpu_devices={accelerators}")  # N GPUs here become N logical CPU devices
    for index in range(pools[i]["replicaCount"]):
      task = {"type": f"workerpool{i}", "index": index}
      env = {
          "CLUSTER_SPEC": json.dumps({"cluster": cluster_spec, "environment": "cloud", "task": task,
                                      "job": json.dumps(job)}),
          "TF_CONFIG": json.dumps({"cluster": tf_cluster, "task": {"type": POOL_TYPES[i], "index": index,
                                                                   **({"trial": trial} if trial else {})},
                                   "environment": "cloud"}),
          "CLOUD_ML_JOB_ID": job_id,
          **({"CLOUD_ML_TRIAL_ID": trial} if trial else {}),
          **{e["name"]: e["value"] for e in package.get("env", [])},
          **extra_env,
      }
      if base:
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/")
      replicas.append(Replica(pool=i, index=index, task_type=POOL_TYPES[i], args=args, env=env, command=command,
                              log_path=os.path.join(job_dir, f"workerpool{i}-{index}.log")))
  return replicas


def local_argv(command: tuple[str, ...]) -> list[str]:
  """A trainer command as this machine runs it: the container's `python3`/`python` (or the console script) is
  this interpreter, with the trainer installed from the sdist on its path."""
  if list(command) == ["vertex-tf-trainer"]:
    return [sys.executable, "-m", "trainer.task"]  # the console script's entry is trainer.task's __main__
  if command and command[0] in ("python", "python3"):
    return [sys.executable, *command[1:]]
  raise LocalRunError(f"cannot run {list(command)!r} here: expected a python -m command or vertex-tf-trainer")


def check_trainer_args(replicas: list[Replica]) -> None:
  """Checks each replica's args as the trainer will (flags and values), so a bad one fails before start."""
  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top

  for replica in replicas:
    try:
      trainer_flags.check_args(replica.args, where=replica.name)
    except UserError as e:
      raise LocalRunError(str(e)) from None


def reserve_ports(count: int, base_port: int | None) -> list[int]:
  """`count` free ports: consecutive from --base_port (each checked), or chosen by the OS."""
  if base_port is None:
    sockets = []
    try:
      for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
      return [s.getsockname()[1] for s in sockets]
    finally:
      for s in sockets:
        s.close()
  if base_port + count - 1 > 65535:
    raise LocalRunError(f"--base_port={base_port}: the job needs {count} consecutive ports, which would pass 65535")
  ports = list(range(base_port, base_port + count))
  for port in ports:
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError as e:
        raise LocalRunError(f"--base_port={base_port}: port {port} on 127.0.0.1 cannot be bound ({e.strerror}); "
                            f"the job needs {count} free ports from there, or omit --base_port") from None
  return ports


@dataclasses.dataclass
class Preemption:
  """`--preempt=REPLICA@SECONDS` (SIGTERM to that replica SECONDS after the job started) or `REPLICA@step=N` (once
  its progress lines reach step N: the same preemption wherever the machine's speed puts it), SIGKILL after the
  grace if it still runs, then a restart as Vertex restarts a preempted VM (same name, host and port). What
  happened is filled in as it happens, for the summary."""

  replica: str
  at_secs: float | None = None
  at_step: int | None = None
  sent: float | None = None  # monotonic time of the SIGTERM
  exit_code: int | None = None
  exit_secs: float | None = None  # from the SIGTERM to the exit
  killed: bool = False
  log_offset: int = 0  # where the replica's log stood at the SIGTERM
  restart_offset: int | None = None  # where it stood at the restart

  @property
  def done(self) -> bool:
    return self.exit_code is not None

  @property
  def when(self) -> str:
    return f"step {self.at_step}" if self.at_step is not None else f"{self.at_secs:g} s"

  def is_due(self, *, secs_since_start: float, replica_step: int) -> bool:
    if self.at_step is not None:
      return replica_step >= self.at_step
    return secs_since_start >= self.at_secs


def parse_preemptions(values: list[str], replica_names: list[str], *, timeout_secs: float) -> list[Preemption]:
  """`--preempt` values (each "REPLICA@SECONDS" or "REPLICA@step=N", comma-separated), checked against the job's
  replicas; in the order they fall due (by seconds first, then by step)."""
  preemptions = []
  for value in values:
    for item in filter(None, value.split(",")):
      name, sep, when = item.partition("@")
      at_secs = at_step = None
      if when.startswith("step="):
        at_step = int(when[5:]) if when[5:].isdigit() and int(when[5:]) > 0 else None
        valid = at_step is not None
      else:
        try:
          at_secs = float(when)
        except ValueError:
          at_secs = -1.0
        valid = 0 <= at_secs < timeout_secs
      if not sep or name not in replica_names or not valid:
        raise LocalRunError(f"--preempt={item!r}: expected REPLICA@SECONDS or REPLICA@step=N with REPLICA one of "
                            f"{', '.join(replica_names)}, 0 <= SECONDS < --timeout_secs={timeout_secs:g} and N >= 1")
      preemptions.append(Preemption(replica=name, at_secs=at_secs, at_step=at_step))
  return sorted(preemptions, key=lambda p: (p.at_secs is None, p.at_secs or 0, p.at_step or 0))
