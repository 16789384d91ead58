"""Command-line flags, all defined in one function, and their conversion into a typed `Config`.

Flags are all optional at definition; `config_from_flags` decides what is required, because several have
defaults that come from Vertex AI's environment (AIP_MODEL_DIR, AIP_TRAINING_DATA_URI, ...).
"""

from __future__ import annotations

import json
from typing import Any

from absl import flags

from trainer.core import config as config_lib
from trainer.core import hparams as hparams_lib
from trainer.core import paths
from trainer.core.errors import UserError
from trainer.data import formats
from trainer.data import schema as schema_lib
from trainer.modeling import model_registry
from trainer.modeling import objective as objective_lib


class _WholeNumberParser(flags.IntegerParser):
  """absl's integer parser that also takes a whole number written as a float ("256.0"): Vertex AI hyperparameter
  tuning passes the values of a DISCRETE parameter so (e.g. --global_batch_size=256.0 for a study over 128, 256,
  512), which absl's own parser refuses, failing every trial."""

  def convert(self, argument):
    try:
      return super().convert(argument)
    except ValueError as error:
      try:
        return hparams_lib.whole_number(argument)
      except (TypeError, ValueError):
        raise error from None  # not a whole number: absl's own message


def _define_integer(name: str, default: int | None, help_text: str, *, flag_values: flags.FlagValues) -> None:
  flags.DEFINE(_WholeNumberParser(), name, default, help_text, flag_values=flag_values,
               serializer=flags.ArgumentSerializer())


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines every trainer flag on `flag_values`. Call once, before absl parses argv."""
  fv = {"flag_values": flag_values}
  # Data.
  flags.DEFINE_string("train_data", None, "Training file pattern (local, gs:// or /gcs/). "
                      "Default: $AIP_TRAINING_DATA_URI.", **fv)
  flags.DEFINE_string("eval_data", None, "Evaluation file pattern. Default: $AIP_VALIDATION_DATA_URI; "
                      "none skips evaluation.", **fv)
  flags.DEFINE_string("test_data", None, "Test file pattern, evaluated once after training (exactly one pass) and "
                      "reported as test_* beside the eval_* metrics. Default: $AIP_TEST_DATA_URI.", **fv)
  flags.DEFINE_enum("data_format", "auto", ("auto", *formats.FLAG_VALUES), "Format of the data files; auto: from "
                    "$AIP_DATA_FORMAT, else the file extension, else the content. Compression (gzip, zlib) is read "
                    "from the files.", **fv)
  flags.DEFINE_string("schema", None, "Feature schema: schema.json, or a TFX/TFDV schema.pbtxt (with --label). "
                      "Default: schema.json beside the training files, else one inferred from the data "
                      "(needs --label).", **fv)
  flags.DEFINE_string("label", None, "The label column: with no schema file, the schema is inferred from a "
                      "sample of the training data.", **fv)
  flags.DEFINE_enum("task", "auto", config_lib.TASKS, "Schema inference: classification or regression "
                    "(auto: text or few whole-number labels -> classification).", **fv)
  flags.DEFINE_list("csv_columns", None, "Names of every CSV column in order, for CSV files without a header "
                    "row (or use the schema's 'columns').", **fv)
  flags.DEFINE_boolean("csv_multiline", None, "CSV whose quoted fields hold line breaks: read with CsvDataset, "
                       "which follows quotes across lines (slower than the line reader). Default: on when the "
                       "first 64 KiB of a split's first file has one.", **fv)
  _define_integer("infer_sample_rows", 100_000, "Records read to infer the schema (deterministic: the same "
                  "on every worker).", **fv)
  _define_integer("preflight_records", 2_000, "Records of each split (train, eval, test) checked in plain Python "
                  "before training, against the schema's types and the training classes, every image file a record "
                  "names decoded-checked too: all of a split that holds at most this many, else an even sample of "
                  "this many (a bad value past it is found when training reads it; the checkpoints are kept).", **fv)
  _define_integer("shuffle_buffer", 10_000, "Examples shuffled together: consecutive parsed batches holding at "
                  "least this many (and at least 2 batches) are pooled and their rows permuted; file order is "
                  "reshuffled every epoch (0: no shuffle).", **fv)
  _define_integer("uri_cache_mb", 1024, "Megabytes of the files that image or text columns name by URI (gs://, "
                  "/gcs/, local) kept in memory after their first read, per input pipeline: later epochs read them "
                  "from memory instead of one Cloud Storage request per file (0: read every time).", **fv)
  flags.DEFINE_boolean("deterministic_input", False, "Read examples in the same order every run (seeded "
                       "shuffle, ordered interleave): reproducible weights, slightly slower input. Not under "
                       "parameter servers (asynchronous: refused there).", **fv)
  # Model.
  flags.DEFINE_string("model", "tabular", "Built-in model (tabular, cnn, or a pretrained backbone: "
                      "mobilenet_v3_small, mobilenet_v3_large, efficientnet_b0, efficientnet_b3, efficientnet_v2_b0, "
                      "resnet50, resnet50_v2) or 'package.module:build_fn'.", **fv)
  flags.DEFINE_list("hidden_units", ["64", "32"], "Hidden layer sizes of the built-in models.", **fv)
  flags.DEFINE_float("dropout", 0.0, "Dropout rate of the built-in models (before the output layer of a backbone "
                     "model; the Keras transfer-learning guide uses 0.2).", **fv)
  flags.DEFINE_string("backbone_weights", None, "Backbone models (--model=mobilenet_v3_small, efficientnet_b0, "
                      "resnet50, ...): the backbone's weights, a file (local, /gcs/ or gs://; .weights.h5, or the .h5 "
                      "Keras Applications download), imagenet (Keras downloads them; the default) or none.", **fv)
  _define_integer("fine_tune_at_step", None, "Backbone models: the step from which the backbone learns too (before "
                  "it, only the new head; default half of the run; 0: from the start).", **fv)
  flags.DEFINE_float("fine_tune_learning_rate_factor", None, "Backbone models: the learning rate is multiplied by "
                     "this from --fine_tune_at_step on (default 0.01).", **fv)
  flags.DEFINE_string("hparams", "{}", "JSON object of extra hyperparameters passed to a plug-in build_fn.", **fv)
  # Training.
  _define_integer("global_batch_size", 256, "Examples per step across all replicas.", **fv)
  _define_integer("train_steps", None, "Optimizer steps to run (default 1000 unless --epochs is given).", **fv)
  _define_integer("epochs", None, "Passes over the training data (instead of --train_steps).", **fv)
  flags.DEFINE_float("learning_rate", 1e-3, "Learning rate.", **fv)
  flags.DEFINE_enum("optimizer", "adam", config_lib.OPTIMIZERS, "Optimizer.", **fv)
  flags.DEFINE_enum("lr_schedule", "constant", config_lib.LR_SCHEDULES, "Learning-rate schedule over the run "
                    "after --warmup_steps: constant, or cosine/linear/exponential decay from --learning_rate to "
                    "--lr_decay_to of it at the final step.", **fv)
  _define_integer("warmup_steps", 0, "Steps of linear warmup from 0 to --learning_rate.", **fv)
  flags.DEFINE_float("lr_decay_to", None, "Fraction of --learning_rate reached at the final step (default 0 for "
                     "cosine and linear, 0.01 for exponential).", **fv)
  flags.DEFINE_float("weight_decay", None, "Decoupled weight decay (default 0.004 with --optimizer=adamw, none "
                     "otherwise).", **fv)
  flags.DEFINE_float("clip_norm", None, "Clip the gradient (summed over all replicas) to this global norm.", **fv)
  flags.DEFINE_string("class_weights", None, "Classification: 'balanced' (weights from the training data's class "
                      "counts) or a JSON object {class: weight} (class ids, or names for a string label).", **fv)
  _define_integer("eval_every_steps", None, "Evaluate on --eval_data every N steps during training "
                  "(TensorBoard and the hypertune file get each).", **fv)
  flags.DEFINE_string("early_stopping_metric", None, "Stop when this eval metric "
                      f"({', '.join(objective_lib.HIGHER_IS_BETTER)}) has not improved for --early_stopping_patience "
                      "evaluations.", **fv)
  _define_integer("early_stopping_patience", None, "Evaluations without improvement before stopping "
                  "(default 3 with --early_stopping_metric; given alone, the eval loss is watched).", **fv)
  flags.DEFINE_enum("export", "last", config_lib.EXPORTS, "Export the weights of the last step, or of the best "
                    "periodic evaluation (by --early_stopping_metric, else loss).", **fv)
  flags.DEFINE_enum("precision", "float32", config_lib.PRECISIONS, "Compute dtype policy: mixed_float16 (GPUs; "
                    "loss scaling), mixed_bfloat16 (TPUs, recent GPUs). Variables and the export stay float32.",
                    **fv)
  flags.DEFINE_boolean("jit_compile", False, "Compile the training step with XLA (custom loop: the "
                       "forward and backward pass; fit: Keras' whole step, refused over several CPU replicas).", **fv)
  flags.DEFINE_enum("loop", "custom", config_lib.LOOPS, "custom: tf.function step with strategy.run; "
                    "fit: Keras model.fit inside strategy.scope().", **fv)
  flags.DEFINE_boolean("run_eagerly", False, "Run the training step eagerly (debugging); still distributed.", **fv)
  _define_integer("seed", 42, "Random seed for weights and shuffling (under parameter servers, weights only: each worker "
                  "shuffles with its own seed).", **fv)
  _define_integer("steps_per_loop", 50, "Steps run inside one tf.function call (custom loop), at most per "
                  "closure scheduled on a worker (parameter servers), or per Keras execution (fit; lowered "
                  "so executions end on every checkpoint, log line, evaluation and the final step, and 1 under "
                  "Keras 3 with several replicas, where Keras cannot run more per call).", **fv)
  _define_integer("log_every_steps", 50, "Steps between progress lines and TensorBoard scalars.", **fv)
  _define_integer("checkpoint_every_steps", 200, "Steps between checkpoints.", **fv)
  flags.DEFINE_float("checkpoint_every_secs", None, "Also checkpoint when this many seconds passed since the last "
                     "one, at the end of the chunk that passes it: --steps_per_loop steps (custom loop), one Keras "
                     "execution (fit), or one Keras epoch of fit under parameter servers (the greatest common "
                     "divisor of the checkpoint, log and evaluation periods).", **fv)
  _define_integer("eval_steps", None, "Evaluation batches (default: one pass over --eval_data; 0 skips).", **fv)
  # Distribution.
  flags.DEFINE_enum("strategy", "auto", config_lib.STRATEGIES, "tf.distribute strategy; auto picks it from "
                    "the cluster (TF_CONFIG / CLUSTER_SPEC) and the devices.", **fv)
  _define_integer("num_cpu_devices", 1, "Split the CPU into this many logical devices (to run "
                  "MirroredStrategy replicas without GPUs).", **fv)
  flags.DEFINE_boolean("reduction_server", False, "Vertex pool 2 runs a Reduction Server, not parameter "
                       "servers: train with MultiWorkerMirroredStrategy over chief and workers.", **fv)
  flags.DEFINE_string("tpu", None, "TPU name or 'local'. Default: $TPU_NAME.", **fv)
  flags.DEFINE_float("peer_timeout_secs", 900, "Multi-process jobs: end with one line naming the missing "
                     "replicas when peers have not joined, or a training chunk has not completed, for this many "
                     "seconds (Vertex starts a job's replicas minutes apart at most).", **fv)
  # Outputs.
  flags.DEFINE_string("output_dir", None, "Base output dir: model/, checkpoints/ and logs/ under it, as "
                      "Vertex's baseOutputDirectory.", **fv)
  flags.DEFINE_string("model_dir", None, "SavedModel export dir. Default: $AIP_MODEL_DIR or <output_dir>/model.", **fv)
  flags.DEFINE_string("checkpoint_dir", None, "Checkpoint dir. Default: $AIP_CHECKPOINT_DIR or "
                      "<output_dir>/checkpoints.", **fv)
  flags.DEFINE_string("tensorboard_dir", None, "TensorBoard dir. Default: $AIP_TENSORBOARD_LOG_DIR or "
                      "<output_dir>/logs.", **fv)
  flags.DEFINE_string("hypertune_metric", None, "Report this eval metric (e.g. accuracy, loss) to Vertex "
                      "hyperparameter tuning through the hypertune metrics file.", **fv)
  flags.DEFINE_boolean("dry_run", False, "Print the resolved role, strategy and config as one JSON object "
                       "and exit without training.", **fv)
  flags.DEFINE_enum("log_format", "auto", ("auto", "json", "text"), "Log lines: json (one object per line with "
                    "severity, message, task_type and task_index, as Cloud Logging parses them), text (absl's lines, "
                    "a progress bar on a terminal); auto: json on Vertex ($CLOUD_ML_JOB_ID set, stderr not a "
                    "terminal), else text.", **fv)


def config_from_flags(values: flags.FlagValues, env: config_lib.Environment, *,
                      check_model: bool = True) -> config_lib.Config:
  """Builds and validates the typed config from parsed flags and the environment. `check_model=False` (tooling
  away from the user's code) takes --hparams as written when the plug-in module cannot be imported."""
  train_pattern = values.train_data or env.aip_training_data_uri
  if not train_pattern:
    raise UserError("--train_data is required (or set AIP_TRAINING_DATA_URI)")
  eval_pattern = values.eval_data or env.aip_validation_data_uri
  vertex_format = _vertex_data_format(env, values.data_format, train_pattern)
  train_pattern = paths.normalize_path(train_pattern)
  eval_pattern = paths.normalize_path(eval_pattern) if eval_pattern else None
  test_pattern = values.test_data or env.aip_test_data_uri
  test_pattern = paths.normalize_path(test_pattern) if test_pattern else None
  schema_path = values.schema or _default_schema_path(train_pattern)

  output_dir = paths.normalize_path(values.output_dir) if values.output_dir else None
  model_dir = _pick_dir("--model_dir", values.model_dir, env.aip_model_dir, output_dir, "model")
  checkpoint_dir = _pick_dir("--checkpoint_dir", values.checkpoint_dir, env.aip_checkpoint_dir, output_dir,
                             "checkpoints")
  tensorboard_dir = _pick_dir("--tensorboard_dir", values.tensorboard_dir, env.aip_tensorboard_log_dir,
                              output_dir, "logs")

  train_steps = values.train_steps
  if train_steps is None and values.epochs is None:
    train_steps = 1000
  try:
    hidden_units = tuple(int(u) for u in values.hidden_units)
  except ValueError:
    raise UserError(f"--hidden_units must be a comma-separated list of integers, got {values.hidden_units}") from None

  config = config_lib.Config(
      data=config_lib.DataConfig(
          train_pattern=train_pattern,
          eval_pattern=eval_pattern,
          test_pattern=test_pattern,
          schema_path=paths.normalize_path(schema_path),
          format=values.data_format,
          shuffle_buffer=values.shuffle_buffer,
          uri_cache_mb=values.uri_cache_mb,
          deterministic=values.deterministic_input,
          schema_given=bool(values.schema),
          vertex_format=vertex_format,
          splits_from_vertex=not values.train_data,
          label=values.label,
          task=values.task,
          csv_columns=tuple(c.strip() for c in values.csv_columns) if values.csv_columns else None,
          csv_multiline=values.csv_multiline,
          infer_sample_rows=values.infer_sample_rows,
          preflight_records=values.preflight_records,
      ),
      model=config_lib.ModelConfig(name=values.model, hidden_units=hidden_units, dropout=values.dropout,
                                   backbone_weights=(paths.normalize_path(values.backbone_weights)
                                                     if values.backbone_weights else None),
                                   fine_tune_at_step=values.fine_tune_at_step,
                                   fine_tune_learning_rate_factor=values.fine_tune_learning_rate_factor),
      train=config_lib.TrainConfig(
          global_batch_size=values.global_batch_size,
          train_steps=train_steps,
          epochs=values.epochs,
          learning_rate=values.learning_rate,
          optimizer=values.optimizer,
          loop=values.loop,
          run_eagerly=values.run_eagerly,
          seed=values.seed,
          steps_per_loop=values.steps_per_loop,
          log_every_steps=values.log_every_steps,
          checkpoint_every_steps=values.checkpoint_every_steps,
          checkpoint_every_secs=values.checkpoint_every_secs,
          eval_steps=values.eval_steps,
          hypertune_metric=values.hypertune_metric,
          lr_schedule=values.lr_schedule,
          warmup_steps=values.warmup_steps,
          lr_decay_to=values.lr_decay_to,
          weight_decay=values.weight_decay,
          clip_norm=values.clip_norm,
          class_weights=values.class_weights,
          eval_every_steps=values.eval_every_steps,
          # --early_stopping_patience alone watches the eval loss.
          early_stopping_metric=values.early_stopping_metric or (
              "loss" if values.early_stopping_patience is not None else None),
          early_stopping_patience=(values.early_stopping_patience if values.early_stopping_patience is not None
                                   or values.early_stopping_metric is None else 3),
          export=values.export,
          precision=values.precision,
          jit_compile=values.jit_compile,
      ),
      output=config_lib.OutputConfig(model_dir=model_dir, checkpoint_dir=checkpoint_dir,
                                     tensorboard_dir=tensorboard_dir),
      distribution=config_lib.DistributionConfig(
          strategy=values.strategy, num_cpu_devices=values.num_cpu_devices, tpu=values.tpu or env.tpu_name,
          peer_timeout_secs=values.peer_timeout_secs,
          reduction_server=values.reduction_server),
      hparams=(hparams_lib.values(values, model=values.model, hparams_json=_parse_hparams(values.hparams))
               if check_model else _parse_hparams(values.hparams)),
  )
  config_lib.validate(config)
  model_registry.validate(config.model, train_steps=config.train.train_steps,
                          hidden_units_given=values["hidden_units"].present)
  return config


def _vertex_data_format(env: config_lib.Environment, requested: str, train_pattern: str) -> str | None:
  """AIP_DATA_FORMAT of a Vertex managed-dataset job, checked; None where it is unset or a flag overrides it."""
  value = env.aip_data_format
  if train_pattern.startswith("bq://") or (value or "").lower() == "bigquery":
    raise UserError(f"AIP_DATA_FORMAT={value or '(unset)'} with data {train_pattern}: BigQuery tables are not "
                    "read by this trainer (no BigQuery Storage Read API emulator runs where it is tested, so the "
                    "reader would be untested); create the job with the dataset exported as CSV or JSONL "
                    "(export format csv/jsonl), or export the table to gs:// and pass --train_data")
  if not value or requested != "auto":
    return None
  if value.lower() not in formats.VERTEX_FORMATS:
    raise UserError(f"AIP_DATA_FORMAT={value!r}; expected one of csv, jsonl, tf-record (or bigquery, not "
                    "supported), or pass --data_format")
  return value.lower()


def _default_schema_path(train_pattern: str) -> str:
  directory = train_pattern.rsplit("/", 1)[0] if "/" in train_pattern else "."
  return paths.join_path(directory, schema_lib.SCHEMA_FILE)


def _pick_dir(flag: str, explicit: str | None, from_env: str | None, output_dir: str | None, leaf: str) -> str:
  for candidate in (explicit, from_env):
    if candidate:
      return paths.normalize_path(candidate).rstrip("/")
  if output_dir:
    return paths.join_path(output_dir, leaf)
  raise UserError(f"{flag} is required: pass it, or --output_dir, or run where Vertex sets the AIP_* output "
                  "variables (baseOutputDirectory)")


def _parse_hparams(text: str) -> dict[str, Any]:
  try:
    value = json.loads(text or "{}")
  except json.JSONDecodeError as e:
    raise UserError(f"--hparams is not valid JSON ({e.msg}): {text!r}; expected an object like "
                    "'{\"units\": 32}'") from None
  if not isinstance(value, dict):
    raise UserError(f"--hparams must be a JSON object, got {text!r}")
  return value


# Stand-ins for what Vertex provides at run time, so `check_args` can validate a job's args before it exists.
_PLACEHOLDER_ENV = config_lib.Environment(
    aip_training_data_uri="gs://placeholder/train/*", aip_model_dir="gs://placeholder/model",
    aip_checkpoint_dir="gs://placeholder/checkpoints", aip_tensorboard_log_dir="gs://placeholder/logs")


def checkable_names(args: list[str]) -> set[str] | None:
  """The flag names `check_args` can judge for these args: every name (None) when the model is built in or its
  plug-in is importable here; else only the trainer's own flags (the plug-in's are known where the job runs)."""
  model = hparams_lib.model_from_argv(args)
  if hparams_lib.plugin_module(model) is None or hparams_lib.importable(model):
    return None
  values = flags.FlagValues()
  define_flags(values)
  return set(values)


def check_args(args: list[str], *, where: str) -> None:
  """Parses trainer args and validates their values as the trainer will, touching nothing (for tooling that
  submits or starts jobs: a bad arg fails here, not on Vertex after machines are provisioned)."""
  values = flags.FlagValues()
  define_flags(values)
  model = hparams_lib.model_from_argv(args)
  check_model = hparams_lib.importable(model)  # a plug-in package may be installed only where the job runs
  try:
    hparams_lib.define(values, hparams_lib.declared(model) if check_model else None, model=model or "")
    rest = values(["trainer.task", *args])
  except flags.Error as e:
    message = hparams_lib.explain_flag_error(e, args) if check_model else " ".join(str(e).split())
    raise UserError(f"{where}: trainer args rejected: {message}") from None
  except UserError as e:
    raise UserError(f"{where}: trainer args rejected: {e}") from None
  if len(rest) > 1:
    raise UserError(f"{where}: trainer args rejected: unexpected positional argument(s) {' '.join(rest[1:])}")
  try:
    config_from_flags(values, _PLACEHOLDER_ENV, check_model=check_model)
  except UserError as e:
    raise UserError(f"{where}: trainer args rejected: {e}") from None
