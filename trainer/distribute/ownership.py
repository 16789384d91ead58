"""A run dir belongs to one job at a time.

Two jobs on one output dir overwrite each other's checkpoints and export, and both can exit 0. So the chief
claims its checkpoint dir before it writes anything there: it writes `run_owner.json` (the job, host, pid and a
heartbeat it refreshes every HEARTBEAT_SECS), and marks it ended when the run ends, whatever the reason.

A claim is refused, in one line, while another live job holds the dir. It is granted when:
- nobody holds it, or the holder ended;
- the holder is the same job: a Vertex restart of the chief, or of the whole job, keeps `CLOUD_ML_JOB_ID`
  (so does `scripts/local_vertex.py`);
- the holder is gone: on this host its pid no longer runs (a local run killed with -9 and started again), or
  its heartbeat is older than STALE_AFTER_SECS (a chief on another machine that died).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Callable

from absl import logging

from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import UserError

OWNER_FILE = "run_owner.json"
HEARTBEAT_SECS = 15.0
# Generous against a heartbeat thread held up while TensorFlow holds the GIL (a strategy waiting for peers).
STALE_AFTER_SECS = 120.0


@dataclasses.dataclass(frozen=True)
class Owner:
  job_id: str | None
  host: str
  pid: int
  heartbeat: float  # wall-clock seconds
  ended: bool = False

  def describe(self, now: float) -> str:
    job = f"job {self.job_id}" if self.job_id else "a run with no CLOUD_ML_JOB_ID"
    return f"{job} (pid {self.pid} on {self.host}, last seen {max(0.0, now - self.heartbeat):.0f} s ago)"


def _read(path: str) -> Owner | None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not tf.io.gfile.exists(path):
    return None
  try:
    return Owner(**storage.read_json(path))
  except (ValueError, TypeError, tf.errors.OpError):  # half-written or not ours: nobody to defer to
    return None


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def why_not_free(holder: Owner | None, *, job_id: str | None, host: str, now: float,
                 pid_alive: Callable[[int], bool] = _pid_alive) -> str | None:
  """None when a job `job_id` on `host` may take a dir held by `holder`; else what holds it."""
  if holder is None or holder.ended:
    return None
  if job_id is not None and holder.job_id == job_id:
    return None
  if holder.host == host and not pid_alive(holder.pid):
    return None
  if now - holder.heartbeat > STALE_AFTER_SECS:
    return None
  return holder.describe(now)


class Claim:
  """This job's hold on a checkpoint dir: a heartbeat thread while held; `release()` marks it ended."""

  def __init__(self, directory: str, *, job_id: str | None, clock: Callable[[], float] = time.time):
    self._path = paths.join_path(directory, OWNER_FILE)
    self._directory = directory
    self._job_id = job_id
    self._clock = clock
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def acquire(self) -> "Claim":
    now = self._clock()
    host = socket.gethostname()
    holder = _read(self._path)
    held_by = why_not_free(holder, job_id=self._job_id, host=host, now=now)
    if held_by is not None:
      raise UserError(f"--checkpoint_dir: {self._directory} is in use by {held_by}; two jobs on one output dir "
                      "overwrite each other's checkpoints and export: give this run its own --output_dir, or stop "
                      "that job first")
    if holder is not None and not holder.ended:
      logging.info("Continuing the run in %s, held before by %s", self._directory, holder.describe(now))
    self._write(ended=False)
    self._thread = threading.Thread(target=self._beat, name="run-dir-heartbeat", daemon=True)
    self._thread.start()
    return self

  def release(self) -> None:
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join()
    self._thread = None
    if _read(self._path) is None:
      return  # the run removed its own dir (bad input found late): leave nothing behind
    try:
      self._write(ended=True)
    except Exception as e:  # pylint: disable=broad-except  (the dir may be gone or unreachable; the run's outcome stands)
      logging.warning("Could not mark %s ended: %s", self._path, e)

  def __enter__(self) -> "Claim":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()

  def _write(self, *, ended: bool) -> None:
    owner = Owner(job_id=self._job_id, host=socket.gethostname(), pid=os.getpid(), heartbeat=self._clock(),
                  ended=ended)
    storage.write_json(self._path, dataclasses.asdict(owner))

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECS):
      try:
        self._write(ended=False)
      except Exception as e:  # pylint: disable=broad-except  (a missed beat is not worth ending training for)
        logging.warning("Run-dir heartbeat to %s failed: %s", self._path, e)
