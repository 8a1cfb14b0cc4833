"""The statistics the benchmarks report (no timing is asserted here: benchmarks are not tests)."""

import argparse
import math

import pytest

from benchmarks import report


def test_spread_gives_median_quartiles_and_range():
  spread = report.Spread.of([5.0, 1.0, 3.0, 2.0, 4.0])
  assert (spread.median, spread.q1, spread.q3, spread.low, spread.high, spread.count) == (
      3.0, 2.0, 4.0, 1.0, 5.0, 5)
  assert spread.relative_iqr == pytest.approx(2 / 3)
  assert spread.format(digits=1) == "3.0 [2.0, 4.0]"


@pytest.mark.parametrize("count", [6, 9, 11, 15, 21, 41, 61])
def test_median_interval_holds_the_median_with_95_percent(count):
  """[x_(j), x_(n-1-j)] misses the median only if at most j of n values fall below it (Binomial)."""
  rank = report._median_interval_rank(count)  # pylint: disable=protected-access
  miss = 2 * sum(math.comb(count, j) for j in range(rank + 1)) / 2**count
  assert miss <= 0.05
  wider_miss = 2 * sum(math.comb(count, j) for j in range(rank + 2)) / 2**count
  assert wider_miss > 0.05  # the narrowest interval that keeps 95%


def test_paired_ratios_are_taken_round_by_round():
  times = {"a": [2.0, 4.0, 6.0], "b": [1.0, 2.0, 3.0]}
  assert report.paired_ratios(times, "a", "b").median == 2.0
  assert report.paired_ratios(times, "a", "b").relative_iqr == 0.0


def test_spread_check_flags_a_wide_interval_and_exits_with_status_3(capsys):
  check = report.SpreadCheck(0.1)
  check.record("steady", report.Spread.of([1.0] * 11))
  assert not check.failures and check.warning() == ""
  check.record("noisy", report.Spread.of([0.5, 1.0, 1.5] * 4))
  assert len(check.failures) == 1 and check.failures[0].startswith("noisy:")
  assert "**Too noisy**" in check.warning()
  with pytest.raises(SystemExit) as exit_info:
    check.exit_if_noisy()
  assert exit_info.value.code == report.SpreadCheck.EXIT_TOO_NOISY
  assert "noisy:" in capsys.readouterr().err


def test_spread_check_finish_writes_a_sound_or_forced_section_then_exits_if_noisy(monkeypatch):
  written = []
  monkeypatch.setattr(report, "write_section", lambda name, title, body, **_: written.append((name, body)))
  monkeypatch.setattr(report, "header_lines", lambda: "machine\n")
  sound = report.SpreadCheck(0.1)
  sound.record("steady", report.Spread.of([1.0] * 11))
  sound.finish(argparse.Namespace(no_readme=False, write_noisy=False), "s", "S", "table")
  assert written == [("s", "machine\n\ntable")]
  noisy = report.SpreadCheck(0.1)
  noisy.record("noisy", report.Spread.of([0.5, 1.0, 1.5] * 4))
  for no_readme, write_noisy in ((False, False), (True, True), (False, True)):
    with pytest.raises(SystemExit) as exit_info:
      noisy.finish(argparse.Namespace(no_readme=no_readme, write_noisy=write_noisy), "n", "N", "table")
    assert exit_info.value.code == report.SpreadCheck.EXIT_TOO_NOISY
  assert len(written) == 2 and written[1][0] == "n" and "**Too noisy**" in written[1][1]


def test_round_seconds_interleaves_with_rotating_order():
  calls = []
  functions = {name: (lambda name=name: calls.append(name)) for name in "abc"}
  times = report.round_seconds(functions, rounds=3, repeats={"a": 1, "b": 2, "c": 1},
                               sync=lambda result: result)
  assert calls[:3] == ["a", "b", "c"]  # the warm-up call of each
  assert calls[3:] == ["a", "b", "b", "c", "b", "b", "c", "a", "c", "a", "b", "b"]
  assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3, "c": 3}


def test_the_timers_that_also_count_cpu_seconds_rotate_their_order_too():
  """The accumulation benchmark's (wall and CPU seconds) and the input pipeline's (CPU seconds): "any" ran first
  and "whole" last in every round."""
  from benchmarks import accumulation  # pylint: disable=import-outside-toplevel
  from benchmarks.input_pipeline import timing  # pylint: disable=import-outside-toplevel
  for measure in (lambda functions: accumulation._round_times(functions, rounds=3, repeats=1),
                  lambda functions: timing.cpu_rates(functions, count=1, rounds=3, seconds=0.0)):
    calls = []
    measure({name: (lambda name=name: calls.append(name)) for name in "abc"})
    assert calls[-9:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_a_table_measured_on_an_accelerator_goes_to_its_own_section(tmp_path, monkeypatch):
  readme = tmp_path / "README.md"
  report.write_section("optimizer", "Optimizer", "cpu table", readme=readme)
  monkeypatch.setattr(report.jax, "default_backend", lambda: "gpu")
  report.write_section("optimizer", "Optimizer", "gpu table", readme=readme)
  report.write_section("gpu-resnet50", "ResNet-50", "only here", readme=readme, per_platform=False)
  text = readme.read_text()
  assert "<!-- BEGIN optimizer -->\n## Optimizer\n\ncpu table\n<!-- END optimizer -->" in text
  assert "<!-- BEGIN optimizer-gpu -->\n## Optimizer, on " in text and "gpu table\n<!-- END optimizer-gpu -->" in text
  assert "<!-- BEGIN gpu-resnet50 -->\n## ResNet-50\n\nonly here" in text


def test_the_shared_timing_options_refuse_counts_below_1_and_spreads_not_above_0(capsys):
  parser = argparse.ArgumentParser(prog="bench")
  report.add_spread_arguments(parser, rounds=9)
  assert parser.parse_args(["--rounds", "3", "--max-spread", "0.2"]).rounds == 3
  for argv, message in ((["--rounds", "0"], "argument --rounds: must be an integer >= 1, got 0"),
                        (["--max-spread", "0"], "argument --max-spread: must be a number > 0, got 0")):
    with pytest.raises(SystemExit) as stop:
      parser.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv0, command", [
    ("/repo/benchmarks/train_loop.py", "python -m benchmarks.train_loop --rounds 9"),
    ("/repo/benchmarks/input_pipeline/__main__.py", "python -m benchmarks.input_pipeline --rounds 9")])
def test_a_section_names_the_command_a_reader_retypes(monkeypatch, argv0, command):
  monkeypatch.setattr("sys.argv", [argv0, "--rounds", "9"])
  assert report.command_line() == command
