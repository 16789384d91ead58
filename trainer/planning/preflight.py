"""Pre-flight: everything checked or counted from the data before any device or peer is touched.

File patterns are expanded, each split's format and compression resolved (`formats`), the schema read or
inferred (`schema_inference`), the records of every split (train, eval, test: all of a small split, a sample of
--preflight_records of a large one) read in plain Python and checked against it, with the image files they name,
records counted for --epochs; failures are one-line `UserError`s. When training does hit a bad record later,
`find_bad_record` reads the split's files again in Python to name the flag, file, record and column (for
`data_errors`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from absl import logging

from trainer.core import config as config_lib
from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import first_line
from trainer.core.errors import UserError
from trainer.data import feature_kinds
from trainer.data import formats
from trainer.data import inference as schema_inference
from trainer.data import schema as schema_lib
from trainer.modeling import export
from trainer.modeling import model_registry
from trainer.modeling import recipe


SPLIT_FLAGS = {"train": "--train_data", "eval": "--eval_data", "test": "--test_data"}


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What pre-flight found: the schema (and where it came from), each split's files and how to read them."""

  schema: schema_lib.Schema
  train_files: list[str]
  eval_files: list[str]
  sources: dict[str, formats.Source]  # "train"/"eval"/"test"
  schema_origin: str = ""
  class_weights: tuple[float, ...] | None = None  # --class_weights by class id
  test_files: list[str] = dataclasses.field(default_factory=list)  # --test_data, evaluated once after training
  # The flag that names each split's files, for messages (a split of Vertex's export is --train_data's).
  flags: dict[str, str] = dataclasses.field(default_factory=lambda: dict(SPLIT_FLAGS))

  def flag(self, split: str) -> str:
    return self.flags.get(split, SPLIT_FLAGS[split])

  def files(self, split: str) -> list[str]:
    return {"train": self.train_files, "eval": self.eval_files, "test": self.test_files}[split]


def check_inputs(config: config_lib.Config) -> Inputs:
  """Files, formats, the schema (read or inferred) and first records: checked in plain Python before any device
  is touched."""
  data_cfg = config.data
  splits = {"train": ("--train_data", data_cfg.train_pattern)}
  if data_cfg.eval_pattern and config.train.eval_steps != 0:
    splits["eval"] = ("--eval_data", data_cfg.eval_pattern)
  if data_cfg.test_pattern:
    splits["test"] = ("--test_data", data_cfg.test_pattern)
  files, sources = {}, {}
  for split, (flag, pattern) in splits.items():
    files[split] = storage.list_files(pattern, flag=flag)
    if data_cfg.format == "auto" and not data_cfg.vertex_format:
      files[split], left_out = formats.image_folder_files(files[split])
      if left_out:
        logging.warning("%s: %d image file(s) and %d other file(s), left out as Keras' image_dataset_from_directory "
                        "leaves them: %s", flag, len(files[split]), len(left_out),
                        ", ".join(left_out[:5]) + (", ..." if len(left_out) > 5 else ""))
    sources[split] = formats.resolve(files[split], requested=data_cfg.format, vertex_format=data_cfg.vertex_format,
                                     flag=flag)
  if data_cfg.label is None and formats.FORMATS[sources["train"].format].files_are_records:
    data_cfg = dataclasses.replace(data_cfg, label=formats.IMAGE_FOLDER_LABEL)
    config = dataclasses.replace(config, data=data_cfg)
  if data_cfg.label is None:
    vertex_label = formats.vertex_export_label(files["train"][0], sources["train"], flag="--train_data")
    if vertex_label:
      logging.info("--train_data: Vertex's classification export: the label is %s", vertex_label)
      data_cfg = dataclasses.replace(data_cfg, label=vertex_label)
      config = dataclasses.replace(config, data=data_cfg)
  if (data_cfg.label in formats.VERTEX_LABELS and formats.FORMATS[sources["train"].format].splits_by_ml_use
      and not data_cfg.splits_from_vertex):
    _split_by_ml_use(splits, files, sources, evaluate=config.train.eval_steps != 0)
  schema = _read_schema(config)
  for split, (flag, _) in splits.items():
    sources[split] = formats.settle(sources[split], files[split][0], schema, csv_columns=data_cfg.csv_columns,
                                    csv_multiline=data_cfg.csv_multiline, flag=flag)
    if schema is not None or split != "train":  # schema inference checks the training files itself
      formats.FORMATS[sources[split].format].check_split(files[split], flag=flag)
  origin = data_cfg.schema_path
  if schema is None:
    schema, origin = _infer_schema(config, files["train"], sources["train"])
  for split, (flag, _) in splits.items():
    formats.check_schema(schema, sources[split], files[split], flag=flag)
    check_first_record(files[split][0], sources[split], schema, flag=flag)
  for split, (flag, _) in splits.items():
    check_split(files[split], sources[split], schema, flag=flag, budget=data_cfg.preflight_records)
  if config.model.name in model_registry.IMAGE_MODELS and not any(f.is_image for f in schema.features):
    raise UserError(f"--model={config.model.name} needs an image feature in the schema (type 'image'); use "
                    "--model=tabular")
  for split, (flag, _) in splits.items():
    logging.info("%s: %d %s(s) of %s", flag, len(files[split]), formats.FORMATS[sources[split].format].unit,
                 sources[split].describe())
  recipe.check_for_schema(config.train, schema)
  class_weights = None
  if config.train.class_weights is not None:
    labels = (_label_values(files["train"], sources["train"], schema, limit=data_cfg.infer_sample_rows)
              if config.train.class_weights == "balanced" and schema.task == "classification" else None)
    class_weights = recipe.class_weights(config.train, schema, labels)
    logging.info("--class_weights=%s: %s", config.train.class_weights,
                 ", ".join(f"{name}: {w:.4g}" for name, w in zip(schema.label.vocabulary or range(len(class_weights)),
                                                                 class_weights)))
  return Inputs(schema=schema, train_files=files["train"], eval_files=files.get("eval", []), sources=sources,
                schema_origin=origin, class_weights=class_weights, test_files=files.get("test", []),
                flags={split: flag for split, (flag, _) in splits.items()})


