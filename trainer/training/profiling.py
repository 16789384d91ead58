"""`--profile_steps=START,END`: a TensorFlow profiler trace of those training steps, on the chief, into the
TensorBoard dir (`AIP_TENSORBOARD_LOG_DIR` on Vertex), where TensorBoard's Profile tab (tensorboard-plugin-profile,
or `xprof --logdir`) and Vertex AI TensorBoard's profiler read it: `<dir>/plugins/profile/<run>/<host>.xplane.pb`.

One periodic action in every loop's list (`actions.standard_actions`), so it fires where the others do: the custom
loop ends a chunk at START and at END, and `fit` sizes its executions to end there too (`fit_loop`), so the trace
holds exactly steps START+1..END. A run that starts (or resumes) inside the window traces from its first step; one
that resumes past it, or ends before START, traces nothing and says so. Under parameter servers the chief is the
coordinator: its trace shows the dispatch of closures, not the workers' kernels. Every process holds the action,
so that the workers' agreement on which actions are due sees the same list everywhere; only the chief traces. No
TensorFlow at import time.
"""

from __future__ import annotations

from absl import logging

from trainer.training import loop as loop_lib


class ProfileWindow(loop_lib.PeriodicAction):
  """Starts the profiler at the first boundary at or after `start` and stops it at the first at or after `end`
  (or at the final step, whichever comes first)."""

  def __init__(self, *, start: int, end: int, log_dir: str, enabled: bool):
    super().__init__("profile", self._toggle)
    self._start, self._end, self._log_dir, self._enabled = start, end, log_dir, enabled
    self._started_at: int | None = None
    self._done = False

  def begin(self, start_step: int, total_steps: int) -> None:
    """Before the first step: starts the trace at once when the run starts inside the window (START 0, or a resume
    between START and END); a window the run cannot reach is said once and left."""
    if self._start >= total_steps:
      self._done = True
      if self._enabled:
        logging.warning("Profiler: --profile_steps=%d,%d starts at or after the final step %d: nothing is traced",
                        self._start, self._end, total_steps)
    elif start_step >= self._end:
      self._done = True
      if self._enabled:
        logging.warning("Profiler: steps %d-%d were trained before step %d, where this run resumed: nothing is "
                        "traced", self._start + 1, self._end, start_step)
    elif start_step >= self._start:
      self._toggle(loop_lib.LoopState(step=start_step))

  def steps_to_boundary(self, step: int) -> int | None:
    for edge in (self._start, self._end):
      if step < edge:
        return edge - step
    return None

  def is_due(self, state: loop_lib.LoopState, *, final: bool = False) -> bool:
    if self._done:
      return False
    if self._started_at is None:
      return state.step >= self._start and not final
    return state.step >= self._end or final

  def _toggle(self, state: loop_lib.LoopState) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self._started_at is None:
      self._started_at = state.step
      if self._enabled:
        tf.profiler.experimental.start(self._log_dir)
      return
    self._done = True
    if self._enabled:
      tf.profiler.experimental.stop()
      logging.info("Profiler: traced steps %d-%d into %s/plugins/profile/ (TensorBoard's Profile tab, or xprof)",
                   self._started_at + 1, state.step, self._log_dir.rstrip("/"))

  def close(self) -> None:
    """Stops a trace still running when training ends early (an error, a preemption); it is written as far as
    it got."""
    if self._started_at is not None and not self._done:
      self._done = True
      if self._enabled:
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        tf.profiler.experimental.stop()
