"""The wheel works outside the repository: configs and everything the CLI needs ship inside it."""

import os
import pathlib
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


def _lbjax_train(target: pathlib.Path, cwd: pathlib.Path, *args: str, data_dir: pathlib.Path | None = None):
  env = dict(os.environ, PYTHONPATH=str(target), JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
  if data_dir is not None:
    env["LBJAX_DATA_DIR"] = str(data_dir)
  return subprocess.run([str(target / "bin" / "lbjax-train"), *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=600)


def test_the_installed_wheel_lists_its_configs_and_trains_mnist_from_an_empty_directory(
    installed_wheel, tmp_path, shared_data):
  empty = tmp_path / "elsewhere"
  empty.mkdir()
  where = subprocess.run([sys.executable, "-c", "import lbjax, lbjax.configs; print(lbjax.__file__)"],
                         cwd=empty, env=dict(os.environ, PYTHONPATH=str(installed_wheel)), capture_output=True,
                         text=True, check=True)
  assert where.stdout.strip().startswith(str(installed_wheel))  # the wheel, not the repository
  help_text = _lbjax_train(installed_wheel, empty, "--help")
  assert help_text.returncode == 0 and "--dry-run" in help_text.stdout
  listing = _lbjax_train(installed_wheel, empty, "--list")
  assert listing.returncode == 0 and "mnist_lstm: MNIST LSTM of papers/001" in listing.stdout
  run = _lbjax_train(installed_wheel, empty, "--config", "mnist_lstm", "--workdir", "w", "--config.num_steps=5",
                     data_dir=shared_data)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "done: step 5" in run.stdout
  assert (empty / "w" / "config.json").is_file() and (empty / "w" / "metrics.jsonl").is_file()
