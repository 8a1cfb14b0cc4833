"""experiments.adaptive_batch on tiny configs: every run trains, the table and plot are written, a
perplexity target is met from below, and an interrupted experiment resumes."""

import json
import os
import pathlib
import signal

import pytest

from experiments import adaptive_batch
from experiments import run_records
from experiments import runner
from lbjax import train
from lbjax.train import batch_policy
from lbjax.train import errors

TINY = str(pathlib.Path(__file__).with_name("tiny_adaptive_config.py"))
TINY_PTB = str(pathlib.Path(__file__).with_name("tiny_adaptive_ptb_config.py"))


def test_the_experiment_writes_its_table_with_updates_and_wall_time_to_the_baseline(tmp_path):
  adaptive_batch.main(["--config", TINY, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs"),
                       "--runs", "baseline,adaptive", "--seeds", "0"])
  table = (tmp_path / "out.md").read_text()
  assert "| baseline B=16 | 16 |" in table and "adaptive batch, LEGW LR" in table
  assert "final test accuracy" in table
  assert (tmp_path / "out.png").stat().st_size > 0
  assert "batch" in (tmp_path / "out.csv").read_text()


@pytest.mark.parametrize("config, variant, message", [
    (TINY, "seed=1", "the variant of '{TINY}:seed=1' sets seed, which the experiment sets itself (--seeds): drop it"),
    (TINY + ":run=legw", "epochs=1", "the variant of '{TINY}:run=legw,epochs=1' sets run, which the experiment sets "
                                     "itself (--runs)"),
])
def test_a_variant_that_sets_the_run_or_the_seed_is_refused_before_training(tmp_path, capsys, config, variant,
                                                                           message):
  """Each run sets `run=` and `seed=` after the variant's keys: the variant's would silently win over --runs/--seeds."""
  with pytest.raises(SystemExit) as exit_info:
    adaptive_batch.main(["--config", config, "--variant", variant, "--seeds", "0,1", "--out", str(tmp_path / "out"),
                         "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2 and message.format(TINY=TINY) in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("config, flags, message", [
    (TINY, ["--seeds", "a,b"], "error: argument --seeds: expected comma-separated ints such as 128,512, got 'a,b'"),
    (TINY, ["--seeds", "1,1"], "error: seeds [1, 1] must be distinct integers >= 0, at least one."),
    (TINY, ["--runs", "adaptiv"], "error: runs ['adaptiv'] must be a non-empty subset of baseline, legw, "
                                  "grow_batch, adaptive, adascale."),
    (TINY, ["--targets", "0.97x"], "error: argument --targets: expected comma-separated floats such as "
                                   "0.1,0.3, got '0.97x'"),
    (TINY, ["--runs", "baseline", "--targets", "0.9,97.5,0"],
     "error: --targets 97.5, 0: the test metric is accuracy, and an accuracy target is a fraction in (0, 1], "
     "e.g. 0.975."),
    (TINY_PTB, ["--runs", "baseline", "--targets", "150,0.5"],
     "error: --targets 0.5: the test metric is perplexity, and a perplexity target is at least 1, e.g. 150."),
])
def test_bad_runs_seeds_and_targets_are_usage_errors_before_training(tmp_path, monkeypatch, capsys, config, flags,
                                                                     message):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(SystemExit) as exit_info:
    adaptive_batch.main(["--config", config, *flags, "--out", str(tmp_path / "out"),
                         "--workdir", str(tmp_path / "runs")])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and f"python -m experiments.adaptive_batch: {message}" in err
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out.md").exists()


def test_unknown_runs_are_refused_before_training():
  with pytest.raises(ValueError, match="must be a non-empty subset"):
    adaptive_batch.load_configs(TINY, ("baseline", "bigger"), (0,))


@pytest.mark.parametrize("value, target, metric, met", [
    (0.98, 0.97, "accuracy", True), (0.96, 0.97, "accuracy", False), (0.97, 0.97, "accuracy", True),
    (120.0, 130.0, "perplexity", True), (140.0, 130.0, "perplexity", False), (130.0, 130.0, "perplexity", True)])
def test_a_target_is_met_from_above_for_accuracy_and_from_below_for_perplexity(value, target, metric, met):
  assert adaptive_batch.meets(value, target, metric) == met


def test_the_ptb_experiment_resumes_and_reads_perplexity_lower_is_better(tmp_path, monkeypatch):
  """SIGTERM at step 9 of the adaptive run stops the experiment; run again, the finished baseline is not
  retrained and the adaptive run goes on from its checkpoint (no step logged twice). The table gives
  the perplexity on the split evaluated (valid): a target above every perplexity is met at the first evaluation,
  one below none."""
  args = ["--config", TINY_PTB, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs"),
          "--runs", "baseline,adaptive", "--targets", "1e6,1"]
  after_step = batch_policy.BatchPolicy.after_step

  def terminate_after(self, step, *rest):
    after_step(self, step, *rest)
    if step == 9 and self.policy == "adaptive":
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(batch_policy.BatchPolicy, "after_step", terminate_after)
  with pytest.raises(errors.RunPreempted, match="adaptive seed 0 was preempted"):
    adaptive_batch.main(args)
  monkeypatch.undo()
  baseline_metrics = (tmp_path / "runs" / "baseline_seed0" / "metrics.jsonl").read_text()
  adaptive_batch.main(args)
  assert (tmp_path / "runs" / "baseline_seed0" / "metrics.jsonl").read_text() == baseline_metrics
  lines = (tmp_path / "runs" / "adaptive_seed0" / "metrics.jsonl").read_text().splitlines()
  logged = [line for line in lines if '"kind": "train"' in line]
  assert len(logged) == len(run_records.read_records(tmp_path / "runs" / "adaptive_seed0", "train")) > 2
  assert run_records.final_eval(tmp_path / "runs" / "adaptive_seed0")["step"] > 9

  table = (tmp_path / "out.md").read_text()
  assert "## Target: the baseline's final perplexity" in table and "| final valid perplexity |" in table
  first_eval = {run: run_records.eval_curve(tmp_path / "runs" / f"{run}_seed0")[0]["step"]
                for run in ("baseline", "adaptive")}
  reached_all, reached_none = table.split("## Target: a fixed perplexity")[1:]
  assert "(1000000.00)" in reached_all and "(1.00)" in reached_none
  updates_to_target = [row.split("|")[6].strip() for row in reached_all.splitlines() if row.startswith("| ")
                       and "run" not in row]
  assert updates_to_target == [str(first_eval["baseline"]), str(first_eval["adaptive"])]
  assert reached_none.count("not reached") == 4
  assert "valid_perplexity" in (tmp_path / "out.csv").read_text().splitlines()[0]  # the synthetic chain's valid walk