def _split_by_ml_use(splits: dict[str, tuple[str, str]], files: dict[str, list[str]],
                     sources: dict[str, formats.Source], *, evaluate: bool) -> None:
  """A Vertex export given as --train_data trains on its training lines only, when its ml_use labels assign
  others to validation or test; those are the eval and test splits unless --eval_data / --test_data name others
  (an --eval_data that is the same export reads its validation lines). In place, on pre-flight's split tables."""
  counts = formats.count_ml_use(files["train"], sources["train"], flag="--train_data")
  if not counts["validation"] and not counts["test"]:
    return
  if not counts["training"] + counts[""]:
    raise UserError(f"--train_data: every line of {splits['train'][1]} has ml_use validation or test "
                    f"({counts['validation']} and {counts['test']}); none is left to train on")
  train_flag, train_pattern = splits["train"]
  sources["train"] = dataclasses.replace(sources["train"], ml_use="training")
  chosen = []
  for split, ml_use, wanted in (("eval", "validation", evaluate), ("test", "test", True)):
    if not counts[ml_use] or not wanted:
      continue
    if split not in splits or splits[split][1] == train_pattern:
      splits[split] = (train_flag, train_pattern)
      files[split] = files["train"]
      sources[split] = dataclasses.replace(sources["train"], ml_use=ml_use)
      chosen.append(f"{'evaluates' if split == 'eval' else 'tests'} on the {counts[ml_use]} {ml_use} lines")
  logging.info("--train_data: Vertex's export splits its lines by ml_use (%d training, %d unset, %d validation, "
               "%d test): trains on the training and unset ones%s", counts["training"], counts[""],
               counts["validation"], counts["test"], "".join(", " + c for c in chosen))


def _label_values(files: list[str], source: formats.Source, schema: schema_lib.Schema, *, limit: int):
  """The label of up to `limit` training records (the bounded, deterministic sample schema inference reads)."""
  for _, record in schema_inference.sample_records(files, source, limit=limit, flag="--train_data"):
    value = record.get(schema.label.name)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], list):
      value = value[1]  # a tf.train.Example feature: (kind, values)
    if isinstance(value, list):
      value = value[0] if value else None
    if value is not None:
      yield value


