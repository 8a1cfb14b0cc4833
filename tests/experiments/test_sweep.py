"""The batch-size sweep on a tiny synthetic config: outputs, recipes per rule, skipping, bad input."""

import csv
import dataclasses
import json
import math
import pathlib
import shutil

import jax
import pytest

from experiments import runner
from experiments import sweep
from experiments import sweep_table
from experiments.runner import RunRow
from lbjax import train

TINY_CONFIG = str(pathlib.Path(__file__).with_name("tiny_sweep_config.py"))


def _spec(tmp_path, **overrides):
  fields = dict(config=TINY_CONFIG, rules=("none", "linear"), batch_sizes=(32, 64),
                out=str(tmp_path / "results" / "tiny"), workdir=str(tmp_path / "runs"), title="tiny")
  fields.update(overrides)
  return sweep.SweepSpec(**fields)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("sweep")
  spec = _spec(tmp_path)
  rows = sweep.run_sweep(spec)
  return spec, rows


def test_csv_has_one_row_per_point_with_the_scaled_recipe(finished_sweep):
  spec, _ = finished_sweep
  with open(pathlib.Path(spec.out).with_suffix(".csv"), newline="") as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0])[:3] == ["rule", "batch_size", "test_accuracy"]
  points = {(r["rule"], int(r["batch_size"])): r for r in rows}
  assert set(points) == {("none", 32), ("none", 64), ("linear", 32), ("linear", 64)}
  for r in rows:
    assert 0.0 <= float(r["test_accuracy"]) <= 1.0
    assert r["status"] == "done"
    assert r["device"] == f"{jax.device_count()}x cpu"
  # Linear scaling doubles the LR from the B=32 baseline at B=64; no rule changes B=32.
  assert float(points[("linear", 64)]["learning_rate"]) == pytest.approx(0.1)
  assert float(points[("none", 64)]["learning_rate"]) == pytest.approx(0.05)
  assert float(points[("linear", 32)]["learning_rate"]) == pytest.approx(0.05)
  # 256 examples: 8 updates at B=32, 4 at B=64 (one epoch).
  assert int(points[("none", 32)]["steps"]) == 8 and int(points[("linear", 64)]["steps"]) == 4


def test_identical_recipes_run_once(finished_sweep):
  spec, rows = finished_sweep
  by_point = {(r.name, r.batch_size): r for r in rows}
  assert by_point[("linear", 32)].same_as == "none"
  assert by_point[("linear", 32)].value == by_point[("none", 32)].value
  assert not (pathlib.Path(spec.workdir) / "linear_b32").exists()
  assert by_point[("linear", 64)].same_as == ""


def test_markdown_and_plot(finished_sweep):
  spec, rows = finished_sweep
  out = pathlib.Path(spec.out)
  table = out.with_suffix(".md").read_text()
  header = [line for line in table.splitlines() if line.startswith("| batch size")]
  assert header == ["| batch size | none | linear |"]
  by_point = {(r.name, r.batch_size): r for r in rows}
  assert f"| 64 | {100 * by_point[('none', 64)].value:.2f}% | {100 * by_point[('linear', 64)].value:.2f}% |" \
      in table
  assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finished_points_are_skipped(finished_sweep, monkeypatch):
  spec, rows = finished_sweep
  def no_training(*args, **kwargs):
    raise AssertionError("a finished point was trained again")
  monkeypatch.setattr(sweep.train, "train_and_evaluate", no_training)
  again = {(r.name, r.batch_size): r for r in sweep.run_sweep(spec)}
  assert set(again) == {(r.name, r.batch_size) for r in rows}
  for r in rows:  # the CSV keeps 6 significant digits
    assert again[(r.name, r.batch_size)].value == pytest.approx(r.value, rel=1e-5)
    assert again[(r.name, r.batch_size)].steps == r.steps


