"""The experiment scripts end on a user's mistake (here a data folder that is not there) with the message
and exit status 2, without a traceback, as lbjax-train does; on a preempted run with its message and
status 75."""

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from lbjax import train
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


TABLE = str(TABLES / "mnist_lstm_fig6_test.json")
SCRIPTS = {  # each experiment script with the arguments it requires besides --out and --workdir
    "adaptive_batch": [], "batch_schedule": ["--config", "batch_schedule_mnist"], "by_epoch": [],
    "compression_bytes": [], "lipschitz": ["--config", "mnist_lstm", "--batch_sizes", "8"],
    "lr_grid": ["--config", "mnist_lstm", "--lrs", "0.1"],
    "mclr_vs_lars": ["--config", "mnist_lstm", "--lars_lrs", "1", "--mclr_lrs", "0.001"],
    "model_parallel_layouts": [], "noise_scale": ["--config", "mnist_lstm", "--max_device_batch", "8"],
    "pipeline_bubble": [], "reevaluate": [TABLE, "--label", "x", "--workdir", "runs/none"],
    "sweep": ["--config", "mnist_lstm", "--rules", "none", "--batch_sizes", "128"], "tensor_sharding_bytes": [],
    "tpu_pod_plan": [], "variant_table": [TABLE], "critical_batch.cli measure": ["measure", "--config", "mnist_lstm"],
    "critical_batch.cli warmup": ["warmup", "--config", "mnist_lstm", "--cbs", "cbs.csv"],
}
TAKES_WORKDIR = {"adaptive_batch", "batch_schedule", "compression_bytes", "lipschitz", "lr_grid", "mclr_vs_lars",
                 "noise_scale", "sweep", "variant_table", "critical_batch.cli measure", "critical_batch.cli warmup"}


def _refusal(script: str, argv: list[str], capsys) -> str:
  module = importlib.import_module(f"experiments.{script.split()[0]}")
  with pytest.raises(SystemExit) as exit_info:
    module.main([*SCRIPTS[script], *argv])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  return err


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_out_prefix_that_cannot_be_written_ends_the_script_before_anything_runs(script, tmp_path, capsys,
                                                                                  monkeypatch):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  a_file = tmp_path / "a_file"
  a_file.write_text("not a folder")
  workdir = ["--workdir", str(tmp_path / "runs")] if script in TAKES_WORKDIR else []
  err = _refusal(script, ["--out", str(a_file / "results"), *workdir], capsys)
  assert (f"error: --out '{a_file / 'results'}' lies under '{a_file}', which is a file: name a prefix in a folder, "
          "e.g. reproduced/results.\n") in err
  err = _refusal(script, ["--out", str(tmp_path), *workdir], capsys)
  assert f"error: --out '{tmp_path}' is a directory; --out is the prefix of the files written" in err
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", sorted(TAKES_WORKDIR))
def test_a_workdir_that_is_a_file_ends_the_script_before_anything_runs(script, tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  a_file = tmp_path / "a_file"
  a_file.write_text("not a folder")
  err = _refusal(script, ["--out", str(tmp_path / "out"), "--workdir", str(a_file)], capsys)
  assert f"error: --workdir '{a_file}' is a file, not a directory: name a new directory or one holding a run" in err
