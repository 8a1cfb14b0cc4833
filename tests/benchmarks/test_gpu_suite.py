"""benchmarks/gpu_suite.sh, read without running it: what it asks of the benchmarks exists."""

import pathlib
import re

from benchmarks import optimizer

SUITE = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.sh"


def test_every_optimizer_the_suite_times_is_one_the_benchmark_knows():
  """A misspelt name would end the optimizer part on the lent GPU with exit 2."""
  lists = re.findall(r'--optimizers "([^"]+)"', SUITE.read_text())
  assert lists
  for names in lists:
    assert set(names.split(";")) <= set(optimizer.optimizers())
