"""Progress reporting: a progress bar on a terminal, periodic log lines elsewhere (Vertex's log viewer)."""

from __future__ import annotations

import time
from typing import Callable, Mapping

from absl import logging


class ProgressReporter:
  """Reports training progress; `clock` is injectable so tests can pin the output."""

  def __init__(self, total_steps: int, *, start_step: int, interactive: bool,
               clock: Callable[[], float] = time.monotonic):
    self._total = total_steps
    self._clock = clock
    self._start_time = clock()
    self._start_step = start_step
    self._bar = None
    if interactive:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top

      self._bar = tf.keras.utils.Progbar(total_steps, stateful_metrics=None, unit_name="step")
      if start_step:
        self._bar.update(start_step)

  def update(self, step: int, values: Mapping[str, float]) -> None:
    if self._bar is not None:
      self._bar.update(step, values=[(k, v) for k, v in values.items()], finalize=step >= self._total)
      return
    logging.info("%s", self.line(step, values))

  def line(self, step: int, values: Mapping[str, float]) -> str:
    elapsed = self._clock() - self._start_time
    done = step - self._start_step
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (self._total - step) / rate if rate > 0 else float("nan")
    shown = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    return f"step {step}/{self._total} ({100 * step // self._total}%) {shown} eta={eta:.0f}s"


def _fmt(value: float) -> str:
  return f"{value:.4g}" if isinstance(value, float) else str(value)
