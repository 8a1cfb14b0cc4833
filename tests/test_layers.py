"""Arrows point one way (docs/design.md, "Layers"): read with `ast` from the sources, lazy imports included.

Each module belongs to a unit (`lbjax.optim`, `lbjax.data`, ..., `experiments`); a unit may import itself and
the units of lower layers, nothing of its own layer or above. And no module imports, directly or through
others, a module that imports it back.
"""

import ast
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A unit is a package (everything under it) or a module.
LAYERS = (
    ("lbjax.optim", "lbjax.schedules", "lbjax.diagnostics", "lbjax.dependencies"),  # nothing of lbjax
    ("lbjax.models", "lbjax.data"),  # neither train nor each other
    ("lbjax.parallel",),  # pipelines and stacks of the models' layers
    ("lbjax.train",),  # composes the above
    ("lbjax.configs",),  # the packaged configs: the trainer's public API
    ("lbjax.config_files",),  # finds, loads and overrides the configs
    ("lbjax.main",),  # the command line
    ("benchmarks",),
    ("experiments",),  # measure with the benchmarks' code too
)
_SOURCE_DIRS = ("lbjax", "experiments", "benchmarks")


def source_modules(root: pathlib.Path = _ROOT) -> dict[str, pathlib.Path]:
  """Dotted module name -> source file, for every module of the repository's packages."""
  modules = {}
  for path in sorted(p for folder in _SOURCE_DIRS for p in (root / folder).rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return modules


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
  """The dotted names an import statement asks for (`from a import b` asks for `a.b`, a module or a name)."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  if not isinstance(node, ast.ImportFrom):
    return []
  base = node.module or ""
  if node.level:
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - node.level + 1]
    base = ".".join(package + ([node.module] if node.module else []))
  return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: pathlib.Path = _ROOT) -> dict[str, set[str]]:
  """module -> the modules of this repository it imports (anywhere in it: top level or in a function)."""
  modules = source_modules(root)
  graph = {}
  for module, path in modules.items():
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      for name in _imported_names(node, module, path.name == "__init__.py"):
        while name and name not in modules:  # `from a import Name` imports module `a`
          name = name.rpartition(".")[0]
        if name and name != module:
          targets.add(name)
    graph[module] = targets
  return graph


def _unit(module: str) -> tuple[int, str] | None:
  for layer, units in enumerate(LAYERS):
    for unit in units:
      if module == unit or module.startswith(unit + "."):
        return layer, unit
  return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, on_stack, stack, components = {}, {}, set(), [], []

  def visit(module: str) -> None:
    index[module] = low[module] = len(index)
    stack.append(module)
    on_stack.add(module)
    for target in sorted(graph.get(module, ())):
      if target not in index:
        visit(target)
        low[module] = min(low[module], low[target])
      elif target in on_stack:
        low[module] = min(low[module], index[target])
    if low[module] == index[module]:
      component = []
      while not component or component[-1] != module:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        components.append(sorted(component))

  for module in sorted(graph):
    if module not in index:
      visit(module)
  return components


def test_every_module_has_a_layer():
  unplaced = sorted(module for module in source_modules() if module != "lbjax" and _unit(module) is None)
  assert not unplaced, f"add these to LAYERS (and to docs/design.md): {unplaced}"


def test_no_module_imports_its_own_layer_or_above():
  violations = []
  for module, targets in import_graph().items():
    if module == "lbjax":
      continue
    layer, unit = _unit(module)
    for target in sorted(targets):
      target_layer, target_unit = _unit(target) if target != "lbjax" else (0, "lbjax")
      if target_unit != unit and target_layer >= layer:
        violations.append(f"{module} (layer {layer}) imports {target} (layer {target_layer})")
  assert not violations, "\n".join(violations)


def test_no_two_modules_import_each_other():
  cycles = _cycles(import_graph())
  assert not cycles, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize("source, expected", [
    ("from lbjax.data import jpeg\n", {"lbjax.data.jpeg"}),
    ("from lbjax.train.errors import ConfigError\n", {"lbjax.train.errors"}),
    ("def f():\n  from lbjax import train\n", {"lbjax.train"}),
    ("from . import stream\n", {"lbjax.data.stream"}),
    ("import numpy\nfrom lbjax.data.stream import Batch as B\n", {"lbjax.data.stream"}),
])
def test_the_graph_sees_every_kind_of_import(tmp_path, source, expected):
  package = tmp_path / "lbjax" / "data"
  package.mkdir(parents=True)
  (tmp_path / "lbjax" / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  for name in ("jpeg", "stream"):
    (package / f"{name}.py").write_text("")
  (tmp_path / "lbjax" / "train").mkdir()
  (tmp_path / "lbjax" / "train" / "__init__.py").write_text("")
  (tmp_path / "lbjax" / "train" / "errors.py").write_text("")
  (package / "probe.py").write_text(source)
  assert import_graph(tmp_path)["lbjax.data.probe"] == expected


def test_a_cycle_and_an_upward_import_are_found():
  graph = {"lbjax.data.a": {"lbjax.data.b"}, "lbjax.data.b": {"lbjax.data.a"}, "lbjax.data.c": set()}
  assert _cycles(graph) == [["lbjax.data.a", "lbjax.data.b"]]
  assert _unit("lbjax.data.a")[0] < _unit("lbjax.train.run")[0]
