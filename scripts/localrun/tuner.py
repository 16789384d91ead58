"""The optimizer behind a local tuning study: Optuna, asked for each trial's values within the StudySpec and told
each trial's measurements and result.

Vertex's tuning service is built on Vizier; OSS Vizier's algorithms need a JAX stack that does not install
consistently from today's package index (FACTS.md), so the local study uses Optuna, a maintained optimizer with
the same shapes: ALGORITHM_UNSPECIFIED (Vertex: Bayesian optimization) -> TPE, a Bayesian method; RANDOM_SEARCH
-> random; GRID_SEARCH -> the grid. Early stopping (any *StoppingSpec) -> the median rule, which is Vertex's
medianAutomatedStoppingSpec: a trial whose best measurement so far is worse than the median of the completed
trials' at the same step is stopped. A local study rehearses the job (parameters reach the model, the metric is
found, outputs stay apart); it does not promise Vertex's exact sequence of suggestions.
"""

from __future__ import annotations

import itertools
from typing import Any

from scripts.study_spec import Parameter
from scripts.study_spec import StudySpec


class Tuner:
  """Suggests values for new trials and learns from finished ones (one thread calls it)."""

  def __init__(self, spec: StudySpec, *, seed: int, max_trials: int):
    import optuna  # pylint: disable=g-import-not-at-top  (tooling only: the trainer never imports it)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    self.spec = spec
    if spec.algorithm in ("GRID_SEARCH", "RANDOM_SEARCH"):  # a grid's points are queued below, in order
      sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
      # TPE's first trials are random, as a Bayesian study's are; a third of a small study, at most 10.
      sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, min(10, max_trials // 3)))
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0) if spec.early_stopping
              else optuna.pruners.NopPruner())
    self._optuna = optuna
    self.study = optuna.create_study(direction=spec.goal.lower(), sampler=sampler, pruner=pruner)
    self._grid_points: int | None = None
    if spec.algorithm == "GRID_SEARCH":
      # Each point of the grid once (Optuna's GridSampler stops a study itself, which ask/tell cannot take).
      points = list(itertools.product(*(_grid(p) for p in spec.parameters)))
      for point in points:
        self.study.enqueue_trial(dict(zip((p.id for p in spec.parameters), point)))
      self._grid_points = len(points)

  def grid_size(self) -> int | None:
    """How many distinct trials a grid study has (None for other algorithms)."""
    return self._grid_points

  def ask(self) -> tuple[Any, dict[str, Any]]:
    """A new trial and its values: every top-level parameter, and each child its parent's value activates."""
    trial = self.study.ask()
    values: dict[str, Any] = {}

    def sample(parameter: Parameter) -> None:
      value = _suggest(trial, parameter, grid=self.spec.algorithm == "GRID_SEARCH")
      values[parameter.id] = value
      for child in parameter.children:
        if value in child.parent_values:
          sample(child)

    for parameter in self.spec.parameters:
      sample(parameter)
    return trial, values

  def report(self, trial, step: int, value: float) -> bool:
    """Records an intermediate measurement; True when the early-stopping rule says to stop the trial."""
    trial.report(value, step)
    return bool(self.spec.early_stopping) and trial.should_prune()

  def succeeded(self, trial, value: float) -> None:
    self.study.tell(trial, value)

  def stopped(self, trial) -> None:
    self.study.tell(trial, state=self._optuna.trial.TrialState.PRUNED)

  def failed(self, trial) -> None:
    self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)


def _grid(parameter: Parameter) -> list:
  if parameter.kind == "integer":
    return list(range(int(parameter.low), int(parameter.high) + 1))
  return list(parameter.values)


def _suggest(trial, p: Parameter, *, grid: bool) -> Any:
  log = p.scale != "UNIT_LINEAR_SCALE"
  if p.kind == "double":
    value = trial.suggest_float(p.id, p.low, p.high, log=log)
    # UNIT_REVERSE_LOG_SCALE: dense near the top of the range, a log-uniform draw mirrored.
    return p.low + p.high - value if p.scale == "UNIT_REVERSE_LOG_SCALE" else value
  if p.kind == "integer":
    value = trial.suggest_int(p.id, int(p.low), int(p.high), log=log)
    return int(p.low) + int(p.high) - value if p.scale == "UNIT_REVERSE_LOG_SCALE" else value
  # Discrete values are ordered: sampled by position (TPE then models "larger/smaller"), written as the value.
  # (A grid lists the values themselves.)
  if p.kind == "categorical" or grid:
    return trial.suggest_categorical(p.id, list(p.values))
  return p.values[trial.suggest_int(p.id, 0, len(p.values) - 1)]
