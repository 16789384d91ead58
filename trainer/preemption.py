"""SIGTERM as Vertex sends it: a Spot preemption or host maintenance, about 30 s before the SIGKILL.

The handler only records the signal; the training loop checks it after every chunk (at most --steps_per_loop
steps, well under a second to a few seconds), saves a checkpoint at the step reached and stops with
`Preempted`. The process then exits EXIT_PREEMPTED, non-zero on purpose: Vertex counts a chief's exit 0 as the
job's success, while a non-zero exit makes it restart the replica, which resumes from that checkpoint with no
step lost.

Under MultiWorkerMirroredStrategy the signal may reach one worker only (one Spot VM is reclaimed), yet all of
them must save the same step together. The loop's agreement (`actions.agreement`) all-reduces "SIGTERM seen"
after every chunk, so every worker saves at the same step and stops; the ones that were not signalled stop too
(`on_peer`), since the job cannot go on without the preempted one. TensorFlow's coordination service installs
its own SIGTERM handler when the strategy starts (it swallows the signal); the watcher is entered after the
strategy exists, so its handler is the one that runs.

Under parameter servers the chief saves (the workers and parameter servers hold no state of their own to
lose); `fit` there runs no batch-level callbacks, so it saves at the end of the running epoch (`fit_loop`).
"""

from __future__ import annotations

import os
import signal
import threading

EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a process ended by SIGTERM


class Preempted(Exception):
  """Training stopped on SIGTERM after saving the checkpoint at `step`."""

  def __init__(self, step: int, checkpoint: str | None, *, on_peer: bool = False):
    where = "SIGTERM on a peer replica" if on_peer else "SIGTERM"
    super().__init__(f"{where}: saved checkpoint {checkpoint} at step {step}")
    self.step, self.checkpoint, self.on_peer = step, checkpoint, on_peer


# After the save on SIGTERM, the process must be gone well within Spot's 30 s. A MultiWorkerMirrored chief whose
# peer had already stopped was measured to hang after its "exiting 143" line until the SIGKILL: a TensorFlow
# thread held the GIL (the strategy's peer health check waits on the stopped peer), so not even `os._exit` in the
# main thread ran. faulthandler's timer is a C thread that needs no GIL: it ends the process (exit 1, still
# non-zero) if the normal exit has not happened by then.
EXIT_DEADLINE_SECS = 10.0


def exit_within(seconds: float = EXIT_DEADLINE_SECS) -> None:
  """Guarantees this process ends within `seconds` from now, even if Python can no longer run."""
  import faulthandler  # pylint: disable=g-import-not-at-top

  global _deadline_sink  # pylint: disable=global-statement  (faulthandler keeps only the fd; keep the file open)
  _deadline_sink = open(os.devnull, "w")  # pylint: disable=consider-using-with
  faulthandler.dump_traceback_later(seconds, exit=True, file=_deadline_sink)


_deadline_sink = None


class SigtermWatcher:
  """Records SIGTERM while active (a context manager); restores the previous handler on exit.

  Outside the main thread (signal handlers can only be set there) it watches nothing.
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
