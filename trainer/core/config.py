"""The trainer's typed configuration: built once from flags and environment, validated, then passed down.

Everything below `task.py` takes these values as arguments; nothing else reads flags or `os.environ`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from trainer.core.errors import UserError

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server", "tpu")
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
  train_pattern: str
  eval_pattern: str | None
  schema_path: str  # --schema, or schema.json beside the training files (which may not exist: then inferred)
  format: str = "auto"
  shuffle_buffer: int = 10_000
  uri_cache_mb: int = 1024  # files `uri` features name, kept in memory after their first read (per pipeline)
  deterministic: bool = False
  schema_given: bool = False  # --schema was passed: it must exist
  test_pattern: str | None = None  # evaluated once after training, reported as test_* (--test_data)
  vertex_format: str | None = None  # AIP_DATA_FORMAT, checked
  # The data is Vertex's split of a managed dataset (AIP_TRAINING_DATA_URI): ml_use labels in its lines are not
  # re-applied. A Vertex export given by --train_data is split by them (`preflight`).
  splits_from_vertex: bool = False
  label: str | None = None  # --label: the label column (schema inference; checked against a given schema)
  task: str = "auto"
  csv_columns: tuple[str, ...] | None = None
  csv_multiline: bool | None = None  # --csv_multiline; None: detected from each split's first file
  infer_sample_rows: int = 100_000
  preflight_records: int = 2_000  # per split, checked in Python before training (`preflight.check_splits`)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  name: str = "tabular"
  hidden_units: tuple[int, ...] = (64, 32)
  dropout: float = 0.0
  # Backbone models (trainer/modeling/backbones.py): the weights, and the step from which the backbone learns too, at the
  # learning rate times the factor (None: half of the run, filled in by `backbones.resolved`).
  backbone_weights: str | None = None  # a weights file, "imagenet" (the default) or "none"
  fine_tune_at_step: int | None = None
  fine_tune_learning_rate_factor: float | None = None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  global_batch_size: int = 256
  train_steps: int | None = 1000
  epochs: int | None = None
  learning_rate: float = 1e-3
  optimizer: str = "adam"
  loop: str = "custom"
  run_eagerly: bool = False
  seed: int = 42
  steps_per_loop: int = 50
  log_every_steps: int = 50
  checkpoint_every_steps: int = 200
  checkpoint_every_secs: float | None = None
  eval_steps: int | None = None
  hypertune_metric: str | None = None
  # The recipe (trainer/modeling/recipe.py): schedule, regularization, class weights, periodic evaluation.
  lr_schedule: str = "constant"
  warmup_steps: int = 0
  lr_decay_to: float | None = None  # fraction of --learning_rate at the final step (None: the schedule's own)
  weight_decay: float | None = None
  clip_norm: float | None = None
  class_weights: str | None = None  # "balanced" or a JSON object {class: weight}
  eval_every_steps: int | None = None
  early_stopping_metric: str | None = None
  early_stopping_patience: int | None = None
  export: str = "last"
  # Speed: compute dtype policy and XLA.
  precision: str = "float32"
  jit_compile: bool = False


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  model_dir: str
  checkpoint_dir: str
  tensorboard_dir: str


@dataclasses.dataclass(frozen=True)
class DistributionConfig:
  strategy: str = "auto"
  num_cpu_devices: int = 1
  tpu: str | None = None
  reduction_server: bool = False
  peer_timeout_secs: float = 900.0


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
  """Checks values that make sense on their own, before anything touches storage or devices."""
  train = config.train
  _positive("--global_batch_size", train.global_batch_size)
  if (train.train_steps is None) == (train.epochs is None):
    raise UserError("--train_steps and --epochs: give exactly one "
                    f"(got train_steps={train.train_steps}, epochs={train.epochs})")
  if train.train_steps is not None:
    _positive("--train_steps", train.train_steps)
  if train.epochs is not None:
    _positive("--epochs", train.epochs)
  if not train.learning_rate > 0:
    raise UserError(f"--learning_rate must be > 0, got {train.learning_rate}")
  _positive("--steps_per_loop", train.steps_per_loop)
  _positive("--log_every_steps", train.log_every_steps)
  _positive("--checkpoint_every_steps", train.checkpoint_every_steps)
  if train.checkpoint_every_secs is not None and not train.checkpoint_every_secs > 0:
    raise UserError(f"--checkpoint_every_secs must be > 0 (omit it to checkpoint by steps only), got "
                    f"{train.checkpoint_every_secs}")
  if train.eval_steps is not None and train.eval_steps < 0:
    raise UserError(f"--eval_steps must be >= 0 (0 skips evaluation), got {train.eval_steps}")
  _validate_recipe(train)
  _positive("--num_cpu_devices", config.distribution.num_cpu_devices)
  if not config.distribution.peer_timeout_secs > 0:
    raise UserError(f"--peer_timeout_secs must be > 0, got {config.distribution.peer_timeout_secs}")
  if not 0 <= config.model.dropout < 1:
    raise UserError(f"--dropout must be in [0, 1), got {config.model.dropout}")
  if not config.model.hidden_units or any(u <= 0 for u in config.model.hidden_units):
    raise UserError(f"--hidden_units must be positive integers, got {list(config.model.hidden_units)}")
  if config.data.infer_sample_rows < 1:
    raise UserError(f"--infer_sample_rows must be a positive integer, got {config.data.infer_sample_rows}")
  if config.data.preflight_records < 1:
    raise UserError(f"--preflight_records must be a positive integer, got {config.data.preflight_records}")
  if config.data.csv_columns is not None and (len(set(config.data.csv_columns)) != len(config.data.csv_columns)
                                              or not all(config.data.csv_columns)):
    raise UserError(f"--csv_columns must name every CSV column once, got {','.join(config.data.csv_columns)}")
  if config.data.uri_cache_mb < 0:
    raise UserError(f"--uri_cache_mb must be >= 0 (0: no cache), got {config.data.uri_cache_mb}")
  if config.data.shuffle_buffer < 0:
    raise UserError(f"--shuffle_buffer must be >= 0, got {config.data.shuffle_buffer}")


def _validate_recipe(train: TrainConfig) -> None:
  """The recipe flags on their own; what depends on the schema (class weights, metric names) is
  `recipe.check_for_schema`."""
  if train.warmup_steps < 0:
    raise UserError(f"--warmup_steps must be >= 0, got {train.warmup_steps}")
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
  if train.weight_decay is not None and not train.weight_decay >= 0:
    raise UserError(f"--weight_decay must be >= 0 (decoupled decay per step, times the learning rate), got "
                    f"{train.weight_decay}")
  if train.clip_norm is not None and not train.clip_norm > 0:
    raise UserError(f"--clip_norm must be > 0 (the largest global gradient norm), got {train.clip_norm}")
  if train.eval_every_steps is not None:
    _positive("--eval_every_steps", train.eval_every_steps)
  if train.early_stopping_patience is not None:
    _positive("--early_stopping_patience", train.early_stopping_patience)
  if train.early_stopping_patience is not None and train.early_stopping_metric is None:
    raise UserError("--early_stopping_patience needs --early_stopping_metric (e.g. loss, accuracy, auc)")
  needs_evals = [flag for flag, given in (("early stopping (--early_stopping_metric, --early_stopping_patience)",
                                           train.early_stopping_metric),
                                          ("--export=best", train.export == "best")) if given]
  if needs_evals and train.eval_every_steps is None:
    raise UserError(f"{' and '.join(needs_evals)} need(s) periodic evaluation: pass --eval_every_steps=N "
                    "(and --eval_data)")


def _positive(flag: str, value: int) -> None:
  if value is None or value <= 0:
    raise UserError(f"{flag} must be a positive integer, got {value}")
