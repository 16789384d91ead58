"""Run a cloud_configs/ job on this machine, replica by replica, the way Vertex AI would run it.

    python scripts/local_vertex.py --config=cloud_configs/multi_worker_gpu.yaml --replica_count=1=1 \\
        --args=--train_steps=300

What each replica gets is Vertex's contract: the trainer sdist built, staged to the (emulated) bucket and
installed into an isolated dir as the executor does from `packageUris`; CLUSTER_SPEC (workerpoolN) and TF_CONFIG
(chief/worker/ps/evaluator); AIP_MODEL_DIR/AIP_CHECKPOINT_DIR/AIP_TENSORBOARD_LOG_DIR from baseOutputDirectory;
CLOUD_ML_JOB_ID; the pool's args and env. A pool's N accelerators become N logical CPU devices
(--num_cpu_devices=N), so a "4-GPU" replica runs 4 MirroredStrategy replicas. A Reduction Server pool is not run
(its image is Google's); the trainer is told with --reduction_server, as on Vertex.

Job semantics: the job succeeds when the chief succeeds (parameter servers and evaluators are then stopped); a
failing replica fails the job at once, with its last lines shown, unless --restart_failed lets it restart like
a Vertex replica. Ctrl-C or --timeout_secs stops every child. Logs stream live, prefixed `workerpool1-0 |`,
and are kept per replica under the job dir.

Cloud Storage: the emulator is started for the job unless STORAGE_EMULATOR_HOST is already set (then the
running one is used: scripts/gcs_emulator.py start).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from scripts import submit  # pylint: disable=wrong-import-position
from scripts import vertex_config  # pylint: disable=wrong-import-position

POOL_TYPES = ("chief", "worker", "ps", "evaluator")


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
  process: subprocess.Popen | None = None
  started: float = 0.0
  ended: float | None = None
  exit_code: int | None = None
  restarts: int = 0

  @property
  def name(self) -> str:
    return f"workerpool{self.pool}-{self.index}"


def plan_replicas(spec: dict, *, job_id: str, job_dir: str, ports: list[int], extra_env: dict[str, str]) -> list[Replica]:
  """Every replica of every trainer pool with the environment Vertex would give it (pure, given the ports)."""
  pools = spec["workerPoolSpecs"]
  trainer_pools = [i for i, p in enumerate(pools) if p and p.get("pythonPackageSpec")]
  addresses: dict[int, list[str]] = {}
  port_iter = iter(ports)
  for i in trainer_pools:
    addresses[i] = [f"127.0.0.1:{next(port_iter)}" for _ in range(pools[i]["replicaCount"])]
  cluster_spec = {f"workerpool{i}": a for i, a in addresses.items()}
  tf_cluster = {POOL_TYPES[i]: a for i, a in addresses.items() if i != 3}  # the evaluator is never listed
  base = spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
  replicas = []
  for i in trainer_pools:
    package = pools[i]["pythonPackageSpec"]
    args = list(package.get("args", []))
    accelerators = pools[i].get("machineSpec", {}).get("acceleratorCount", 0)
    if accelerators > 1 and not any(a.startswith("--num_cpu_devices") for a in args):
      args.append(f"--num_cpu_devices={accelerators}")  # N GPUs here become N logical CPU devices
    for index in range(pools[i]["replicaCount"]):
      task = {"type": f"workerpool{i}", "index": index}
      env = {
          "CLUSTER_SPEC": json.dumps({"cluster": cluster_spec, "environment": "cloud", "task": task,
                                      "job": json.dumps({"python_module": package["pythonModule"]})}),
          "TF_CONFIG": json.dumps({"cluster": tf_cluster, "task": {"type": POOL_TYPES[i], "index": index},
                                   "environment": "cloud"}),
          "CLOUD_ML_JOB_ID": job_id,
          **{e["name"]: e["value"] for e in package.get("env", [])},
          **extra_env,
      }
      if base:
        env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
                   AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/")
      replicas.append(Replica(pool=i, index=index, task_type=POOL_TYPES[i], args=args, env=env,
                              log_path=os.path.join(job_dir, f"workerpool{i}-{index}.log")))
  return replicas


def check_trainer_args(replicas: list[Replica]) -> None:
  """Checks each replica's args as the trainer will (flags and values), so a bad one fails before start."""
  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top

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


