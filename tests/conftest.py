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
# The tests' programs are tiny: compiling them takes far longer than running them, and much of a compile is LLVM
# optimising the CPU code. At LLVM's -O1 without its expensive passes the suite compiles faster with the same
# numbers wherever the tests compare two programs; at -O0 some differ (an unrolled LSTM's last bits, float16 LAMB
# ratios). `.ci/run`'s suites on a cold compilation cache, 2 cores, 2026-12-02: Python 3.13 13:47 (20:00 before),
# the oldest versions 15:26 (30:07 before). With more tests they took 18:29 and 21:10 in CI; with 3 test processes
# (README's command) the Python 3.13 suite took 10:56 here, on a warm cache (-n 2: 16:17, with other work beside), and
# `.ci/run` on a cold one 17:14 (Python 3.13) and 22:54 (oldest versions): compile-bound.
# Put before the caller's XLA_FLAGS, which can set other levels (the last of a flag wins).
_FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=1 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = " ".join(filter(None, [_FAST_COMPILE_FLAGS, os.environ.get("XLA_FLAGS", "")]))

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """Path of the real MNIST/PTB files (`../shared/data`); skips if absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared data not found at {SHARED_DATA}")
  return SHARED_DATA
