"""A plug-in model's own hyperparameters, by name on the command line, the way Vertex AI tuning passes a trial's.

A plug-in module declares them beside its `build_fn`, each with its default:

    HPARAMS = {"units": 32, "dropout": 0.1, "activation": "relu", "batch_norm": False}

    def build(schema, hparams):  # hparams["units"] is an int: 32, or what --units says
      ...

Each name becomes a trainer flag, `--units=64` or `--units 64` (a hyperparameter tuning trial passes its
`parameterId`s so), parsed to the default's type (int, float, bool, str, or a list of ints as "64,32"), and reaches
`build_fn(schema, hparams)` with every other declared name at its default. `--hparams='{"units": 64}'` sets them
too (a flag wins over it). A declared name that is also a built-in model flag (`dropout`, `hidden_units`) is fed by
that flag. Refused in one line, before anything runs: a name nothing declares (`Unknown command line flag`, with
the declared names), a value of the wrong type, and a built-in model flag under a plug-in model that does not
declare it (nothing would read it: a study would search a dead dimension). A module without `HPARAMS` gets
`--hparams` as it is, as before.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Sequence

from absl import flags

from trainer.core import config
from trainer.core import options
from trainer.core.errors import first_line
from trainer.core.errors import UserError

DECLARATION = "HPARAMS"
# The trainer's flags that only the built-in models read (`models.build_tabular`, `models.build_cnn`): every
# option of the model's config but --model itself.
BUILT_IN_MODEL_FLAGS = tuple(entry.flag for entry in options.declared(config.ModelConfig) if entry.field != "name")
_TYPES = {bool: "a bool (true/false)", int: "an int", float: "a float", str: "a string"}


def plugin_module(model: str | None) -> str | None:
  """The module of a `--model=module:build_fn` plug-in, None for a built-in model."""
  if not model or ":" not in model:
    return None
  return model.partition(":")[0]


def model_from_argv(argv: Sequence[str]) -> str | None:
  """--model's value in a command line (`--model=X` or `--model X`, the last one wins), before flags are parsed."""
  model = None
  for i, arg in enumerate(argv):
    if arg.startswith("--model="):
      model = arg[len("--model="):]
    elif arg == "--model" and i + 1 < len(argv):
      model = argv[i + 1]
  return model