def _read_schema(config: config_lib.Config) -> schema_lib.Schema | None:
  """The schema file (--schema, else schema.json beside the data), or None when there is none to read."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  data_cfg = config.data
  if not data_cfg.schema_given and not tf.io.gfile.exists(data_cfg.schema_path):
    if data_cfg.label is None:
      missing = (f"{data_cfg.schema_path} does not exist" if data_cfg.schema_path
                 else f"a table ({data_cfg.train_pattern}) has no schema.json beside it")
      raise UserError(f"no schema: {missing}; pass --label=COLUMN to infer one from the data, or --schema=FILE "
                      "(python -m trainer.schema_inference writes one to review)")
    return None
  schema = schema_lib.load_schema(data_cfg.schema_path, label=data_cfg.label)
  if data_cfg.label is not None and data_cfg.label != schema.label.name:
    raise UserError(f"--label={data_cfg.label!r} but the schema {data_cfg.schema_path} names the label "
                    f"{schema.label.name!r}; drop --label or fix the schema")
  return schema


def _shortened(value: dict[str, Any], *, shown: int = 20) -> dict[str, Any]:
  """The schema as logged: a long vocabulary (a text feature's thousands of words and word pairs) cut to its first
  entries."""
  def cut(column):
    for key in ("vocabulary", "bigrams"):
      entries = column.get(key)
      if entries and len(entries) > shown:
        column = {**column, key: entries[:shown] + [f"... {len(entries)} in all"]}
    return column

  return {**value, "features": [cut(f) for f in value["features"]], "label": cut(value["label"])}


def _infer_schema(config: config_lib.Config, files: list[str],
                  source: formats.Source) -> tuple[schema_lib.Schema, str]:
  """A schema inferred from the training data; on a restart, the one the run inferred when it started (a grown
  dataset must not change the vocabularies under existing checkpoints)."""
  import json  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  record_path = paths.join_path(config.output.checkpoint_dir, export.RUN_RECORD_FILE)
  if tf.io.gfile.exists(record_path):
    try:
      with tf.io.gfile.GFile(record_path) as f:
        stored = json.load(f).get("schema")
    except (tf.errors.OpError, ValueError, AttributeError) as e:
      # Not silently re-inferred: a schema inferred again from grown data could change the vocabularies under
      # the run's checkpoints.
      raise UserError(f"--checkpoint_dir: {record_path} cannot be read ({first_line(e)}); it holds the schema this "
                      "run inferred when it started: restore it, pass --schema, or start over in an empty "
                      "--checkpoint_dir") from e
    if stored:
      schema = schema_lib.parse_schema(stored, source=record_path)
      if schema.label.name == config.data.label:
        logging.info("Schema: the one this run inferred when it started (%s)", record_path)
        return schema, record_path
  data_cfg = config.data
  inference = schema_inference.InferenceConfig(label=data_cfg.label, task=data_cfg.task,
                                               sample_rows=data_cfg.infer_sample_rows)
  schema = schema_inference.infer_schema(files, source, inference, flag="--train_data", log=logging.info,
                                          warn=logging.warning)
  logging.info("Schema (inferred; written beside the model as %s): %s", schema_lib.SCHEMA_FILE,
               json.dumps(_shortened(schema.to_dict()), sort_keys=True))
  return schema, "inferred from --train_data"


def check_first_record(path: str, source: formats.Source, schema: schema_lib.Schema, *, flag: str) -> None:
  """Reads the first record of `path` in plain Python and checks it against the schema: a mismatch is one line
  before any device or peer is touched (no TensorFlow op may run before the strategy is built)."""
  for where, record in formats.iter_records(path, source, flag=flag):
    problem = record_problem(record, schema, source)
    if problem:
      raise UserError(f"{flag}: {path} {where}: {problem}")
    return
  raise UserError(f"{flag}: {path} holds no records")


_FILE_READERS = 16  # image files named by records, read at once (each a request of its own on gs://)


def check_split(files: list[str], source: formats.Source, schema: schema_lib.Schema, *, flag: str,
                budget: int) -> None:
  """Checks a split's records in plain Python before training, so a bad value in the eval or test data is refused
  before hours of training rather than found after them: every record's values against the schema's types, its
  label against the training classes, and every file a record names read (an image decode-checked,
  `schema_inference.image_problem`). All records of a split of at most `budget` (--preflight_records), else an
  even sample of `budget`: the same share from each file in order, or (images in class folders) files spread
  over the folders. A failure is one line naming the flag, the file, the line or record, and the column."""
  import time  # pylint: disable=g-import-not-at-top

  started = time.monotonic()
  checked, named = 0, []  # named: (path, where, column, uri) of each file a checked record names
  uri_features = [f for f in schema.features if f.uri]
  if formats.FORMATS[source.format].files_are_records:
    step = max(1.0, len(files) / budget)
    chosen = [files[int(i * step)] for i in range(min(budget, len(files)))]
    for path in chosen:
      record = {formats.IMAGE_FOLDER_IMAGE: path, formats.IMAGE_FOLDER_LABEL: formats.folder_class(path)}
      problem = record_problem(record, schema, source)
      if problem:
        raise UserError(f"{flag}: {path}: {problem}")
      named.append((path, "", formats.IMAGE_FOLDER_IMAGE, path))
    checked = len(chosen)
  else:
    share = max(1, -(-budget // len(files)))
    for path in files:
      if checked >= budget:
        break
      taken = 0
      for where, record in formats.iter_records(path, source, flag=flag):
        if taken >= share or checked >= budget:
          break
        problem = record_problem(record, schema, source)
        if problem:
          raise UserError(f"{flag}: {path} {where}: {problem}")
        for feature in uri_features:
          uri = named_uri(record, feature, source)
          if uri:
            named.append((path, where, feature.name, uri))
        taken += 1
        checked += 1
  problem = _named_files_problem(named, schema, source, flag=flag)
  if problem:
    raise UserError(problem)
  named_files = named and not formats.FORMATS[source.format].files_are_records
  logging.info("%s: pre-flight checked %d record(s)%s in %.1f s (--preflight_records=%d per split)", flag, checked,
               f" and {len(named)} file(s) they name" if named_files else "", time.monotonic() - started, budget)


def _named_files_problem(named: list[tuple[str, str, str, str]], schema: schema_lib.Schema, source: formats.Source,
                         *, flag: str) -> str | None:
  """The first (in record order) of the files the records name that cannot be read, or (an image) decoded, as a
  message line; None when all can. Read in parallel: on gs:// each file is a request."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top

  if not named:
    return None
  with concurrent.futures.ThreadPoolExecutor(min(_FILE_READERS, len(named))) as pool:
    problems = pool.map(lambda item: file_problem(item[3], schema.feature(item[2])), named)
    for (path, where, column, uri), problem in zip(named, problems):
      if problem:
        if formats.FORMATS[source.format].files_are_records:
          return f"{flag}: {uri} {problem}"
        return f"{flag}: {path} {where}: column {column!r} names {uri}, which {problem}"
  return None


def file_problem(uri: str, feature: schema_lib.Feature) -> str | None:
  """Why the file a record names (an image or a text by URI, `/gcs/` read as gs://) cannot be used ("cannot be
  read (...)", "is a JPEG cut short ..."), or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  path = schema_inference.gcs_uri(uri)
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      data = f.read()
  except tf.errors.OpError as e:
    return f"cannot be read ({first_line(e)})"
  if feature.is_image:
    problem = schema_inference.image_problem(data)
    return f"is {problem}" if problem else None
  return None


def named_uri(record: dict[str, Any], feature: schema_lib.Feature, source: formats.Source) -> str | None:
  """The file a `uri` feature names in a record that `record_problem` passed, or None where it names none."""
  value = formats.FORMATS[source.format].present_value(feature.name, record.get(feature.name), kind=feature.kind,
                                                       count=1, record=record)
  if isinstance(value, bytes):
    value = value.decode("utf-8", errors="replace")
  return value if isinstance(value, str) and value.strip() else None


def record_problem(record: dict[str, Any], schema: schema_lib.Schema, source: formats.Source) -> str | None:
  """Why `record` (as `formats.iter_records` yields it) does not fit the schema, or None."""
  if formats.BLANK_LINE in record:
    return "the line is blank; expected a record on every line (remove blank lines)"
  if formats.FIELD_COUNT in record:
    return f"the row has {record[formats.FIELD_COUNT]} fields, the CSV {len(source.columns)} columns"
  label = schema.label
  data_format = formats.FORMATS[source.format]
  what = data_format.value_word
  for name in schema.columns:
    feature = None if name == label.name else schema.feature(name)
    kind = feature.kind if feature else label.kind
    value = record.get(name)
    if feature is None and label.multi_label:
      problem = _class_list_problem(name, value, label)
      if problem:
        return problem
      continue
    count = feature.values_per_example if feature else 1
    try:
      value = data_format.present_value(name, value, kind=kind, count=count, record=record)
      if value is formats.MISSING:
        if feature is not None and feature.default is not None:
          continue
        return data_format.missing_problem(name, record, feature)
      if feature is not None and feature.uri:
        problem = _uri_problem(what, name, value)
        if problem:
          return problem
        continue
      value = data_format.typed_value(name, value, kind=kind, count=count, feature=feature)
    except formats.ValueProblem as e:
      return str(e)
    problem = _value_problem(what, name, kind, value, feature, label)
    if problem:
      return problem
  return None


def _class_list_problem(name: str, value: Any, label: schema_lib.Label) -> str | None:
  if value is None:
    unannotated = " (a data item without classificationAnnotations)" if name == formats.VERTEX_MULTI_LABEL else ""
    return f"label {name!r} is missing{unannotated}; a multi-label record holds a list of class names ([] for none)"
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    return f"label {name!r} holds {str(value)[:40]}; a multi-label label is a list of class names"
  unknown = [v for v in value if v not in label.vocabulary]
  if unknown:
    return (f"label {name!r} holds {unknown[0]!r}, not one of the schema's classes "
            f"({', '.join(label.vocabulary[:10])}{', ...' if len(label.vocabulary) > 10 else ''})")
  return None


def _uri_problem(what: str, name: str, value: Any) -> str | None:
  """A value that names a file (the file itself is read later, `file_problem`)."""
  if isinstance(value, bytes):
    try:
      value = value.decode("utf-8")
    except UnicodeDecodeError:
      return f"{what} {name!r} is not a UTF-8 URI"
  if not isinstance(value, str) or not value.strip():
    return f"{what} {name!r} holds {str(value)[:40]!r}; the schema says it names a file (a gs:// URI or a path)"
  return None


def _value_problem(what: str, name: str, kind: feature_kinds.Kind, value: Any, feature,
                   label: schema_lib.Label) -> str | None:
  """What the value model's rules refuse, in every format alike: an image that does not decode (or raw bytes of
  another size), a NaN or infinity, a label that is not one of the classes."""
  if kind.image:
    if feature.encoding in feature_kinds.ENCODED_IMAGES:
      problem = schema_inference.image_problem(value)
      if problem:
        return f"{what} {name!r} is {problem}"
    else:
      size = feature.shape[0] * feature.shape[1] * feature.shape[2]
      if len(value) != size:
        return f"image {what} {name!r} has {len(value)} bytes; shape {list(feature.shape)} needs {size}"
    return None
  if kind.holds == feature_kinds.NUMBER:  # one number or a list of them (a vector feature)
    numbers = value if isinstance(value, list) else [value]
    bad = next((v for v in numbers if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
      return formats.non_finite_problem(what, name, bad, feature)
  if feature is None:  # the label's value
    if label.vocabulary is not None:
      text = value if isinstance(value, str) else str(value)
      if text not in label.vocabulary:
        return (f"label {name!r} holds {text!r}, not one of the schema's classes "
                f"({', '.join(label.vocabulary[:10])}{', ...' if len(label.vocabulary) > 10 else ''})")
    elif label.num_classes is not None and not (float(value) == int(value) and 0 <= value < label.num_classes):
      return f"label {name!r} holds {value!r}; class ids are 0..{label.num_classes - 1}"
  return None


def total_steps(config: config_lib.Config, inputs: Inputs) -> int:
  """--train_steps, or --epochs turned into steps by counting the training records (never 0)."""
  if config.train.train_steps is not None:
    return config.train.train_steps
  examples = formats.count_records(inputs.train_files, inputs.sources["train"])
  steps = config.train.epochs * examples // config.train.global_batch_size
  if steps < 1:
    raise UserError(f"--epochs={config.train.epochs} over {examples} examples is less than one batch of "
                    f"--global_batch_size={config.train.global_batch_size}")
  logging.info("%d epoch(s) of %d examples = %d steps", config.train.epochs, examples, steps)
  return steps


def find_bad_record(inputs: Inputs, *, splits: tuple[str, ...] = ("train", "eval", "test"),
                    budget_secs: float = 120.0) -> str | None:
  """"FLAG: PATH line/record N: what is wrong" for the first record (of the `splits` being read when the input
  pipeline failed) that does not fit, or names a file that cannot be read or decoded; None when none is found within
  `budget_secs` (this runs on the failure path only, to name it)."""
  import time  # pylint: disable=g-import-not-at-top

  deadline = time.monotonic() + budget_secs
  uri_features = [f for f in inputs.schema.features if f.uri]
  for split in splits:
    flag, source = inputs.flag(split), inputs.sources.get(split)
    if source is None:
      continue
    for path in inputs.files(split):
      try:
        for where, record in formats.iter_records(path, source, flag=flag):
          problem = record_problem(record, inputs.schema, source)
          if problem:
            return f"{flag}: {path}{'' if formats.FORMATS[source.format].files_are_records else ' ' + where}: {problem}"
          for feature in uri_features:
            value = named_uri(record, feature, source)
            problem = file_problem(value, feature) if value else None
            if problem:
              if formats.FORMATS[source.format].files_are_records:
                return f"{flag}: {value} {problem}"
              return f"{flag}: {path} {where}: column {feature.name!r} names {value}, which {problem}"
          if time.monotonic() > deadline:
            return None
      except UserError as e:  # a corrupted or truncated file
        return str(e)
  return None
