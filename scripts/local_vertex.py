"""Run a cloud_configs/ job on this machine, replica by replica, the way Vertex AI would run it.

    python -m scripts.local_vertex --config=cloud_configs/multi_worker_gpu.yaml --replica_count=1=1 \\
        --args=--train_steps=300

What each replica gets is Vertex's contract: the trainer sdist built, staged to the (emulated) bucket and
installed into an isolated dir as the executor does from `packageUris` (a containerSpec pool: as the
Dockerfile installs it into the image, and the container's command and args run here without Docker); CLUSTER_SPEC (workerpoolN) and TF_CONFIG
(chief/worker/ps/evaluator); AIP_MODEL_DIR/AIP_CHECKPOINT_DIR/AIP_TENSORBOARD_LOG_DIR from baseOutputDirectory;
CLOUD_ML_JOB_ID; the pool's args and env. A pool's N accelerators become N logical CPU devices
(--num_cpu_devices=N), so a "4-GPU" replica runs 4 MirroredStrategy replicas. A Reduction Server pool is not run
(its image is Google's); the trainer is told with --reduction_server, as on Vertex.

Job semantics: the job succeeds when the chief succeeds (parameter servers and evaluators are then stopped, and a
peer failing after that is reported, not fatal, as Vertex judges a job by its primary replica); a failing replica
is restarted up to --restart_failed times (5, as Vertex restarts one), then fails the job with its last lines
shown; a trainer's bad-input exit 2 fails it at once. --preempt=REPLICA@SECONDS (or REPLICA@step=N, once the
replica's progress reaches step N) sends a Spot preemption (SIGTERM, SIGKILL after
--preempt_grace_secs, a restart; the whole job with scheduling.restartJobOnWorkerRestart), and the summary shows
the step each preempted replica saved and the step it resumed at. Ctrl-C or --timeout_secs stops every child. Logs stream live, prefixed `workerpool1-0 |`,
and are kept per replica under the job dir.

A hyperparameter-tuning config runs as a study (scripts/localrun/study.py): its trials, each such a job with the
trial's values, id and output dirs, `parallelTrialCount` at a time (--parallel_trials, --max_trials shrink it).

Cloud Storage: the emulator is started for the job unless STORAGE_EMULATOR_HOST is already set (then the
running one is used: python -m scripts.gcs_emulator start; one that does not answer is refused in one line).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any, Iterator

from scripts import study_spec
from scripts import submit
from scripts import vertex_config
from scripts.localrun import study as localrun_study
from scripts.localrun.install import install_package
from scripts.localrun.planning import LocalRunError, check_trainer_args, parse_preemptions, plan_replicas, \
    reserve_ports
from scripts.localrun.report import summary, tail
from scripts.localrun import supervise as supervise_lib
from scripts.localrun.supervise import supervise
from trainer.core import paths
from trainer.modeling import export


@contextlib.contextmanager
def _storage(buckets: tuple[str, ...], job_dir: str) -> Iterator[dict[str, str]]:
  """The environment of the emulator to use: the running one (STORAGE_EMULATOR_HOST set) or a new one.

  A STORAGE_EMULATOR_HOST that does not answer (a shell that kept a stopped emulator's variables) is refused here,
  before anything is built: the storage client would retry it for minutes, then fail mid-staging."""
  from scripts import emulator as emulator_lib  # pylint: disable=g-import-not-at-top

  host = os.environ.get("STORAGE_EMULATOR_HOST")
  if host:
    problem = emulator_lib.unanswered(host, buckets=buckets)
    if problem:
      raise LocalRunError(problem)
    yield {}
    return
  with emulator_lib.running(buckets=buckets, directory=os.path.join(job_dir, "gcs")) as emulator:
    yield emulator.env


def check_flags(args) -> None:
  """The runner's own flags, checked before anything is read, built or started."""
  args.bucket = vertex_config.bucket_name(args.bucket)
  if args.restart_failed < 0:
    raise LocalRunError(f"--restart_failed={args.restart_failed}: expected a count >= 0 (0: never restart)")
  if not args.timeout_secs > 0:
    raise LocalRunError(f"--timeout_secs={args.timeout_secs}: expected a positive number of seconds")
  if not args.preempt_grace_secs >= 0:
    raise LocalRunError(f"--preempt_grace_secs={args.preempt_grace_secs}: expected seconds >= 0 (Spot gives 30)")
  if args.base_port is not None and not 1024 <= args.base_port <= 65535:
    raise LocalRunError(f"--base_port={args.base_port}: expected a port in 1024..65535, or omit it to let the "
                        "OS choose free ports")


@dataclasses.dataclass
class Staged:
  """What every job (every trial of a study) shares: the emulator, the staged and installed packages."""

  client: Any  # google-cloud-storage client on the emulator
  env: dict[str, str]  # the replicas' base environment
  site: str  # where the packageUris are installed
  uri: str  # the trainer's sdist in the bucket


def run(args) -> int:
  check_flags(args)

  job_id = args.run_id or time.strftime("local-%Y%m%d-%H%M%S")
  values = vertex_config.values_from(os.environ, project="local-project", region="local", bucket=args.bucket,
                                     run_id=job_id)
  pending = f"gs://{args.bucket}/staging/pending.tar.gz"
  config = vertex_config.load(args.config, {**values, "PACKAGE_URI": pending})
  body = submit.apply_overrides(config, args.args, submit.parse_env(args.env))
  spec = body["trialJobSpec"] if config.kind == "hp_tuning" else body
  study = _study(args, config, body) if config.kind == "hp_tuning" else None
  for override in args.replica_count:
    pool, sep, count = override.partition("=")
    if not sep or not pool.isdigit() or not count.isdigit() or int(pool) >= len(spec["workerPoolSpecs"]) \
        or not spec["workerPoolSpecs"][int(pool)] or (int(pool) == 0 and int(count) != 1) or int(count) < 1:
      raise LocalRunError(f"--replica_count={override!r}: expected POOL=N for an existing pool (0..3), N >= 1, "
                          "and the chief pool stays at 1")
    spec["workerPoolSpecs"][int(pool)]["replicaCount"] = int(count)
  job_dir = args.job_dir or tempfile.mkdtemp(prefix=f"{job_id}-")
  os.makedirs(job_dir, exist_ok=True)
  pools = spec["workerPoolSpecs"]
  command = vertex_config.trainer_command(pools[0])
  module = command[command.index("-m") + 1] if "-m" in command else "trainer.task"
  containers = bool(pools[0].get("containerSpec"))
  ports = reserve_ports(_replica_count(spec), args.base_port)
  probe = plan_replicas(spec, job_id=job_id, job_dir=job_dir, ports=ports, extra_env={})
  check_trainer_args(probe)  # before anything is built, uploaded or started
  if study is not None:
    _check_study(study, probe[0].args)  # the built-in flags, and a plug-in importable here
  preemptions = parse_preemptions(args.preempt, [r.name for r in probe], timeout_secs=args.timeout_secs)
  with _storage((args.bucket,), job_dir) as storage_env:
    staged = _stage(args, spec, storage_env, job_dir, containers=containers)
    module_file = os.path.join(staged.site, *module.split(".")) + ".py"
    if not os.path.exists(module_file):
      raise LocalRunError(f"pythonModule {module!r} is not in the package {staged.uri} (no {module_file})")
    if study is not None:
      _check_study(study, probe[0].args, site=staged.site)  # a plug-in model from --extra_package, installed now
    for warning in config.warnings:  # printed once every check has passed: a bad input stays one error line
      print(f"warning: {warning}", file=sys.stderr)
    scheduling = _scheduling_note(spec.get("scheduling") or {})
    if scheduling:
      print(scheduling, flush=True)
    kind = (f"container {pools[0]['containerSpec']['imageUri']} as {' '.join(command)} (trainer from {staged.uri})"
            if containers else f"package {staged.uri}")
    if study is not None:
      return _run_study(args, study, spec, staged, job_id=job_id, job_dir=job_dir, kind=kind)
    print(f"job {job_id}: {len(probe)} replica(s), {kind}, logs in {job_dir}", flush=True)
    replicas, (ok, reason, failed) = run_job(args, spec, staged, job_id=job_id, job_dir=job_dir,
                                             preemptions=preemptions)
    base = spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
    artifacts = _artifacts(staged.client, f"{base}/model/")
    print("\n" + summary(replicas, artifacts, preemptions), flush=True)
    if not ok:
      if failed:
        print(f"\n--- last lines of {failed.name} ({failed.log_path}) ---\n{tail(failed.log_path)}", file=sys.stderr)
      raise LocalRunError(f"job {job_id} failed: {reason}")
    metrics_uri = f"{base}/model/{export.METRICS_FILE}"
    if metrics_uri in artifacts:
      bucket, blob = paths.split_gcs_uri(metrics_uri)
      metrics = json.loads(staged.client.bucket(bucket).blob(blob).download_as_text())
      print(f"eval metrics: {json.dumps({k: v for k, v in metrics.items() if k.startswith('eval_')})}")
      print(f"model: {base}/model/")
    print(f"job {job_id} succeeded ({reason})")
  return 0


def _stage(args, spec: dict, storage_env: dict[str, str], job_dir: str, *, containers: bool) -> Staged:
  """Builds the trainer's sdist (and each --extra_package), stages them to the bucket and installs them into the
  one dir every replica imports from, as Vertex's executor pip-installs packageUris."""
  from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  env = {**os.environ, **storage_env, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
  client = storage.Client(project="local-project", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": env["STORAGE_EMULATOR_HOST"]})
  if not client.bucket(args.bucket).exists():
    client.create_bucket(args.bucket)
  archive = submit.build_sdist(os.path.join(job_dir, "dist"))
  uri = submit.package_uri(args.bucket, archive)
  extras = submit.stage_extra_packages(args.extra_package, args.bucket, os.path.join(job_dir, "dist"))
  for local, remote in [(archive, uri), *extras]:
    submit.upload(local, remote, client=client)
  pools = spec["workerPoolSpecs"]
  for pool in pools:
    if pool and pool.get("pythonPackageSpec"):
      pool["pythonPackageSpec"]["packageUris"] = [uri]
  submit.add_package_uris(spec, [u for _, u in extras])
  # Every packageUri, trainer first, into the one dir each replica imports from (Vertex pip-installs them
  # all). A container pool gets what the Dockerfile puts in the image: the trainer from this sdist and each
  # --extra_package, as submit's build context holds them (no Docker: the container's command runs with this
  # interpreter, see localrun.planning.local_argv).
  site = os.path.join(job_dir, "site")
  for package in [uri, *(u for _, u in extras)] if containers else pools[0]["pythonPackageSpec"]["packageUris"]:
    install_package(package, site, client=client)
  return Staged(client=client, env=env, site=site, uri=uri)


def run_job(args, spec: dict, staged: Staged, *, job_id: str, job_dir: str, preemptions=(), extra_env=None,
            trial: str | None = None, stop=None):
  """One job of the spec's pools to its end: its replicas and supervise's (succeeded, reason, failed replica)."""
  ports = reserve_ports(_replica_count(spec), args.base_port)
  replicas = plan_replicas(spec, job_id=job_id, job_dir=job_dir, ports=ports, extra_env=extra_env or {}, trial=trial)
  restart_job = bool(spec.get("scheduling", {}).get("restartJobOnWorkerRestart"))
  outcome = supervise(replicas, site=staged.site, base_env=staged.env, timeout_secs=args.timeout_secs,
                      restart_failed=args.restart_failed, quiet=args.quiet or trial is not None,
                      preemptions=preemptions, grace_secs=args.preempt_grace_secs, restart_job=restart_job,
                      stop=stop)
  return replicas, outcome


def _scheduling_note(scheduling: dict) -> str | None:
  """What Vertex's scheduling strategy would do that a local run does not (said, not silently ignored)."""
  strategy = scheduling.get("strategy")
  if strategy == "FLEX_START":
    wait = scheduling.get("maxWaitDuration")
    return ("scheduling.strategy FLEX_START: Vertex would queue the job for its machines"
            f"{f' for up to {wait}' if wait else ''} (Dynamic Workload Scheduler); here it starts at once")
  if strategy == "SPOT":
    return ("scheduling.strategy SPOT: Vertex may preempt any replica; here none is unless --preempt says so "
            "(e.g. --preempt=workerpool1-0@step=20)")
  return None


def _replica_count(spec: dict) -> int:
  """How many trainer processes the spec's pools run (each needs a port)."""
  return sum(p["replicaCount"] for p in spec["workerPoolSpecs"] if vertex_config.trainer_spec(p))


def _artifacts(client, model_uri: str) -> list[str]:
  if not model_uri.startswith("gs://"):
    return []
  bucket, prefix = paths.split_gcs_uri(model_uri)
  return [f"gs://{bucket}/{b.name}" for b in client.list_blobs(bucket, prefix=prefix)
          if b.name.endswith((".pb", ".json"))]


def _study(args, config: vertex_config.JobConfig, body: dict) -> study_spec.StudySpec:
  """The config's StudySpec, with the runner's flags that only a study takes checked against it."""
  if args.preempt:
    raise LocalRunError("--preempt: preemptions are rehearsed on a custom-job config, not on a tuning study")
  if args.base_port is not None:
    raise LocalRunError("--base_port: a study's trials run side by side on ports the OS chooses; omit it")
  try:
    spec = study_spec.parse(body, config.path)
  except study_spec.StudyError as e:
    raise LocalRunError(str(e)) from None
  for flag, value in (("--max_trials", args.max_trials), ("--parallel_trials", args.parallel_trials)):
    if value is not None and value < 1:
      raise LocalRunError(f"{flag}={value}: expected a count >= 1 (or omit it to use the config's)")
  return spec


def _check_study(spec: study_spec.StudySpec, trial_args: list[str], *, site: str | None = None) -> None:
  """Every value a trial can get, checked as the trainer will check it (`site`: where the job's packages are
  installed, so a plug-in model from --extra_package is read as the trials will read it)."""
  try:
    complete = study_spec.check_trial_values(spec, trial_args, site=site)
  except study_spec.StudyError as e:
    raise LocalRunError(str(e)) from None
  if site is not None and not complete:
    from trainer.core import hparams as hparams_lib  # pylint: disable=g-import-not-at-top

    model = hparams_lib.model_from_argv(trial_args)
    raise LocalRunError(f"--model={model}: not importable from the trials' packages (the trainer and each "
                        "--extra_package): every trial would fail; pass your package with --extra_package=DIR")


def _run_study(args, spec: study_spec.StudySpec, job_spec: dict, staged: Staged, *, job_id: str, job_dir: str,
               kind: str) -> int:
  max_trials = min(args.max_trials or spec.max_trials, spec.max_trials)
  parallel = min(args.parallel_trials or spec.parallel_trials, max_trials)
  print(f"study {job_id}: {max_trials} trial(s) of {spec.max_trials}, {parallel} at a time, "
        f"{spec.goal.lower()} {spec.metric}, {spec.algorithm}; {kind}; logs in {job_dir}", flush=True)
  if spec.early_stopping:
    print(f"study {job_id}: early stopping ({spec.early_stopping}) by the median rule", flush=True)

  def launch(body: dict, trial: localrun_study.Trial, extra_env: dict):
    _, outcome = run_job(args, body, staged, job_id=job_id, job_dir=trial.job_dir, extra_env=extra_env,
                         trial=trial.id, stop=trial.stop)
    return outcome

  trials = localrun_study.run_study(spec, job_spec=job_spec, job_id=job_id, job_dir=job_dir, launch=launch,
                                    max_trials=max_trials, parallel=parallel, seed=args.seed)
  print(f"study {job_id} succeeded: {sum(t.state == 'SUCCEEDED' for t in trials)} of {len(trials)} trial(s)")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config")
  parser.add_argument("--bucket", default=os.environ.get("BUCKET", "local-bucket"))
  parser.add_argument("--run_id", default=None)
  parser.add_argument("--args", action="append", default=[], help="extra trainer arg (repeatable)")
  parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every trainer replica")
  parser.add_argument("--extra_package", action="append", default=[], metavar="PATH",
                      help="your own package for every replica (repeatable): a directory with pyproject.toml or "
                           "setup.py, or a built sdist/wheel; staged and installed beside the trainer")
  parser.add_argument("--replica_count", action="append", default=[], help="POOL=N: run N replicas of pool POOL")
  parser.add_argument("--restart_failed", type=int, default=supervise_lib.VERTEX_RESTARTS,
                      help="restart a failed replica up to N times (Vertex: 5); a trainer's bad-input exit 2 is "
                           "never restarted")
  parser.add_argument("--timeout_secs", type=float, default=1800, help="stop the job after this long (a study: "
                      "each trial)")
  parser.add_argument("--preempt", action="append", default=[], metavar="REPLICA@SECONDS|REPLICA@step=N[,...]",
                      help="preempt a replica as Spot does, at a second of the job (workerpool1-0@40) or once its "
                      "progress lines reach a step (workerpool1-0@step=2000): SIGTERM, SIGKILL after "
                      "--preempt_grace_secs, then a restart (repeatable)")
  parser.add_argument("--preempt_grace_secs", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
  parser.add_argument("--base_port", type=int, default=None, help="first of the consecutive ports replicas use")
  parser.add_argument("--job_dir", default=None, help="logs, the installed package, the emulator's files")
  parser.add_argument("--quiet", action="store_true", help="keep replica logs in files only (a study's trials "
                      "always do: they run side by side)")
  parser.add_argument("--max_trials", type=int, default=None,
                      help="a tuning study: run at most N of its maxTrialCount trials (a laptop-sized study)")
  parser.add_argument("--parallel_trials", type=int, default=None,
                      help="a tuning study: run at most N trials at a time (default: its parallelTrialCount)")
  parser.add_argument("--seed", type=int, default=0, help="a tuning study: the tuner's random seed")
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not args.config:
    parser.error("the following arguments are required: --config")

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
