"""A hyperparameter-tuning study run locally as Vertex runs it: up to maxTrialCount trials, parallelTrialCount at
a time, each a full job of the trial spec's pools with the trial's values appended to every trainer pool's args
(`--ID=VALUE`, as Vertex passes them), its own id (TF_CONFIG task.trial, CLOUD_ML_TRIAL_ID) and its own outputs
(<baseOutputDirectory>/<trial id>/model/, checkpoints/, logs/).

A trial's metric is what its chief reports through the hypertune file (--hypertune_metric): each measurement
is read as it is written, told to the tuner (which may stop the trial early, when the spec asks for early
stopping), and the trial's final measurement is its last one, or its best with measurementSelectionType
BEST_MEASUREMENT. A trial that exits non-zero, or ends without reporting the metric, failed; the study fails
when maxFailedTrialCount trials have failed (with 0, when no trial succeeds). Each trial runs on this machine,
so each gets its own hypertune file (CLOUD_ML_HP_METRIC_FILE) where a Vertex VM has the default path to itself.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import threading
import time
from typing import Any, Callable

from scripts import vertex_config
from scripts.localrun.planning import LocalRunError
from scripts.localrun.tuner import Tuner
from scripts.study_spec import StudySpec
from scripts.study_spec import trial_arg


@dataclasses.dataclass
class Trial:
  id: str
  values: dict[str, Any]
  handle: Any  # the tuner's trial
  job_dir: str  # its logs
  output: str  # <baseOutputDirectory>/<id>/, or "" without one
  stop: threading.Event = dataclasses.field(default_factory=threading.Event)
  thread: threading.Thread | None = None
  outcome: tuple[bool, str, Any] | None = None  # the job's (succeeded, reason, failed replica)
  measurements: list[tuple[int, float]] = dataclasses.field(default_factory=list)
  read_offset: int = 0
  state: str = "ACTIVE"  # then SUCCEEDED, FAILED or STOPPED (early)
  reason: str = ""
  final: tuple[int, float] | None = None  # (step, value) of the final measurement
  started: float = dataclasses.field(default_factory=time.monotonic)
  seconds: float = 0.0

  @property
  def metric_file(self) -> str:
    return os.path.join(self.job_dir, "hypertune", "output.metrics")


# launch(trial spec, trial, extra env) runs the trial's job to its end (or trial.stop) and returns the job's
# (succeeded, reason, failed replica).
Launch = Callable[[dict, Trial, dict], tuple[bool, str, Any]]


def trial_spec(job_spec: dict, spec: StudySpec, values: dict[str, Any]) -> dict:
  """The trial's CustomJobSpec: every trainer pool's args with the trial's values appended, in spec order."""
  args = [trial_arg(p, values[p.id]) for p in spec.all_parameters() if p.id in values]
  body = copy.deepcopy(job_spec)
  for pool in body["workerPoolSpecs"]:
    package = vertex_config.trainer_spec(pool)
    if package:
      package["args"] = [*package.get("args", []), *args]
  return body


