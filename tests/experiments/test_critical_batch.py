"""experiments.critical_batch on the tiny adaptive-batch MNIST config: branches restore the reference
run exactly, a lost branch is trained again to the same loss, the CBS and the warm-up follow their
definitions, and the warm-up comparison writes its table."""

import csv
import dataclasses
import json
import pathlib

import pytest

from experiments import run_records
from experiments import runner
from experiments.critical_batch import branches
from experiments.critical_batch import cli
from experiments.critical_batch import grid
from experiments.critical_batch import measure
from experiments.critical_batch import warmup
from lbjax import config_files
from lbjax import train
from lbjax.train import optimizer as optimizer_lib

TINY = str(pathlib.Path(__file__).with_name("tiny_adaptive_config.py"))
TINY_PTB = str(pathlib.Path(__file__).with_name("tiny_adaptive_ptb_config.py"))
# B0 = 16 on micro-batches of 8, 256 examples, an evaluation every 0.5 epochs (where the reference saves).
REFERENCE = f"{TINY}:run=legw,large_batch=16,epochs=1"


def _measure(tmp_path, *extra):
  cli.main(["measure", "--config", REFERENCE, "--overrides", "data_options.eval_split=validation", "--checkpoints",
            "0,0.5", "--batch_sizes", "16,32,64", "--budget_epochs", "0.5", "--tolerance", "0.05",
            "--out", str(tmp_path / "cbs"), "--workdir", str(tmp_path / "runs"), *extra])
  with open(tmp_path / "cbs_branches.csv", newline="") as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
  """A folder where `_measure` ran: the reference run (`runs/reference`) and its 6 branches (`cbs_branches.csv`)."""
  directory = tmp_path_factory.mktemp("measured")
  _measure(directory)
  return directory


