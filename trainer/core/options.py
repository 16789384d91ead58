"""An option is declared once: a field of a config dataclass whose metadata holds its help, its flag's name and
what values it accepts. The absl flag, `--help` and the value check all come from that one declaration
(`trainer/flags.py` defines the flags; `check` runs the checks), so adding an option is one field:

    shuffle_buffer: int = option(10_000, "Examples shuffled together ...", check=AT_LEAST_0)

The field's type chooses the flag's parser: bool, int (also "256.0", as Vertex tuning passes a DISCRETE value),
float, str (an enum with `choices`), or a tuple (a comma-separated list). `X | None` makes the flag optional.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, Iterator

from trainer.core.errors import UserError

_METADATA_KEY = "option"
_FIELD_DEFAULT = object()  # `Option.flag_default` when the flag's default is the field's


@dataclasses.dataclass(frozen=True)
class Accepts:
  """What values an option accepts: a test and the words for it in the error ("--x must be <words>, got v")."""

  test: Callable[[Any], bool]
  words: str


POSITIVE = Accepts(lambda v: v > 0, "a positive integer")


def at_least_0(why: str = "") -> Accepts:
  return Accepts(lambda v: v >= 0, ">= 0" + (f" ({why})" if why else ""))


def above_0(why: str = "") -> Accepts:
  return Accepts(lambda v: v > 0, "> 0" + (f" ({why})" if why else ""))


@dataclasses.dataclass(frozen=True)
class Option:
  help: str
  flag: str | None = None  # the flag's name where it is not the field's (`--model` fills `ModelConfig.name`)
  # An enum's values; a str names a list the layer that owns it gives when flags are defined (the registered data
  # formats), so this module need not import that layer.
  choices: tuple[str, ...] | str | None = None
  accepts: Accepts | None = None  # checked on the resolved value (None values are not checked)
  flag_default: Any = _FIELD_DEFAULT  # the flag's default where it differs from the field's (resolved later)


def option(default: Any, help: str, **kwargs: Any) -> Any:  # pylint: disable=redefined-builtin
  """A dataclass field that is also a command-line option (see the module docstring)."""
  return dataclasses.field(default=default, metadata={_METADATA_KEY: Option(help, **kwargs)})


@dataclasses.dataclass(frozen=True)
class Declared:
  """One option as the flag layer needs it: the config field, its type and the declaration."""

  field: str
  flag: str
  kind: type  # bool, int, float, str or tuple
  item_kind: type | None  # a tuple's element type
  default: Any
  option: Option
  optional: bool = False  # typed `X | None`: None means not given (an empty list too)


def declared(config_class: type) -> Iterator[Declared]:
  """The options among a config dataclass's fields, in declaration order."""
  hints = typing.get_type_hints(config_class)
  for field in dataclasses.fields(config_class):
    option_ = field.metadata.get(_METADATA_KEY)
    if option_ is None:
      continue
    kind, item_kind = _kind(hints[field.name])
    default = field.default if option_.flag_default is _FIELD_DEFAULT else option_.flag_default
    optional = type(None) in typing.get_args(hints[field.name])
    yield Declared(field.name, option_.flag or field.name, kind, item_kind, default, option_, optional)


def _kind(hint: Any) -> tuple[type, type | None]:
  arguments = [a for a in typing.get_args(hint) if a is not type(None)]
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    return _kind(arguments[0])  # X | None
  if typing.get_origin(hint) is tuple:
    return tuple, arguments[0]
  if hint in (bool, int, float, str):
    return hint, None
  raise TypeError(f"an option's type is bool, int, float, str or a tuple, optionally | None; got {hint}")


def check(config: Any) -> None:
  """Raises `UserError` naming the flag for the first option of `config` (a config dataclass, or one holding
  config dataclasses) whose value its declaration does not accept."""
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if dataclasses.is_dataclass(value):
      check(value)
  for entry in declared(type(config)):
    value = getattr(config, entry.field)
    accepts = entry.option.accepts
    if accepts is not None and value is not None and not accepts.test(value):
      shown = list(value) if isinstance(value, tuple) else value
      raise UserError(f"--{entry.flag} must be {accepts.words}, got {shown}")
