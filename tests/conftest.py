"""Test-wide setup: 8 simulated CPU devices, set before jax initialises."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """Path of the real MNIST/PTB files (`../shared/data`); skips if absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared data not found at {SHARED_DATA}")
  return SHARED_DATA
