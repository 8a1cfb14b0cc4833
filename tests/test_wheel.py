"""The wheel works outside the repository: configs and everything the CLI needs ship inside it, and it
needs no package that it does not require (directly or through its requirements)."""

import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> pathlib.Path:
  """Builds the wheel (no network: the build uses this environment's setuptools) and installs it,
  without dependencies, into a folder that shadows the editable install."""
  build = tmp_path_factory.mktemp("wheel")
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                  "--wheel-dir", str(build), str(REPO)], check=True, timeout=300, cwd=build)
  wheel = next(build.glob("lbjax-*.whl"))
  target = tmp_path_factory.mktemp("site")
  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                  str(wheel)], check=True, timeout=300)
  return target


# Run by Python at start-up (sitecustomize): makes the modules named in $LBJAX_BLOCKED_MODULES unimportable,
# as in a clean environment where only the wheel and its requirements are installed.
IMPORT_BLOCKER = """
import json, os, sys
_blocked = frozenset(json.load(open(os.environ["LBJAX_BLOCKED_MODULES"])))
class _NotInstalled:
  def find_spec(self, name, path=None, target=None):
    if name.partition(".")[0] in _blocked:
      raise ModuleNotFoundError(f"No module named {name!r} (not required by the lbjax wheel)", name=name)
    return None
sys.meta_path.insert(0, _NotInstalled())
"""


def _canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str] | None) -> set[str]:
  """Distribution names of the requirements that are not behind an extra."""
  return {_canonical(re.match(r"\s*([A-Za-z0-9._-]+)", r).group(1)) for r in requirements or [] if "extra ==" not in r}


def _required_distributions(target: pathlib.Path) -> set[str]:
  """The wheel's core Requires-Dist and, through this environment's metadata, everything they require."""
  [metadata] = target.glob("lbjax-*.dist-info/METADATA")
  todo = _requirement_names([line.split(":", 1)[1] for line in metadata.read_text().splitlines()
                             if line.startswith("Requires-Dist:")])
  required = set()
  while todo:
    name = todo.pop()
    required.add(name)
    try:
      todo |= _requirement_names(importlib.metadata.requires(name)) - required
    except importlib.metadata.PackageNotFoundError:
      pass
  return required


@pytest.fixture(scope="module")
def clean_environment(installed_wheel, tmp_path_factory) -> dict[str, str]:
  """PYTHONPATH and the variable under which only the wheel, its requirements and the standard library
  import: this environment's other packages (the extras, pytest, notebooks' kernels) are blocked."""
  required = _required_distributions(installed_wheel)
  assert {"jax", "flax", "optax", "orbax-checkpoint"} <= required
  blocked = sorted(module for module, distributions in importlib.metadata.packages_distributions().items()
                   if module != "lbjax" and not {_canonical(d) for d in distributions} & required)
  assert "pytest" in blocked
  probe = tmp_path_factory.mktemp("probe")
  (probe / "sitecustomize.py").write_text(IMPORT_BLOCKER)
  (probe / "blocked.json").write_text(json.dumps(blocked))
  return {"PYTHONPATH": f"{installed_wheel}{os.pathsep}{probe}", "LBJAX_BLOCKED_MODULES": str(probe / "blocked.json")}


def _lbjax_train(target: pathlib.Path, clean: dict[str, str], cwd: pathlib.Path, *args: str,
                 data_dir: pathlib.Path | None = None):
  env = dict(os.environ, **clean, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
  if data_dir is not None:
    env["LBJAX_DATA_DIR"] = str(data_dir)
  return subprocess.run([str(target / "bin" / "lbjax-train"), *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=600)


def test_the_installed_wheel_lists_its_configs_and_trains_mnist_from_an_empty_directory(
    installed_wheel, clean_environment, tmp_path, shared_data):
  empty = tmp_path / "elsewhere"
  empty.mkdir()
  where = subprocess.run([sys.executable, "-c", "import lbjax, lbjax.configs; print(lbjax.__file__)"],
                         cwd=empty, env=dict(os.environ, **clean_environment), capture_output=True, text=True,
                         check=True)
  assert where.stdout.strip().startswith(str(installed_wheel))  # the wheel, not the repository
  blocked = subprocess.run([sys.executable, "-c", "import pytest"], cwd=empty,
                           env=dict(os.environ, **clean_environment), capture_output=True, text=True)
  assert blocked.returncode == 1 and "not required by the lbjax wheel" in blocked.stderr
  help_text = _lbjax_train(installed_wheel, clean_environment, empty, "--help")
  assert help_text.returncode == 0 and "--dry-run" in help_text.stdout
  listing = _lbjax_train(installed_wheel, clean_environment, empty, "--list")
  assert listing.returncode == 0 and "mnist_lstm: MNIST LSTM of papers/001" in listing.stdout
  run = _lbjax_train(installed_wheel, clean_environment, empty, "--config", "mnist_lstm", "--workdir", "w",
                     "--config.num_steps=5", data_dir=shared_data)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "done: step 5" in run.stdout
  assert (empty / "w" / "config.json").is_file() and (empty / "w" / "metrics.jsonl").is_file()
