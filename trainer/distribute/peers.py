"""A bound on every wait for peer replicas, naming the ones that are missing.

A multi-process job waits for its peers in places where TensorFlow itself waits for a long time or forever: the
MultiWorkerMirroredStrategy start-up (every worker must join), a parameter-server chief's first remote call,
and every collective or scheduled closure after that. On Vertex a replica that never came up (a bad image, a
quota, a crash loop) would leave the others blocked until the job's timeout (7 days by default) with no line
saying why.

`PeerWatchdog` runs beside those waits. The training loop feeds it after every chunk; if it goes unfed for
--peer_timeout_secs, it probes every peer's address, writes one `error:` line naming the ones that do not accept
connections (or saying that all do, and what else would keep them from joining), and kills the process
(SIGKILL, exit 137 as a scheduler sees it): the main thread is blocked inside TensorFlow, where no Python
exception can reach it, and a non-zero exit is what makes Vertex restart the replica.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import BinaryIO, Callable

from trainer.distribute import cluster as cluster_lib


def unreachable_peers(role: cluster_lib.ClusterRole, *, connect_timeout: float = 2.0) -> list[str]:
  """The other replicas of the cluster that do not accept a TCP connection, as "worker:1 (host:port)"."""
  missing = []
  for task_type, addresses in role.tf_cluster_dict().items():
    for index, address in enumerate(addresses):
      if (task_type, index) == (role.task_type, role.task_index):
        continue
      host, _, port = address.rpartition(":")
      try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=connect_timeout):
          pass
      except OSError:
        missing.append(f"{task_type}:{index} ({address})")
  return missing


def timeout_message(role: cluster_lib.ClusterRole, waited_secs: float, what: str, missing: list[str]) -> str:
  if missing:
    peers = f"{', '.join(missing)} not reachable"
  else:
    peers = ("every peer accepts connections, but the job did not move: check that every replica runs with the "
             "same cluster (TF_CONFIG / CLUSTER_SPEC) and the same strategy flags")
  return (f"{role.task_type}:{role.task_index} waited {waited_secs:.0f} s for {what}: {peers}; raise "
          f"--peer_timeout_secs if replicas start this far apart")


class PeerWatchdog:
  """Kills `target_pid` (this process) with one line when `feed()` is not called for `timeout_secs`.

  The watch runs in a small child process (`python -m trainer.distribute.peers`, no TensorFlow), not a thread: while
  TensorFlow's start-up waits for peers (`TFE_EnableCollectiveOps`) it holds the GIL, so no Python thread of
  this process runs (measured: a watchdog thread stayed blocked for the whole wait). Feeds travel over a pipe;
  when this process ends, the child sees the pipe close and exits too. A context manager.
  """

  def __init__(self, role: cluster_lib.ClusterRole, timeout_secs: float, *, target_pid: int | None = None):
    self._role, self._timeout = role, timeout_secs
    self._target_pid = os.getpid() if target_pid is None else target_pid
    self._child: subprocess.Popen | None = None

  def __enter__(self) -> "PeerWatchdog":
    role = {"task_type": self._role.task_type, "task_index": self._role.task_index, "cluster": self._role.cluster}
    self._child = subprocess.Popen(
        [sys.executable, "-m", "trainer.distribute.peers", str(self._target_pid), str(self._timeout), json.dumps(role)],
        stdin=subprocess.PIPE, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return self

  def feed(self, what: str = "the next training chunk") -> None:
    """The job moved; the next wait (described by `what`) starts now."""
    if self._child is not None and self._child.poll() is None:
      try:
        self._child.stdin.write((what.replace("\n", " ") + "\n").encode())
        self._child.stdin.flush()
      except BrokenPipeError:
        pass

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops watching (idempotent)."""
    if self._child is not None:
      with contextlib.suppress(BrokenPipeError):
        self._child.stdin.close()
      self._child.wait()
      self._child = None


def sigterm_pending(pid: int) -> bool:
  """Whether a SIGTERM waits, blocked, in process `pid` (Linux /proc; False elsewhere)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("ShdPnd:"):
          return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
  except (OSError, ValueError, IndexError):
    pass
  return False


# The trainer holds SIGTERM back until its strategy exists (`preemption.hold_sigterm`: TensorFlow's coordination
# service would swallow it). A SIGTERM still waiting this long means the process is stuck in a wait for peers,
# where nothing is trained: it is ended now rather than by the SIGKILL 30 s after the SIGTERM.
SIGTERM_WAIT_SECS = 2.0


def watch(target_pid: int, timeout_secs: float, role: cluster_lib.ClusterRole, feeds: BinaryIO, *,
          kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL),
          clock: Callable[[], float] = time.monotonic,
          pending: Callable[[int], bool] = sigterm_pending) -> bool:
  """The child's loop: reads feeds (one line each, naming the next wait) until `feeds` closes (returns False)
  or none came for `timeout_secs` (writes the error line, kills the target, returns True), or a SIGTERM has
  waited SIGTERM_WAIT_SECS in the target (writes a line, kills it, returns True)."""
  what, fed_at = "the peers to join", clock()
  pending_since = None
  while True:
    left = timeout_secs - (clock() - fed_at)
    readable, _, _ = select.select([feeds], [], [], min(0.5, max(0.0, left)))
    if pending(target_pid):
      pending_since = clock() if pending_since is None else pending_since
      if clock() - pending_since >= SIGTERM_WAIT_SECS:
        sys.stderr.write(f"{role.task_type}:{role.task_index} got SIGTERM while it waited for {what}: nothing was "
                         "trained since the last checkpoint; ending it now (exit 137), as the SIGKILL would\n")
        sys.stderr.flush()
        kill(target_pid)
        return True
    else:
      pending_since = None
    if readable:
      data = os.read(feeds.fileno(), 65536)
      if not data:
        return False
      lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
      what, fed_at = (lines[-1].strip() if lines else what), clock()
    elif clock() - fed_at >= timeout_secs:
      message = timeout_message(role, clock() - fed_at, what, unreachable_peers(role))
      sys.stderr.write(f"error: {message}\n")
      sys.stderr.flush()
      kill(target_pid)  # SIGKILL: SIGTERM is the preemption signal, and the target is blocked in TensorFlow
      return True


if __name__ == "__main__":
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # the trainer's hold is inherited; not ours to keep
  _pid, _timeout, _role = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
  watch(_pid, _timeout, cluster_lib.ClusterRole(task_type=_role["task_type"], task_index=_role["task_index"],
                                                cluster=_role["cluster"], source="watchdog"), sys.stdin.buffer)
