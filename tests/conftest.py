"""Test-wide setup, set before jax initialises: 8 simulated CPU devices, and a persistent compilation
cache shared by the test processes (and the subprocesses they start), because many tests compile the
same tiny train steps: it halves the suite's time on 2 cores."""

import os
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "lbjax-tests-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """Path of the real MNIST/PTB files (`../shared/data`); skips if absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared data not found at {SHARED_DATA}")
  return SHARED_DATA
