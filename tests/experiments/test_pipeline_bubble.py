"""experiments/pipeline_bubble.py at tiny sizes (4 blocks of width 8, batch 16) on the simulated devices
of tests/conftest.py: the bubble of the executed schedule is GPipe's (S-1)/(M+S-1), papers/004's
factor half of it, and the CSV and markdown hold a row per (S, M) and the command."""

import csv

import pytest

from experiments import pipeline_bubble

ARGV = ["--stages", "2,4", "--microbatches", "1,2,4", "--num_layers", "4", "--width", "8", "--batch_size", "16",
        "--repeats", "1"]


def test_the_executed_schedule_idles_the_gpipe_fraction(tmp_path):
  rows = pipeline_bubble.main([*ARGV, "--out", str(tmp_path / "new" / "bubble")])  # its folder made too
  assert [(r["S"], r["M"]) for r in rows] == [(s, m) for s in (2, 4) for m in (1, 2, 4)]
  for r in rows:
    assert r["schedule"] == pytest.approx((r["S"] - 1) / (r["M"] + r["S"] - 1), abs=1e-6)
    assert r["gpipe"] == pytest.approx(r["schedule"], abs=1e-6) and r["lecture"] == pytest.approx(r["gpipe"] / 2)
  with open(tmp_path / "new" / "bubble.csv") as f:
    assert [(int(r["stages"]), int(r["microbatches"]), float(r["schedule_bubble"])) for r in csv.DictReader(f)] == [
        (r["S"], r["M"], round(r["schedule"], 4)) for r in rows]
  markdown = (tmp_path / "new" / "bubble.md").read_text()
  assert f"JAX_NUM_CPU_DEVICES=8 python -m experiments.pipeline_bubble {' '.join(ARGV)} --out " in markdown


def test_more_stages_than_devices_is_a_usage_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as stop:
    pipeline_bubble.main(["--stages", "16", "--out", str(tmp_path / "bubble")])
  assert stop.value.code == 2 and "--stages up to 16 needs at least 16 devices, jax sees 8" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--stages", "0"], "--stages must be integers >= 1, got 0."),
    (["--microbatches", "2,0"], "--microbatches must be integers >= 1, got 2,0."),
    (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got 0"),
    (["--width", "-4"], "argument --width: must be an integer >= 1, got -4"),
    (["--stages", "3"], "--num_layers 8 must be divisible by every stage count (--stages 3)"),
    (["--microbatches", "3"], "--batch_size 512 must be divisible by every micro-batch count (--microbatches 3)."),
])
def test_arguments_that_cannot_run_are_a_usage_error_before_any_compute(argv, message, tmp_path, capsys):
  with pytest.raises(SystemExit) as stop:
    pipeline_bubble.main([*argv, "--out", str(tmp_path / "bubble")])
  assert stop.value.code == 2 and message in capsys.readouterr().err
  assert not list(tmp_path.iterdir())
