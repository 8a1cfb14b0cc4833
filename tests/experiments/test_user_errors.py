"""The experiment scripts end on a user's mistake (here a data folder that is not there) with the message
and exit status 2, without a traceback, as lbjax-train does; on a preempted run with its message and
status 75."""

import os
import pathlib
import subprocess
import sys

import pytest

from lbjax.train import errors

ROOT = pathlib.Path(__file__).parents[2]
TABLES = ROOT / "experiments" / "tables"


@pytest.mark.parametrize("command", [
    ["experiments.variant_table", str(TABLES / "ptb_lstm_640_hypotheses.json"), "--rows", "legw"],
    ["experiments.sweep", "--config", "ptb_lstm", "--rules", "none", "--batch_sizes", "20",
     "--metric", "perplexity"],
    ["experiments.mclr_vs_lars", "--config", "mnist_lstm", "--lars_lrs", "1", "--mclr_lrs", "0.001"],
    ["experiments.lipschitz", "--config", "mnist_lstm", "--batch_sizes", "8"],
    ["experiments.noise_scale", "--config", "mnist_lstm", "--max_device_batch", "8"],
    ["experiments.compression_bytes", "--config", "mnist_lstm"],
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


def test_a_preempted_run_ends_an_experiment_with_its_message_and_status_75(capsys):
  with pytest.raises(SystemExit) as stopped:
    with errors.exit_on_user_errors("python -m experiments.x"):
      raise errors.RunPreempted("row seed 0 was preempted (SIGTERM or SIGINT); its checkpoint in runs/row_s0 "
                                "resumes when the experiment runs again.")
  assert stopped.value.code == errors.PREEMPTED_EXIT_STATUS == 75
  assert capsys.readouterr().err == ("python -m experiments.x: row seed 0 was preempted (SIGTERM or SIGINT); its "
                                     "checkpoint in runs/row_s0 resumes when the experiment runs again.\n")