def install_package(uri: str, target: str, *, client) -> str:
  """Downloads the sdist from the bucket and installs it into `target`, as Vertex's executor does."""
  bucket, _, blob = uri[len("gs://"):].partition("/")
  archive = os.path.join(os.path.dirname(target), os.path.basename(blob))
  client.bucket(bucket).blob(blob).download_to_filename(archive)
  result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", target, archive], capture_output=True, text=True, check=False)
  if result.returncode:
    raise LocalRunError(f"installing {uri} failed: {result.stderr.strip().splitlines()[-1:]}")
  return target


class _Streamer(threading.Thread):
  """Copies one replica's output to its log file and, prefixed, to our stdout."""

  def __init__(self, replica: Replica, quiet: bool, lock: threading.Lock):
    super().__init__(daemon=True)
    self.replica, self.quiet, self.lock = replica, quiet, lock

  def run(self) -> None:
    with open(self.replica.log_path, "a") as log:
      for raw in self.replica.process.stdout:  # type: ignore[union-attr]
        line = raw.decode(errors="replace")
        log.write(line)
        log.flush()
        if not self.quiet:
          with self.lock:
            sys.stdout.write(f"{self.replica.name} | {line}")
            sys.stdout.flush()


def _start(replica: Replica, *, module: str, site: str, base_env: dict, quiet: bool, lock: threading.Lock) -> None:
  env = {**base_env, **replica.env, "PYTHONPATH": site, "PYTHONUNBUFFERED": "1"}
  replica.process = subprocess.Popen([sys.executable, "-m", module, *replica.args], env=env, cwd=site,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
  replica.started = time.monotonic()
  replica.ended = replica.exit_code = None
  _Streamer(replica, quiet, lock).start()


def _stop(replicas: list[Replica]) -> None:
  for replica in replicas:
    proc = replica.process
    if proc is not None and proc.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
  deadline = time.monotonic() + 5
  for replica in replicas:
    proc = replica.process
    if proc is None:
      continue
    try:
      proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
    if replica.exit_code is None:
      replica.exit_code = proc.returncode
      replica.ended = time.monotonic()


def supervise(replicas: list[Replica], *, module: str, site: str, base_env: dict, timeout_secs: float,
              restart_failed: int, quiet: bool = False) -> tuple[bool, str, Replica | None]:
  """Runs the replicas to the job's end; returns (succeeded, reason, the replica that failed it).

  Every child is gone when it returns."""
  lock = threading.Lock()
  deadline = time.monotonic() + timeout_secs
  chief = next(r for r in replicas if r.task_type == "chief")
  # Servers and side-cars run until the chief is done; workers of a synchronous job finish with it, but
  # under parameter servers the workers serve too.
  waits_for_chief = {"ps", "evaluator"}
  if any(r.task_type == "ps" for r in replicas):
    waits_for_chief.add("worker")
  try:
    for replica in replicas:
      _start(replica, module=module, site=site, base_env=base_env, quiet=quiet, lock=lock)
    while True:
      for replica in replicas:
        code = replica.process.poll() if replica.exit_code is None else None
        if code is None:
          continue
        replica.exit_code, replica.ended = code, time.monotonic()
        if code != 0:
          if replica.restarts < restart_failed:
            replica.restarts += 1
            print(f"{replica.name} exited with {code}; restarting it ({replica.restarts}/{restart_failed})",
                  flush=True)
            _start(replica, module=module, site=site, base_env=base_env, quiet=quiet, lock=lock)
            continue
          return False, f"{replica.name} ({replica.task_type}) failed with exit code {code}", replica
      if chief.exit_code == 0:
        others = [r for r in replicas if r.task_type not in waits_for_chief and r is not chief]
        grace = time.monotonic() + 60
        while any(r.process.poll() is None for r in others) and time.monotonic() < grace:
          time.sleep(0.1)
        for r in others:
          code = r.process.poll()
          if code is not None and r.exit_code is None:
            r.exit_code, r.ended = code, time.monotonic()
          if code not in (0, None):
            return False, f"{r.name} ({r.task_type}) failed with exit code {code}", r
        return True, "the chief succeeded", None
      if time.monotonic() > deadline:
        return False, f"timed out after {timeout_secs:.0f} s", None
      time.sleep(0.1)
  except KeyboardInterrupt:
    return False, "interrupted", None
  finally:
    _stop(replicas)


def summary(replicas: list[Replica], artifacts: list[str]) -> str:
  lines = [f"{'replica':<16}{'role':<11}{'exit':>5}{'seconds':>9}{'restarts':>9}"]
  for r in replicas:
    seconds = (r.ended or time.monotonic()) - r.started if r.started else 0
    exit_code = "-" if r.exit_code is None else ("stopped" if r.exit_code < 0 else str(r.exit_code))
    lines.append(f"{r.name:<16}{r.task_type:<11}{exit_code:>5}{seconds:>9.1f}{r.restarts:>9}")
  if artifacts:
    lines.append("artifacts:")
    lines.extend(f"  {a}" for a in artifacts)
  return "\n".join(lines)


def _tail(path: str, lines: int = 15) -> str:
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:])


