"""The one outer loop every way of training runs, and the periodic actions it drives.

Shaped after orbit's `Controller` and CLU's `PeriodicAction`. A source advances the step: a `tf.function` of
several steps under sync strategies, scheduled closures under parameter servers, or the next checkpoint for the
side-car evaluator. Actions fire on step boundaries, elapsed seconds or a condition (a SIGTERM arrived), and
once more at the final step: logging with summaries (through one `writers.MetricWriter`), checkpoints,
evaluation, the save before a preemption. Under MultiWorkerMirroredStrategy an `Agreement` merges the
processes' decisions, so all fire together. Chunks never cross a step boundary of any action, so a checkpoint
lands on exactly the step its cadence names. Pure Python: no TensorFlow here, so the cadence is tested
in-process with a fake source and clock.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping, Sequence


@dataclasses.dataclass
class LoopState:
  """What the actions see: the step reached, the mean training loss of the last chunk (None if none ran),
  and other metrics a source reports (Keras' logs under `fit`)."""

  step: int
  loss: float | None = None
  metrics: Mapping[str, float] | None = None


class PeriodicAction:
  """Calls `fn(state)` every `every_steps` steps and/or every `every_secs` seconds, when `when()` says so, and
  at the final step.

  Args:
    name: for logs and errors.
    fn: the action; it receives the `LoopState`.
    every_steps: step cadence (the loop stops a chunk on each multiple), or None.
    every_secs: time cadence (checked after each chunk), or None.
    when: a condition checked after each chunk (a SIGTERM was received), or None.
    at_end: also run once at the final step, whatever the cadence.
    clock: seconds, monotonic; injectable for tests.
  """

  def __init__(self, name: str, fn: Callable[[LoopState], None], *, every_steps: int | None = None,
               every_secs: float | None = None, when: Callable[[], bool] | None = None, at_end: bool = True,
               clock: Callable[[], float] = time.monotonic):
    if every_steps is not None and every_steps <= 0:
      raise ValueError(f"{name}: every_steps must be positive, got {every_steps}")
    self.name, self._fn, self.every_steps, self._every_secs, self._at_end = name, fn, every_steps, every_secs, at_end
    self._when = when
    self._clock = clock
    self._last_time = clock()
    self._last_step: int | None = None

  def steps_to_boundary(self, step: int) -> int | None:
    """Steps from `step` to this action's next step multiple, or None without a step cadence."""
    if not self.every_steps:
      return None
    return self.every_steps - step % self.every_steps

  def is_due(self, state: LoopState, *, final: bool = False) -> bool:
    """Whether the action is due at `state.step` by this process's own step count, clock and condition."""
    if state.step == self._last_step:
      return False
    return bool((self.every_steps and state.step % self.every_steps == 0) or
                (self._every_secs is not None and self._clock() - self._last_time >= self._every_secs) or
                (self._when is not None and self._when()) or (final and self._at_end))

  def fire(self, state: LoopState) -> None:
    self._fn(state)
    self._last_step, self._last_time = state.step, self._clock()

  def __call__(self, state: LoopState, *, final: bool = False) -> bool:
    """Runs the action if it is due at `state.step`; returns whether it ran."""
    if not self.is_due(state, final=final):
      return False
    self.fire(state)
    return True


# `agree(due) -> due`: merges each process's decisions into one for all (any process's True is everyone's), so
# workers that must act together (MultiWorkerMirroredStrategy saves collectively) fire the same actions at the
# same step even when a clock or a signal made the decision on one of them only.
Agreement = Callable[[Sequence[bool]], Sequence[bool]]


def fire_due(actions: Sequence[PeriodicAction], state: LoopState, *, final: bool = False,
             agree: Agreement | None = None) -> None:
  """Fires, in order, every action due at `state.step`, agreed across processes when `agree` is given."""
  due = [action.is_due(state, final=final) for action in actions]
  if agree is not None:
    due = agree(due)
  for action, is_due in zip(actions, due):
    if is_due:
      action.fire(state)


def run(*, start_step: int, total_steps: int, advance: Callable[[int], tuple[int, float | None]],
        actions: Sequence[PeriodicAction], max_steps_per_call: int | None = None,
        agree: Agreement | None = None, stop: Callable[[], bool] | None = None) -> LoopState:
  """Advances from `start_step` to `total_steps`, firing `actions` on their cadence.

  Args:
    start_step: the step training resumes at (0, or a restored checkpoint's).
    total_steps: the final step.
    advance: `advance(max_steps) -> (steps_done, mean_loss)`. Training sources do exactly `max_steps`; the
      side-car evaluator's source returns however far the next checkpoint is, or 0 when none comes.
    actions: fired after every chunk that reaches their cadence, and at the final step.
    max_steps_per_call: the most steps one call of `advance` may take (`--steps_per_loop`), or None.
    agree: merges the actions' due decisions across processes after every chunk (`Agreement`), or None.
    stop: checked after the actions of every chunk: True ends the loop there (early stopping). It must say the
      same on every process (early stopping decides on all-reduced metrics).

  Returns:
    The final `LoopState`; `state.step < total_steps` only when the source stopped advancing or `stop` said so.
  """
  state = LoopState(step=start_step)
  while state.step < total_steps:
    limits = [total_steps - state.step] + [n for n in (a.steps_to_boundary(state.step) for a in actions) if n]
    if max_steps_per_call:
      limits.append(max_steps_per_call)
    done, loss = advance(min(limits))
    if done <= 0:
      break
    state.step += done
    state.loss = loss
    fire_due(actions, state, final=state.step >= total_steps, agree=agree)
    if stop is not None and stop():
      break
  return state
