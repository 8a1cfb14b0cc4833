"""The benchmarks refuse a flag that the chosen mode would not use (exit 2, before anything is measured or
written), never ignore it."""

import runpy
import sys

import pytest

from benchmarks import accumulation
from benchmarks import gpu_resnet50
from benchmarks import optimizer


def _refused(monkeypatch, capsys, main, prog, flags) -> str:
  monkeypatch.setattr(sys, "argv", [prog, *flags])
  with pytest.raises(SystemExit) as exit_info:
    main()
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  return err


@pytest.mark.parametrize("flags, message", [
    (["--adapt-every", "5"], "--adapt-every sets how often --loop writes `batch` records; add --any-batch --loop"),
    (["--any-batch", "--adapt-every", "5"], "add --any-batch --loop, or drop it."),
    (["--any-batch", "--write-noisy"], "--any-batch reports its ratios without a spread check: drop --write-noisy."),
    (["--any-batch", "--loop", "--max-spread", "0.2"], "without a spread check: drop --max-spread."),
])
def test_accumulation_refuses_what_its_mode_would_not_use(monkeypatch, capsys, flags, message):
  assert message in _refused(monkeypatch, capsys, accumulation.main, "accumulation", flags)


@pytest.mark.parametrize("case, message", [
    ("foo", "argument --case: 'foo': a case is MODEL:BATCH:MICRO with MODEL one of mnist_lstm, ptb_lstm"),
    ("alexnet:512:128", "'alexnet:512:128': a case is MODEL:BATCH:MICRO"),
    ("mnist_lstm:512", "'mnist_lstm:512': a case is MODEL:BATCH:MICRO"),
    ("mnist_lstm:512:0", "and BATCH, MICRO integers >= 1"),
    ("mnist_lstm:x:128", "and BATCH, MICRO integers >= 1"),
    ("resnet_tiny:512:100", "'resnet_tiny:512:100': BATCH 512 is not a whole number of micro-batches of MICRO 100; "
                            "use a BATCH that is a multiple of MICRO."),
])
def test_accumulation_refuses_a_malformed_any_batch_case(monkeypatch, capsys, case, message):
  monkeypatch.setattr(accumulation, "any_batch_rows", lambda *a, **k: pytest.fail("a case ran"))
  assert message in _refused(monkeypatch, capsys, accumulation.main, "accumulation",
                             ["--no-readme", "--any-batch", "--case", "mnist_lstm:8:8", "--case", case])


@pytest.mark.parametrize("flags, message", [
    (["--step-kernels"], "--step-kernels adds the train step's kernels to those --kernels-for counts: add "
                         "--kernels-for h100"),
    (["--kernels-for", "h100", "--collectives"], "keep one, or run them as two commands."),
    (["--collectives", "--rounds", "5"], "--collectives times nothing: drop --rounds."),
    (["--kernels-for", "h100", "--write-noisy", "--seconds-per-round", "0.1"],
     "--kernels-for h100 times nothing: drop --seconds-per-round, --write-noisy."),
    (["--collectives", "--trees", "ptb_lstm"], "--collectives counts on the FSDP-sharded ResNet-50 tree alone: drop "
                                               "--trees."),
])
def test_optimizer_refuses_what_its_mode_would_not_use(monkeypatch, capsys, flags, message):
  assert message in _refused(monkeypatch, capsys, optimizer.main, "optimizer", flags)


def test_gpu_resnet50_pending_refuses_the_flags_of_a_measurement(monkeypatch, capsys):
  """--pending writes the README section and returns: --no-readme, --batch, ... would have been ignored."""
  monkeypatch.setattr(gpu_resnet50.report, "write_section", lambda *a, **k: pytest.fail("README written"))
  err = _refused(monkeypatch, capsys, gpu_resnet50.main, "gpu_resnet50",
                 ["--pending", "--peak-tflops", "989", "--batch", "128", "--no-readme"])
  assert ("--pending only writes the README section saying the figures are not yet measured: drop --peak-tflops, "
          "--batch, --no-readme." in err)


@pytest.mark.parametrize("flags, message", [
    (["--part", "host", "--worker-batch", "16"], "--part host does not use --worker-batch: drop it, or run --part "
                                                 "imagenet."),
    (["--part", "host", "--imagenet-images", "8"], "or run --part decoders or imagenet."),
    (["--part", "decoders", "--imagenet-images", "8", "--imagenet-target", "100"],
     "--part decoders does not use --imagenet-target: drop it, or run --part imagenet."),
])
def test_input_pipeline_refuses_the_flags_of_another_part(monkeypatch, capsys, flags, message):
  run = lambda: runpy.run_module("benchmarks.input_pipeline", run_name="__main__")
  assert message in _refused(monkeypatch, capsys, run, "input_pipeline", flags)
