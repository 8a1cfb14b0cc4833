"""`lbjax-train`: --list, --dry-run, overrides, and errors that are messages (exit 2, no traceback)."""

import subprocess
import sys

import pytest

from lbjax import main as cli


def _run(capsys, *argv):
  status = cli.main(list(argv))
  out, err = capsys.readouterr()
  return status, out, err


def test_list_shows_every_config_with_what_it_reproduces_and_its_variant_keys(capsys):
  status, out, _ = _run(capsys, "--list")
  assert status == 0
  for name in ("mnist_lstm", "ptb_lstm", "resnet50_imagenet", "batch_schedule_mnist"):
    assert f"\n{name}: " in f"\n{out}"
  assert "papers/001" in out and "rule " in out and "= --config.scaling.rule" in out


def test_a_variant_and_a_command_line_override_print_the_same_resolved_run(capsys):
  _, by_override, _ = _run(capsys, "--config", "mnist_lstm:batch=8192", "--config.scaling.rule=legw", "--dry-run")
  _, by_variant, _ = _run(capsys, "--config", "mnist_lstm:batch=8192,rule=legw", "--dry-run")
  assert by_override.splitlines()[1:] == by_variant.splitlines()[1:]  # line 0 echoes the command
  assert "peak 0.64, warm-up 10 epochs" in by_variant and "8192 (global)" in by_variant


def test_every_optimizer_argument_is_honoured_or_refused(capsys):
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.optimizer.name=mclr",
                        "--config.optimizer.nesterov=True", "--dry-run")
  assert status == 0 and "lbjax.optim.mclr(momentum=0.9, nesterov=True)" in out
  status, _, err = _run(capsys, "--config", "mnist_lstm", "--config.optimizer.name=lamb", "--dry-run")
  assert status == 2 and "config.optimizer.momentum: lbjax.optim.lamb takes no argument 'momentum'" in err


def test_a_mistyped_optimizer_exits_2_naming_it_and_suggesting_the_right_one(capsys):
  status, _, err = _run(capsys, "--config", "mnist_lstm", "--config.optimizer.name=larz")
  assert status == 2 and "'larz'" in err and "Did you mean 'lars'?" in err
  assert "Traceback" not in err and len(err.splitlines()) <= 6


def test_user_errors_exit_2_without_a_traceback_from_the_command_line(tmp_path):
  result = subprocess.run([sys.executable, "-m", "lbjax.main", "--config", "mnist_lstm:batch=abc", "--workdir",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert "variant batch (config.batch_size)='abc': expected int" in result.stderr
  assert "Traceback" not in result.stderr


def test_help_shows_usage(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert "--config" in out and "--dry-run" in out and "--list" in out and "--config.<field>=<value>" in out
  # the examples of lbjax/main.py's docstring keep one command per line
  assert "\n  lbjax-train --list\n  lbjax-train --config mnist_lstm --workdir runs/mnist_lstm\n" in out
