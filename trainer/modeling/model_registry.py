"""--model's names: the built-in models and their builders, in one table; any other value is a plug-in's import
path (`package.module:build_fn`, `models.plugin_builder`)."""

from __future__ import annotations

from typing import Any, Callable

from trainer.core import config as config_lib
from trainer.core.errors import UserError
from trainer.modeling import backbones
from trainer.modeling import models

BUILDERS: dict[str, Callable[..., Any]] = {
    "tabular": models.build_tabular,
    "cnn": models.build_cnn,
    **{name: backbones.build for name in backbones.BACKBONES},
}
IMAGE_MODELS = ("cnn", *backbones.BACKBONES)  # the built-in models over an image feature


def resolve_builder(name: str) -> Callable[..., Any]:
  """A `build(schema, model_config, hparams)` callable for --model; a plug-in's import errors are UserError."""
  return BUILDERS.get(name) or models.plugin_builder(name)


def is_import_path(name: str) -> bool:
  module, sep, attr = name.partition(":")
  return bool(sep) and bool(attr) and all(part.isidentifier() for part in module.split(".")) and attr.isidentifier()


def validate(model: config_lib.ModelConfig, *, train_steps: int | None = None,
             hidden_units_given: bool = False) -> None:
  """--model and the built-in models' own flags, on their own (before anything touches storage or devices)."""
  if model.name not in BUILDERS and not is_import_path(model.name):
    raise UserError(f"--model={model.name!r} is neither a built-in model ({', '.join(BUILDERS)}) "
                    "nor an import path 'package.module:function'")
  backbone_flags = {"--backbone_weights": model.backbone_weights, "--fine_tune_at_step": model.fine_tune_at_step,
                    "--fine_tune_learning_rate_factor": model.fine_tune_learning_rate_factor}
  given = [flag for flag, value in backbone_flags.items() if value is not None]
  # A plug-in may declare these as its own hyperparameters (trainer/core/hparams.py checks that).
  if given and model.name not in backbones.BACKBONES and not is_import_path(model.name):
    raise UserError(f"{', '.join(given)}: only backbone models take {'it' if len(given) == 1 else 'them'} "
                    f"(--model={' or '.join(backbones.BACKBONES)}), not --model={model.name}")
  if model.fine_tune_at_step is not None and model.fine_tune_at_step < 0:
    raise UserError(f"--fine_tune_at_step must be >= 0 (0: fine-tune from the start), got {model.fine_tune_at_step}")
  if model.name in backbones.BACKBONES and hidden_units_given:
    raise UserError(f"--hidden_units: --model={model.name} has a linear head over the backbone's pooled features (as "
                    "the Keras transfer-learning guide); drop --hidden_units, or write a plug-in with a head of your "
                    "own (--model=package.module:build_fn)")
  if (model.name in backbones.BACKBONES and model.fine_tune_at_step is not None and train_steps is not None
      and model.fine_tune_at_step >= train_steps):
    raise UserError(f"--fine_tune_at_step={model.fine_tune_at_step} is not before the last step "
                    f"(--train_steps={train_steps}): the backbone would never learn; give a step below {train_steps}")
  factor = model.fine_tune_learning_rate_factor
  if factor is not None and not 0 < factor <= 1:
    raise UserError(f"--fine_tune_learning_rate_factor must be in (0, 1], got {factor}")
