"""The diagnostics experiments on tiny synthetic runs: MCLR vs LARS, L(x, g) per batch size, noise scale."""

import csv
import math
import pathlib

import numpy as np
import pytest

from experiments import lipschitz
from experiments import mclr_vs_lars
from experiments import noise_scale
from lbjax import train

TINY_CONFIG = str(pathlib.Path(__file__).with_name("tiny_sweep_config.py"))  # 256 synthetic digits, B=32


def _read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _comparison_spec(tmp_path, **overrides):
  fields = dict(config=TINY_CONFIG, learning_rates={"lars": (1.0,), "mclr": (0.001, 0.003)},
                out=str(tmp_path / "results" / "mclr_vs_lars"), workdir=str(tmp_path / "runs"), batch_size=64,
                epochs=1.0, warmup_epochs=0.25, eval_every_epochs=0.5, log_every=1, title="tiny")
  fields.update(overrides)
  return mclr_vs_lars.ComparisonSpec(**fields)


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
  spec = _comparison_spec(tmp_path_factory.mktemp("mclr_vs_lars"))
  return spec, mclr_vs_lars.run_comparison(spec)


def test_comparison_csv_has_every_run_curve_and_one_selected_run_per_optimizer(comparison):
  spec, results = comparison
  rows = _read_csv(pathlib.Path(spec.out).with_suffix(".csv"))
  assert tuple(rows[0]) == mclr_vs_lars.CSV_COLUMNS
  runs = {(r["optimizer"], float(r["learning_rate"])) for r in rows}
  assert runs == {("lars", 1.0), ("mclr", 0.001), ("mclr", 0.003)}
  # 256 examples at B=64: 4 steps, one train point per step; evaluations at epochs 0.5 and 1 (final).
  lars_rows = [r for r in rows if r["optimizer"] == "lars"]
  assert [int(r["step"]) for r in lars_rows if r["split"] == "train"] == [1, 2, 3, 4]
  assert [float(r["epoch"]) for r in lars_rows if r["split"] == "test"] == [0.5, 1.0]
  for r in rows:
    assert 0.0 <= float(r["accuracy"]) <= 1.0 and math.isfinite(float(r["loss"]))
  selected = {(r["optimizer"], float(r["learning_rate"])) for r in rows if r["selected"] == "1"}
  best_mclr = min((r for r in results if r.optimizer == "mclr"), key=lambda r: r.final_train_loss)
  assert selected == {("lars", 1.0), ("mclr", best_mclr.learning_rate)}


def test_both_optimizers_share_the_schedule_and_differ_only_in_rate_and_scale(comparison):
  spec, _ = comparison
  lars = mclr_vs_lars.run_config(spec, "lars", 1.0)
  mclr = mclr_vs_lars.run_config(spec, "mclr", 0.003)
  assert (lars.optimizer.name, mclr.optimizer.name) == ("lars", "mclr")
  lars_lr, mclr_lr = train.learning_rate_schedule(lars), train.learning_rate_schedule(mclr)
  epochs = np.linspace(0.0, 1.0, 41)
  np.testing.assert_allclose([float(lars_lr(e)) for e in epochs],
                             [float(mclr_lr(e)) / 0.003 for e in epochs], rtol=1e-6, atol=1e-9)
  assert float(lars_lr(0.0)) == 0.0 and float(lars_lr(0.25)) == pytest.approx(1.0)  # warm-up to the peak
  assert float(lars_lr(1.0)) == pytest.approx(0.0, abs=1e-9)  # poly decay to 0
  assert lars.optimizer.to_dict() == {"name": "lars", "momentum": 0.9, "weight_decay": 0.0, "trust_coefficient": 0.001}
  assert mclr.optimizer.to_dict() == {"name": "mclr", "momentum": 0.9, "weight_decay": 0.0}  # mclr has no eta
  lars.optimizer = mclr.optimizer
  lars.lr.base = 0.003
  assert lars.to_json() == mclr.to_json()


def test_comparison_markdown_and_plot(comparison):
  spec, results = comparison
  out = pathlib.Path(spec.out)
  table = out.with_suffix(".md").read_text()
  assert table.startswith("# tiny")
  for r in results:
    assert f"| {r.optimizer} |" in table
  assert "**1**" in table  # the only LARS run is its selected one
  assert out.with_suffix(".png").stat().st_size > 1000


def test_comparison_skips_finished_runs(comparison):
  spec, results = comparison
  metrics = pathlib.Path(spec.workdir) / "lars_lr1" / "metrics.jsonl"
  before = metrics.stat().st_mtime_ns
  again = mclr_vs_lars.run_comparison(spec)
  assert metrics.stat().st_mtime_ns == before
  assert [r.final_test_accuracy for r in again] == [r.final_test_accuracy for r in results]


