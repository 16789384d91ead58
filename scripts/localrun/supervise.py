"""Running the replicas as processes with Vertex's job semantics: logs streamed and kept per replica, a failed
replica restarted up to --restart_failed times (5 by default, as Vertex; a trainer's bad-input exit 2 fails the
job at once, since a restart fails the same way), preemptions (--preempt) sent as Vertex sends them, the job done
when the chief is, everything stopped at the end.

A preempted replica gets SIGTERM, SIGKILL after the grace if it still runs, and is restarted whatever its exit
code, without counting against --restart_failed (Vertex restarts a preempted VM). Its peers may exit on their
own (a MultiWorkerMirrored job stops together); they restart under --restart_failed, as on Vertex. The job's
result is the chief's, as Vertex judges it: a peer that fails after the chief succeeded does not fail it. With
`scheduling.restartJobOnWorkerRestart`, any restart restarts every replica.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from scripts.localrun.planning import local_argv
from scripts.localrun.planning import Preemption
from scripts.localrun.planning import Replica
from trainer.core.errors import EXIT_USER_ERROR  # the trainer's exit code for bad input (one `error:` line)


class _Streamer(threading.Thread):
  """Copies one replica's output to its log file and, prefixed, to our stdout."""

  def __init__(self, replica: Replica, quiet: bool, lock: threading.Lock):
    super().__init__(daemon=True)
    self.replica, self.quiet, self.lock = replica, quiet, lock

  def run(self) -> None:
    with open(self.replica.log_path, "a") as log:
      for raw in self.replica.process.stdout:  # type: ignore[union-attr]
        line = _readable(raw.decode(errors="replace"))
        progress = _PROGRESS.match(line)
        if progress:
          self.replica.last_step = int(progress.group(1))
        log.write(line)
        log.flush()
        if not self.quiet:
          with self.lock:
            sys.stdout.write(f"{self.replica.name} | {line}")
            sys.stdout.flush()


_PROGRESS = re.compile(r"^I step (\d+)/\d+ ")  # the trainer's progress line, as _readable gives it


def _readable(line: str) -> str:
  """A trainer's JSON log line (it writes them when CLOUD_ML_JOB_ID is set, as on Vertex) as a human line:
  the severity's initial and the message; any other line as it is."""
  if not line.startswith("{"):
    return line
  try:
    entry = json.loads(line)
  except ValueError:
    return line
  if not isinstance(entry, dict) or "severity" not in entry or "message" not in entry:
    return line
  return f"{str(entry['severity'])[:1]} {entry['message']}\n"