def importable(model: str | None) -> bool:
  """Whether a plug-in's module imports here (tooling may run away from the package, which Vertex installs)."""
  module_name = plugin_module(model)
  if module_name is None:
    return True
  try:
    importlib.import_module(module_name)
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def declared(model: str | None, *, required: bool = True) -> dict[str, Any] | None:
  """The plug-in's HPARAMS (name -> default), checked; None for a built-in model, a module that declares none, or
  (`required=False`, tooling that checks args away from the user's code) a module that cannot be imported here."""
  module_name = plugin_module(model)
  if module_name is None:
    return None
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  (the user's code: any failure is theirs to see)
    if not required:
      return None
    raise UserError(f"--model={model!r}: cannot import module {module_name!r} ({type(e).__name__}: "
                    f"{first_line(e)}); a local plug-in is found on PYTHONPATH (or pip install its package)") from None
  value = getattr(module, DECLARATION, None)
  if value is None:
    return None
  where = f"--model={model!r}: {module_name}.{DECLARATION}"
  if not isinstance(value, Mapping):
    raise UserError(f"{where} is a {type(value).__name__}; expected a dict of name -> default, e.g. "
                    "{'units': 32, 'dropout': 0.1}")
  for name, default in value.items():
    if not isinstance(name, str) or not name.isidentifier():
      raise UserError(f"{where}: {name!r} is not a flag name (letters, digits and _)")
    if _kind(default) is None:
      raise UserError(f"{where}: {name!r} has default {default!r}; a hyperparameter is an int, float, bool, str "
                      "or a list of ints")
  return dict(value)


def _kind(default: Any):
  if isinstance(default, (list, tuple)):
    return list if all(isinstance(v, int) and not isinstance(v, bool) for v in default) else None
  return type(default) if type(default) in _TYPES else None


def define(flag_values: flags.FlagValues, hparams: Mapping[str, Any] | None, *, model: str) -> None:
  """A string flag per declared name (parsed by `values`, so a trial's "16.0" can be an int 16); names the trainer
  already has are refused, but for the built-in model flags, which then feed the plug-in's hyperparameter."""
  for name, default in (hparams or {}).items():
    if name in flag_values:
      if name in BUILT_IN_MODEL_FLAGS:
        continue
      raise UserError(f"--model={model!r}: hyperparameter {name!r} in {DECLARATION} is also a trainer flag "
                      f"(--{name}); rename it")
    flags.DEFINE_string(name, None, f"Hyperparameter of --model={model} (default {default!r}).",
                        flag_values=flag_values)


def define_for_argv(flag_values: flags.FlagValues, argv: Sequence[str]) -> None:
  """Defines the flags of the plug-in model `argv` names (before absl parses `argv`, which refuses unknown ones)."""
  model = model_from_argv(argv)
  define(flag_values, declared(model), model=model or "")


def explain_flag_error(error: flags.Error, argv: Sequence[str]) -> str:
  """absl's message in one line; for an unknown flag under a plug-in model, what that model does declare."""
  message = " ".join(str(error).split())
  model = model_from_argv(argv)
  if "Unknown command line flag" in message and plugin_module(model) is not None:
    hparams = declared(model, required=False)
    offer = (f"--model={model} declares {', '.join(hparams)}" if hparams else
             f"--model={model} declares no {DECLARATION}")
    return f"{message}; it is neither a trainer flag nor a hyperparameter: {offer} (see --help)"
  return f"{message} (see --help)"


def values(flag_values: flags.FlagValues, *, model: str, hparams_json: Mapping[str, Any]) -> dict[str, Any]:
  """What `build_fn` receives: each declared name's default, then --hparams, then its own flag, typed; or (no
  declaration) --hparams as it is. Refuses a built-in model flag that nothing reads."""
  hparams = declared(model)
  if plugin_module(model) is not None:
    unread = [name for name in BUILT_IN_MODEL_FLAGS
              if flag_values[name].present and name not in (hparams or {})]
    if unread:
      offer = f"its {DECLARATION}: {', '.join(hparams)}" if hparams else f"it declares no {DECLARATION}"
      raise UserError(f"--{unread[0]} is read by the built-in models only; --model={model} does not read it "
                      f"({offer}): drop it, or declare {unread[0]!r} in {DECLARATION} to receive it")
  if hparams is None:
    return dict(hparams_json)
  unknown = [name for name in hparams_json if name not in hparams]
  if unknown:
    raise UserError(f"--hparams names {', '.join(map(repr, unknown))}, which --model={model} does not declare "
                    f"(its {DECLARATION}: {', '.join(hparams) or 'none'})")
  result = dict(hparams)
  for name, default in hparams.items():
    if name in hparams_json:
      result[name] = _typed(name, hparams_json[name], default, source="--hparams")
    if name in flag_values and flag_values[name].present:
      result[name] = _typed(name, flag_values[name].value, default, source=f"--{name}")
  return result


def whole_number(value: Any) -> int:
  """An int from 16, "16" or "16.0" (a tuning service may send a whole number as a float)."""
  if isinstance(value, bool):
    raise ValueError
  number = float(value.strip()) if isinstance(value, str) else float(value)
  if number != int(number):
    raise ValueError
  return int(number)


def _typed(name: str, value: Any, default: Any, *, source: str) -> Any:
  kind = _kind(default)
  text = value if isinstance(value, str) else None
  try:
    if kind is bool:
      if isinstance(value, bool):
        return value
      lowered = str(value).strip().lower()
      if lowered in ("true", "1", "yes"):
        return True
      if lowered in ("false", "0", "no"):
        return False
      raise ValueError
    if kind is int:
      return whole_number(value)
    if kind is float:
      if isinstance(value, bool):
        raise ValueError
      return float(value)
    if kind is list:
      return [whole_number(item) for item in (value.split(",") if text is not None else value)]
    return str(value)
  except (TypeError, ValueError):
    what = "a list of ints (e.g. 64,32)" if kind is list else _TYPES[kind]
    raise UserError(f"{source}={value!r}: hyperparameter {name!r} is {what} (its default is {default!r})") from None
