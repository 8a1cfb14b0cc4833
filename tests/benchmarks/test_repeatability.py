"""`benchmarks.repeatability`: how two runs' final states are compared, and what its command line refuses."""

import sys

import numpy as np
import pytest

from benchmarks import repeatability


def _run_file(path, leaves, eval_loss):
  np.savez(path, eval_loss=np.float64(eval_loss), **{f"leaf{i}": leaf for i, leaf in enumerate(leaves)})
  return path


def test_equal_states_are_bit_identical(tmp_path):
  leaves = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(3, np.int32)]
  result = repeatability.compare(_run_file(tmp_path / "a.npz", leaves, 1.5), _run_file(tmp_path / "b.npz", leaves, 1.5))
  assert result == {"identical": True, "largest_difference": 0.0, "leaves": 2, "eval_losses": [1.5, 1.5]}


def test_one_last_bit_makes_states_differ_and_the_largest_relative_difference_is_reported(tmp_path):
  first = [np.array([1.0, -4.0], np.float32), np.array([10.0, 20.0], np.float32)]
  second = [first[0].copy(), np.array([10.0, np.nextafter(np.float32(20), np.float32(21))], np.float32)]
  result = repeatability.compare(_run_file(tmp_path / "a.npz", first, 2.0), _run_file(tmp_path / "b.npz", second, 2.5))
  assert not result["identical"]
  # The float32 spacing at 20 (2^-19), relative to the leaf's largest magnitude.
  assert result["largest_difference"] == pytest.approx(2.0**-19 / float(second[1][1]), rel=1e-6)
  assert result["eval_losses"] == [2.0, 2.5]


@pytest.mark.parametrize("flags, env, message", [
    (["--cases", "ptb_lstm,mnist"], {}, "--cases takes some of ptb_lstm, resnet_tiny, comma-separated; got "
                                        "'ptb_lstm,mnist'."),
    (["--cases", ","], {}, "--cases takes some of ptb_lstm, resnet_tiny"),
    (["--steps", "0"], {}, "must be an integer >= 1, got 0"),
    ([], {"XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}, "XLA_FLAGS already asks for deterministic ops"),
])
def test_refuses_bad_input_before_training(monkeypatch, capsys, flags, env, message):
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setattr(sys, "argv", ["repeatability", *flags])
  monkeypatch.setattr(repeatability, "run_twice", lambda *a: pytest.fail("trained despite a refused input"))
  with pytest.raises(SystemExit) as exit_info:
    repeatability.main()
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and message in err and "Traceback" not in err


def test_two_runs_in_their_own_processes_are_compared_end_to_end(tmp_path):
  # The packaged PTB config on its synthetic twin, one step, deterministic: each child starts its backend with
  # XLA's deterministic flags (train_and_evaluate refuses a backend started without them, so an import that
  # started it would fail here). CPU runs are bit-identical.
  result = repeatability.run_twice("ptb_lstm", True, 1, tmp_path)
  assert result["identical"] and result["largest_difference"] == 0.0
  assert result["leaves"] > 10  # the LSTM's parameters and momentum, not an empty state
  first_loss, second_loss = result["eval_losses"]
  assert first_loss == second_loss and 0 < first_loss < 12  # ln(10,000) = 9.2 for a uniform guess
  assert len(result["seconds"]) == 2 and sorted(p.name for p in tmp_path.iterdir()) == [
      "ptb_lstm_deterministic_1.npz", "ptb_lstm_deterministic_2.npz"]
