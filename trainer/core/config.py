"""The trainer's typed configuration: built once from flags and environment, validated, then passed down.

Everything below `task.py` takes these values as arguments; nothing else reads flags or `os.environ`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from trainer.core.errors import UserError
from trainer.core.options import above_0
from trainer.core.options import Accepts
from trainer.core.options import at_least_0
from trainer.core.options import option
from trainer.core.options import POSITIVE
from trainer.core import options as options_lib

LOOPS = ("custom", "fit")
TASKS = ("auto", "classification", "regression")
OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad", "rmsprop")
LR_SCHEDULES = ("constant", "cosine", "linear", "exponential")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
EXPORTS = ("last", "best")


@dataclasses.dataclass(frozen=True)
class Environment:
  """What the trainer reads from its process environment, parsed once at start-up."""

  tf_config: str | None = None
  cluster_spec: str | None = None
  aip_model_dir: str | None = None
  aip_checkpoint_dir: str | None = None
  aip_tensorboard_log_dir: str | None = None
  aip_training_data_uri: str | None = None
  aip_validation_data_uri: str | None = None
  aip_test_data_uri: str | None = None
  aip_data_format: str | None = None
  job_id: str | None = None
  tpu_name: str | None = None
  hp_metric_file: str | None = None

  @classmethod
  def from_mapping(cls, environ: Mapping[str, str]) -> "Environment":
    def get(name: str) -> str | None:
      value = environ.get(name)
      return value if value else None

    return cls(
        tf_config=get("TF_CONFIG"),
        cluster_spec=get("CLUSTER_SPEC"),
        aip_model_dir=get("AIP_MODEL_DIR"),
        aip_checkpoint_dir=get("AIP_CHECKPOINT_DIR"),
        aip_tensorboard_log_dir=get("AIP_TENSORBOARD_LOG_DIR"),
        aip_training_data_uri=get("AIP_TRAINING_DATA_URI"),
        aip_validation_data_uri=get("AIP_VALIDATION_DATA_URI"),
        aip_test_data_uri=get("AIP_TEST_DATA_URI"),
        aip_data_format=get("AIP_DATA_FORMAT"),
        job_id=get("CLOUD_ML_JOB_ID"),
        tpu_name=get("TPU_NAME"),
        hp_metric_file=get("CLOUD_ML_HP_METRIC_FILE"),
    )


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data: where each split is, its format and schema, and how it is read. Fields that are `option`s are
  command-line flags too (their help is `--help`'s); the rest are resolved from flags and the environment."""

  train_pattern: str = option(None, "Training file pattern (local, gs:// or /gcs/), or a BigQuery table "
                              "(bq://PROJECT.DATASET.TABLE[?where=FILTER]). Default: $AIP_TRAINING_DATA_URI.",
                              flag="train_data")
  eval_pattern: str | None = option(None, "Evaluation file pattern or bq:// table. Default: $AIP_VALIDATION_DATA_URI; "
                                    "none skips evaluation.", flag="eval_data")
  # --schema, or schema.json beside the training files (which may not exist: then inferred)
  schema_path: str = option(None, "Feature schema: schema.json, or a TFX/TFDV schema.pbtxt (with --label). Default: "
                            "schema.json beside the training files, else one inferred from the data (needs --label).",
                            flag="schema")
  format: str = option("auto", "Format of the data files; auto: from $AIP_DATA_FORMAT, else the file extension, else "
                       "the content. Compression (gzip, zlib) is read from the files.", flag="data_format",
                       choices="data_formats")
  shuffle_buffer: int = option(10_000, "Examples shuffled together: consecutive parsed batches holding at least this "
                               "many (and at least 2 batches) are pooled and their rows permuted; file order is "
                               "reshuffled every epoch (0: no shuffle).", accepts=at_least_0())
  uri_cache_mb: int = option(1024, "Megabytes of the files that image or text columns name by URI (gs://, /gcs/, "
                             "local) kept in memory after their first read, per input pipeline: later epochs read "
                             "them from memory instead of one Cloud Storage request per file (0: read every time).",
                             accepts=at_least_0("0: no cache"))
  deterministic: bool = option(False, "Read examples in the same order every run (seeded shuffle, ordered "
                               "interleave): reproducible weights, slightly slower input. Not under parameter "
                               "servers (asynchronous: refused there).", flag="deterministic_input")
  schema_given: bool = False  # --schema was passed: it must exist
  test_pattern: str | None = option(None, "Test file pattern, evaluated once after training (exactly one pass) and "
                                    "reported as test_* beside the eval_* metrics. Default: $AIP_TEST_DATA_URI.",
                                    flag="test_data")
  vertex_format: str | None = None  # AIP_DATA_FORMAT, checked
  # The data is Vertex's split of a managed dataset (AIP_TRAINING_DATA_URI): ml_use labels in its lines are not
  # re-applied. A Vertex export given by --train_data is split by them (`preflight`).
  splits_from_vertex: bool = False
  label: str | None = option(None, "The label column: with no schema file, the schema is inferred from a sample of "
                             "the training data.")
  task: str = option("auto", "Schema inference: classification or regression (auto: text or few whole-number "
                     "labels -> classification).", choices=TASKS)
  csv_columns: tuple[str, ...] | None = option(None, "Names of every CSV column in order, for CSV files without a "
                                               "header row (or use the schema's 'columns').")
  csv_multiline: bool | None = option(None, "CSV whose quoted fields hold line breaks: read with CsvDataset, which "
                                      "follows quotes across lines (slower than the line reader). Default: on when "
                                      "the first 64 KiB of a split's first file has one.")
  infer_sample_rows: int = option(100_000, "Records read to infer the schema (deterministic: the same on every "
                                  "worker).", accepts=POSITIVE)
  preflight_records: int = option(2_000, "Records of each split (train, eval, test) checked in plain Python before "
                                  "training, against the schema's types and the training classes, every image file "
                                  "a record names decoded-checked too: all of a split that holds at most this many, "
                                  "else an even sample of this many (a bad value past it is found when training "
                                  "reads it; the checkpoints are kept).", accepts=POSITIVE)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The built-in model's options (a plug-in's own are its HPARAMS, `trainer/core/hparams.py`). Every field but
  `name` is read by the built-in models only."""

  name: str = option("tabular", "Built-in model (tabular, cnn, or a pretrained backbone: mobilenet_v3_small, "
                     "mobilenet_v3_large, efficientnet_b0, efficientnet_b3, efficientnet_v2_b0, resnet50, "
                     "resnet50_v2) or 'package.module:build_fn'.", flag="model")
  hidden_units: tuple[int, ...] = option((64, 32), "Hidden layer sizes of the built-in models.",
                                         accepts=Accepts(lambda units: bool(units) and all(u > 0 for u in units),
                                                         "positive integers"))
  dropout: float = option(0.0, "Dropout rate of the built-in models (before the output layer of a backbone model; "
                          "the Keras transfer-learning guide uses 0.2).",
                          accepts=Accepts(lambda v: 0 <= v < 1, "in [0, 1)"))
  # Backbone models (trainer/modeling/backbones.py): the weights, and the step from which the backbone learns too,
  # at the learning rate times the factor (None: half of the run, filled in by `backbones.resolved`).
  backbone_weights: str | None = option(None, "Backbone models (--model=mobilenet_v3_small, efficientnet_b0, "
                                        "resnet50, ...): the backbone's weights, a file (local, /gcs/ or gs://; "
                                        ".weights.h5, or the .h5 Keras Applications download), imagenet (Keras "
                                        "downloads them; the default) or none.")
  fine_tune_at_step: int | None = option(None, "Backbone models: the step from which the backbone learns too "
                                         "(before it, only the new head; default half of the run; 0: from the "
                                         "start).")
  fine_tune_learning_rate_factor: float | None = option(None, "Backbone models: the learning rate is multiplied by "
                                                        "this from --fine_tune_at_step on (default 0.01).")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  global_batch_size: int = option(256, "Examples per step across all replicas.", accepts=POSITIVE)
  train_steps: int | None = option(1000, "Optimizer steps to run (default 1000 unless --epochs is given).",
                                   accepts=POSITIVE, flag_default=None)
  epochs: int | None = option(None, "Passes over the training data (instead of --train_steps).", accepts=POSITIVE)
  learning_rate: float = option(1e-3, "Learning rate.", accepts=above_0())
  optimizer: str = option("adam", "Optimizer.", choices=OPTIMIZERS)
  loop: str = option("custom", "custom: tf.function step with strategy.run; fit: Keras model.fit inside "
                     "strategy.scope().", choices=LOOPS)
  run_eagerly: bool = option(False, "Run the training step eagerly (debugging); still distributed.")
  seed: int = option(42, "Random seed for weights and shuffling (under parameter servers, weights only: each worker "
                     "shuffles with its own seed).")
  steps_per_loop: int = option(50, "Steps run inside one tf.function call (custom loop), at most per closure "
                               "scheduled on a worker (parameter servers), or per Keras execution (fit; lowered so "
                               "executions end on every checkpoint, log line, evaluation, --profile_steps edge and the "
                               "final step, and 1 "
                               "under Keras 3 with several replicas, where Keras cannot run more per call).",
                               accepts=POSITIVE)
  log_every_steps: int = option(50, "Steps between progress lines and TensorBoard scalars.", accepts=POSITIVE)
  profile_steps: tuple[int, ...] | None = option(
      None, "START,END: capture a TensorFlow profiler trace of these training steps on the chief into the "
      "TensorBoard dir (plugins/profile/: TensorBoard's Profile tab, Vertex AI TensorBoard, xprof): steps "
      "START+1..END under both loops (fit sizes its executions to end there).",
      accepts=Accepts(lambda steps: len(steps) == 2 and 0 <= steps[0] < steps[1],
                      "START,END: two steps with 0 <= START < END (e.g. 10,20)"))
  checkpoint_every_steps: int = option(200, "Steps between checkpoints.", accepts=POSITIVE)
  checkpoint_every_secs: float | None = option(
      None, "Also checkpoint when this many seconds passed since the last one, at the end of the chunk that passes "
      "it: --steps_per_loop steps (custom loop), one Keras execution (fit), or one Keras epoch of fit under "
      "parameter servers (the greatest common divisor of the checkpoint, log and evaluation periods).",
      accepts=above_0("omit it to checkpoint by steps only"))
  eval_steps: int | None = option(None, "Evaluation batches (default: one pass over --eval_data; 0 skips).",
                                  accepts=at_least_0("0 skips evaluation"))
  hypertune_metric: str | None = option(None, "Report this eval metric (e.g. accuracy, loss) to Vertex "
                                        "hyperparameter tuning through the hypertune metrics file.")
  # The recipe (trainer/modeling/recipe.py): schedule, regularization, class weights, periodic evaluation.
  lr_schedule: str = option("constant", "Learning-rate schedule over the run after --warmup_steps: constant, or "
                            "cosine/linear/exponential decay from --learning_rate to --lr_decay_to of it at the final "
                            "step.", choices=LR_SCHEDULES)
  warmup_steps: int = option(0, "Steps of linear warmup from 0 to --learning_rate.", accepts=at_least_0())
  # fraction of --learning_rate at the final step (None: the schedule's own)
  lr_decay_to: float | None = option(None, "Fraction of --learning_rate reached at the final step (default 0 for "
                                     "cosine and linear, 0.01 for exponential).")
  weight_decay: float | None = option(None, "Decoupled weight decay (default 0.004 with --optimizer=adamw, none "
                                      "otherwise).",
                                      accepts=at_least_0("decoupled decay per step, times the learning rate"))
  clip_norm: float | None = option(None, "Clip the gradient (summed over all replicas) to this global norm.",
                                   accepts=above_0("the largest global gradient norm"))
  # "balanced" or a JSON object {class: weight}
  class_weights: str | None = option(None, "Classification: 'balanced' (weights from the training data's class "
                                     "counts) or a JSON object {class: weight} (class ids, or names for a string "
                                     "label).")
  eval_every_steps: int | None = option(None, "Evaluate on --eval_data every N steps during training (TensorBoard "
                                        "and the hypertune file get each).", accepts=POSITIVE)
  early_stopping_metric: str | None = option(None, "Stop when this eval metric ({metrics}) has not improved for "
                                             "--early_stopping_patience evaluations.")
  early_stopping_patience: int | None = option(None, "Evaluations without improvement before stopping (default 3 "
                                               "with --early_stopping_metric; given alone, the eval loss is "
                                               "watched).", accepts=POSITIVE)
  export: str = option("last", "Export the weights of the last step, or of the best periodic evaluation (by "
                       "--early_stopping_metric, else loss).", choices=EXPORTS)
  # Speed: compute dtype policy and XLA.
  precision: str = option("float32", "Compute dtype policy: mixed_float16 (GPUs; loss scaling), mixed_bfloat16 "
                          "(TPUs, recent GPUs). Variables and the export stay float32.", choices=PRECISIONS)
  jit_compile: bool = option(False, "Compile the training step with XLA (custom loop: the forward and backward "
                             "pass; fit: Keras' whole step, refused over several CPU replicas).")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  model_dir: str = option(None, "SavedModel export dir. Default: $AIP_MODEL_DIR or <output_dir>/model.")
  checkpoint_dir: str = option(None, "Checkpoint dir. Default: $AIP_CHECKPOINT_DIR or <output_dir>/checkpoints.")
  tensorboard_dir: str = option(None, "TensorBoard dir. Default: $AIP_TENSORBOARD_LOG_DIR or <output_dir>/logs.")


@dataclasses.dataclass(frozen=True)
class DistributionConfig:
  strategy: str = option("auto", "tf.distribute strategy; auto picks it from the cluster (TF_CONFIG / CLUSTER_SPEC) "
                         "and the devices.", choices="strategies")
  num_cpu_devices: int = option(1, "Split the CPU into this many logical devices (to run MirroredStrategy replicas "
                                "without GPUs).", accepts=POSITIVE)
  tpu: str | None = option(None, "TPU name or 'local'. Default: $TPU_NAME.")
  reduction_server: bool = option(False, "Vertex pool 2 runs a Reduction Server, not parameter servers: train with "
                                  "MultiWorkerMirroredStrategy over chief and workers.")
  peer_timeout_secs: float = option(900.0, "Multi-process jobs: end with one line naming the missing replicas when "
                                    "peers have not joined, or a training chunk has not completed, for this many "
                                    "seconds (Vertex starts a job's replicas minutes apart at most).",
                                    accepts=above_0())


@dataclasses.dataclass(frozen=True)
class Config:
  data: DataConfig
  model: ModelConfig
  train: TrainConfig
  output: OutputConfig
  distribution: DistributionConfig
  hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True, default=list)


def validate(config: Config) -> None:
  """Checks values that make sense on their own, before anything touches storage or devices: each option against
  its declaration, then the options that depend on each other."""
  train = config.train
  if (train.train_steps is None) == (train.epochs is None):
    raise UserError("--train_steps and --epochs: give exactly one "
                    f"(got train_steps={train.train_steps}, epochs={train.epochs})")
  options_lib.check(config)
  if config.data.csv_columns is not None and (len(set(config.data.csv_columns)) != len(config.data.csv_columns)
                                              or not all(config.data.csv_columns)):
    raise UserError(f"--csv_columns must name every CSV column once, got {','.join(config.data.csv_columns)}")
  _validate_recipe(train)


def _validate_recipe(train: TrainConfig) -> None:
  """The recipe flags on their own; what depends on the schema (class weights, metric names) is
  `recipe.check_for_schema`."""
  if train.train_steps is not None and train.warmup_steps >= train.train_steps:
    raise UserError(f"--warmup_steps={train.warmup_steps} must be below --train_steps={train.train_steps}")
  if train.lr_decay_to is not None:
    if train.lr_schedule == "constant":
      raise UserError(f"--lr_decay_to={train.lr_decay_to} has no effect with --lr_schedule=constant; "
                      "pass --lr_schedule=cosine|linear|exponential")
    exponential = train.lr_schedule == "exponential"
    if not (0 < train.lr_decay_to < 1 if exponential else 0 <= train.lr_decay_to < 1):
      accepted = "in (0, 1)" if exponential else "in [0, 1)"
      raise UserError(f"--lr_decay_to must be {accepted} for --lr_schedule={train.lr_schedule} (the fraction of "
                      f"--learning_rate reached at the final step), got {train.lr_decay_to}")
  if train.early_stopping_patience is not None and train.early_stopping_metric is None:
    raise UserError("--early_stopping_patience needs --early_stopping_metric (e.g. loss, accuracy, auc)")
  needs_evals = [flag for flag, given in (("early stopping (--early_stopping_metric, --early_stopping_patience)",
                                           train.early_stopping_metric),
                                          ("--export=best", train.export == "best")) if given]
  if needs_evals and train.eval_every_steps is None:
    raise UserError(f"{' and '.join(needs_evals)} need(s) periodic evaluation: pass --eval_every_steps=N "
                    "(and --eval_data)")