def run_study(spec: StudySpec, *, job_spec: dict, job_id: str, job_dir: str, launch: Launch, max_trials: int,
              parallel: int, seed: int, say: Callable[[str], None] = print) -> list[Trial]:
  """Runs the study to its end; returns every trial (raises LocalRunError when the study failed)."""
  tuner = Tuner(spec, seed=seed, max_trials=max_trials)
  grid = tuner.grid_size()
  limit = min(max_trials, grid) if grid else max_trials
  if grid and grid < max_trials:
    say(f"study {job_id}: the grid has {grid} points; {grid} trials instead of {max_trials}")
  base = job_spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "").rstrip("/")
  trials: list[Trial] = []
  running: list[Trial] = []
  failed_study = ""

  def start() -> None:
    handle, values = tuner.ask()
    trial_id = str(len(trials) + 1)
    trial = Trial(id=trial_id, values=values, handle=handle, job_dir=os.path.join(job_dir, f"trial-{trial_id}"),
                  output=f"{base}/{trial_id}/" if base else "")
    os.makedirs(trial.job_dir, exist_ok=True)
    body = trial_spec(job_spec, spec, values)
    env = {"CLOUD_ML_HP_METRIC_FILE": trial.metric_file}

    def run() -> None:
      try:
        trial.outcome = launch(body, trial, env)
      except Exception as e:  # pylint: disable=broad-except  (a trial that cannot start fails, as on Vertex)
        trial.outcome = (False, f"could not start: {e}", None)

    trial.thread = threading.Thread(target=run, name=f"trial-{trial_id}", daemon=True)
    trials.append(trial)
    running.append(trial)
    say(f"trial {trial_id}: {_values_text(values)} (logs: {trial.job_dir})")
    trial.thread.start()

  def read(trial: Trial) -> None:
    for step, value in _new_measurements(trial, spec.metric):
      trial.measurements.append((step, value))
      say(f"trial {trial.id}: step {step} {spec.metric}={value:.6g}")
      if trial.state == "ACTIVE" and not trial.stop.is_set() and tuner.report(trial.handle, step, value):
        trial.state = "STOPPED"
        trial.reason = (f"stopped early at step {step}: {spec.metric} below the median of completed trials "
                        "at that step")
        say(f"trial {trial.id}: {trial.reason}")
        trial.stop.set()

  def finish(trial: Trial) -> None:
    trial.thread.join()
    read(trial)
    trial.seconds = time.monotonic() - trial.started
    ok, reason, failed_replica = trial.outcome
    if trial.measurements:
      trial.final = _final(trial.measurements, spec)
    if trial.state == "ACTIVE" and trial.stop.is_set() and not ok:
      trial.state, trial.reason = "STOPPED", "stopped when the study failed"
    if trial.state == "STOPPED":
      tuner.stopped(trial.handle)
    elif ok and trial.final is not None:
      trial.state = "SUCCEEDED"
      tuner.succeeded(trial.handle, trial.final[1])
    else:
      trial.state = "FAILED"
      trial.reason = (_failure(reason, failed_replica) if not ok else
                      f"the job succeeded but reported no {spec.metric!r} measurement")
      tuner.failed(trial.handle)
    ending = f"{spec.metric}={trial.final[1]:.6g} at step {trial.final[0]}" if trial.final else trial.reason
    ended = sum(t.state in ("SUCCEEDED", "FAILED", "STOPPED") for t in trials)
    leader = best(spec, trials)  # the study's progress, on the line each trial ends with
    standing = f"; {ended} of {limit} trial(s) done" + (
        f", best so far trial {leader.id} ({spec.metric}={leader.final[1]:.6g})" if leader else "")
    say(f"trial {trial.id}: {trial.state} ({ending}, {trial.seconds:.0f} s)"
        + (f": {trial.reason}" if trial.state == "FAILED" and trial.final else "") + standing)

  try:
    while True:
      while not failed_study and len(running) < parallel and len(trials) < limit:
        start()
      for trial in list(running):
        read(trial)
        if not trial.thread.is_alive():
          finish(trial)
          running.remove(trial)
      failures = sum(t.state == "FAILED" for t in trials)
      if not failed_study and spec.max_failed_trials and failures >= spec.max_failed_trials:
        failed_study = f"{failures} trial(s) failed, maxFailedTrialCount is {spec.max_failed_trials}"
        say(f"study {job_id}: {failed_study}; stopping the trials still running")
        for trial in running:
          trial.stop.set()
      if not running and (failed_study or len(trials) >= limit):
        break
      time.sleep(0.2)
  except KeyboardInterrupt:
    for trial in running:
      trial.stop.set()
    for trial in running:
      trial.thread.join()
    raise LocalRunError(f"study {job_id} interrupted") from None
  if not failed_study and not any(t.state == "SUCCEEDED" for t in trials):
    failed_study = "no trial succeeded"
  _write_record(os.path.join(job_dir, "study.json"), spec, trials, best(spec, trials))
  say("\n" + summary(spec, trials))
  say(f"trials: {os.path.join(job_dir, 'study.json')}")
  if failed_study:
    raise LocalRunError(f"study {job_id} failed: {failed_study}")
  return trials


