"""`benchmarks.xla_flags` times the trainer's step under each XLA flag set in processes of its own. A set given as
NAME=FLAGS that XLA refuses when its backend starts (an unknown flag, a value it cannot read) is refused before
anything is timed; a set XLA accepts whose step fails, or one of the module's own sets that XLA refuses, is
reported in its row, the others measured (a GPU session runs it unattended)."""

import re
import sys

import pytest

from benchmarks import xla_flags


def _main(monkeypatch, capsys, *flags):
  monkeypatch.setattr(sys, "argv", ["xla_flags", *flags])
  xla_flags.main()
  return capsys.readouterr().out


def test_every_set_runs_against_the_defaults(monkeypatch, capsys):
  out = _main(monkeypatch, capsys, "--cases", "mnist_lstm:8", "--flag-sets", "no command buffers",
              "--rounds", "1", "--inner-rounds", "1", "--seconds-per-round", "0.01", "--no-readme",
              "--max-spread", "1000")
  rows = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| mnist_lstm:8")}
  assert list(rows) == ["default", "no command buffers"]
  assert re.match(r"\d+\.\d{3} \[", rows["no command buffers"].split(" | ")[-1])  # its ratio to the defaults


def test_a_set_xla_accepts_whose_step_fails_is_a_row_and_the_others_are_measured(monkeypatch, capsys):
  monkeypatch.setattr(xla_flags, "xla_refusal", lambda flags, timeout: None)
  monkeypatch.setattr(xla_flags, "run_process", lambda flags, args: (
      "RuntimeError: the step failed" if flags == "--xla_breaks_the_step" else {"mnist_lstm:8": 0.01}))
  out = _main(monkeypatch, capsys, "--cases", "mnist_lstm:8", "--flag-sets",
              "no command buffers;broken=--xla_breaks_the_step", "--rounds", "2", "--no-readme")
  rows = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| mnist_lstm:8")}
  assert list(rows) == ["default", "no command buffers", "broken"]
  assert rows["no command buffers"].endswith("| 1.000 [1.000, 1.000] |")
  assert "| failed: RuntimeError: the step failed |" in rows["broken"]


def test_a_set_with_a_flag_xla_does_not_know_is_refused_before_anything_is_timed(monkeypatch, capsys):
  monkeypatch.setattr(xla_flags, "run_process", lambda *a: pytest.fail("a step was timed"))
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # the set's flags alone
  monkeypatch.setattr(sys, "argv", ["xla_flags", "--no-readme", "--cases", "mnist_lstm:8", "--flag-sets",
                                    "no command buffers;typo=--xla_cpu_enable_fast_mth=false"])
  with pytest.raises(SystemExit) as exit_info:
    xla_flags.main()
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  assert ("XLA refuses these flag sets when its backend starts, so nothing was timed:\n"
          "  'typo' (XLA_FLAGS='--xla_cpu_enable_fast_mth=false'): Unknown flag in XLA_FLAGS: "
          "--xla_cpu_enable_fast_mth=false\nCorrect the flag's name or value" in err)
  assert "'no command buffers'" not in err  # a set XLA accepts is not named


def test_the_modules_own_sets_are_not_tried_first(monkeypatch, capsys):
  monkeypatch.setattr(xla_flags, "xla_refusal", lambda *a: pytest.fail("one of the module's own sets was tried"))
  monkeypatch.setattr(xla_flags, "run_process", lambda flags, args: {"mnist_lstm:8": 0.01})
  out = _main(monkeypatch, capsys, "--cases", "mnist_lstm:8", "--rounds", "1", "--no-readme")
  assert [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| mnist_lstm:8")] == list(
      xla_flags.FLAG_SETS)


@pytest.mark.parametrize("flags, message", [
    (["--cases", "mnist_lstm"], "'mnist_lstm': a case is MODEL:BATCH"),
    (["--cases", "alexnet:8"], "MODEL one of mnist_lstm, ptb_lstm"),
    (["--flag-sets", "faster"], "'faster': a flag set is NAME=FLAGS, or one of default, command buffers with loops"),
    (["--flag-sets", "default"], "--flag-sets names no set beside the defaults"),
])
def test_a_malformed_case_or_set_is_refused_before_any_process_starts(monkeypatch, capsys, flags, message):
  monkeypatch.setattr(xla_flags, "run_process", lambda *a: pytest.fail("a process started"))
  monkeypatch.setattr(sys, "argv", ["xla_flags", *flags])
  with pytest.raises(SystemExit) as exit_info:
    xla_flags.main()
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and message in err and "Traceback" not in err


def test_a_process_past_its_timeout_is_a_failed_set_not_a_traceback(monkeypatch):
  def too_slow(*args, **kwargs):
    raise xla_flags.subprocess.TimeoutExpired(args[0], kwargs["timeout"])
  monkeypatch.setattr(xla_flags.subprocess, "run", too_slow)
  args = xla_flags.argparse.Namespace(cases="mnist_lstm:8", inner_rounds=1, seconds_per_round=0.01,
                                      process_timeout=5.0)
  assert xla_flags.run_process("--xla_slow", args) == "the process ran past --process-timeout 5 s (stopped)"
