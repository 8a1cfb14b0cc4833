"""The experiment scripts end on a user's mistake (here a data folder that is not there) with the message
and exit status 2, without a traceback, as lbjax-train does."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
TABLES = ROOT / "experiments" / "tables"


@pytest.mark.parametrize("command", [
    ["experiments.variant_table", str(TABLES / "ptb_lstm_640_hypotheses.json"), "--rows", "legw"],
    ["experiments.sweep", "--config", "ptb_lstm", "--rules", "none", "--batch_sizes", "20",
     "--metric", "perplexity"],
])
def test_a_missing_data_folder_is_a_message_not_a_traceback(command, tmp_path):
  missing = tmp_path / "no_such_folder"
  env = {**os.environ, "LBJAX_DATA_DIR": str(missing), "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
  env.pop("XLA_FLAGS", None)
  env.pop("LBJAX_TRACEBACK", None)
  done = subprocess.run([sys.executable, "-m", *command, "--out", str(tmp_path / "out"),
                         "--workdir", str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 2, done.stderr
  assert "Traceback" not in done.stderr
  assert f"python -m {command[0]}: LBJAX_DATA_DIR='{missing}' is not a directory" in done.stderr
  assert "LBJAX_TRACEBACK=1" in done.stderr
