"""The shape of the code: no import circles among the project's modules (module-level or inside functions), and
no module of the trainer importing tooling. Read from the source with `ast`; nothing is imported."""

import ast
import os

import pytest

import procs

# The quick tier (scripts/test.sh --quick): no test here trains for long or waits on peers.
pytestmark = pytest.mark.quick

PACKAGES = ("trainer", "serving", "scripts")


def _modules() -> dict[str, str]:
  """Dotted module name -> file, for every module of the project's packages."""
  found = {}
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(procs.REPO, package)):
      for name in files:
        if name.endswith(".py"):
          relative = os.path.relpath(os.path.join(directory, name), procs.REPO)[:-3].replace(os.sep, ".")
          found[relative[:-len(".__init__")] if relative.endswith(".__init__") else relative] = os.path.join(
              directory, name)
  return found


def import_graph() -> dict[str, set[str]]:
  """Module -> the project modules it imports anywhere in its source (a package's import counts as its
  __init__; `from package import module` as the module)."""
  modules = _modules()
  graph = {}
  for module, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
        for alias in node.names:
          targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    graph[module] = {t for t in targets if t in modules and t != module}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every strongly connected group of more than one module (Tarjan), each sorted."""
  index, low, stack, on_stack, groups = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in sorted(graph[node]):
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      group = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        group.append(member)
        if member == node:
          break
      if len(group) > 1:
        groups.append(sorted(group))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return groups


def test_the_cycle_finder_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
  assert cycles(import_graph()) == []


def test_the_trainer_imports_no_tooling():
  """The package Vertex installs is the trainer alone: nothing in it may need scripts/."""
  graph = import_graph()
  leaks = {m: sorted(t for t in targets if t.startswith("scripts")) for m, targets in graph.items()
           if m.startswith("trainer")}
  assert not {m: t for m, t in leaks.items() if t}


# The trainer's layers, bottom first: the data's way through the trainer. Each imports only layers before it in
# this list (anywhere in its source, lazy imports included); the commands at the top of the package (task, runner,
# flags, schema_inference) may import any layer. docs/layout.md draws the same picture.
LAYERS = ("trainer.core", "trainer.distribute", "trainer.data", "trainer.modeling", "trainer.planning",
          "trainer.training")


def _layer(module: str) -> int:
  """The index of the module's layer in LAYERS; len(LAYERS) for the commands at the top."""
  for index, layer in enumerate(LAYERS):
    if module == layer or module.startswith(layer + "."):
      return index
  return len(LAYERS)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
  """Every (importer, imported) pair of trainer modules where the imported one sits in a higher layer."""
  found = []
  for module, targets in graph.items():
    if not module.startswith("trainer."):
      continue
    for target in targets:
      if target.startswith("trainer.") and _layer(target) > _layer(module):
        found.append((module, target))
  return sorted(found)


def test_the_layer_checker_finds_an_upward_import():
  graph = {"trainer.core.storage": {"trainer.data.schema"}, "trainer.data.schema": {"trainer.core.paths"},
           "trainer.task": {"trainer.training.loop"}, "trainer.core.paths": set(), "trainer.training.loop": set()}
  assert upward_imports(graph) == [("trainer.core.storage", "trainer.data.schema")]


def test_each_layer_imports_only_the_layers_below():
  assert upward_imports(import_graph()) == []


def test_every_trainer_module_sits_in_a_layer_or_is_a_command():
  """A new module goes into a layer; the top holds only the commands and the package's version."""
  top = sorted(m for m in import_graph() if m.startswith("trainer") and _layer(m) == len(LAYERS))
  assert top == ["trainer", "trainer.flags", "trainer.runner", "trainer.schema_inference", "trainer.task"]


def test_serving_imports_only_the_trainers_lower_layers():
  """The serving image (Dockerfile.serving) holds the trainer's sdist and serving/: nothing of scripts/, and of
  the trainer only the layers below training (the schema it reads rows by), so serving never pulls in a loop."""
  graph = import_graph()
  imported = {t for m, targets in graph.items() if m == "serving" or m.startswith("serving.") for t in targets}
  assert not {t for t in imported if t.startswith("scripts")}
  assert {t for t in imported if t.startswith("trainer")} <= {
      m for m in graph if _layer(m) <= LAYERS.index("trainer.modeling") and m.startswith("trainer.")}
  assert not {t for m, targets in graph.items() if m.startswith("trainer") for t in targets
              if t == "serving" or t.startswith("serving.")}
