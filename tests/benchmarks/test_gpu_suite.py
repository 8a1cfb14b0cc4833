"""benchmarks/gpu_suite.sh: what it asks of the benchmarks exists (read without running it), and how it ends."""

import os
import pathlib
import re
import subprocess

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


def test_a_part_that_fails_ends_the_dry_run_with_status_1_naming_it(tmp_path):
  """The CPU rehearsal (--dry-run) must say when a part fails (it exited 0 whatever its parts did); the next parts
  still run and the archive is still packed."""
  env = dict(os.environ, PYTHON="false", TMPDIR=str(tmp_path))
  done = subprocess.run(["bash", str(SUITE), "--dry-run", "--parts", "max_pool,repeatability", "--out",
                         str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120, check=False)
  assert done.returncode == 1, done.stdout + done.stderr
  assert "parts that did not exit 0: max_pool repeatability" in done.stdout
  assert (tmp_path / "out" / "gpu_suite.tgz").is_file()