def best(spec: StudySpec, trials: list[Trial]) -> Trial | None:
  """The succeeded trial with the best final measurement (the first of equals)."""
  found = None
  for trial in trials:
    if trial.state == "SUCCEEDED" and (found is None or spec.better(trial.final[1], found.final[1])):
      found = trial
  return found


def summary(spec: StudySpec, trials: list[Trial]) -> str:
  names = [p.id for p in spec.all_parameters()]
  header = ["trial", "state", spec.metric, "step", *names]
  rows = [[t.id, t.state, f"{t.final[1]:.6g}" if t.final else "-", str(t.final[0]) if t.final else "-",
           *(_value_text(t.values[n]) if n in t.values else "-" for n in names)] for t in trials]
  widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
  found = best(spec, trials)
  if found:
    lines.append(f"best trial {found.id}: {spec.metric}={found.final[1]:.6g} ({spec.goal.lower()}) with "
                 f"{_values_text(found.values)}" + (f"; model: {found.output}model/" if found.output else ""))
  lines.extend(f"trial {t.id} {t.state.lower()}: {t.reason}" for t in trials if t.reason)
  return "\n".join(lines)


def _final(measurements: list[tuple[int, float]], spec: StudySpec) -> tuple[int, float]:
  if not spec.best_measurement:
    return measurements[-1]
  chosen = measurements[0]
  for m in measurements[1:]:
    if spec.better(m[1], chosen[1]):
      chosen = m
  return chosen


def _new_measurements(trial: Trial, metric: str) -> list[tuple[int, float]]:
  """Complete lines the trial's chief has appended to its hypertune file since the last read."""
  try:
    with open(trial.metric_file) as f:
      f.seek(trial.read_offset)
      text = f.read()
  except OSError:
    return []
  complete = text[:text.rfind("\n") + 1]
  trial.read_offset += len(complete.encode())
  found = []
  for line in complete.splitlines():
    try:
      entry = json.loads(line)
      found.append((int(float(entry.get("global_step", 0))), float(entry[metric])))
    except (ValueError, KeyError, TypeError):
      continue  # another metric's line, or not one the trainer wrote
  return found


def _failure(reason: str, replica) -> str:
  """The job's reason, with the trainer's own `error:` line when the failed replica wrote one."""
  if replica is None:
    return reason
  try:
    with open(replica.log_path, errors="replace") as f:
      errors = re.findall(r"^(?:E )?error: (.*)$", f.read(), flags=re.MULTILINE)
  except OSError:
    errors = []
  return f"{reason}: {errors[-1]}" if errors else f"{reason} (log: {replica.log_path})"


def _value_text(value: Any) -> str:
  return f"{value:.6g}" if isinstance(value, float) else str(value)


def _values_text(values: dict[str, Any]) -> str:
  return " ".join(f"{k}={_value_text(v)}" for k, v in values.items())


def _write_record(path: str, spec: StudySpec, trials: list[Trial], best_trial: Trial | None) -> None:
  """The study's trials in the shape Vertex's API returns them (Trial: id, state, parameters,
  finalMeasurement), plus each trial's outputs and logs: what a pipeline's next step reads the best trial from."""
  record = {
      "trials": [{
          "id": t.id, "state": t.state,
          "parameters": [{"parameterId": k, "value": v} for k, v in t.values.items()],
          **({"finalMeasurement": {"stepCount": str(t.final[0]),
                                   "metrics": [{"metricId": spec.metric, "value": t.final[1]}]}} if t.final else {}),
          "measurements": [{"stepCount": str(s), "metrics": [{"metricId": spec.metric, "value": v}]}
                           for s, v in t.measurements],
          **({"infeasibleReason": t.reason} if t.reason else {}),
          "output": t.output, "logs": t.job_dir,
      } for t in trials],
      "bestTrial": best_trial.id if best_trial else None,
  }
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(record, f, indent=1)
  os.replace(tmp, path)