@contextlib.contextmanager
def _storage(buckets: tuple[str, ...], job_dir: str) -> Iterator[dict[str, str]]:
  """The environment of the emulator to use: the running one (STORAGE_EMULATOR_HOST set) or a new one."""
  from scripts import gcs_emulator  # pylint: disable=g-import-not-at-top

  if os.environ.get("STORAGE_EMULATOR_HOST"):
    yield {}
    return
  with gcs_emulator.running(buckets=buckets, directory=os.path.join(job_dir, "gcs")) as emulator:
    yield emulator.env


def check_flags(args) -> None:
  """The runner's own flags, checked before anything is read, built or started."""
  args.bucket = vertex_config.bucket_name(args.bucket)
  if args.restart_failed < 0:
    raise LocalRunError(f"--restart_failed={args.restart_failed}: expected a count >= 0 (0: never restart)")
  if not args.timeout_secs > 0:
    raise LocalRunError(f"--timeout_secs={args.timeout_secs}: expected a positive number of seconds")
  if args.base_port is not None and not 1024 <= args.base_port <= 65535:
    raise LocalRunError(f"--base_port={args.base_port}: expected a port in 1024..65535, or omit it to let the "
                        "OS choose free ports")


def run(args) -> int:
  from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  check_flags(args)

  job_id = args.run_id or time.strftime("local-%Y%m%d-%H%M%S")
  values = vertex_config.values_from(os.environ, project="local-project", region="local", bucket=args.bucket,
                                     run_id=job_id)
  pending = f"gs://{args.bucket}/staging/pending.tar.gz"
  config = vertex_config.load(args.config, {**values, "PACKAGE_URI": pending})
  if config.kind != "custom_job":
    raise LocalRunError(f"{args.config}: local runs take custom-job configs; run a tuning trial's spec by hand")
  body = submit.apply_overrides(config, args.args, submit.parse_env(args.env))
  for override in args.replica_count:
    pool, sep, count = override.partition("=")
    if not sep or not pool.isdigit() or not count.isdigit() or int(pool) >= len(body["workerPoolSpecs"]) \
        or not body["workerPoolSpecs"][int(pool)] or (int(pool) == 0 and int(count) != 1) or int(count) < 1:
      raise LocalRunError(f"--replica_count={override!r}: expected POOL=N for an existing pool (0..3), N >= 1, "
                          "and the chief pool stays at 1")
    body["workerPoolSpecs"][int(pool)]["replicaCount"] = int(count)
  job_dir = args.job_dir or tempfile.mkdtemp(prefix=f"{job_id}-")
  os.makedirs(job_dir, exist_ok=True)
  pools = body["workerPoolSpecs"]
  module = pools[0]["pythonPackageSpec"]["pythonModule"]
  count = sum(p["replicaCount"] for p in pools if p and p.get("pythonPackageSpec"))
  ports = reserve_ports(count, args.base_port)
  probe = plan_replicas(body, job_id=job_id, job_dir=job_dir, ports=ports, extra_env={})
  check_trainer_args(probe)  # before anything is built, uploaded or started
  with _storage((args.bucket,), job_dir) as storage_env:
    env = {**os.environ, **storage_env, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    endpoint = env["STORAGE_EMULATOR_HOST"]
    client = storage.Client(project="local-project", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": endpoint})
    if not client.bucket(args.bucket).exists():
      client.create_bucket(args.bucket)
    archive = submit.build_sdist(os.path.join(job_dir, "dist"))
    uri = submit.package_uri(args.bucket, archive)
    submit.upload(archive, uri, client=client)
    for pool in pools:
      if pool and pool.get("pythonPackageSpec"):
        pool["pythonPackageSpec"]["packageUris"] = [uri]
    site = install_package(uri, os.path.join(job_dir, "site"), client=client)
    module_file = os.path.join(site, *module.split(".")) + ".py"
    if not os.path.exists(module_file):
      raise LocalRunError(f"pythonModule {module!r} is not in the package {uri} (no {module_file})")
    replicas = plan_replicas(body, job_id=job_id, job_dir=job_dir, ports=ports, extra_env={})
    print(f"job {job_id}: {len(replicas)} replica(s), package {uri}, logs in {job_dir}", flush=True)
    ok, reason, failed = supervise(replicas, module=module, site=site, base_env=env, timeout_secs=args.timeout_secs,
                           restart_failed=args.restart_failed, quiet=args.quiet)
    base = body.get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
    artifacts = []
    if base.startswith("gs://"):
      bucket, _, prefix = base[len("gs://"):].partition("/")
      artifacts = [f"gs://{bucket}/{b.name}" for b in client.list_blobs(bucket, prefix=prefix + "/model/")
                   if b.name.endswith((".pb", ".json"))]
    print("\n" + summary(replicas, artifacts), flush=True)
    if not ok:
      if failed:
        print(f"\n--- last lines of {failed.name} ({failed.log_path}) ---\n{_tail(failed.log_path)}", file=sys.stderr)
      raise LocalRunError(f"job {job_id} failed: {reason}")
    metrics_uri = f"{base}/model/eval_metrics.json"
    if f"{metrics_uri}" in artifacts:
      bucket, _, blob = metrics_uri[len("gs://"):].partition("/")
      metrics = json.loads(client.bucket(bucket).blob(blob).download_as_text())
      print(f"eval metrics: {json.dumps({k: v for k, v in metrics.items() if k.startswith('eval_')})}")
      print(f"model: {base}/model/")
    print(f"job {job_id} succeeded ({reason})")
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True)
  parser.add_argument("--bucket", default=os.environ.get("BUCKET", "local-bucket"))
  parser.add_argument("--run_id", default=None)
  parser.add_argument("--args", action="append", default=[], help="extra trainer arg (repeatable)")
  parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every trainer replica")
  parser.add_argument("--replica_count", action="append", default=[], help="POOL=N: run N replicas of pool POOL")
  parser.add_argument("--restart_failed", type=int, default=0, help="restart a failed replica up to N times")
  parser.add_argument("--timeout_secs", type=float, default=1800)
  parser.add_argument("--base_port", type=int, default=None, help="first of the consecutive ports replicas use")
  parser.add_argument("--job_dir", default=None, help="logs, the installed package, the emulator's files")
  parser.add_argument("--quiet", action="store_true", help="keep replica logs in files only")
  args = parser.parse_args(argv)

  def interrupt(*_):
    raise KeyboardInterrupt  # SIGTERM stops the job like Ctrl-C: every child is stopped

  signal.signal(signal.SIGTERM, interrupt)
  try:
    return run(args)
  except (LocalRunError, vertex_config.ConfigError, submit.SubmitError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
