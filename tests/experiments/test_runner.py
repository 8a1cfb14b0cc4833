"""`experiments.runner.run_once`: the row of a run, trained once, however many sessions it took."""

import json
import math
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from experiments import runner
from lbjax import config_files
from lbjax import train
from lbjax.train import workdir_lock
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


@pytest.mark.parametrize("loss, status", [(2.0, "done"), (2.4, "done"), (3.4, "diverged")])
def test_a_run_that_ends_far_worse_than_a_uniform_guess_diverged(tmp_path, loss, status):
  """10 classes: a final evaluation loss a nat above ln 10 = 2.303 (a uniform guess's) is a run that
  diverged without a non-finite step, its value kept in the row; just above it is a run that learned little."""
  config, run_dir = helpers.tiny_classifier_config(), tmp_path / "run"
  run_dir.mkdir()
  final = {"kind": "eval", "step": 8, "epoch": 1.0, "loss": loss, "accuracy": 0.09, "final": True}
  (run_dir / "metrics.jsonl").write_text(json.dumps(final) + "\n")
  assert runner.uniform_guess_loss(config) == pytest.approx(2.302585)
  row = runner.read_row(config, run_dir, name="row")
  assert (row.status, row.value) == (status, 0.09)


def _finished_run(run_dir: pathlib.Path, config) -> None:
  """`run_dir` as the trainer leaves a finished run of `config`: its `config.json` and a final evaluation."""
  run_dir.mkdir()
  (run_dir / "config.json").write_text(json.dumps({"config": json.loads(config.to_json())}))
  final = {"kind": "eval", "step": 8, "epoch": 1.0, "loss": 1.0, "accuracy": 0.5, "final": True}
  (run_dir / "metrics.jsonl").write_text(json.dumps(final) + "\n")