def test_csv_round_trip_keeps_diverged_points(tmp_path):
  rows = [RunRow("linear", 0, "test", "accuracy", float("nan"), "diverged", 5.12, 0.0, 0.4, 3, 1.0, batch_size=8192),
          RunRow("legw", 0, "test", "accuracy", 0.98, "done", 0.64, 10.0, 25.0, 184, 60.0, batch_size=8192)]
  path = tmp_path / "rows.csv"
  sweep_table.write_csv(rows, path, "accuracy")
  back = {r.name: r for r in sweep_table.read_csv(path, "accuracy")}
  assert math.isnan(back["linear"].value) and back["linear"].status == "diverged"
  assert back["legw"].value == 0.98 and back["legw"].warmup_epochs == 10.0
  assert "| 8192 | diverged | 98.00% |" in sweep_table.markdown_table(rows, "accuracy", "t")
  sweep_table.plot(rows, "accuracy", "t", tmp_path / "rows.png")


@pytest.mark.parametrize("overrides, message", [
    (dict(rules=("cubic",)), "unknown scaling rule"),
    (dict(batch_sizes=(0, 64)), "positive integers"),
    (dict(config="configs/missing.py"), "Config file configs/missing.py not found"),
    (dict(config="mnist_lstn"), "Did you mean 'mnist_lstm'"),
    (dict(variant="bacth=64"), "unknown variant key 'bacth'"),
    (dict(metric="bleu"), "metric must be"),
    (dict(variant="batch=64"), r"sets batch_size, which the experiment sets itself \(--batch_sizes\)"),
    (dict(variant="epochs=2,rule=legw"), r"sets scaling.rule, which the experiment sets itself \(--rules\)"),
    (dict(config=TINY_CONFIG + ":batch=64"), "sets batch_size, which the experiment sets itself"),
    (dict(max_device_batch=-1), "max_device_batch must be"),
    (dict(metric="perplexity"), "--metric accuracy"),
])
def test_bad_specs_are_rejected_before_training(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    sweep.run_sweep(_spec(tmp_path, **overrides))
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags, message", [
    (["--rules", "legw,sqr"], "unknown scaling rule(s) ['sqr']; choose from none, linear, sqrt, legw, goyal."),
    (["--batch_sizes", "0,-128"], "batch sizes must be positive integers, got [0, -128]."),
    (["--metric", "perplexity"], "trains on 'synthetic_mnist', whose test metric is 'accuracy', but the sweep "
                                 "measures 'perplexity'; pass --metric accuracy."),
])
def test_cli_refuses_a_bad_sweep_before_training(tmp_path, monkeypatch, capsys, flags, message):
  monkeypatch.setattr(sweep.train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  arguments = {"--config": TINY_CONFIG, "--rules": "none", "--batch_sizes": "32", "--out": str(tmp_path / "out"),
               "--workdir": str(tmp_path / "runs"), **dict(zip(flags[::2], flags[1::2]))}
  with pytest.raises(SystemExit) as exit_info:
    sweep.main([token for pair in arguments.items() for token in pair])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "python -m experiments.sweep: error: Invalid sweep:\n  - " in err
  assert message in err and "Traceback" not in err
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out.csv").exists()


def test_cli_parses_lists(tmp_path):
  with pytest.raises(SystemExit):
    sweep.main(["--config", TINY_CONFIG, "--rules", "none", "--batch_sizes", "32,abc", "--out", "x",
                "--workdir", "y"])


def test_lr_grid_picks_the_best_and_skips_finished_runs(tmp_path, monkeypatch, capsys):
  from experiments import lr_grid  # pylint: disable=g-import-not-at-top
  finals = lr_grid.run_grid(TINY_CONFIG, [0.05, 0.5], str(tmp_path / "runs"))
  best = lr_grid.write_outputs(finals, str(tmp_path / "grid"), "accuracy", "grid")
  assert best == max(finals, key=lambda lr: finals[lr]["accuracy"])
  with open(tmp_path / "grid.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [r["learning_rate"] for r in rows] == ["0.05", "0.5"] and all(r["steps"] == "8" for r in rows)
  assert f"| {best:g} (best) |" in (tmp_path / "grid.md").read_text()
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a: pytest.fail("retrained"))
  assert lr_grid.run_grid(TINY_CONFIG, [0.05, 0.5], str(tmp_path / "runs")) == finals
  with pytest.raises(ValueError, match="positive numbers"):
    lr_grid.run_grid(TINY_CONFIG, [0.0], str(tmp_path / "runs"))
  assert lr_grid.run_grid(TINY_CONFIG, [0.05, 0.2], str(tmp_path / "runs"), dry_run=True) == {}
  assert capsys.readouterr().out.splitlines()[-2:] == [
      f"[lr_grid]   lr=0.05: batch 32, peak LR 0.05, warm-up 0 epochs, 1 epochs, test split; "
      f"{tmp_path / 'runs' / 'lr_0.05'}: ended there: read back",
      f"[lr_grid]   lr=0.2: batch 32, peak LR 0.2, warm-up 0 epochs, 1 epochs, test split; "
      f"{tmp_path / 'runs' / 'lr_0.2'}: new"]
  assert not (tmp_path / "runs" / "lr_0.2").exists()


def test_lr_grid_refuses_a_variant_that_sets_the_learning_rate(tmp_path, capsys):
  from experiments import lr_grid  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as exit_info:
    lr_grid.main(["--config", TINY_CONFIG, "--variant", "lr=0.3", "--lrs", "0.05,0.5", "--out",
                  str(tmp_path / "grid"), "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2 and "sets lr.base, which the experiment sets itself (--lrs): drop it there." \
      in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()


def test_lr_grid_refuses_a_non_positive_learning_rate_before_training(tmp_path, monkeypatch, capsys):
  from experiments import lr_grid  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(SystemExit) as exit_info:
    lr_grid.main(["--config", TINY_CONFIG, "--lrs", "0.1,-0.5", "--out", str(tmp_path / "grid"),
                  "--workdir", str(tmp_path / "runs")])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "python -m experiments.lr_grid: error: learning rates must be a non-empty " \
      "list of positive numbers, got [0.1, -0.5]." in err
  assert not (tmp_path / "runs").exists() and not (tmp_path / "grid.csv").exists()


def test_zoom_panel_only_when_collapsed_runs_flatten_the_good_ones():
  assert sweep_table._zoom_limits([98.96, 98.25, 10.28], "accuracy") == pytest.approx((95.96, 99.46))
  assert sweep_table._zoom_limits([98.96, 98.25, 97.1], "accuracy") is None
  assert sweep_table._zoom_limits([118.9, 157.1, 18599.0], "perplexity") == pytest.approx((115.333, 178.35))
  assert sweep_table._zoom_limits([118.9, 157.1], "perplexity") is None


def test_points_of_a_packaged_config_are_its_variants(tmp_path):
  from lbjax import config_files  # pylint: disable=g-import-not-at-top
  spec = _spec(tmp_path, config="mnist_lstm:epochs=5", variant="seed=3")
  config = sweep.point_config(spec, "legw", 512)
  expected = config_files.load("mnist_lstm:epochs=5,seed=3,batch=512,rule=legw").config
  assert config.to_json() == expected.to_json()
  assert (config.batch_size, config.scaling.rule, config.num_epochs, config.seed) == (512, "legw", 5.0, 3)
  assert (config.lr.warmup, config.lr.warmup_epochs) == ("linear_warmup", 0.15625)  # finalize saw the rule


def test_config_spec_appends_variant_keys():
  from experiments import config_spec, variant_fields  # pylint: disable=g-import-not-at-top
  assert config_spec("mnist_lstm") == "mnist_lstm"
  assert config_spec("mnist_lstm", "", "batch=8") == "mnist_lstm:batch=8"
  assert config_spec("mnist_lstm:epochs=5", "batch=8", "") == "mnist_lstm:epochs=5,batch=8"
  assert variant_fields("ptb_lstm:batch=640,recipe=zaremba") == {"batch_size", "recipe"}
  assert variant_fields(TINY_CONFIG) == set()


def _configs_trained(monkeypatch, runner_module) -> dict:
  """Replaces `runner_module.run_once` by a recorder: the returned dict fills with each run folder's config."""
  trained = {}

  def run_once(config, run_dir, *, name, prefix):
    del prefix
    trained[pathlib.Path(run_dir).name] = config
    return RunRow(name, config.seed, "test", "accuracy", 0.9, "done", 0.1, 0.0, 5.0, 10, 1.0)

  monkeypatch.setattr(runner_module, "run_once", run_once)
  return trained


def test_batch_schedule_loads_each_realisation(monkeypatch, tmp_path):
  from experiments import batch_schedule  # pylint: disable=g-import-not-at-top
  trained = _configs_trained(monkeypatch, batch_schedule.runner)
  batch_schedule.run_schedules("batch_schedule_mnist", str(tmp_path), variant="epochs=5", max_device_batch=128,
                               seeds=(0, 3))
  assert set(trained) == {f"{s}_seed{k}" for s in batch_schedule.SCHEDULES for k in (0, 3)}
  decay = trained["decay_lr_seed0"]
  assert decay.lr.decay == "multistep_decay" and decay.lr.boundaries == (2.0, 3.0, 4.0)
  assert trained["grow_batch_seed3"].batch_sizes == (128, 640, 3200, 16000)
  assert all(c.num_epochs == 5.0 and c.max_device_batch == 128 for c in trained.values())
  assert {c.seed for name, c in trained.items() if name.endswith("_seed3")} == {3}
  with pytest.raises(ValueError, match="must be a non-empty subset"):
    batch_schedule.run_schedules("batch_schedule_mnist", str(tmp_path), ("grow",))
  with pytest.raises(ValueError, match="must be distinct integers"):
    batch_schedule.run_schedules("batch_schedule_mnist", str(tmp_path), seeds=(1, 1))


def test_batch_schedule_dry_run_prints_each_realisation_and_trains_nothing(monkeypatch, tmp_path, capsys):
  from experiments import batch_schedule  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  batch_schedule.main(["--config", "batch_schedule_mnist", "--variant", "epochs=5", "--seeds", "0",
                       "--schedules", "decay_lr,grow_batch", "--out", str(tmp_path / "out" / "bs"),
                       "--workdir", str(tmp_path / "runs"), "--dry-run"])
  assert capsys.readouterr().out.splitlines() == [
      f"[batch_schedule]   decay_lr seed=0: batch 128, peak LR 0.08, warm-up 0 epochs, 5 epochs, test split; "
      f"{tmp_path / 'runs' / 'decay_lr_seed0'}: new",
      f"[batch_schedule]   grow_batch seed=0: batch [128, 640, 3200, 16000], peak LR 0.08, warm-up 0 epochs, 5 epochs, "
      f"test split; {tmp_path / 'runs' / 'grow_batch_seed0'}: new"]
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_batch_schedule_gives_a_variant_key_only_to_the_realisations_it_applies_to(monkeypatch, tmp_path):
  """`max_batch` is hybrid's B_max: the other realisations train without it; given to none of them it is refused."""
  from experiments import batch_schedule  # pylint: disable=g-import-not-at-top
  trained = _configs_trained(monkeypatch, batch_schedule.runner)
  batch_schedule.run_schedules("batch_schedule_mnist", str(tmp_path), ("grow_batch", "hybrid"),
                               variant="max_batch=16000")
  assert trained["hybrid_seed0"].batch_sizes == (128, 640, 3200, 16000)
  assert trained["grow_batch_seed0"].batch_sizes == (128, 640, 3200, 16000)
  with pytest.raises(train.ConfigError, match=r"variant key max_batch applies to none of the experiment's runs: "
                                              r"variant max_batch=16000 applies only with schedule=hybrid, and "
                                              r"schedule is grow_batch"):
    batch_schedule.run_schedules("batch_schedule_mnist", str(tmp_path), ("grow_batch",), variant="max_batch=16000")


def test_batch_schedule_tables_every_seed_and_their_mean_and_spread(tmp_path):
  """The table: per realisation its batch sizes, updates, mean ± sample sd of the final accuracy over the
  seeds that finished (a seed still running is counted out) and each seed's; the CSV a row per evaluation."""
  from experiments import batch_schedule  # pylint: disable=g-import-not-at-top
  finals = {("decay_lr", 0): 0.98, ("decay_lr", 1): 0.99, ("grow_batch", 0): 0.97, ("hybrid", 0): 0.1}
  for (schedule, seed), accuracy in finals.items():
    directory = runner.run_dir(str(tmp_path), schedule, seed)
    directory.mkdir()
    sizes = (128,) if schedule == "decay_lr" else (128, 640)
    loss = 50.0 if schedule == "hybrid" else 0.1  # hybrid: far above a uniform guess's ln 10, diverged
    records = [{"kind": "compile", "step": 5 * i, "batch_size": size} for i, size in enumerate(sizes)] + [
        {"kind": "eval", "step": 5, "epoch": 1.0, "accuracy": accuracy - 0.1, "loss": loss},
        {"kind": "eval", "step": 10, "epoch": 2.0, "accuracy": accuracy, "loss": loss, "final": True}]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  running = runner.run_dir(str(tmp_path), "grow_batch", 1)
  running.mkdir()
  (running / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 5, "epoch": 1.0, "accuracy": 0.5})
                                         + "\n")
  out = tmp_path / "out"
  batch_schedule.write_outputs(str(tmp_path), str(out), seeds=(0, 1), diverged_above=2.303 + 1)
  table = out.with_suffix(".md").read_text()
  assert "| decaying learning rate | 128 | 10 | 98.50 ± 0.71% | 2/2 | 98.00% (seed 0), 99.00% (seed 1) |" in table
  assert "| increasing batch size | 128 → 640 | 10 | 97.00% | 1/2 | 97.00% (seed 0) |" in table
  assert "| hybrid (batch up to B_max, then LR decay) | | | diverged | 0/2 | diverged (seed 0) |" in table
  with open(out.with_suffix(".csv")) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2 * 4 + 1 and {r["seed"] for r in rows} == {"0", "1"}
  assert out.with_suffix(".png").is_file()


def test_batch_schedule_refuses_repeated_seeds_before_training(monkeypatch, tmp_path, capsys):
  from experiments import batch_schedule  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(batch_schedule.runner, "run_once", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(SystemExit) as exit_info:
    batch_schedule.main(["--config", "batch_schedule_mnist", "--seeds", "1,1", "--out", str(tmp_path / "out"),
                         "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2 and "seeds [1, 1] must be distinct integers" in capsys.readouterr().err


def test_batch_schedule_refuses_a_variant_that_sets_the_schedule(monkeypatch, tmp_path, capsys):
  from experiments import batch_schedule  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(batch_schedule.runner, "run_once", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(SystemExit) as exit_info:
    batch_schedule.main(["--config", "batch_schedule_mnist:schedule=hybrid", "--out", str(tmp_path / "out"),
                         "--workdir", str(tmp_path / "runs")])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "the variant of 'batch_schedule_mnist:schedule=hybrid' sets schedule, which " \
      "the experiment sets itself (--schedules): drop it there." in err
  with pytest.raises(SystemExit):
    batch_schedule.main(["--config", "batch_schedule_mnist:seed=1", "--out", str(tmp_path / "out"),
                         "--workdir", str(tmp_path / "runs")])
  assert "sets seed, which the experiment sets itself (--seeds)" in capsys.readouterr().err


def test_seeds_run_each_point_once_per_seed_and_report_mean_and_spread(tmp_path, capsys):
  spec = _spec(tmp_path, rules=("none",), batch_sizes=(64,), seeds=(0, 1))
  rows = sweep.run_sweep(spec)
  assert sorted((r.seed, r.status) for r in rows) == [(0, "done"), (1, "done")]
  assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["none_b64_s0", "none_b64_s1"]
  assert "2 to run" in capsys.readouterr().out
  metrics = [r.value for r in rows]
  point = sweep_table.summarize(rows)[("none", 64)]
  assert point.finished == 2 and point.mean == pytest.approx(sum(metrics) / 2)
  assert point.std == pytest.approx(abs(metrics[0] - metrics[1]) / 2 ** 0.5)
  table = pathlib.Path(spec.out).with_suffix(".md").read_text()
  assert f"| 64 | {100 * point.mean:.2f}% ± {100 * point.std:.2f} (2 seeds) |" in table
  again = sweep.run_sweep(dataclasses.replace(spec, reference=str(pathlib.Path(spec.out).with_suffix(".csv"))))
  assert len(again) == 2
  out = capsys.readouterr().out
  assert "0 to run" in out and "| none | 64 |" in out and "within spread" in out


def test_seeds_given_twice_are_refused(tmp_path):
  with pytest.raises(ValueError, match=r"sets seed, which the experiment sets itself \(--seeds\)"):
    sweep.run_sweep(_spec(tmp_path, config="mnist_lstm", variant="seed=1", seeds=(0, 1)))
  with pytest.raises(ValueError, match="distinct integers"):
    sweep.run_sweep(_spec(tmp_path, seeds=(1, 1)))
  with pytest.raises(ValueError, match="reference .* not found"):
    sweep.run_sweep(_spec(tmp_path, reference=str(tmp_path / "none.csv")))


def test_compare_verdicts(tmp_path):
  from experiments import compare  # pylint: disable=g-import-not-at-top
  def rows(rule, values):
    return [RunRow(rule, s, "test", "accuracy", v, "done", 0.08, 0.0, 25.0, 10, 1.0, batch_size=128)
            for s, v in enumerate(values)]
  reference = rows("legw", [0.988, 0.989, 0.990]) + rows("none", [0.9887])
  sweep_table.write_csv(reference, tmp_path / "ref.csv", "accuracy")
  sweep_table.write_csv(rows("legw", [0.9885, 0.9889, 0.9893]) + rows("none", [0.95]), tmp_path / "same.csv",
                        "accuracy")
  sweep_table.write_csv(rows("legw", [0.980, 0.981, 0.982]), tmp_path / "worse.csv", "accuracy")
  assert compare.main([str(tmp_path / "same.csv"), str(tmp_path / "ref.csv")]) == 0
  assert compare.main([str(tmp_path / "same.csv"), str(tmp_path / "ref.csv"), "--tolerance", "0.003"]) == 1
  assert compare.main([str(tmp_path / "worse.csv"), str(tmp_path / "ref.csv")]) == 1
  table = compare.comparison_table(rows("legw", [0.980, 0.981, 0.982]), reference, "accuracy")
  assert "| legw | 128 | 98.10% ± 0.10 (3 seeds) | 98.90% ± 0.10 (3 seeds) | -0.80 | differs |" in table
  assert "| none | 128 | – | 98.87% | – | not run |" in table
  assert compare.main([str(tmp_path / "absent.csv"), str(tmp_path / "ref.csv")]) == 2


def _failed(rule, statuses):
  return [RunRow(rule, s, "test", "accuracy", math.nan, status, 0.08, 0.0, 3.0, 10, 1.0, batch_size=128)
          for s, status in enumerate(statuses)]


def test_compare_fails_a_point_whose_seeds_all_failed_on_one_side_only(tmp_path):
  """A reproduction that diverged where the reference finished (or finished where it diverged) differs; both
  failing agree; a point the reproduction has not run yet is listed and passes (a partial reproduction)."""
  from experiments import compare  # pylint: disable=g-import-not-at-top
  finished = [RunRow("legw", s, "test", "accuracy", v, "done", 0.08, 0.0, 25.0, 10, 1.0, batch_size=128)
              for s, v in enumerate([0.98, 0.981])]
  sweep_table.write_csv(finished, tmp_path / "ref.csv", "accuracy")
  sweep_table.write_csv(_failed("legw", ["diverged", "diverged"]), tmp_path / "new.csv", "accuracy")
  assert compare.main([str(tmp_path / "new.csv"), str(tmp_path / "ref.csv")]) == 1
  assert compare.main([str(tmp_path / "ref.csv"), str(tmp_path / "new.csv")]) == 1
  assert compare.main([str(tmp_path / "new.csv"), str(tmp_path / "new.csv")]) == 0
  table = compare.comparison_table(_failed("legw", ["diverged"]), finished, "accuracy")
  assert table.splitlines()[-1] == "| legw | 128 | diverged | 98.05% ± 0.07 (2 seeds) | – | failed here |"
  table = compare.comparison_table(finished, _failed("legw", ["diverged"]), "accuracy")
  assert table.splitlines()[-1].endswith("| finished here, failed in the reference |")
  assert compare.comparison_table(_failed("legw", ["diverged"]), _failed("legw", ["diverged"]),
                                  "accuracy").endswith("| both failed |")


def test_compare_refuses_a_negative_tolerance_and_advises_on_a_csv_of_another_metric(tmp_path, capsys):
  from experiments import compare  # pylint: disable=g-import-not-at-top
  rows = [RunRow("legw", 0, "test", "perplexity", 120.0, "done", 0.8, 0.0, 5.0, 10, 1.0, batch_size=640)]
  sweep_table.write_csv(rows, tmp_path / "ptb.csv", "perplexity")
  with pytest.raises(SystemExit) as exit_info:
    compare.main([str(tmp_path / "ptb.csv"), str(tmp_path / "ptb.csv"), "--metric", "perplexity", "--tolerance", "-1"])
  assert exit_info.value.code == 2 and "python -m experiments.compare: error: --tolerance must be >= 0 (0: no check " \
      "of single-seed points), got -1" in capsys.readouterr().err
  assert compare.main([str(tmp_path / "ptb.csv"), str(tmp_path / "ptb.csv")]) == 2
  err = capsys.readouterr().err
  assert err == (f"error: {tmp_path / 'ptb.csv'} lacks the column(s) ['test_accuracy']: it was not written by a sweep "
                 "measuring 'accuracy'; compare CSVs written by `python -m experiments.sweep` (for sweeps that "
                 "measured perplexity, add --metric perplexity).\n")
  assert "--out" not in err


def test_a_sweep_refuses_recorded_rows_or_a_reference_of_another_metric(tmp_path):
  rows = [RunRow("none", 0, "test", "perplexity", 120.0, "done", 0.8, 0.0, 5.0, 10, 1.0, batch_size=32)]
  sweep_table.write_csv(rows, tmp_path / "ptb.csv", "perplexity")
  with pytest.raises(ValueError, match=r"ptb.csv lacks the column\(s\) \['test_accuracy'\]: .*; pass a --reference "
                                       "of a sweep that measured accuracy"):
    sweep.run_sweep(_spec(tmp_path, reference=str(tmp_path / "ptb.csv")))
  (tmp_path / "results").mkdir()
  sweep_table.write_csv(rows, tmp_path / "results" / "tiny.csv", "perplexity")
  with pytest.raises(ValueError, match="tiny.csv lacks the column.*; move it away or choose another --out"):
    sweep.run_sweep(_spec(tmp_path))
  assert not (tmp_path / "runs").exists()


def test_old_csvs_without_a_seed_column_read_as_the_default_seed(tmp_path):
  path = tmp_path / "old.csv"
  path.write_text("rule,batch_size,test_accuracy,status,learning_rate,warmup_epochs,epochs,steps,seconds,same_as\n"
                  "legw,128,0.9896,done,0.08,0.15625,25,11719,379,\n")
  [row] = sweep_table.read_csv(path, "accuracy")
  assert row.seed == sweep_table.DEFAULT_SEED and row.value == 0.9896
  assert row.device == "" and "| not recorded |" in sweep_table.markdown_table([row], "accuracy", "t")


def test_dry_run_prints_each_point_recipe_and_whether_it_is_new_resumed_or_read_back(finished_sweep, tmp_path,
                                                                                    capsys, monkeypatch):
  """--dry-run checks the points and prints what each would train, or whose row it copies (linear scaling at the
  baseline batch is the baseline's recipe); it trains nothing and writes nothing."""
  spec, _ = finished_sweep
  resumed = pathlib.Path(spec.workdir) / "linear_b64"
  interrupted = tmp_path / "runs" / "linear_b64"
  shutil.copytree(resumed, interrupted)
  records = (interrupted / "metrics.jsonl").read_text().splitlines()
  (interrupted / "metrics.jsonl").write_text("".join(f"{r}\n" for r in records if '"final": true' not in r))
  shutil.copytree(pathlib.Path(spec.workdir) / "none_b32", tmp_path / "runs" / "none_b32")
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  out = tmp_path / "results" / "dry"
  assert sweep.main(["--config", TINY_CONFIG, "--rules", "none,linear", "--batch_sizes", "32,64", "--out", str(out),
                     "--workdir", str(tmp_path / "runs"), "--dry-run"]) == []
  lines = capsys.readouterr().out.splitlines()
  steps = sorted(int(p.name) for p in (interrupted / "checkpoints").iterdir() if p.name.isdigit())
  assert lines[0] == f"[sweep] 4 runs (2 rules x 2 batch sizes x 1 seeds): 0 recorded in {out}.csv (skipped), 4 to run."
  assert lines[1:] == [
      f"[sweep]   rule=none batch=32 seed=0: batch 32, peak LR 0.05, warm-up 0 epochs, 1 epochs, test split; "
      f"{tmp_path / 'runs' / 'none_b32'}: ended there: read back",
      "[sweep]   rule=linear batch=32 seed=0: the recipe of rule=none at this batch: its row is copied (same_as), "
      "not trained",
      f"[sweep]   rule=none batch=64 seed=0: batch 64, peak LR 0.05, warm-up 0 epochs, 1 epochs, test split; "
      f"{tmp_path / 'runs' / 'none_b64'}: new",
      f"[sweep]   rule=linear batch=64 seed=0: batch 64, peak LR 0.1, warm-up 0 epochs, 1 epochs, test split; "
      f"{interrupted}: resumes at step {steps[-1]}"]
  assert not out.parent.exists() and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["linear_b64",
                                                                                               "none_b32"]


def test_a_point_that_cannot_run_is_refused_naming_it_before_the_first_point_trains(tmp_path, monkeypatch):
  """LEGW's warm-up at 16x the batch (16 x 0.125 epochs) is longer than the one epoch trained."""
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(train.ConfigError, match=r"(?s)Invalid sweep:\n  - rule=legw batch=512: .*warm-up"):
    sweep.run_sweep(_spec(tmp_path, rules=("none", "legw"), batch_sizes=(32, 512)))
  assert not (tmp_path / "runs").exists()


def test_a_sweep_on_the_validation_split_says_so_and_is_compared_only_with_one(tmp_path, capsys):
  """Rows of the validation split: the CSV's column is `validation_accuracy` and the page says validation (it said
  test); read back they are the validation split's. A sweep, --out or --reference of another split is refused,
  and so is a comparison across splits."""
  from experiments import compare  # pylint: disable=g-import-not-at-top
  rows = [RunRow("none", 0, "validation", "accuracy", 0.9, "done", 0.05, 0.0, 1.0, 8, 1.0, batch_size=32)]
  sweep_table.write_csv(rows, tmp_path / "validation.csv", "accuracy")
  assert (tmp_path / "validation.csv").read_text().startswith("rule,batch_size,validation_accuracy,")
  assert sweep_table.read_csv(tmp_path / "validation.csv", "accuracy") == rows
  page = sweep_table.markdown_table(rows, "accuracy", "t")
  assert "Final validation accuracy by batch size" in page and "| validation accuracy |" in page
  with pytest.raises(ValueError, match="different splits"):
    sweep_table.write_csv(rows + [dataclasses.replace(rows[0], split="test", seed=1)], tmp_path / "x.csv", "accuracy")
  with pytest.raises(ValueError, match=r"validation.csv \(the reference\) holds validation accuracy, but this sweep "
                                       "evaluates the test split"):
    sweep.run_sweep(_spec(tmp_path, reference=str(tmp_path / "validation.csv")))
  sweep_table.write_csv([dataclasses.replace(rows[0], split="test")], tmp_path / "test.csv", "accuracy")
  assert compare.main([str(tmp_path / "validation.csv"), str(tmp_path / "test.csv")]) == 2
  assert "holds validation accuracy" in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()