def test_a_diverged_run_is_recorded_and_the_experiment_goes_on(tmp_path, monkeypatch):
  """LEGW stopped by a non-finite loss before its first record: the adaptive run still trains, the table
  says diverged, and a second call trains nothing."""
  train_and_evaluate = train.train_and_evaluate
  trained = []

  def diverging_legw(config, workdir):
    trained.append(pathlib.Path(workdir).name)
    if config.batch_size == 32:
      raise train.NonFiniteError("Non-finite loss at step 1.")
    return train_and_evaluate(config, workdir)

  monkeypatch.setattr(train, "train_and_evaluate", diverging_legw)
  args = ["--config", TINY_PTB, "--variant", "large_batch=32", "--out", str(tmp_path / "out"),
          "--workdir", str(tmp_path / "runs"), "--runs", "baseline,legw,adaptive"]
  adaptive_batch.main(args)
  assert trained == ["baseline_seed0", "legw_seed0", "adaptive_seed0"]
  assert "step 1" in (tmp_path / "runs" / "legw_seed0" / runner.DIVERGED_NOTE).read_text()
  assert "| LEGW, fixed B=32 |  | diverged | 0 |" in (tmp_path / "out.md").read_text()
  adaptive_batch.main(args)
  assert len(trained) == 3


def test_dry_run_prints_each_run_and_trains_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  adaptive_batch.main(["--config", TINY, "--runs", "baseline,adaptive", "--seeds", "0,1", "--out",
                       str(tmp_path / "out" / "ab"), "--workdir", str(tmp_path / "runs"), "--dry-run"])
  lines = capsys.readouterr().out.splitlines()
  assert [line.split(":")[0] for line in lines] == [f"[adaptive_batch]   {run} seed={seed}"
                                                    for run in ("baseline", "adaptive") for seed in (0, 1)]
  assert all(line.endswith(f"{tmp_path / 'runs'}/{line.split()[1]}_seed{line.split()[2][5]}: new") for line in lines)
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_a_run_that_ends_far_above_a_uniform_guess_counts_as_diverged_as_in_every_experiment(tmp_path):
  """`runner.learned`: a final evaluation loss above `diverged_above` (a nat above ln K) is a run that diverged
  without a non-finite step; its metric stays out of the table's mean, and out of the baseline's target."""
  for seed, loss, accuracy in ((0, 1.0, 0.9), (1, 50.0, 0.1)):
    directory = runner.run_dir(str(tmp_path), "baseline", seed)
    directory.mkdir(parents=True)
    records = [{"kind": "train", "step": 4, "epoch": 1.0, "loss": loss, "batch_size": 32},
               {"kind": "eval", "step": 4, "epoch": 1.0, "loss": loss, "accuracy": accuracy, "final": True}]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  above = 2.303 + runner.DIVERGED_ABOVE_UNIFORM_NATS
  assert adaptive_batch.baseline_target(str(tmp_path), (0, 1), "accuracy", above) == 0.9
  [row] = adaptive_batch.summarize(str(tmp_path), ("baseline",), (0, 1), 0.5, "accuracy", above)
  assert row["metric"] == [90.0] and row["diverged"] == 1


def test_the_outputs_name_the_split_the_runs_evaluated(tmp_path):
  """Runs evaluated on the validation split: the CSV column, the table and the plot say so (they said "test")."""
  runs = tmp_path / "runs"
  for run in ("baseline", "adaptive"):
    directory = runner.run_dir(str(runs), run, 0)
    directory.mkdir(parents=True)
    records = [{"kind": "batch", "step": 5, "epoch": 0.5, "batch_size": 64, "noise_scale": 100.0,
                "statistical_efficiency": 1.0, "examples_per_second": 10.0, "goodput": 10.0, "learning_rate": 0.1,
                "wall_seconds": 3.0},
               {"kind": "eval", "step": 10, "epoch": 1.0, "accuracy": 0.9, "loss": 0.3, "final": True}]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  out = tmp_path / "out"
  adaptive_batch.write_outputs(str(runs), str(out), ("baseline", "adaptive"), (0,), "t", "cmd", "accuracy",
                               {"baseline": "baseline", "adaptive": "adaptive"}, diverged_above=3.3,
                               split="validation")
  assert "validation_accuracy" in out.with_suffix(".csv").read_text().splitlines()[0]
  table = out.with_suffix(".md").read_text()
  assert "| final validation accuracy |" in table and "test" not in table

