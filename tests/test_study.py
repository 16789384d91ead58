"""Hyperparameter-tuning studies rehearsed locally (python -m scripts.local_vertex on an hp-tuning config): the
StudySpec read and checked, values suggested within it, and whole studies on real data (scikit-learn's iris,
written by pandas) with a tutorial-style model that declares the hyperparameters the study tunes."""

import json
import os
import re
import subprocess
import textwrap

import pytest

from scripts.public_data import iris_frame
from scripts import local_vertex
from scripts import stage_data
from scripts import study_spec
from scripts.localrun import study as localrun_study
from scripts.localrun.tuner import Tuner

PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "iris-models"
version = "0.1.0"

[tool.setuptools]
py-modules = ["iris_models"]
"""

# A Keras-tutorial model over the numeric features; its width, dropout and an optional second layer are
# hyperparameters a study can tune. `fragile` fails for wide layers, as a user's model with a bug would.
MODULE = '''
import tensorflow as tf

HPARAMS = {"units": 8, "dropout": 0.0, "second_layer": "no", "second_units": 4}


def build(schema, hparams):
  numeric = [f for f in schema.features if f.type != "string"]
  layers = [tf.keras.Input((len(numeric),)),
            tf.keras.layers.Normalization(mean=[f.mean for f in numeric], variance=[f.std ** 2 for f in numeric]),
            tf.keras.layers.Dense(hparams["units"], activation="relu"),
            tf.keras.layers.Dropout(hparams["dropout"])]
  if hparams["second_layer"] == "yes":
    layers.append(tf.keras.layers.Dense(hparams["second_units"], activation="relu"))
  layers.append(tf.keras.layers.Dense(schema.label.num_classes, activation="softmax"))
  return tf.keras.Sequential(layers)


def fragile(schema, hparams):
  if hparams["units"] > 32:
    raise ValueError(f"units={hparams['units']} is more than this model supports")
  return build(schema, hparams)
'''


def _package(directory) -> str:
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "pyproject.toml").write_text(PYPROJECT)
  (directory / "iris_models.py").write_text(MODULE)
  return str(directory)


def _config(path, *, parameters: str, model: str = "iris_models:build", trials: int = 4, parallel: int = 2,
            failed: int = 0, algorithm: str = "ALGORITHM_UNSPECIFIED", extra_study: str = "",
            args: tuple | None = None, metric: str = "accuracy", goal: str = "MAXIMIZE"):
  args = (f"--hypertune_metric={metric}",) if args is None else args
  trainer_args = ["--train_data=gs://test-bucket/iris/train.csv", "--eval_data=gs://test-bucket/iris/eval.csv",
                  "--label=species", f"--model={model}", "--train_steps=120", "--global_batch_size=30",
                  "--learning_rate=0.02", "--eval_every_steps=60"]
  # What `args` sets, or the study tunes, replaces the default above.
  given = {a.split("=")[0] for a in args} | {f"--{m}" for m in re.findall(r"parameterId: (\w+)", parameters)}
  trainer_args = [a for a in trainer_args if a.split("=")[0] not in given] + list(args)
  path.write_text(textwrap.dedent("""\
      studySpec:
        metrics: [{metricId: %s, goal: %s}]
        algorithm: %s
        parameters:
      %s
      %s
      trialJobSpec:
        workerPoolSpecs:
          - machineSpec: {machineType: n1-standard-4}
            replicaCount: 1
            containerSpec:
              imageUri: ${TRAINER_IMAGE}
              args: %s
        baseOutputDirectory: {outputUriPrefix: gs://test-bucket/tuning/${RUN_ID}}
      maxTrialCount: %d
      parallelTrialCount: %d
      maxFailedTrialCount: %d
      """) % (metric, goal, algorithm, textwrap.indent(textwrap.dedent(parameters), "  "), extra_study, json.dumps(trainer_args),
              trials, parallel, failed))
  return str(path)


TUNED = """\
  - parameterId: units
    integerValueSpec: {minValue: 1, maxValue: 32}
    scaleType: UNIT_LOG_SCALE
  - parameterId: dropout
    doubleValueSpec: {minValue: 0.0, maxValue: 0.3}
  - parameterId: second_layer
    categoricalValueSpec: {values: ["no", "yes"]}
    conditionalParameterSpecs:
      - parentCategoricalValues: {values: ["yes"]}
        parameterSpec:
          parameterId: second_units
          discreteValueSpec: {values: [2, 4, 16]}
"""


def _spec(tmp_path, parameters=TUNED, **kwargs):
  from scripts import vertex_config  # pylint: disable=g-import-not-at-top

  path = _config(tmp_path / "study.yaml", parameters=parameters, **kwargs)
  config = vertex_config.load(path, {"BUCKET": "test-bucket", "RUN_ID": "r", "TRAINER_IMAGE": "trainer-image"})
  return study_spec.parse(config.body, path), config.body


def test_the_study_spec_reads_every_parameter_kind(tmp_path):
  spec, _ = _spec(tmp_path, extra_study="  measurementSelectionType: BEST_MEASUREMENT\n"
                                       "  medianAutomatedStoppingSpec: {useElapsedDuration: false}")
  units, dropout, second = spec.parameters
  assert (units.kind, units.low, units.high, units.scale) == ("integer", 1, 32, "UNIT_LOG_SCALE")
  assert (dropout.kind, dropout.low, dropout.high, dropout.scale) == ("double", 0.0, 0.3, "UNIT_LINEAR_SCALE")
  assert second.kind == "categorical" and second.values == ("no", "yes")
  (child,) = second.children
  assert child.id == "second_units" and child.values == (2.0, 4.0, 16.0) and child.parent_values == ("yes",)
  assert spec.best_measurement and spec.early_stopping == "medianAutomatedStoppingSpec"
  assert (spec.metric, spec.goal, spec.max_trials, spec.parallel_trials) == ("accuracy", "MAXIMIZE", 4, 2)
  # Values as Vertex passes them: a DISCRETE value as a float, an INTEGER as an int.
  assert study_spec.trial_arg(child, 16.0) == "--second_units=16.0"
  assert study_spec.trial_arg(units, 7) == "--units=7"


def test_suggested_values_stay_within_the_spec(tmp_path):
  spec, _ = _spec(tmp_path, parameters=TUNED + """\
  - parameterId: learning_rate
    doubleValueSpec: {minValue: 0.001, maxValue: 0.1}
    scaleType: UNIT_REVERSE_LOG_SCALE
""")
  for algorithm in ("ALGORITHM_UNSPECIFIED", "RANDOM_SEARCH"):
    tuner = Tuner(spec.__class__(**{**spec.__dict__, "algorithm": algorithm}), seed=1, max_trials=30)
    seen_children = set()
    for i in range(30):
      trial, values = tuner.ask()
      assert isinstance(values["units"], int) and 1 <= values["units"] <= 32
      assert 0.0 <= values["dropout"] <= 0.3 and 0.001 <= values["learning_rate"] <= 0.1
      assert values["second_layer"] in ("no", "yes")
      # The conditional child exists exactly when its parent takes an activating value.
      assert ("second_units" in values) == (values["second_layer"] == "yes")
      seen_children.add(values.get("second_units"))
      tuner.succeeded(trial, float(values["units"]) / 32 + i * 1e-3)
    assert {2.0, 4.0, 16.0} <= seen_children  # every discrete value is reachable
  # A grid visits each point once, and a study of a grid runs no more trials than it has points.
  grid_spec, _ = _spec(tmp_path, algorithm="GRID_SEARCH", parameters="""\
  - parameterId: units
    integerValueSpec: {minValue: 2, maxValue: 4}
  - parameterId: second_layer
    categoricalValueSpec: {values: ["no", "yes"]}
""")
  tuner = Tuner(grid_spec, seed=0, max_trials=6)
  assert tuner.grid_size() == 6
  points = set()
  for _ in range(6):
    trial, values = tuner.ask()
    points.add((values["units"], values["second_layer"]))
    tuner.succeeded(trial, 0.5)
  assert points == {(u, s) for u in (2, 3, 4) for s in ("no", "yes")}


@pytest.mark.parametrize("parameters,extra,message", [
    ("""\
  - parameterId: units
    integerValueSpec: {minValue: 8, maxValue: 4}
""", {}, r"studySpec.parameters\[0\] \(units\): minValue 8 is not below maxValue 4$"),
    ("""\
  - parameterId: dropout
    doubleValueSpec: {minValue: 0.0, maxValue: 0.3}
    scaleType: UNIT_LOG_SCALE
""", {}, r"\(dropout\): UNIT_LOG_SCALE needs minValue > 0, got 0.0$"),
    ("""\
  - parameterId: units
    discreteValueSpec: {values: [16, 4]}
""", {}, r"\(units\): discreteValueSpec.values must list distinct numbers in increasing order, got \[16.0, 4.0\]$"),
    ("""\
  - parameterId: second_layer
    categoricalValueSpec: {values: ["no", "yes"]}
    conditionalParameterSpecs:
      - parentCategoricalValues: {values: ["maybe"]}
        parameterSpec: {parameterId: second_units, integerValueSpec: {minValue: 1, maxValue: 4}}
""", {}, r"\(second_units\): parentCategoricalValues \['maybe'\] must name values 'second_layer' can take "
         r"\(no, yes\)$"),
    ("""\
  - parameterId: dropout
    doubleValueSpec: {minValue: 0.0, maxValue: 0.3}
""", {"algorithm": "GRID_SEARCH"}, r"GRID_SEARCH takes integer, discrete and categorical parameters only; dropout"),
])
def test_bad_study_specs_are_one_line(tmp_path, parameters, extra, message):
  with pytest.raises(study_spec.StudyError, match=message):
    _spec(tmp_path, parameters=parameters, **extra)


@pytest.fixture(scope="module")
def iris_staged(gcs, tmp_path_factory):
  frame = iris_frame()
  directory = tmp_path_factory.mktemp("iris")
  frame.iloc[:120].to_csv(directory / "train.csv", index=False)
  frame.iloc[120:].to_csv(directory / "eval.csv", index=False)
  stage_data.upload_tree(str(directory), "gs://test-bucket/iris")
  return "gs://test-bucket/iris"


def _children_of(job_dir):
  out = subprocess.run(["pgrep", "-f", job_dir], capture_output=True, text=True, check=False).stdout
  return [p for p in out.split() if int(p) != os.getpid()]


def _run(tmp_path, config, *args):
  job_dir = str(tmp_path / "job")
  code = local_vertex.main([f"--config={config}", "--bucket=test-bucket", f"--job_dir={job_dir}",
                            "--timeout_secs=300", *args])
  assert not _children_of(job_dir)  # no trial's process is left behind
  return code, job_dir


def _download_json(uri):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  bucket, _, blob = uri[len("gs://"):].partition("/")
  return json.loads(storage.Client(project="p").bucket(bucket).blob(blob).download_as_text())


def test_a_local_study_tunes_the_models_own_hyperparameters(iris_staged, tmp_path, capsys):
  """Four trials, two at a time, of a 6-trial study (--max_trials) minimizing the eval loss: each trial's model
  gets its values (read back from its own export), every trial writes under its own id, the best trial is the one
  with the lowest reported loss."""
  package = _package(tmp_path / "iris-models")
  config = _config(tmp_path / "study.yaml", parameters=TUNED, trials=6, parallel=2, failed=2, metric="loss",
                   goal="MINIMIZE")
  code, job_dir = _run(tmp_path, config, "--run_id=study1", f"--extra_package={package}", "--max_trials=4",
                       "--seed=3")
  out = capsys.readouterr().out
  assert code == 0, out
  record = json.load(open(os.path.join(job_dir, "study.json")))
  trials = record["trials"]
  assert [t["id"] for t in trials] == ["1", "2", "3", "4"] and {t["state"] for t in trials} == {"SUCCEEDED"}, out
  finals = {}
  for trial in trials:
    values = {p["parameterId"]: p["value"] for p in trial["parameters"]}
    model_dir = f"gs://test-bucket/tuning/study1/{trial['id']}/model/"
    assert trial["output"] == f"gs://test-bucket/tuning/study1/{trial['id']}/"
    run_record = _download_json(model_dir + "trainer_config.json")
    received = run_record["config"]["hparams"]
    # The trial's values reached build_fn, typed by the model's HPARAMS (second_units only when asked for).
    expected = {"units": values["units"], "dropout": values["dropout"], "second_layer": values["second_layer"],
                "second_units": int(values.get("second_units", 4))}
    assert received == pytest.approx(expected), (received, values)
    assert isinstance(received["units"], int) and isinstance(received["second_units"], int)
    # The final measurement is the last one the trial's chief reported: the export's evaluation.
    final = trial["finalMeasurement"]
    assert final["stepCount"] == "120" and [m["stepCount"] for m in trial["measurements"]] == ["60", "120"]
    metrics = _download_json(model_dir + "eval_metrics.json")
    assert final["metrics"][0]["value"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
    finals[trial["id"]] = final["metrics"][0]["value"]
    # Its own trial id, as Vertex gives it (TF_CONFIG task.trial), in what the chief reported.
    lines = open(os.path.join(trial["logs"], "hypertune", "output.metrics")).read().splitlines()
    assert {json.loads(line)["trial"] for line in lines} == {trial["id"]}
  assert len({t["output"] for t in trials}) == 4
  assert len(set(finals.values())) > 1, finals  # the tuned dimensions change the result
  best = min(finals, key=lambda k: (finals[k], int(k)))
  assert record["bestTrial"] == best
  assert re.search(rf"^best trial {best}: loss={finals[best]:.6g} \(minimize\)", out, re.MULTILINE), out
  assert re.search(r"^study study1: 4 trial\(s\) of 6, 2 at a time", out, re.MULTILINE)
  # Each trial's last line says how far the study is and which trial leads.
  ends = re.findall(r"^trial \d: SUCCEEDED \(loss=\S+ at step 120, \d+ s\); (\d) of 4 trial\(s\) done, best so far "
                    r"trial (\d) \(loss=", out, re.MULTILINE)
  assert [int(done) for done, _ in ends] == [1, 2, 3, 4] and ends[-1][1] == best, out


def test_failed_trials_count_against_max_failed_trial_count(iris_staged, tmp_path, capsys):
  """A grid of two widths, one of which the user's model cannot build: that trial fails with the trainer's own
  error, and with maxFailedTrialCount 1 the study fails (one line, exit 2) and says which trial and why."""
  package = _package(tmp_path / "iris-models")
  config = _config(tmp_path / "study.yaml", model="iris_models:fragile", algorithm="GRID_SEARCH", trials=2,
                   parallel=2, failed=1, parameters="""\
  - parameterId: units
    discreteValueSpec: {values: [4, 64]}
""")
  code, job_dir = _run(tmp_path, config, "--run_id=study2", f"--extra_package={package}")
  captured = capsys.readouterr()
  assert code == 2, captured.out
  errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
  assert errors == ["error: study study2 failed: 1 trial(s) failed, maxFailedTrialCount is 1"], captured.err
  record = json.load(open(os.path.join(job_dir, "study.json")))
  by_units = {t["parameters"][0]["value"]: t for t in record["trials"]}
  assert by_units[64.0]["state"] == "FAILED"
  assert "units=64 is more than this model supports" in by_units[64.0]["infeasibleReason"], record
  assert by_units[4.0]["state"] in ("SUCCEEDED", "STOPPED")  # done, or stopped when the study failed


def test_bad_studies_start_nothing(iris_staged, tmp_path, capsys):
  """Each is one `error:` line and exit 2, before any trial starts."""
  package = _package(tmp_path / "iris-models")
  cases = [
      # A parameter nothing reads (the model declares units, dropout, second_layer, second_units).
      (dict(parameters="""\
  - parameterId: width
    integerValueSpec: {minValue: 1, maxValue: 8}
"""), r"^error: studySpec parameter 'width' \(1\.\.8\): --width=1 is refused by the trainer: Unknown command line "
      r"flag 'width'.*--model=iris_models:build declares units, dropout, second_layer, second_units"),
      # A value the spec allows and the model cannot take.
      (dict(parameters="""\
  - parameterId: units
    doubleValueSpec: {minValue: 1, maxValue: 32}
"""), r"^error: studySpec parameter 'units' \(1\.\.32\): --units=11\.33+\d* is refused by the trainer: "
      r"--units='11\.33+\d*': hyperparameter 'units' is an int"),
      # A built-in model flag the plug-in does not read.
      (dict(parameters="""\
  - parameterId: hidden_units
    categoricalValueSpec: {values: ["16", "32,16"]}
"""), r"^error: studySpec parameter 'hidden_units' .*--hidden_units is read by the built-in models only"),
      # A study whose metric the trainer does not report.
      (dict(parameters=TUNED, args=()), r"^error: studySpec metric 'accuracy': the trial's args do not report it; "
       r"add --hypertune_metric=accuracy"),
      (dict(parameters=TUNED, args=("--hypertune_metric=loss",)),
       r"studySpec metric 'accuracy' is not what the trainer reports \(--hypertune_metric=loss\)"),
      # One output dir for every trial: they would overwrite each other and resume from each other's checkpoints.
      (dict(parameters=TUNED, args=("--hypertune_metric=accuracy", "--output_dir=gs://test-bucket/one-dir")),
       r"^error: the trial's args set --output_dir=gs://test-bucket/one-dir: every trial would write there"),
  ]
  for i, (kwargs, message) in enumerate(cases):
    config = _config(tmp_path / f"bad{i}.yaml", **kwargs)
    code, job_dir = _run(tmp_path / f"case{i}", config, f"--run_id=bad{i}", f"--extra_package={package}")
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and re.search(message, errors[0]), (message, err)
    assert not any(name.startswith("trial-") for name in os.listdir(job_dir)) if os.path.isdir(job_dir) else True
  # The model's package not passed: every trial would fail to import it.
  code, _ = _run(tmp_path / "nopackage", _config(tmp_path / "ok.yaml", parameters=TUNED), "--run_id=nopackage")
  err = capsys.readouterr().err
  assert code == 2 and re.search(r"^error: --model=iris_models:build: not importable from the trials' packages .*"
                                 r"pass your package with --extra_package=DIR$", err, re.MULTILINE), err
  flag_cases = [("--max_trials=0", r"^error: --max_trials=0: expected a count >= 1"),
                ("--preempt=workerpool0-0@5", r"^error: --preempt: preemptions are rehearsed on a custom-job config")]
  for flag, message in flag_cases:
    code, _ = _run(tmp_path / "flags", _config(tmp_path / "ok.yaml", parameters=TUNED), flag,
                   f"--extra_package={package}")
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err, re.MULTILINE), err


def test_a_double_range_is_probed_off_the_whole_numbers():
  """An int hyperparameter takes 24.0: the value probed inside a double range must not be whole, or a range like
  4..64 (a third of the way: 24.0) would pass the check and fail every trial."""
  for low, high in ((4.0, 64.0), (1.0, 32.0), (0.0, 3.0), (0.0, 0.4)):
    values = study_spec.Parameter(id="units", kind="double", low=low, high=high).extremes()
    assert values[:2] == (low, high) and low < values[2] < high and not float(values[2]).is_integer()


def test_trial_spec_appends_each_value_as_vertex_passes_it(tmp_path):
  spec, body = _spec(tmp_path)
  values = {"units": 5, "dropout": 0.125, "second_layer": "yes", "second_units": 16.0}
  trial = localrun_study.trial_spec(body["trialJobSpec"], spec, values)
  args = trial["workerPoolSpecs"][0]["containerSpec"]["args"]
  assert args[-4:] == ["--units=5", "--dropout=0.125", "--second_layer=yes", "--second_units=16.0"]
  assert body["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"][-1] == "--hypertune_metric=accuracy"


def test_early_stopping_stops_a_trial_worse_than_the_median(iris_staged, tmp_path, capsys):
  """medianAutomatedStoppingSpec: the first trial (a working learning rate) completes; the second (a rate too
  small to learn anything) reports a worse loss at its first measurement and is stopped there, its processes
  ended. BEST_MEASUREMENT: a trial's final measurement is its best one."""
  package = _package(tmp_path / "iris-models")
  # A grid runs its points in the order listed: the working rate first.
  config = _config(tmp_path / "study.yaml", algorithm="GRID_SEARCH", trials=2, parallel=1, metric="loss",
                   goal="MINIMIZE", extra_study="  measurementSelectionType: BEST_MEASUREMENT\n"
                                                "  medianAutomatedStoppingSpec: {}",
                   args=("--hypertune_metric=loss", "--eval_every_steps=20"), parameters="""\
  - parameterId: learning_rate
    categoricalValueSpec: {values: ["0.05", "0.00001"]}
""")
  code, job_dir = _run(tmp_path, config, "--run_id=study3", f"--extra_package={package}")
  out = capsys.readouterr().out
  assert code == 0, out
  first, second = json.load(open(os.path.join(job_dir, "study.json")))["trials"]
  assert (first["parameters"][0]["value"], second["parameters"][0]["value"]) == ("0.05", "0.00001")
  assert (first["state"], second["state"]) == ("SUCCEEDED", "STOPPED"), out
  assert int(second["measurements"][-1]["stepCount"]) < 120 and "stopped early at step" in second["infeasibleReason"]
  losses = [m["metrics"][0]["value"] for m in first["measurements"]]
  assert len(losses) >= 6 and first["finalMeasurement"]["metrics"][0]["value"] == min(losses)
  assert re.search(r"^trial 2: stopped early at step \d+: loss below the median", out, re.MULTILINE), out