def test_branches_continue_the_reference_run_exactly_and_a_lost_branch_is_retrained(measured):
  tmp_path = measured
  with open(tmp_path / "cbs_branches.csv", newline="") as f:
    recorded = list(csv.DictReader(f))
  assert len(recorded) == 6 and {int(b["examples"]) for b in recorded} == {128}
  assert {b["split"] for b in recorded} == {"validation"}
  assert {(int(b["batch_size"]), int(b["updates"])) for b in recorded} == {(16, 8), (32, 4), (64, 2)}
  curve = run_records.eval_curve(tmp_path / "runs" / "reference")
  evals = {round(r["epoch"], 3): r["loss"] for r in curve}
  reference = {float(b["checkpoint_epoch"]): float(b["loss"]) for b in recorded if b["batch_size"] == "16"}
  # The B0 branch of 128 examples from epoch 0 (0.5) is the reference run itself at epoch 0.5 (1.0).
  assert reference[0.0] == pytest.approx(evals[0.5], rel=1e-5)
  assert reference[0.5] == pytest.approx(evals[1.0], rel=1e-5)
  table = (tmp_path / "cbs.md").read_text()
  assert "| B0 validation loss |" in table and "| CBS | B_noise |" in table
  assert (tmp_path / "cbs.png").stat().st_size > 0
  with open(tmp_path / "cbs.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [r["checkpoint_epoch"] for r in rows] == ["0.0", "0.5"]
  assert all(int(r["critical_batch_size"]) in (16, 32, 64) for r in rows)
  # B_noise where the |G|^2 average is positive, else nan there and n/a in the table, saying why
  assert all(float(r["noise_scale"]) > 0 or float(r["noise_grad_norm_sq"]) <= 0 for r in rows)
  assert "| nan" not in table

  kept = [b for b in recorded if not (b["checkpoint_epoch"] == "0.5" and b["batch_size"] == "32")]
  with open(tmp_path / "cbs_branches.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(recorded[0]))
    writer.writeheader()
    writer.writerows(kept)
  again = _measure(tmp_path)
  lost = next(b for b in recorded if b["checkpoint_epoch"] == "0.5" and b["batch_size"] == "32")
  retrained = next(b for b in again if b["checkpoint_epoch"] == "0.5" and b["batch_size"] == "32")
  assert float(retrained["loss"]) == pytest.approx(float(lost["loss"]), rel=1e-5)
  assert [b for b in again if b is not retrained] == [b for b in kept]


@pytest.mark.parametrize("losses, critical", [
    ({16: 1.0, 32: 1.01, 64: 1.5}, 32), ({16: 1.0, 32: 1.5, 64: 1.0}, 16), ({16: 1.0, 32: 0.9, 64: 1.02}, 64),
    ({16: 1.0, 32: float("inf"), 64: 1.0}, 16)])
def test_the_cbs_is_the_largest_batch_with_every_smaller_one_within_the_tolerance(losses, critical):
  assert measure.critical_batch_size(losses, tolerance=0.02) == critical


def test_the_warmup_never_shrinks_stays_in_bounds_and_stops_at_the_end_of_training():
  curve = [(0.0, 8), (0.25, 64), (0.5, 32), (1.0, 512), (2.0, 1024)]
  assert warmup.warmup_schedule(curve, 16, 256, num_epochs=2.0) == ((16, 64, 256), (0.25, 1.0))


def test_the_warmup_lr_at_each_batch_is_the_branch_lr_at_that_batch():
  config = grid.load_config(REFERENCE)
  schedule = warmup.rule_at_batch_in_force(config.lr.base, batch_sizes=(16, 64), boundaries=(0.25,),
                                           recipe=warmup.recipe_json(config))
  for epoch, batch in ((0.05, 16), (0.2, 16), (0.3, 64), (0.6, 64), (0.9, 64)):
    branch = optimizer_lib.learning_rate_schedule(grid.at_batch(config, batch))
    assert schedule(epoch) == pytest.approx(branch(epoch)), (epoch, batch)


def test_the_warmup_comparison_trains_every_run_and_reports_validation_and_test(tmp_path):
  table = tmp_path / "cbs.csv"
  table.write_text("checkpoint_epoch,loss_ratio_b16,loss_ratio_b32,critical_batch_size\n0.0,1.0,1.5,16\n"
                   "0.5,1.0,1.04,16\n")
  assert measure.read_cbs_curve(table) == [(0.0, 16), (0.5, 16)]
  cli.main(["warmup", "--config", f"{TINY}:epochs=1", "--allow_test_split", "--cbs", str(table), "--tolerance", "0.05",
            "--seeds", "0", "--targets", "0.01", "--out", str(tmp_path / "warmup"),
            "--workdir", str(tmp_path / "runs")])
  page = (tmp_path / "warmup.md").read_text()
  assert "16 from epoch 0 → 32 from epoch 0.5" in page
  assert "## Target: the baseline's final test accuracy" in page and "## Target: a fixed test accuracy, 1.00%" in page
  for run in warmup.WARMUP_RUNS:
    assert page.count(f"| {run} | 1/1 |") == 2
  assert "| baseline | 1/1 |" in page.split("## Target: a fixed")[1] and "(0 of 1)" not in page.split("a fixed")[1]
  sizes = {r["batch_size"] for r in run_records.read_records(tmp_path / "runs" / "cbs_warmup_seed0",
                                                                           "train")}
  assert sizes == {16, 32}


def test_a_grid_that_does_not_fit_the_reference_is_refused_before_training():
  config = grid.load_config(REFERENCE)
  with pytest.raises(ValueError) as error:
    grid.make_grid(config, (0.0, 0.3, 2.0), (32, 24), 0.5, -1.0, (1.0,), 256)
  message = str(error.value)
  for expected in ("--batch_sizes must be increasing", "--checkpoints must be increasing", "not multiples",
                   "--tolerance must be >= 0"):
    assert expected in message


@pytest.mark.parametrize("budget", ["-5", "0"])
def test_a_budget_that_is_not_positive_is_refused_before_training(tmp_path, capsys, monkeypatch, budget):
  monkeypatch.setattr(measure.train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(SystemExit) as exit_info:
    _measure(tmp_path, "--budget_epochs", budget)
  assert exit_info.value.code == 2 and capsys.readouterr().err == (
      "Invalid critical-batch grid:\n  - --budget_epochs must be > 0 (the examples each branch trains on, in epochs); "
      f"got {float(budget)}.\n")
  assert not (tmp_path / "runs").exists() and not (tmp_path / "cbs.csv").exists()


def test_the_ptb_lstm_branches_restore_its_carried_state_and_count_rows_of_windows(tmp_path):
  cli.main(["measure", "--config", f"{TINY_PTB}:run=legw,large_batch=16,epochs=1", "--checkpoints",
            "0,0.5", "--batch_sizes", "16,32", "--budget_epochs", "0.25", "--out", str(tmp_path / "cbs"),
            "--workdir", str(tmp_path / "runs")])
  with open(tmp_path / "cbs_branches.csv", newline="") as f:
    recorded = list(csv.DictReader(f))
  # 8,000 tokens in windows of 10 at B=16: 49 windows x 16 rows an epoch; a quarter is 6 updates of 32 rows.
  assert {(b["batch_size"], b["updates"], b["examples"]) for b in recorded} == {("16", "12", "192"),
                                                                               ("32", "6", "192")}
  assert all(b["split"] == "valid" and float(b["loss"]) < 10 for b in recorded)
  assert "| CBS | B_noise |" in (tmp_path / "cbs.md").read_text()


def test_a_bad_grid_or_a_missing_table_ends_the_command_with_status_2(tmp_path, capsys):
  for command in (["measure", "--config", REFERENCE, "--batch_sizes", "32,24"],
                  ["warmup", "--config", TINY, "--cbs", str(tmp_path / "none.csv")]):
    with pytest.raises(SystemExit) as exit_info:
      cli.main([*command, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")])
    assert exit_info.value.code == 2
  errors = capsys.readouterr().err
  assert "--batch_sizes must be increasing" in errors and "none.csv not found" in errors


def _refused_warmup(tmp_path, capsys, monkeypatch, *flags: str) -> str:
  """`warmup` of a one-step CBS table (16 -> 32 at epoch 0.5) with `flags`: ends with status 2 before training;
  returns its stderr."""
  monkeypatch.setattr(warmup.train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  table = tmp_path / "cbs.csv"
  table.write_text("checkpoint_epoch,loss_ratio_b16,loss_ratio_b32,critical_batch_size\n0.5,1.0,1.04,32\n")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["warmup", "--config", f"{TINY}:epochs=1", "--cbs", str(table), *flags,
              "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2
  return capsys.readouterr().err


@pytest.mark.parametrize("max_batch, message", [
    ("-5", "--max_batch must be >= 0 (the largest batch of the warm-up; 0: no cap), got -5"),
    ("16", "--max_batch 16 caps the warm-up at or below the baseline batch 16, which it grows from: give a larger "
           "one, or 0 for no cap"),
])
def test_warmup_refuses_a_max_batch_that_leaves_no_warmup(tmp_path, capsys, monkeypatch, max_batch, message):
  err = _refused_warmup(tmp_path, capsys, monkeypatch, f"--max_batch={max_batch}")
  assert f"python -m experiments.critical_batch: error: {message}\n" in err
  assert "never exceeds" not in err and not (tmp_path / "runs").exists()


def test_warmup_refuses_a_run_or_seed_set_in_the_config_or_the_overrides(tmp_path, capsys):
  """warmup appends each run's `run=` and `seed=`: the variant's would be dropped, an override would beat --seeds."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["warmup", "--config", f"{TINY}:run=legw", "--overrides", "seed=3", "--cbs", str(tmp_path / "none.csv"),
              "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2
  assert (f"--config '{TINY}:run=legw' or --overrides sets run, seed, which the experiment sets itself (each run, "
          "--seeds): drop them there." in capsys.readouterr().err)


def test_the_cbs_row_takes_each_batch_best_lr_and_waits_for_the_whole_grid(tmp_path):
  two_batches = grid.Grid((0.0,), (16, 32), (0.5, 1.0), 64, 0.05, 256, "test")

  def branch(size, multiplier, loss):
    return branches.Branch(0.0, 0.0, 0, size, multiplier, 0.1, 64 // size, 64, "test", loss, "accuracy",
                           0.9, 1.0, "1x cpu")

  partial = [branch(16, 0.5, 1.2), branch(16, 1.0, 1.0), branch(32, 0.5, 1.04)]
  row, = measure.cbs_rows(two_batches, partial, tmp_path, {0.0: None})
  assert row.losses == {16: 1.0, 32: 1.04} and row.critical_batch_size is None and row.noise_scale is None
  row, = measure.cbs_rows(two_batches, partial + [branch(32, 1.0, float("inf"))], tmp_path, {0.0: None})
  assert row.losses == {16: 1.0, 32: 1.04} and row.critical_batch_size == 32
  # A multiplier of another grid recorded in the same CSV (--lr_multipliers 0.5,1,2 before) counts for nothing.
  row, = measure.cbs_rows(two_batches, partial + [branch(32, 1.0, float("inf")), branch(32, 2.0, 0.5),
                                                  branch(16, 2.0, 2.0)], tmp_path, {0.0: None})
  assert row.losses == {16: 1.0, 32: 1.04} and row.critical_batch_size == 32


def test_an_undetermined_noise_scale_is_n_a_with_why_in_the_table(tmp_path):
  """The tiny run's |G|^2 average is negative at epoch 0.5 (a signal below what the averages resolve), where
  B_noise is nan: the table printed "nan"; it says n/a and why, and the CSV keeps the average."""
  records = [{"kind": "batch", "step": 0, "epoch": 0.0, "noise_scale": "nan", "grad_norm_sq": 0.0},
             {"kind": "batch", "step": 4, "epoch": 0.25, "noise_scale": 17.5, "grad_norm_sq": 0.4},
             {"kind": "batch", "step": 8, "epoch": 0.5, "noise_scale": "nan", "grad_norm_sq": -0.136}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  one_batch = grid.Grid((0.0, 0.25, 0.5), (16,), (1.0,), 64, 0.05, 256, "validation")
  made = [branches.Branch(point, point, 0, 16, 1.0, 0.1, 4, 64, "validation", 1.0, "accuracy", 0.9, 1.0, "1x cpu")
          for point in one_batch.checkpoints]
  rows = measure.cbs_rows(one_batch, made, tmp_path, {0.0: None, 0.25: 4, 0.5: 8})
  assert [r.noise_grad_norm_sq for r in rows] == [0.0, 0.4, -0.136]
  table = measure.measurement_markdown(one_batch, rows, made, "measure ...", "tiny")
  assert "| n/a: no estimate yet (epoch 0) |" in table and "| 18 (epoch 0.25) |" in table
  assert "| n/a: |G|^2 average -0.136 <= 0 (epoch 0.5) |" in table and "nan" not in table


def test_warmup_refuses_an_accuracy_target_given_as_a_percentage(tmp_path, capsys, monkeypatch):
  err = _refused_warmup(tmp_path, capsys, monkeypatch, "--targets", "97.5")
  assert ("--targets 97.5: the test metric is accuracy, and an accuracy target is a fraction in (0, 1], e.g. "
          "0.975.") in err
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--seeds", "1,1", "--seeds [1, 1] must be distinct integers >= 0, at least one."),
    ("--seeds", "", "--seeds [] must be distinct integers >= 0, at least one."),
    ("--seeds", "0,one", "argument --seeds: expected comma-separated ints such as 128,512, got '0,one'"),
    ("--targets", "0.9,high", "argument --targets: expected comma-separated floats such as 0.1,0.3, got '0.9,high'"),
])
def test_warmup_refuses_seeds_and_targets_that_are_not_lists_it_can_run(tmp_path, capsys, monkeypatch, flag, value,
                                                                        message):
  err = _refused_warmup(tmp_path, capsys, monkeypatch, f"{flag}={value}")
  assert f"error: {message}\n" in err and "Traceback" not in err
  assert not (tmp_path / "runs").exists()


def test_measure_refuses_a_grid_list_that_is_not_numbers(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["measure", "--config", REFERENCE, "--batch_sizes", "32,sixty-four",
              "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2
  assert ("argument --batch_sizes: expected comma-separated ints such as 128,512, got '32,sixty-four'"
          in capsys.readouterr().err)


def test_warmup_dry_run_prints_the_warmup_and_each_run_and_trains_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(warmup.train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  table = tmp_path / "cbs.csv"
  table.write_text("checkpoint_epoch,loss_ratio_b16,loss_ratio_b32,critical_batch_size\n0.5,1.0,1.04,32\n")
  cli.main(["warmup", "--config", f"{TINY}:epochs=1", "--overrides", "data_options.eval_split=validation",
            "--cbs", str(table), "--seeds", "0", "--dry-run",
            "--out", str(tmp_path / "out" / "w"), "--workdir", str(tmp_path / "runs")])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == f"[critical_batch] the warm-up's batch sizes [16, 32] at epochs [0.5], from the CBS of {table}"
  assert [line.split(":")[0] for line in lines[1:]] == [f"[critical_batch]   {run} seed=0"
                                                        for run in warmup.WARMUP_RUNS]
  assert all(line.endswith(": new") for line in lines[1:]) and "batch [16, 32]" in lines[-1]
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_a_run_trained_on_the_validation_split_s_data_is_evaluated_on_the_test_split(tmp_path, shared_data):
  """MNIST with eval_split=validation trains on 50,000 images, with the test split on all 60,000: the final
  state is evaluated through init_from (`runner.evaluate_final_state`); restoring the run itself, whose data
  position fits 50,000 only, failed the warm-up comparison after its first run."""
  overrides = ["--config.eval_batch_size=1000", f"--config.data_dir={shared_data}", "--config.progress=False"]
  config = config_files.load("mnist_lstm", ["--config.num_steps=2", "--config.data_options.eval_split=validation",
                                            *overrides]).config
  train.train_and_evaluate(config, tmp_path / "run")
  files = sorted((tmp_path / "run").rglob("*"))
  metrics = runner.evaluate_final_state(config_files.load("mnist_lstm", overrides).config, tmp_path / "run")
  assert metrics["step"] == 2 and 0.0 <= metrics["accuracy"] <= 1.0
  assert sorted((tmp_path / "run").rglob("*")) == files  # the run's folder is only read
  assert warmup.final_test_metrics(config, tmp_path / "run") == metrics
  assert json.loads((tmp_path / "run" / warmup.TEST_FILE).read_text()) == metrics  # kept for the next call


@pytest.mark.parametrize("table, message", [
    (",".join(branches.BRANCH_FIELDS) + "\n0.0,0.0,0,16,1.0,0.05,8,128,test,2.3,accuracy,0.1,1.0,1x cpu\n",
     "is not a `measure` table (<out>.csv, with the columns checkpoint_epoch, loss_ratio_b<B> for each batch B, "
     "critical_batch_size); its columns: " + ", ".join(branches.BRANCH_FIELDS) + "."),
    ("checkpoint_epoch,loss_ratio_b16,loss_ratio_b32,critical_batch_size\n0.5,1.0,1.04,12.5\n",
     "line 2: critical_batch_size '12.5' is not what `measure` writes there"),
    ("checkpoint_epoch,loss_ratio_b16,loss_ratio_b32,critical_batch_size\n0.5,1.0,1.04,64\n",
     "line 2: critical_batch_size 64 is none of the table's batch sizes [16, 32]"),
], ids=["the_branches_csv", "a_fractional_cbs", "a_cbs_off_the_grid"])
def test_warmup_refuses_a_cbs_file_that_is_not_a_measure_table(tmp_path, capsys, monkeypatch, table, message):
  """E.g. the `<out>_branches.csv` beside the table: a KeyError traceback, a bare int() message before."""
  monkeypatch.setattr(warmup.train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  path = tmp_path / "cbs_branches.csv"
  path.write_text(table)
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["warmup", "--config", f"{TINY}:epochs=1", "--cbs", str(path), "--out", str(tmp_path / "out"),
              "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert f"{path} {message}" in err and "Traceback" not in err
  with pytest.raises(ValueError, match="measure` table"):
    measure.read_cbs_curve(path, tolerance=0.05)


def test_the_budget_is_a_whole_number_of_every_batch_or_the_grid_is_refused():
  """Rounded to the largest batch only, 128 examples gave the B=24 branch 5 updates (120 examples), the others 128."""
  config = grid.load_config(REFERENCE)
  assert grid.make_grid(config, (0.0,), (16, 24, 32), 0.5, 0.05, (1.0,), 256).budget_examples == 96
  assert grid.make_grid(config, (0.0,), (16, 32, 64), 0.5, 0.05, (1.0,), 256).budget_examples == 128
  with pytest.raises(ValueError) as error:
    grid.make_grid(config, (0.0,), (16, 48, 80), 0.25, 0.05, (1.0,), 256)
  assert ("--budget_epochs 0.25 (64 examples) holds no whole number of every batch size [16, 48, 80] (their least "
          "common multiple is 240 examples, 0.9375 epochs)") in str(error.value)


class _SavedCheckpoints:
  """Stands in for the reference run's `Checkpointer` in `branches.branch_points`: steps 24 and 32 at epochs
  1.5 and 2 of B=16 on 256 examples (0.0625 epoch a step), as a run that kept 2 checkpoints leaves them."""
  SAVED = {24: 1.5, 32: 2.0}

  def __init__(self, directory, max_to_keep):
    del directory, max_to_keep

  def all_steps(self):
    return sorted(self.SAVED, reverse=True)

  def read_meta_verified(self, step):
    return {"epoch": self.SAVED[step]}

  def close(self):
    pass


def test_a_branch_starts_at_the_checkpoint_of_its_epoch_never_a_later_one(tmp_path, monkeypatch):
  """With keep_checkpoints=2 the branches of epochs 0.5 and 1 started from epoch 1.5 under their own epoch's name."""
  monkeypatch.setattr(branches, "Checkpointer", _SavedCheckpoints)
  assert branches.branch_points(tmp_path, (0.0, 1.5, 2.0), 0.0625) == [
      branches.BranchPoint(0.0, None), branches.BranchPoint(1.5, 24), branches.BranchPoint(2.0, 32)]
  with pytest.raises(ValueError) as error:
    branches.branch_points(tmp_path, (0.0, 0.5, 1.0, 2.0), 0.0625)
  message = str(error.value)
  assert message.startswith(f"{tmp_path} has no checkpoint at epochs 0.5, 1 (within a step, 0.0625 epochs, after "
                            "each): it saved epochs 1.5, 2.")
  assert "keeps config.keep_checkpoints of them; `measure`'s own reference run keeps them all" in message
  with pytest.raises(ValueError, match="has no checkpoint at epochs 3: the reference run has not run that far "
                                       r"\(it saved epochs 1.5, 2\); train it further."):
    branches.branch_points(tmp_path, (1.5, 3.0), 0.0625)


@pytest.mark.parametrize("command, choices", [
    (["measure", "--config", REFERENCE, "--checkpoints", "0,0.5", "--batch_sizes", "16,32"],
     "measure chooses each branch's LR and the critical batch size"),
    (["warmup", "--config", f"{TINY}:epochs=1", "--cbs", "TABLE"],
     "warmup takes its target, the baseline's final quality, and the updates to it"),
], ids=["measure", "warmup"])
def test_measure_and_warmup_refuse_the_test_split_unless_allowed(tmp_path, capsys, monkeypatch, command, choices):
  """The tiny config, as MNIST's, evaluates on the test split unless told otherwise: the LR, the CBS and the warm-up's
  target were chosen on it."""
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  table = tmp_path / "cbs.csv"
  table.write_text("checkpoint_epoch,loss_ratio_b16,loss_ratio_b32,critical_batch_size\n0.5,1.0,1.04,32\n")
  command = [str(table) if word == "TABLE" else word for word in command]
  with pytest.raises(SystemExit) as exit_info:
    cli.main([*command, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == (
      f"{choices} on the evaluation split, which is the test split here (data_options.eval_split of --config "
      f"{command[2]}): pass --overrides data_options.eval_split=validation (valid for PTB) to choose on data held "
      "out of training, or --allow_test_split to use the test split all the same.\n")
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, messages", [
    (["--budget_epochs", "1.0"],
     ["cbs_branches.csv holds branches of another measurement (budget: 128 examples a branch there, 256 now): give "
      "another --out, or delete"]),
    (["--overrides", "data_options.eval_split=validation lr.base=0.5"],
     ["runs/reference holds a finished run of another recipe (lr.base: 0.05 there, 0.5 now): delete that directory "
      "to train this run, or choose another --workdir.",
      "cbs_branches.csv holds branches of another measurement (lr.base: 0.05 there, 0.5 now)"]),
    (["--overrides", "data_options.eval_split=validation seed=1", "--workdir", "OTHER"],
     ["cbs_branches.csv holds branches of another measurement (seed: 0 there, 1 now)"]),
], ids=["another_budget", "another_lr", "another_seed_in_a_new_workdir"])
def test_measure_refuses_a_reference_run_or_branches_of_another_measurement(measured, tmp_path, capsys, monkeypatch,
                                                                             flags, messages):
  """It read them back: "6 recorded, 0 to train" under a budget of 256, branches restored from checkpoints of LR 0.05
  under LR 0.5, a CSV of two seeds."""
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  monkeypatch.setattr(branches.BranchTrainer, "train", lambda *a, **k: pytest.fail("trained a branch"))
  before = {path.name: path.read_bytes() for path in measured.glob("cbs*")}
  with pytest.raises(SystemExit) as exit_info:
    _measure(measured, *[str(tmp_path / "runs") if flag == "OTHER" else flag for flag in flags])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert all(f"{measured}/{message}" in err for message in messages), err
  assert {path.name: path.read_bytes() for path in measured.glob("cbs*")} == before
  assert not (tmp_path / "runs").exists()


def test_a_branch_of_another_recipe_is_never_added_to_the_recorded_ones(tmp_path):
  """A second process of another seed that passed the check before the first recorded anything."""
  config = grid.load_config(REFERENCE)
  other = grid.load_config(REFERENCE, ["seed=1"])
  branch = branches.Branch(0.0, 0.0, 0, 16, 1.0, 0.1, 8, 128, "test", 1.0, "accuracy", 0.9, 1.0, "1x cpu")
  branches.record_branch(branch, tmp_path / "cbs", tmp_path, config, 128)
  with pytest.raises(ValueError, match=r"e0_b32_lr1 is not recorded: .* holds branches of another measurement "
                                       r"\(seed: 0 there, 1 now\)"):
    branches.record_branch(dataclasses.replace(branch, batch_size=32), tmp_path / "cbs", tmp_path, other, 128)
  assert branches.read_branches(tmp_path / "cbs_branches.csv") == [branch]
  assert branches.recorded_branches_problem(tmp_path / "cbs", config, 128) == ""
  (tmp_path / "cbs_branches.json").unlink()  # a CSV of before the record: what it holds is unknown
  assert branches.recorded_branches_problem(tmp_path / "cbs", config, 128) == (
      f"{tmp_path}/cbs_branches.csv holds branches without {tmp_path}/cbs_branches.json, the budget and reference "
      "recipe they were trained with (written before `measure` recorded them), so they cannot be checked against "
      f"this measurement: give another --out, or delete {tmp_path}/cbs_branches.csv to train the branches again.")
