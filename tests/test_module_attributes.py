"""Every `alias.name` that a module reads from another module of this repository names something there.

A function moved between modules leaves callers that still say `old_module.function`; Python finds out only
when the line runs, and a line in `if __name__ == "__main__":` runs in no test (two experiment scripts
called `lbjax.main.exit_on_user_errors` after it moved to `lbjax.train.errors`, seen on the first GPU run).
Read with `ast`: the names a module defines at its top level (functions, classes, assignments, imports)
and, for a package, its submodules.
"""

import ast
import pathlib

from tests.test_layers import source_modules


def _top_level_names(path: pathlib.Path) -> set[str] | None:
  """The names `path` binds at module level; None when it defines `__getattr__` (any name may exist)."""
  names = set()
  for node in ast.parse(path.read_text(), str(path)).body:
    for child in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else (node,):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(child.name)
      elif isinstance(child, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = child.targets if isinstance(child, ast.Assign) else [child.target]
        names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
      elif isinstance(child, (ast.Import, ast.ImportFrom)):
        names.update((a.asname or a.name).split(".")[0] for a in child.names)
  return None if "__getattr__" in names else names


def _module_aliases(tree: ast.Module, modules: dict[str, pathlib.Path]) -> dict[str, str]:
  """Local name -> repository module, for `import a.b as c` and `from a import b [as c]` naming a module."""
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:
        if f"{node.module}.{a.name}" in modules:
          aliases[a.asname or a.name] = f"{node.module}.{a.name}"
  return aliases


def missing_attributes(modules: dict[str, pathlib.Path]) -> list[str]:
  """`file:line: alias.name` for every read of a name the aliased repository module does not define."""
  defined = {name: _top_level_names(path) for name, path in modules.items()}
  for name in modules:  # a package's submodules are its attributes once imported
    parent, _, child = name.rpartition(".")
    if defined.get(parent) is not None:
      defined[parent].add(child)
  missing = []
  for path in modules.values():
    tree = ast.parse(path.read_text(), str(path))
    aliases = _module_aliases(tree, modules)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
          and defined[aliases[node.value.id]] is not None and node.attr not in defined[aliases[node.value.id]]
          and not (node.attr.startswith("__") and node.attr.endswith("__"))):  # __name__, __path__, ...
        missing.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
  return missing


def test_every_attribute_read_from_a_repository_module_exists():
  assert missing_attributes(source_modules()) == []


def test_a_moved_function_is_found(tmp_path):
  (tmp_path / "lbjax").mkdir()
  (tmp_path / "lbjax" / "__init__.py").write_text("")
  (tmp_path / "lbjax" / "errors.py").write_text("def exit_on_user_errors(prog):\n  pass\n")
  (tmp_path / "lbjax" / "cli.py").write_text("from lbjax import errors\nfrom lbjax import cli as me\n"
                                              "errors.exit_on_user_errors('x')\nerrors.print_error()\nme.main\n"
                                              "def main():\n  pass\n")
  assert missing_attributes(source_modules(tmp_path)) == ["cli.py:4: errors.print_error (lbjax.errors)"]