def _start(replica: Replica, *, site: str, base_env: dict, quiet: bool, lock: threading.Lock) -> None:
  env = {**base_env, **replica.env, "PYTHONPATH": site, "PYTHONUNBUFFERED": "1"}
  replica.process = subprocess.Popen([*local_argv(replica.command), *replica.args], env=env, cwd=site,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
  replica.started = time.monotonic()
  replica.ended = replica.exit_code = None
  replica.last_step = 0  # until the restart prints its own progress
  replica.streamer = _Streamer(replica, quiet, lock)
  replica.streamer.start()


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


def _log_size(replica: Replica) -> int:
  try:
    return os.path.getsize(replica.log_path)
  except OSError:
    return 0


VERTEX_RESTARTS = 5  # Vertex restarts a failed replica up to 5 times (then retries the job up to 3 times)


def _as_vertex_reports(code: int | None) -> int | None:
  """A process ended by signal N (Popen: -N) as a container's exit code, 128 + N (SIGTERM 143, SIGKILL 137)."""
  return 128 - code if code is not None and code < 0 else code


def supervise(replicas: list[Replica], *, site: str, base_env: dict, timeout_secs: float,
              restart_failed: int, quiet: bool = False, preemptions: list[Preemption] = (),
              grace_secs: float = 30.0, restart_job: bool = False,
              stop: threading.Event | None = None) -> tuple[bool, str, Replica | None]:
  """Runs the replicas to the job's end, or until `stop` is set (a tuning study stopping a trial early); returns
  (succeeded, reason, the replica that failed it).

  Every child is gone when it returns."""
  lock = threading.Lock()
  started = time.monotonic()
  deadline = started + timeout_secs
  by_name = {r.name: r for r in replicas}

  def say(message: str) -> None:
    with lock:
      print(message, flush=True)

  def settle(replica: Replica, preemption: Preemption) -> None:
    """The preempted replica ended: its exit and where its log stood, before anything restarts it."""
    preemption.exit_code = _as_vertex_reports(replica.exit_code)
    preemption.exit_secs = replica.ended - preemption.sent
    replica.process.wait()
    replica.streamer.join(timeout=10)  # its last lines (the save) belong before the restart's
    preemption.restart_offset = _log_size(replica)

  def restart(replica: Replica) -> None:
    for r in (replicas if restart_job else [replica]):
      if r is not replica:
        _stop([r])
        pending = preemption_of(r)
        if pending is not None:  # preempted too, and ended in this same moment: its preemption is over as well
          settle(r, pending)
      _start(r, site=site, base_env=base_env, quiet=quiet, lock=lock)
    if restart_job:
      say(f"restarting every replica (scheduling.restartJobOnWorkerRestart), after {replica.name}")

  def preempt_due() -> None:
    now = time.monotonic()
    for p in preemptions:
      replica = by_name[p.replica]
      if (p.sent is None and replica.exit_code is None
          and p.is_due(secs_since_start=now - started, replica_step=replica.last_step)):
        if any(q.sent is not None and not q.done for q in preemptions if q.replica == p.replica):
          continue  # the previous preemption of this replica is still under way
        p.sent, p.log_offset = now, _log_size(replica)
        at_step = f", step {replica.last_step}" if p.at_step is not None else ""
        say(f"{replica.name}: preempted at {now - started:.1f} s{at_step} (SIGTERM; SIGKILL after {grace_secs:g} s)")
        with contextlib.suppress(ProcessLookupError):
          os.kill(replica.process.pid, signal.SIGTERM)  # the trainer process, as Vertex signals the container
      elif p.sent is not None and not p.done and not p.killed and now - p.sent > grace_secs:
        p.killed = True
        say(f"{replica.name}: still running {grace_secs:g} s after SIGTERM: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
          os.killpg(replica.process.pid, signal.SIGKILL)

  def preemption_of(replica: Replica) -> Preemption | None:
    return next((p for p in preemptions if p.replica == replica.name and p.sent is not None and not p.done), None)

  chief = next(r for r in replicas if r.task_type == "chief")
  # Servers and side-cars run until the chief is done; workers of a synchronous job finish with it, but
  # under parameter servers the workers serve too.
  waits_for_chief = {"ps", "evaluator"}
  if any(r.task_type == "ps" for r in replicas):
    waits_for_chief.add("worker")
  try:
    for replica in replicas:
      _start(replica, site=site, base_env=base_env, quiet=quiet, lock=lock)
    while True:
      preempt_due()
      # A preempted replica and the peers that stop with it often end within one poll: the preempted one is
      # judged first, so that its exit is the preemption's and theirs the restarts' (not the other way round).
      for replica in sorted(replicas, key=lambda r: preemption_of(r) is None):
        code = _as_vertex_reports(replica.process.poll()) if replica.exit_code is None else None
        if code is None:
          continue
        replica.exit_code, replica.ended = code, time.monotonic()
        preemption = preemption_of(replica)
        if preemption is not None:
          settle(replica, preemption)
          say(f"{replica.name}: exited {code} {preemption.exit_secs:.1f} s after SIGTERM; restarting it "
              "(a preemption restart)")
          restart(replica)
          continue
        if code != 0:
          if chief.exit_code == 0:
            continue  # the chief is done (it exited in the same moment): judged below, as Vertex judges a job
          if code == EXIT_USER_ERROR:
            # The trainer's one `error:` line for bad input: the same input fails the same way again, so the
            # job fails now (Vertex would restart the replica and fail after its restarts and job retries).
            return False, f"{replica.name} ({replica.task_type}) failed with exit code {code} (bad input)", replica
          if replica.restarts < restart_failed:
            replica.restarts += 1
            say(f"{replica.name} exited with {code}; restarting it ({replica.restarts}/{restart_failed})")
            restart(replica)
            continue
          return False, f"{replica.name} ({replica.task_type}) failed with exit code {code}", replica
      if chief.exit_code == 0:
        others = [r for r in replicas if r.task_type not in waits_for_chief and r is not chief]
        grace = time.monotonic() + 60
        while any(r.process.poll() is None for r in others) and time.monotonic() < grace:
          time.sleep(0.1)
        late = []
        for r in others:
          code = _as_vertex_reports(r.process.poll())
          if code is not None and r.exit_code is None:
            r.exit_code, r.ended = code, time.monotonic()
          if code not in (0, None):
            late.append(f"{r.name} exited {code}")
        if late:  # Vertex judges a job by its primary replica: a peer failing once the chief is done is not fatal
          say(f"after the chief succeeded: {', '.join(late)}; the job succeeds, as on Vertex")
        return True, "the chief succeeded", None
      if time.monotonic() > deadline:
        return False, f"timed out after {timeout_secs:.0f} s", None
      if stop is not None and stop.is_set():
        return False, "stopped", None
      time.sleep(0.1)
  except KeyboardInterrupt:
    return False, "interrupted", None
  finally:
    _stop(replicas)
