"""A hyperparameter-tuning config's StudySpec as typed values, checked before anything is built, sent or started:
its parameters (double / integer / discrete / categorical, linear / log / reverse-log scale, conditional
children), its metric and goal, the algorithm, measurement selection and early stopping; and each parameter
checked against the trainer, so a study never searches a name nothing reads or a value the trainer refuses.

How Vertex passes a trial's values (what `trial_arg` writes): `--ID=VALUE`, a DISCRETE value as a float
("256.0"), an INTEGER as an int, a DOUBLE as a float, a CATEGORICAL as its string.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, Collection, Iterator

from scripts import vertex_config

STOPPING_SPECS = ("medianAutomatedStoppingSpec", "decayCurveStoppingSpec", "convexAutomatedStoppingSpec")
_VALUE_SPECS = {"doubleValueSpec": "double", "integerValueSpec": "integer", "discreteValueSpec": "discrete",
                "categoricalValueSpec": "categorical"}
_PARENT_VALUES = {"discrete": "parentDiscreteValues", "integer": "parentIntValues",
                  "categorical": "parentCategoricalValues"}


@dataclasses.dataclass(frozen=True)
class Parameter:
  id: str
  kind: str  # double | integer | discrete | categorical
  low: float = 0.0  # double and integer
  high: float = 0.0
  values: tuple = ()  # discrete (floats, increasing) and categorical (strings)
  scale: str = "UNIT_LINEAR_SCALE"
  parent_values: tuple = ()  # a conditional child: the parent's values that activate it
  children: tuple[Parameter, ...] = ()

  def extremes(self) -> tuple:
    """The values a trial can receive that the trainer must accept: both ends of a range, every listed value."""
    if self.kind == "double":
      # And one value inside that is not a whole number: an int hyperparameter takes 24.0, never 24.33.
      inside = (self.low + (self.high - self.low) * f for f in (1 / 3, 0.6180339887, 0.5, 0.1234567))
      return (self.low, self.high, next((v for v in inside if not v.is_integer()), self.low))
    if self.kind == "integer":
      return (int(self.low), int(self.high))
    return self.values


@dataclasses.dataclass(frozen=True)
class StudySpec:
  metric: str
  goal: str  # MAXIMIZE | MINIMIZE
  parameters: tuple[Parameter, ...]
  algorithm: str = "ALGORITHM_UNSPECIFIED"
  best_measurement: bool = False  # measurementSelectionType BEST_MEASUREMENT (else the last one)
  early_stopping: str | None = None  # the *StoppingSpec asked for, if any
  max_trials: int = 1
  parallel_trials: int = 1
  max_failed_trials: int = 0  # 0: Vertex decides; here, the study fails only when no trial succeeds

  def all_parameters(self) -> Iterator[Parameter]:
    def walk(params):
      for p in params:
        yield p
        yield from walk(p.children)
    return walk(self.parameters)

  def better(self, a: float, b: float) -> bool:
    return a > b if self.goal == "MAXIMIZE" else a < b


def trial_arg(parameter: Parameter, value: Any) -> str:
  """The command-line argument Vertex gives a trial for this value."""
  if parameter.kind == "integer":
    return f"--{parameter.id}={int(value)}"
  if parameter.kind in ("double", "discrete"):
    return f"--{parameter.id}={float(value)!r}"
  return f"--{parameter.id}={value}"


# Trainer flags that name where a job writes: fixed in a trial's args, every trial would share them.
_OUTPUT_FLAGS = ("--output_dir", "--model_dir", "--checkpoint_dir", "--tensorboard_dir")


class StudyError(ValueError):
  """One line: what in the StudySpec is wrong and what would be accepted."""


def parse(body: dict, where: str) -> StudySpec:
  """The StudySpec and trial counts of a hyperparameter-tuning body (already parsed by the API types)."""
  study = body["studySpec"]
  metrics = study.get("metrics", [])
  if len(metrics) != 1:
    raise StudyError(f"{where}: studySpec has {len(metrics)} metrics; the trainer reports one "
                     "(--hypertune_metric): list exactly one")
  goal = metrics[0].get("goal", "GOAL_TYPE_UNSPECIFIED")
  if goal not in ("MAXIMIZE", "MINIMIZE"):
    raise StudyError(f"{where}: studySpec.metrics[0].goal is {goal}; expected MAXIMIZE or MINIMIZE")
  algorithm = study.get("algorithm", "ALGORITHM_UNSPECIFIED")
  seen: set[str] = set()
  parameters = tuple(_parameter(p, f"{where}: studySpec.parameters[{i}]", seen)
                     for i, p in enumerate(study.get("parameters", [])))
  if not parameters:
    raise StudyError(f"{where}: studySpec has no parameters to tune")
  spec = StudySpec(
      metric=metrics[0]["metricId"], goal=goal, parameters=parameters, algorithm=algorithm,
      best_measurement=study.get("measurementSelectionType") == "BEST_MEASUREMENT",
      early_stopping=next((s for s in STOPPING_SPECS if s in study), None),
      max_trials=int(body.get("maxTrialCount", 0)), parallel_trials=int(body.get("parallelTrialCount", 1) or 1),
      max_failed_trials=int(body.get("maxFailedTrialCount", 0) or 0))
  if spec.max_trials < 1:
    raise StudyError(f"{where}: maxTrialCount is {spec.max_trials}; expected at least 1")
  if algorithm == "GRID_SEARCH":
    doubles = [p.id for p in spec.all_parameters() if p.kind == "double"]
    if doubles:
      raise StudyError(f"{where}: GRID_SEARCH takes integer, discrete and categorical parameters only; "
                       f"{', '.join(doubles)} is a doubleValueSpec (list its values in a discreteValueSpec)")
    if any(p.children for p in spec.parameters):
      raise StudyError(f"{where}: GRID_SEARCH here takes no conditionalParameterSpecs (the grid is the product of "
                       "the top-level parameters); use RANDOM_SEARCH or ALGORITHM_UNSPECIFIED")
  return spec


def _parameter(raw: dict, where: str, seen: set[str], parent: Parameter | None = None,
               conditional: dict | None = None) -> Parameter:
  """One ParameterSpec; a conditional child also gets its ConditionalParameterSpec (the parent's values)."""
  pid = raw.get("parameterId", "")
  if not pid:
    raise StudyError(f"{where} has no parameterId")
  where = f"{where} ({pid})"
  if pid in seen:
    raise StudyError(f"{where}: parameterId {pid!r} is used twice; each parameter is one trainer argument")
  seen.add(pid)
  given = [k for k in _VALUE_SPECS if k in raw]
  if len(given) != 1:
    raise StudyError(f"{where}: expected exactly one of {', '.join(_VALUE_SPECS)}, got {', '.join(given) or 'none'}")
  kind = _VALUE_SPECS[given[0]]
  value_spec = raw[given[0]]
  scale = raw.get("scaleType", "UNIT_LINEAR_SCALE")
  if scale == "SCALE_TYPE_UNSPECIFIED":
    scale = "UNIT_LINEAR_SCALE"
  low = high = 0.0
  values: tuple = ()
  if kind in ("double", "integer"):
    convert = float if kind == "double" else int  # int64 bounds arrive as strings in JSON
    try:
      low, high = convert(value_spec["minValue"]), convert(value_spec["maxValue"])
    except (KeyError, TypeError, ValueError):
      raise StudyError(f"{where}: {given[0]} needs minValue and maxValue ({kind}s)") from None
    if not low < high if kind == "double" else not low <= high:
      raise StudyError(f"{where}: minValue {low} is not below maxValue {high}")
    if scale != "UNIT_LINEAR_SCALE" and low <= 0:
      raise StudyError(f"{where}: {scale} needs minValue > 0, got {low}")
  elif kind == "discrete":
    values = tuple(float(v) for v in value_spec.get("values", []))
    if not values or list(values) != sorted(set(values)):
      raise StudyError(f"{where}: discreteValueSpec.values must list distinct numbers in increasing order, "
                       f"got {list(values)}")
    if scale != "UNIT_LINEAR_SCALE" and values[0] <= 0:
      raise StudyError(f"{where}: {scale} needs values > 0, got {values[0]}")
  else:
    values = tuple(str(v) for v in value_spec.get("values", []))
    if not values or len(set(values)) != len(values):
      raise StudyError(f"{where}: categoricalValueSpec.values must list distinct strings, got {list(values)}")
  parameter = Parameter(id=pid, kind=kind, low=low, high=high, values=values, scale=scale)
  if parent is not None:
    parameter = dataclasses.replace(parameter, parent_values=_parent_values(conditional or {}, where, parent))
  children = tuple(_parameter(c.get("parameterSpec", {}), f"{where}.conditionalParameterSpecs[{i}]", seen,
                              parent=parameter, conditional=c)
                   for i, c in enumerate(raw.get("conditionalParameterSpecs", [])))
  return dataclasses.replace(parameter, children=children)


def _parent_values(conditional: dict, where: str, parent: Parameter) -> tuple:
  expected = _PARENT_VALUES.get(parent.kind)
  if expected is None:
    raise StudyError(f"{where}: a double parameter ({parent.id}) cannot have conditional parameters; Vertex "
                     "conditions on discrete, integer or categorical parents")
  given = [k for k in _PARENT_VALUES.values() if k in conditional]
  if given != [expected]:
    raise StudyError(f"{where}: a child of {parent.kind} parameter {parent.id!r} needs {expected}, got "
                     f"{', '.join(given) or 'none'}")
  raw_values = conditional[expected].get("values", [])
  if parent.kind == "discrete":
    values = tuple(float(v) for v in raw_values)
    outside = [v for v in values if v not in parent.values]
  elif parent.kind == "integer":
    values = tuple(int(v) for v in raw_values)
    outside = [v for v in values if not parent.low <= v <= parent.high]
  else:
    values = tuple(str(v) for v in raw_values)
    outside = [v for v in values if v not in parent.values]
  if not values or outside:
    raise StudyError(f"{where}: {expected} {list(values)} must name values {parent.id!r} can take "
                     f"({_describe(parent)})")
  return values


def _describe(p: Parameter) -> str:
  if p.kind in ("double", "integer"):
    return f"{p.low:g}..{p.high:g}"
  return ", ".join(str(v) for v in p.values)


def check_against_trainer(spec: StudySpec, trial_args: list[str], check: Callable[[list[str]], None],
                          only: Collection[str] | None = None) -> None:
  """Every value a trial can receive, given to the trainer's own argument check with the trial spec's args: a
  parameter the trainer does not read, or a value it refuses, fails here in one line (`check` raises
  StudyError with the trainer's reason). `only`:
  the parameter names that can be judged here (a plug-in model installed only where the job runs is not)."""
  reported = [a.split("=", 1)[1] for a in trial_args if a.startswith("--hypertune_metric=")]
  if not reported:
    raise StudyError(f"studySpec metric {spec.metric!r}: the trial's args do not report it; add "
                     f"--hypertune_metric={spec.metric} (and --eval_data) to trialJobSpec's trainer args")
  if reported[-1] != spec.metric:
    raise StudyError(f"studySpec metric {spec.metric!r} is not what the trainer reports "
                     f"(--hypertune_metric={reported[-1]})")
  shared = [a for a in trial_args if a.split("=", 1)[0] in _OUTPUT_FLAGS]
  if shared:
    raise StudyError(f"the trial's args set {shared[0]}: every trial would write there, and a trial would resume "
                     "from another's checkpoint; drop it so each trial writes under <baseOutputDirectory>/<trial id>/ "
                     "(AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR)")
  tuned = {p.id for p in spec.all_parameters()}
  fixed = sorted({a[2:].split("=", 1)[0] for a in trial_args if a.startswith("--")} & tuned)
  if fixed:
    raise StudyError(f"studySpec parameter {fixed[0]!r} is also fixed in the trial's args (--{fixed[0]}=...); "
                     "a trial's value would be appended after it: drop one")

  def probe(parameter: Parameter, context: list[str]) -> None:
    for value in parameter.extremes() if only is None or parameter.id in only else ():
      arg = trial_arg(parameter, value)
      try:
        check([*trial_args, *context, arg])
      except StudyError as e:
        raise StudyError(f"studySpec parameter {parameter.id!r} ({_describe(parameter)}): {arg} is refused by "
                         f"the trainer: {e}") from None
    for child in parameter.children:
      activating = trial_arg(parameter, child.parent_values[0])
      probe(child, [*context, activating])

  for parameter in spec.parameters:
    probe(parameter, [])


def trainer_args(body: dict) -> list[str]:
  """The chief pool's trainer args of the trial spec (every pool gets the same parameters)."""
  pools = body["trialJobSpec"]["workerPoolSpecs"]
  return list(vertex_config.trainer_spec(pools[0]).get("args", []))


def check_trial_values(spec: StudySpec, trial_args: list[str], *, site: str | None = None) -> bool:
  """check_against_trainer with the trainer's own argument check, as submit and local runs use it; `site`: a dir
  the job's packages are installed in, so a plug-in model from --extra_package is read as the trials will read
  it (then in a child process, `_check_in`). Returns False when the model is a plug-in that cannot be imported
  here (then only the trainer's own flags were judged)."""
  if site is not None:
    return _check_in(site, spec, trial_args)
  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top

  def check(args: list[str]) -> None:
    try:
      trainer_flags.check_args(args, where="trial")
    except UserError as e:
      raise StudyError(str(e).split("trainer args rejected: ", 1)[-1]) from None

  only = trainer_flags.checkable_names(trial_args)
  check_against_trainer(spec, trial_args, check, only=only)
  return only is None


def _check_in(site: str, spec: StudySpec, trial_args: list[str]) -> bool:
  """`check_trial_values` in a child process that imports from `site` first, as a trial's process will: the
  plug-in and whatever it imports stay out of this process, and no import path of this one is edited."""
  import json  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [site, repo, os.environ.get("PYTHONPATH")]))}
  # cwd=site: `python -m` puts the working directory first on the path.
  result = subprocess.run([sys.executable, "-m", "scripts.study_spec"], input=pickle.dumps((spec, trial_args)),
                          capture_output=True, cwd=site, env=env, timeout=600, check=False)
  lines = result.stdout.decode(errors="replace").strip().splitlines()
  if result.returncode or not lines:
    raise RuntimeError(f"checking the study against {site} failed (exit {result.returncode}): "
                       f"{result.stderr.decode(errors='replace')[-2000:]}")
  answer = json.loads(lines[-1])
  if "error" in answer:
    raise StudyError(answer["error"])
  return answer["complete"]


def _check_from_stdin() -> None:
  """The child of `_check_in`: (spec, trial args) pickled on stdin; one JSON line on stdout."""
  import json  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top

  from scripts import study_spec  # pylint: disable=g-import-not-at-top  (the module, not this __main__)

  spec, trial_args = pickle.load(sys.stdin.buffer)
  try:
    answer = {"complete": study_spec.check_trial_values(spec, trial_args)}
  except study_spec.StudyError as e:
    answer = {"error": str(e)}
  print(json.dumps(answer), flush=True)


if __name__ == "__main__":
  _check_from_stdin()
