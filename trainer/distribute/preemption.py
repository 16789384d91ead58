"""SIGTERM as Vertex sends it: a Spot preemption or host maintenance, about 30 s before the SIGKILL.

The handler only records the signal; the training loop checks it after every chunk (at most --steps_per_loop
steps, well under a second to a few seconds), saves a checkpoint at the step reached and stops with
`Preempted`. The process then exits EXIT_PREEMPTED, non-zero on purpose: Vertex counts a chief's exit 0 as the
job's success, while a non-zero exit makes it restart the replica, which resumes from that checkpoint with no
step lost.

Under MultiWorkerMirroredStrategy the signal may reach one worker only (one Spot VM is reclaimed), yet all of
them must save the same step together. The loop's agreement (`actions.agreement`) all-reduces "SIGTERM seen"
after every chunk, so every worker saves at the same step and stops; the ones that were not signalled stop too
(`on_peer`), since the job cannot go on without the preempted one. A worker whose peer vanished inside a
collective (its chief preempted during the final evaluation) exits the same way (`PeerLost`), not with a traceback.

Outside the training loop there is nothing to save that is not saved already (start-up and restore come before
the first step; the final checkpoint is written before the final evaluation and the export), so SIGTERM keeps
its default action there: the process ends at once, exit 143. One library gets in the way: TensorFlow's
coordination service installs its own SIGTERM handler while a MultiWorkerMirrored (or parameter-server) strategy
starts, and that handler swallows the signal; measured: a replica signalled during start-up trained on and was
SIGKILLed 30 s later, losing 670 steps. So the entry point blocks SIGTERM as its first instruction
(`hold_sigterm`, inherited by every thread TensorFlow starts), and once the strategy exists `release_sigterm`
puts the default action back and unblocks it: a SIGTERM that arrived in between is delivered then, not lost.

Under parameter servers the chief saves (the workers and parameter servers hold no state of their own to
lose); `fit` there runs no batch-level callbacks, so it saves at the end of the running epoch (`fit_loop`).
"""

from __future__ import annotations

import os
import re
import signal
import threading

from trainer.core.errors import EXIT_PREEMPTED


class Preempted(Exception):
  """Training stopped on SIGTERM after saving the checkpoint at `step`."""

  def __init__(self, step: int, checkpoint: str | None, *, on_peer: bool = False):
    where = "SIGTERM on a peer replica" if on_peer else "SIGTERM"
    super().__init__(f"{where}: saved checkpoint {checkpoint} at step {step}")
    self.step, self.checkpoint, self.on_peer = step, checkpoint, on_peer


class PeerLost(Exception):
  """A collective failed because a peer replica is gone (preempted or killed): this replica stops too, with the
  exit code of a preemption, and resumes from the last checkpoint when restarted."""


# What TensorFlow raises in a collective or a coordination-service call whose peer went away: "Collective ops is
# aborted by: Socket closed", "failed to connect to all addresses", "heartbeat timeout", the coordination service
# shutting down. Anything else is not a peer's loss and passes unchanged.
_PEER_GONE_WORDS = ("Collective ops is aborted", "Socket closed", "failed to connect to all addresses",
                    "heartbeat timeout", "coordination service", "Connection reset", "Broken pipe",
                    "preempted/died/restarted", "The tasks have crashed")


def peer_lost(error: BaseException, *, where: str) -> PeerLost | None:
  """`PeerLost` for a TensorFlow error that says a peer of a multi-process job vanished, else None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                            tf.errors.DeadlineExceededError, tf.errors.InternalError)):
    return None
  text = str(getattr(error, "message", "") or error)
  if not any(w in text for w in _PEER_GONE_WORDS):  # e.g. an unavailable gs:// is storage's, told by `storage`
    return None
  said = next((line.strip() for line in text.splitlines() if any(w in line for w in _PEER_GONE_WORDS)),
              text.splitlines()[0] if text else type(error).__name__)
  said = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", said)  # TensorFlow's node name says nothing to a user
  return PeerLost(f"a peer replica stopped during {where} ({said[:200]})")


# After the save on SIGTERM, the process must be gone well within Spot's 30 s. A MultiWorkerMirrored chief whose
# peer had already stopped was measured to hang after its "exiting 143" line until the SIGKILL: a TensorFlow
# thread held the GIL (the strategy's peer health check waits on the stopped peer), so not even `os._exit` in the
# main thread ran. So a small child process (no TensorFlow) sends SIGTERM again after the deadline, with
# SIGTERM's default action back in place: the kernel ends the process, exit 143, whatever holds the GIL.
EXIT_DEADLINE_SECS = 10.0

_DEADLINE_CHILD = """
import os, signal, sys, time
pid, seconds = int(sys.argv[1]), float(sys.argv[2])
time.sleep(seconds)
if os.getppid() == pid:  # the trainer still runs (an exited one's child is adopted by another process)
    os.kill(pid, signal.SIGTERM)
"""


def exit_within(seconds: float = EXIT_DEADLINE_SECS) -> None:
  """Guarantees this process ends within `seconds` from now, exit 143, even if Python can no longer run."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  if not _from_entry:
    return  # a test running the trainer in its own process: never end that process
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  subprocess.Popen([sys.executable, "-c", _DEADLINE_CHILD, str(os.getpid()), str(seconds)],  # pylint: disable=consider-using-with
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


_held = False
_from_entry = False  # the process is the trainer's command (`task.entry`), not a test calling it


def hold_sigterm() -> None:
  """The entry point's first instruction: SIGTERM blocked, so that it stays pending (not swallowed by a handler
  TensorFlow installs) until `release_sigterm`. Every thread started after this inherits the block."""
  global _held, _from_entry  # pylint: disable=global-statement
  if threading.current_thread() is threading.main_thread():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _held = _from_entry = True


def sigterm_pending() -> bool:
  return _held and signal.SIGTERM in signal.sigpending()


def release_sigterm(where: str) -> None:
  """SIGTERM's default action back (replacing any handler a library installed) and the signal unblocked: one
  that arrived while held ends the process now, exit 143. `where` names the phase for the log. No-op unless held."""
  global _held  # pylint: disable=global-statement
  if not _held:
    return
  if sigterm_pending():
    from absl import logging  # pylint: disable=g-import-not-at-top

    logging.warning("SIGTERM arrived %s: nothing was trained since the last checkpoint; exiting %d so that Vertex "
                    "restarts this replica", where, EXIT_PREEMPTED)
    logging.flush()
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  _held = False
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def honour_pending_sigterm(where: str) -> None:
  """While held: ends the process (exit 143) if a SIGTERM is already waiting, before a long phase starts."""
  if sigterm_pending():
    release_sigterm(where)


class SigtermWatcher:
  """Records SIGTERM while active (a context manager); restores the previous handler on exit.

  Outside the main thread (signal handlers can only be set there) it watches nothing. After the trainer's entry
  released SIGTERM (`release_sigterm`) the previous handler is the default action: the process ends at once.
  """

  def __init__(self):
    self._event = threading.Event()
    self._previous = None

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def __enter__(self) -> "SigtermWatcher":
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, lambda *_: self._event.set())
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
