"""Reading the trainer's own source in tests: a registry's names compared outside the module that owns them."""

from __future__ import annotations

import ast
import os
from typing import Iterable

import procs


def _reads(operand: ast.expr, attribute: str) -> bool:
  """`x.<attribute>`, `x["<attribute>"]` or `x.get("<attribute>")` (a schema.json entry as a dict)."""
  if isinstance(operand, ast.Attribute):
    return operand.attr == attribute
  if isinstance(operand, ast.Subscript):
    return isinstance(operand.slice, ast.Constant) and operand.slice.value == attribute
  return (isinstance(operand, ast.Call) and isinstance(operand.func, ast.Attribute) and operand.func.attr == "get"
          and bool(operand.args) and isinstance(operand.args[0], ast.Constant) and operand.args[0].value == attribute)


def comparisons_naming(names: Iterable[str], *, owner: str, attribute: str | None = None) -> list[str]:
  """`path:line` of each comparison in trainer/ and serving/, `owner` (a path under trainer/) aside, with a string
  of `names` among its operands (alone, or in a tuple, list or set), and, when `attribute` is given, an operand that
  reads it (`x.type`, `x["type"]`, `x.get("type")`) too. A registry's names compared elsewhere mean a new entry
  would touch that module as well."""
  names = set(names)
  root = os.path.join(procs.REPO, "trainer")
  found = []
  for directory, _, files in [*os.walk(root), *os.walk(os.path.join(procs.REPO, "serving"))]:
    for file_name in files:
      path = os.path.join(directory, file_name)
      if not file_name.endswith(".py") or os.path.relpath(path, root) == owner:
        continue
      for node in ast.walk(ast.parse(open(path).read(), path)):
        if not isinstance(node, ast.Compare):
          continue
        operands = [node.left, *node.comparators]
        constants = {c.value for operand in operands
                     for c in ([operand] if isinstance(operand, ast.Constant) else getattr(operand, "elts", []))
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if names & constants and (attribute is None or any(_reads(o, attribute) for o in operands)):
          found.append(f"{os.path.relpath(path, procs.REPO)}:{node.lineno}")
  return found