def test_a_finished_run_of_another_recipe_is_refused_not_read_back_as_this_ones(tmp_path, monkeypatch):
  """A run directory reused by a changed experiment (another LR, more epochs) holds the old recipe's result:
  reading it back would record it as the new recipe's. Operational fields (logging, evaluation cadence) may
  differ."""
  monkeypatch.setattr(runner.train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  config, run_dir = helpers.tiny_classifier_config(), tmp_path / "run"
  _finished_run(run_dir, config)
  config.log_every = config.log_every + 7
  assert runner.run_once(config, run_dir, name="row").value == 0.5
  assert runner.planned_run(config, run_dir).endswith(f"{run_dir}: ended there: read back")
  config.lr.base, config.num_epochs = 2 * config.lr.base, config.num_epochs + 1
  message = (f"{run_dir} holds a finished run of another recipe (lr.base: {config.lr.base / 2!r} there, "
             f"{config.lr.base!r} now; num_epochs: {config.num_epochs - 1!r} there, {config.num_epochs!r} now): delete "
             "that directory to train this run, or choose another --workdir.")
  with pytest.raises(train.ConfigError) as refused:
    runner.run_once(config, run_dir, name="row")
  assert str(refused.value) == message
  assert runner.planned_run(config, run_dir).endswith(f"{run_dir}: refused: {message}")


def test_a_language_models_uniform_guess_is_its_vocabulary():
  """PTB's 10,000 words: perplexity 10,000 is the line (nothing is read: the vocabulary is published)."""
  assert runner.uniform_guess_loss(config_files.load("ptb_lstm").config) == pytest.approx(math.log(10_000))


def test_an_out_prefix_or_workdir_in_a_folder_this_process_cannot_write_is_named_without_creating_it(tmp_path,
                                                                                                  monkeypatch):
  monkeypatch.setattr(workdir_lock.os, "access", lambda path, mode: pathlib.Path(path) != tmp_path)
  assert runner.out_problem(str(tmp_path / "new" / "results")) == (
      f"--out '{tmp_path / 'new' / 'results'}': '{tmp_path}' is not writable by this process; name a prefix in a "
      "folder this process can write.")
  assert workdir_lock.workdir_problem(str(tmp_path / "runs")) == (
      f"--workdir '{tmp_path / 'runs'}' cannot be created: '{tmp_path}' is not writable by this process. Name a "
      "directory this process can create and write.")
  assert runner.out_problem(str(tmp_path.parent / "results")) == ""
  assert not (tmp_path / "new").exists() and not (tmp_path / "runs").exists()


def test_a_folder_this_process_cannot_enter_or_a_dangling_link_is_named_not_a_traceback(tmp_path, monkeypatch):
  secret = tmp_path / "secret"
  exists = pathlib.Path.exists

  def exists_unless_inside_secret(path, *args, **kwargs):  # as stat(2) answers EACCES under a folder mode 700
    if secret in path.parents:
      raise PermissionError(13, "Permission denied", str(path))
    return exists(path, *args, **kwargs)

  secret.mkdir()
  monkeypatch.setattr(pathlib.Path, "exists", exists_unless_inside_secret)
  monkeypatch.setattr(workdir_lock.os, "access", lambda path, mode: pathlib.Path(path) != secret)
  assert workdir_lock.workdir_problem(str(secret / "run")) == (
      f"--workdir '{secret / 'run'}' cannot be created: '{secret}' is not writable by this process. Name a "
      "directory this process can create and write.")
  monkeypatch.undo()
  link = tmp_path / "link"
  link.symlink_to(tmp_path / "gone")
  assert workdir_lock.workdir_problem(str(link)) == (
      f"--workdir '{link}' cannot be created: '{link}' is a link to '{tmp_path / 'gone'}', which does not exist. "
      "Name a directory this process can create and write.")
  assert runner.out_problem(str(link / "results")) == (
      f"--out '{link / 'results'}': '{link}' is a link to '{tmp_path / 'gone'}', which does not exist; name a "
      "prefix in a folder this process can write.")


@pytest.mark.parametrize("seeds, problem", [
    (list(np.arange(3)), ""), ((0, 1), ""), ([], "seeds [] must"), ([1, 1], "seeds [1, 1] must"),
    ([-1], "seeds [-1] must"), ([True], "seeds [True] must"), ([0.5], "seeds [0.5] must")])
def test_seeds_are_distinct_integers_numpy_ones_included(seeds, problem):
  assert runner.seeds_problem(seeds).startswith(problem) and bool(runner.seeds_problem(seeds)) == bool(problem)


def test_a_planned_run_names_the_split_its_dataset_evaluates_by_default(tmp_path):
  """ImageNet evaluates its validation split unless the config says otherwise (MNIST and PTB: test)."""
  planned = runner.planned_run(config_files.load("resnet50_imagenet:batch=1024").config, tmp_path / "run")
  assert planned == (f"batch 1024, peak LR 5.65685, warm-up 0.3125 epochs, 90 epochs, validation split; "
                     f"{tmp_path / 'run'}: new")


def test_load_runs_names_every_run_that_does_not_load_or_is_invalid_by_its_label():
  def invalid():
    config = config_files.load("mnist_lstm").config
    config.num_epochs = -1.0
    return config

  loaders = {("good", 0): runner.config_loader("mnist_lstm", ["--config.seed=3"]), ("invalid", 0): invalid,
             ("unloadable", 1): runner.config_loader("mnist_lstm", ["--config.num_stepz=3"])}
  configs, problems = runner.run_problems(loaders, label=lambda key: f"{key[0]} seed={key[1]}")
  assert list(configs) == [("good", 0)] and configs[("good", 0)].seed == 3
  assert [p.split(":")[0] for p in problems] == ["invalid seed=0", "unloadable seed=1"]
  assert "num_epochs" in problems[0] and "Did you mean 'num_steps'?" in problems[1]
  assert runner.load_runs({"a": loaders[("good", 0)]}, "table")["a"].seed == 3
  with pytest.raises(train.ConfigError, match=r"(?s)^Invalid table:\n  - invalid seed=0: .*num_epochs.*\n  - "
                                               r"unloadable seed=1: "):
    runner.load_runs(loaders, "table", label=lambda key: f"{key[0]} seed={key[1]}")



