"""`experiments.runner.run_once`: the row of a run, trained once, however many sessions it took."""

import json
from types import SimpleNamespace

import pytest

from experiments import runner
from lbjax.train.errors import RunPreempted
from tests.train import helpers


def test_a_resumed_runs_seconds_add_up_its_sessions(tmp_path, monkeypatch):
  """A session preempted after 30 s and the one that resumed it for 45 s: the row says 75 s, not 45."""
  clock = iter([100.0, 130.0, 200.0, 245.0])
  monkeypatch.setattr(runner, "time", SimpleNamespace(time=lambda: next(clock)))
  sessions = []

  def train_and_evaluate(config, run_dir):
    run_dir.mkdir(parents=True, exist_ok=True)
    sessions.append(run_dir)
    if len(sessions) == 2:  # the second session ends with the final evaluation
      final = {"kind": "eval", "step": 5, "epoch": 1.0, "accuracy": 0.5, "final": True}
      (run_dir / "metrics.jsonl").write_text(json.dumps(final) + "\n")
    return SimpleNamespace(preempted=len(sessions) == 1)

  monkeypatch.setattr(runner.train, "train_and_evaluate", train_and_evaluate)
  config, run_dir = helpers.tiny_classifier_config(), tmp_path / "run"
  with pytest.raises(RunPreempted, match="row seed 0 was preempted"):
    runner.run_once(config, run_dir, name="row")
  row = runner.run_once(config, run_dir, name="row")
  assert row.seconds == pytest.approx(75.0) and row.value == 0.5 and row.status == "done"
  assert runner.run_once(config, run_dir, name="row").seconds == 0.0  # read back, not trained now
