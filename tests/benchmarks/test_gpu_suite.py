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


def test_every_default_part_has_its_branch_and_every_test_file_it_runs_exists():
  """A part without its branch would end the suite on the lent GPU with exit 2, a missing test file with 4."""
  text = SUITE.read_text()
  parts = re.search(r'^PARTS="([^"]+)"', text, re.MULTILINE).group(1).split(",")
  branches = set(re.findall(r"^    (\w+)\)", text, re.MULTILINE))
  assert set(parts) <= branches, set(parts) - branches
  test_files = set(re.findall(r"\b(tests/[\w/]+\.py)\b", text))
  assert test_files
  for path in test_files:
    assert (SUITE.parents[1] / path).is_file(), path
