"""One sink for metrics: progress (a bar on a terminal, log lines elsewhere) and TensorBoard scalars.

Every place that reports writes here once (CLU's `create_default_writer` shape), instead of calling the progress
reporter and the summary writer side by side. Only the chief writes TensorBoard files; every process logs.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from absl import logging

from trainer.core import progress as progress_lib
from trainer.core import summaries as summaries_lib


class MetricWriter:
  """Writes training progress and per-split scalars.

  Args:
    directory: the TensorBoard dir (one event-file writer per split under it).
    enabled: whether this process writes TensorBoard files (the chief).
    splits: the summary splits this writer may write.
    progress: the training progress reporter, or None (the side-car evaluator only logs).
  """

  def __init__(self, directory: str, *, enabled: bool, splits: Iterable[str] = ("train", "eval"),
               progress: progress_lib.ProgressReporter | None = None):
    self._summaries = summaries_lib.Summaries(directory, enabled=enabled, splits=splits)
    self._progress = progress

  def write_train(self, step: int, values: Mapping[str, float]) -> None:
    """A training progress line (or bar update) and the same values as `train` scalars."""
    if self._progress is not None:
      self._progress.update(step, values)
    self._summaries.scalars("train", step, values)

  def write(self, split: str, step: int, values: Mapping[str, float], *, label: str | None = None) -> None:
    """Scalars of another split (eval, the side-car's), logged as one line."""
    logging.info("%s: step %d %s", label or split.capitalize(), step, dict(values))
    self._summaries.scalars(split, step, values)

  def close(self) -> None:
    self._summaries.close()