def test_comparison_rejects_bad_specs_before_training(tmp_path):
  with pytest.raises(ValueError, match="unknown optimizer"):
    mclr_vs_lars.check_spec(_comparison_spec(tmp_path, learning_rates={"lars": (1.0,), "mclr": (0.1,), "adam": (1.0,)}))
  with pytest.raises(ValueError, match="no learning rates for mclr"):
    mclr_vs_lars.check_spec(_comparison_spec(tmp_path, learning_rates={"lars": (1.0,)}))
  with pytest.raises(ValueError, match="warmup_epochs"):
    mclr_vs_lars.check_spec(_comparison_spec(tmp_path, warmup_epochs=1.0))
  assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def lipschitz_curves(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("lipschitz")
  spec = lipschitz.LipschitzSpec(config=TINY_CONFIG, batch_sizes=(32, 64), out=str(tmp_path / "lipschitz"),
                                 workdir=str(tmp_path / "runs"), steps=4, every=2, lipschitz_batch_size=32,
                                 title="tiny L")
  return spec, lipschitz.run_experiment(spec)


def test_comparison_refuses_a_variant_it_would_replace(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    mclr_vs_lars.main(["--config", TINY_CONFIG + ":lr=0.3,epochs=2", "--lars_lrs", "1", "--mclr_lrs", "0.001",
                       "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2 and "sets lr.base, num_epochs, which the experiment sets itself (the LR recipe " \
      "flags, --epochs): drop them there." in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()


def test_lipschitz_csv_has_every_logged_step_of_every_batch_size(lipschitz_curves):
  spec, curves = lipschitz_curves
  rows = _read_csv(pathlib.Path(spec.out).with_suffix(".csv"))
  assert tuple(rows[0]) == lipschitz.CSV_COLUMNS
  for batch_size in (32, 64):
    mine = [r for r in rows if int(r["batch_size"]) == batch_size]
    assert [int(r["step"]) for r in mine] == [2, 4]  # `steps` iterations whatever B, L every `every`
    for r in mine:
      assert int(r["examples_seen"]) == int(r["step"]) * batch_size
      assert float(r["epoch"]) == pytest.approx(int(r["step"]) * batch_size / 256)
      assert math.isfinite(float(r["lipschitz"])) and float(r["lipschitz"]) > 0
  assert sorted(curves) == [32, 64]


def test_lipschitz_markdown_reports_the_peak_and_plot_exists(lipschitz_curves):
  spec, curves = lipschitz_curves
  table = pathlib.Path(spec.out).with_suffix(".md").read_text()
  for batch_size, records in curves.items():
    peak = max(records, key=lambda r: r["lipschitz"])
    assert f"| {batch_size} |" in table and f"{peak['lipschitz']:.4g}" in table
  assert pathlib.Path(spec.out).with_suffix(".png").stat().st_size > 1000


def test_lipschitz_run_length_is_counted_in_iterations(tmp_path):
  spec = lipschitz.LipschitzSpec(config=TINY_CONFIG, batch_sizes=(32,), out=str(tmp_path / "l"),
                                 workdir=str(tmp_path / "runs"), steps=100)
  config = lipschitz.run_config(spec, 128)
  assert config.num_epochs == 50.0  # 100 iterations x 128 / 256 examples
  assert config.diagnostics.lipschitz_every == 2 and config.eval_every_epochs == config.num_epochs
  with pytest.raises(ValueError, match=r"sets num_epochs, which the experiment sets itself \(--steps\)"):
    lipschitz.check_spec(lipschitz.LipschitzSpec(TINY_CONFIG, (32,), "o", "w", variant="epochs=3"))
  with pytest.raises(ValueError, match="every must be"):
    lipschitz.check_spec(lipschitz.LipschitzSpec(TINY_CONFIG, (32,), "o", "w", steps=4, every=5))


def test_noise_scale_outputs_are_the_ratio_of_the_logged_estimates(tmp_path):
  spec = noise_scale.NoiseScaleSpec(config=TINY_CONFIG, out=str(tmp_path / "noise"), workdir=str(tmp_path / "run"),
                                    max_device_batch=4, variant="batch=64", log_every=1, title="tiny noise")
  records = noise_scale.run_experiment(spec)
  rows = _read_csv(tmp_path / "noise.csv")
  assert tuple(rows[0]) == noise_scale.CSV_COLUMNS
  assert [int(r["step"]) for r in rows] == [1, 2, 3, 4] and len(records) == 4
  for r in rows:  # B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018); +inf where the |G|^2 estimate <= 0
    g2, trace = float(r["grad_norm_sq"]), float(r["trace_sigma"])
    assert float(r["gradient_noise_scale"]) == (pytest.approx(trace / g2, rel=1e-4) if g2 > 0 else math.inf)
    assert int(r["batch_size"]) == 64
  table = (tmp_path / "noise.md").read_text()
  assert table.startswith("# tiny noise") and table.count("| epochs ") == 4
  assert (tmp_path / "noise.png").stat().st_size > 1000


def test_noise_scale_needs_an_accumulating_run(tmp_path):
  spec = noise_scale.NoiseScaleSpec(config=TINY_CONFIG, out=str(tmp_path / "n"), workdir=str(tmp_path / "w"),
                                    max_device_batch=64, variant="batch=64")
  with pytest.raises(ValueError, match="do not exceed max_device_batch"):
    noise_scale.run_experiment(spec)
  assert not (tmp_path / "w").exists()


def test_lipschitz_window_means_split_the_iterations_into_equal_ranges():
  records = [{"step": s, "lipschitz": float(s)} for s in range(2, 101, 2)]
  # Iterations 1-25: steps 2..24 (mean 13); 26-50: 26..50 (38); 51-75: 52..74 (63); 76-100: 76..100 (88).
  assert lipschitz.window_means(records, 100) == [13.0, 38.0, 63.0, 88.0]
  assert math.isnan(lipschitz.window_means(records[:3], 100)[1])
