"""`config.deterministic=True` (lbjax.train.determinism): XLA's deterministic-ops flags reach the backend
when it starts, and two runs of one config agree bit for bit."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from lbjax.train import determinism
from lbjax.train import train_and_evaluate
from lbjax.train.errors import ConfigError
from tests.train import helpers

REPO = pathlib.Path(__file__).resolve().parents[2]

# In a fresh process: the backend has not started; the run starts it with the flags (XLA parses XLA_FLAGS
# then and aborts on a flag it does not know), twice; the two final states are compared bit for bit.
TWO_RUNS = """
import os, sys
from jax._src import xla_bridge
import numpy as np
import jax
from lbjax.train import train_and_evaluate
from tests.train import helpers
assert not xla_bridge.backends_are_initialized()
config = helpers.tiny_language_model_config(num_steps=6, deterministic=True)
first = train_and_evaluate(config, sys.argv[1] + "/first")
assert xla_bridge.backends_are_initialized()
print("XLA_FLAGS at start:", os.environ["XLA_FLAGS"])
second = train_and_evaluate(config, sys.argv[1] + "/second")
for a, b in zip(jax.tree.leaves(first.state), jax.tree.leaves(second.state), strict=True):
  assert np.array_equal(np.asarray(a), np.asarray(b)), "the runs differ"
assert first.eval_metrics == second.eval_metrics
print("bit-identical")
"""


def test_the_flags_reach_xla_before_its_backend_starts_and_two_runs_are_bit_identical(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_cpu_enable_fast_math=false")
  done = subprocess.run([sys.executable, "-c", TWO_RUNS, str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  flags = done.stdout.split("XLA_FLAGS at start:")[1].splitlines()[0].split()
  assert flags == ["--xla_cpu_enable_fast_math=false", *determinism.DETERMINISTIC_XLA_FLAGS]  # the user's kept
  assert done.stdout.strip().endswith("bit-identical")


def test_a_backend_started_without_the_flags_is_refused_before_compute(tmp_path, monkeypatch):
  jax.devices()  # this test process's backend is running, without the flags
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  with pytest.raises(ConfigError, match="must be set before JAX starts its backend.*XLA_FLAGS="):
    train_and_evaluate(helpers.tiny_language_model_config(num_steps=1, deterministic=True), tmp_path)
  with pytest.raises(ConfigError, match="config.deterministic must be True or False, got 'yes'"):
    train_and_evaluate(helpers.tiny_language_model_config(num_steps=1, deterministic="yes"), tmp_path)


@pytest.mark.parametrize("flags, expected", [
    (" ".join(determinism.DETERMINISTIC_XLA_FLAGS), True),
    ("--xla_gpu_deterministic_ops --xla_gpu_exclude_nondeterministic_ops=true", True),  # a bare flag is true
    ("--xla_gpu_deterministic_ops=true", False),  # one of the two
    (" ".join(determinism.DETERMINISTIC_XLA_FLAGS) + " --xla_gpu_deterministic_ops=false", False),  # the last wins
])
def test_in_effect_reads_xla_flags_as_xla_does(flags, expected):
  assert determinism.in_effect(flags) is expected
