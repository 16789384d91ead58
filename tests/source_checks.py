"""Reading the trainer's own source in tests: a registry's names compared outside the module that owns them."""

from __future__ import annotations

import ast
import os
from typing import Iterable

import procs


def comparisons_naming(names: Iterable[str], *, owner: str, attribute: str | None = None) -> list[str]:
  """`path:line` of each comparison in trainer/, `owner` (a path under trainer/) aside, with a string of `names`
  among its operands (alone, or in a tuple, list or set), and, when `attribute` is given, an operand `x.<attribute>`
  too. A registry's names compared elsewhere mean a new entry would touch that module as well."""
  names = set(names)
  root = os.path.join(procs.REPO, "trainer")
  found = []
  for directory, _, files in os.walk(root):
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
        if names & constants and (attribute is None or any(
            isinstance(o, ast.Attribute) and o.attr == attribute for o in operands)):
          found.append(f"{os.path.relpath(path, procs.REPO)}:{node.lineno}")
  return found
