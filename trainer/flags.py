"""Command-line flags, one per option declared in `trainer/core/config.py` (and `CommandOptions` here), and their
conversion into a typed `Config`.

Flags are all optional at definition; `config_from_flags` decides what is required, because several have
defaults that come from Vertex AI's environment (AIP_MODEL_DIR, AIP_TRAINING_DATA_URI, ...).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from absl import flags

from trainer.core import config as config_lib
from trainer.core import hparams as hparams_lib
from trainer.core import options as options_lib
from trainer.core import paths
from trainer.core import storage
from trainer.core.errors import UserError
from trainer.core.options import option
from trainer.data import formats
from trainer.data import schema as schema_lib
from trainer.distribute import strategy as strategy_lib
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


@dataclasses.dataclass(frozen=True)
class CommandOptions:
  """The options of the command itself rather than of the config it builds (declared like the config's)."""

  output_dir: str | None = option(None, "Base output dir: model/, checkpoints/ and logs/ under it, as Vertex's "
                                  "baseOutputDirectory.")
  hparams: str = option("{}", "JSON object of extra hyperparameters passed to a plug-in build_fn.")
  dry_run: bool = option(False, "Print the resolved role, strategy and config as one JSON object and exit without "
                         "training.")
  log_format: str = option("auto", "Log lines: json (one object per line with severity, message, task_type and "
                           "task_index, as Cloud Logging parses them), text (absl's lines, a progress bar on a "
                           "terminal); auto: json on Vertex ($CLOUD_ML_JOB_ID set, stderr not a terminal), else text.",
                           choices=("auto", "json", "text"))


# Where the flags come from, in --help's order of topics.
OPTION_CLASSES = (config_lib.DataConfig, config_lib.ModelConfig, config_lib.TrainConfig,
                  config_lib.DistributionConfig, config_lib.OutputConfig, CommandOptions)


def _lists() -> dict[str, tuple[str, ...]]:
  """The value lists that layers above `trainer.core` own, which declarations name (`Option.choices`, {name} in a
  help text)."""
  return {"data_formats": ("auto", *formats.FLAG_VALUES), "strategies": ("auto", *strategy_lib.STRATEGIES),
          "metrics": tuple(objective_lib.HIGHER_IS_BETTER)}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines every trainer flag on `flag_values`, one per declared option. Call once, before absl parses argv."""
  lists = _lists()
  for config_class in OPTION_CLASSES:
    for entry in options_lib.declared(config_class):
      define_option(entry, lists, flag_values)


def define_option(entry: options_lib.Declared, lists: dict[str, tuple[str, ...]],
                  flag_values: flags.FlagValues) -> None:
  """The absl flag of one declared option (its parser from the field's type)."""
  help_text = entry.option.help
  for name, names in lists.items():
    help_text = help_text.replace("{" + name + "}", ", ".join(names))
  kwargs = {"flag_values": flag_values}
  choices = entry.option.choices
  if isinstance(choices, str):
    choices = lists[choices]
  if entry.kind is bool:
    flags.DEFINE_boolean(entry.flag, entry.default, help_text, **kwargs)
  elif entry.kind is int:
    flags.DEFINE(_WholeNumberParser(), entry.flag, entry.default, help_text, serializer=flags.ArgumentSerializer(),
                 **kwargs)
  elif entry.kind is float:
    flags.DEFINE_float(entry.flag, entry.default, help_text, **kwargs)
  elif entry.kind is tuple:
    default = [str(item) for item in entry.default] if entry.default is not None else None
    flags.DEFINE_list(entry.flag, default, help_text, **kwargs)
  elif choices:
    flags.DEFINE_enum(entry.flag, entry.default, choices, help_text, **kwargs)
  else:
    flags.DEFINE_string(entry.flag, entry.default, help_text, **kwargs)


def option_values(config_class: type, values: flags.FlagValues) -> dict[str, Any]:
  """The config class's option fields, each its flag's value in the field's type."""
  fields = {}
  for entry in options_lib.declared(config_class):
    value = values[entry.flag].value
    if entry.kind is tuple and not value and entry.optional:
      value = None  # `--csv_columns=` says nothing, as leaving it out does
    elif entry.kind is tuple and value is not None:
      try:
        value = tuple(entry.item_kind(item.strip()) for item in value)
      except ValueError:
        raise UserError(f"--{entry.flag} must be a comma-separated list of integers, got {value}") from None
    fields[entry.field] = value
  return fields


def config_from_flags(values: flags.FlagValues, env: config_lib.Environment, *,
                      check_model: bool = True) -> config_lib.Config:
  """Builds and validates the typed config from parsed flags and the environment. `check_model=False` (tooling
  away from the user's code) takes --hparams as written when the plug-in module cannot be imported."""
  train_pattern = values.train_data or env.aip_training_data_uri
  if not train_pattern:
    raise UserError("--train_data is required (or set AIP_TRAINING_DATA_URI)")
  eval_pattern = values.eval_data or env.aip_validation_data_uri
  vertex_format = _vertex_data_format(env, values.data_format)
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

  # Each config class from its options' flags, then what is resolved from several flags and the environment.
  model = option_values(config_lib.ModelConfig, values)
  train = option_values(config_lib.TrainConfig, values)
  if train["train_steps"] is None and train["epochs"] is None:  # the config field's default, when --epochs is not given
    train["train_steps"] = config_lib.TrainConfig.__dataclass_fields__["train_steps"].default
  config = config_lib.Config(
      data=config_lib.DataConfig(**{
          **option_values(config_lib.DataConfig, values),
          "train_pattern": train_pattern, "eval_pattern": eval_pattern, "test_pattern": test_pattern,
          "schema_path": paths.normalize_path(schema_path), "schema_given": bool(values.schema),
          "vertex_format": vertex_format, "splits_from_vertex": not values.train_data}),
      model=config_lib.ModelConfig(**{
          **model, "backbone_weights": paths.normalize_path(model["backbone_weights"])
          if model["backbone_weights"] else None}),
      train=config_lib.TrainConfig(**{
          **train,
          # --early_stopping_patience alone watches the eval loss.
          "early_stopping_metric": train["early_stopping_metric"] or (
              "loss" if train["early_stopping_patience"] is not None else None),
          "early_stopping_patience": (train["early_stopping_patience"] if train["early_stopping_patience"] is not None
                                      or train["early_stopping_metric"] is None else 3)}),
      output=config_lib.OutputConfig(model_dir=model_dir, checkpoint_dir=checkpoint_dir,
                                     tensorboard_dir=tensorboard_dir),
      distribution=config_lib.DistributionConfig(**{
          **option_values(config_lib.DistributionConfig, values), "tpu": values.tpu or env.tpu_name}),
      hparams=(hparams_lib.values(values, model=values.model, hparams_json=_parse_hparams(values.hparams))
               if check_model else _parse_hparams(values.hparams)),
  )
  config_lib.validate(config)
  model_registry.validate(config.model, train_steps=config.train.train_steps,
                          hidden_units_given=values["hidden_units"].present)
  return config


def _vertex_data_format(env: config_lib.Environment, requested: str) -> str | None:
  """AIP_DATA_FORMAT of a Vertex managed-dataset job, checked; None where it is unset or a flag overrides it."""
  value = env.aip_data_format
  if not value or requested != "auto":
    return None
  if value.lower() not in formats.VERTEX_FORMATS:
    raise UserError(f"AIP_DATA_FORMAT={value!r}; expected one of {', '.join(sorted(formats.VERTEX_FORMATS))}, "
                    "or pass --data_format")
  return value.lower()


def _default_schema_path(train_pattern: str) -> str:
  """schema.json beside the data; a table (bq://) has no folder, so none ("": --label infers one)."""
  if train_pattern.startswith(storage.TABLE_SCHEMES):
    return ""
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
