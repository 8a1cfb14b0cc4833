"""experiments.adaptive_batch on a tiny config: every run trains, the table and plot are written."""

import pathlib

import pytest

from experiments import adaptive_batch

TINY = str(pathlib.Path(__file__).with_name("tiny_adaptive_config.py"))


def test_the_experiment_writes_its_table_with_updates_and_wall_time_to_the_baseline(tmp_path):
  adaptive_batch.main(["--config", TINY, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs"),
                       "--runs", "baseline,adaptive", "--seeds", "0"])
  table = (tmp_path / "out.md").read_text()
  assert "| baseline B=128 | 16 |" in table and "adaptive batch, LEGW LR" in table
  assert (tmp_path / "out.png").stat().st_size > 0
  assert "batch" in (tmp_path / "out.csv").read_text()


def test_unknown_runs_are_refused_before_training(tmp_path):
  with pytest.raises(ValueError, match="must be a non-empty subset"):
    adaptive_batch.train_runs(TINY, str(tmp_path), ("baseline", "bigger"), (0,))
