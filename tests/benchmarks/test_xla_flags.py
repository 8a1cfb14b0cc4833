"""`benchmarks.xla_flags` times the trainer's step under each XLA flag set in processes of its own (a GPU session
runs it unattended: a set XLA refuses is reported in its row, the others measured)."""

import re
import sys

import pytest

from benchmarks import xla_flags


def _main(monkeypatch, capsys, *flags):
  monkeypatch.setattr(sys, "argv", ["xla_flags", *flags])
  xla_flags.main()
  return capsys.readouterr().out


def test_every_set_runs_against_the_defaults_and_a_refused_one_is_a_row(monkeypatch, capsys):
  out = _main(monkeypatch, capsys, "--cases", "mnist_lstm:8",
              "--flag-sets", "no command buffers;bogus=--xla_no_such_flag",
              "--rounds", "1", "--inner-rounds", "1", "--seconds-per-round", "0.01", "--no-readme",
              "--max-spread", "1000")
  rows = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| mnist_lstm:8")}
  assert list(rows) == ["default", "no command buffers", "bogus"]
  assert re.match(r"\d+\.\d{3} \[", rows["no command buffers"].split(" | ")[-1])  # its ratio to the defaults
  assert "failed:" in rows["bogus"] and "Unknown flag in XLA_FLAGS: --xla_no_such_flag" in rows["bogus"]


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
