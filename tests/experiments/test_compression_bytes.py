"""experiments/compression_bytes.py with `--lrs`: the LR chosen on the validation split, a diverged LR
recorded and skipped, finished runs not trained again, and the outputs."""

import argparse
import csv
import json
import math
import pathlib

import pytest

from experiments import compression_bytes
from experiments import runner
from lbjax import train

TINY_CONFIG = str(pathlib.Path(__file__).with_name("tiny_image_config.py"))  # 64 synthetic 8x8 images, B=16


def _args(tmp_path, **overrides):
  fields = dict(config=TINY_CONFIG, batch_size=16, epochs=0.5, ranks=(1,), qsgd_levels=4, lrs=(0.05, 1e30),
                seed=0, out=str(tmp_path / "out"), workdir=str(tmp_path / "runs"))
  fields.update(overrides)
  return argparse.Namespace(**fields)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
  """PowerSGD rank 1 at two LRs on the validation split (1e30 goes non-finite), then the chosen one on test."""
  tmp_path = tmp_path_factory.mktemp("compression_bytes")
  args = _args(tmp_path)
  variant = compression_bytes.Variant("powersgd_r1", {"name": "powersgd", "rank": 1})
  return args, variant, compression_bytes.variant_result(variant, args, ["--config.seed=0"])


def test_the_lr_is_chosen_on_validation_and_reported_on_test(tuned):
  args, variant, result = tuned
  runs = pathlib.Path(args.workdir) / variant.name
  assert sorted(p.name for p in runs.iterdir()) == ["test_lr_0.05", "validation_lr_0.05", "validation_lr_1e+30"]
  assert (runs / "validation_lr_1e+30" / runner.DIVERGED_NOTE).read_text().startswith("Non-finite")
  assert result.learning_rate == 0.05 and math.isnan(result.validation_accuracy[1e30])
  for run, split in (("validation_lr_0.05", "validation"), ("test_lr_0.05", "test")):
    config = json.loads((runs / run / "config.json").read_text())["config"]
    assert (config["data_options"]["eval_split"], config["lr"]["base"], config["seed"]) == (split, 0.05, 0)
  assert result.steps == 2 and 0.0 <= result.final_test_accuracy <= 1.0


def test_finished_and_diverged_runs_are_not_trained_again(tuned, monkeypatch):
  args, variant, result = tuned

  def refuse(*_):
    raise AssertionError("a finished run was trained again")

  monkeypatch.setattr(train, "train_and_evaluate", refuse)
  assert compression_bytes.variant_result(variant, args, ["--config.seed=0"]) == result


def test_outputs_list_the_chosen_lr_and_every_validation_accuracy(tuned):
  args, _, result = tuned
  compression_bytes.write_outputs([result], args.out, "the command", args, num_devices=8)
  with open(f"{args.out}.csv", newline="") as f:
    (row,) = list(csv.DictReader(f))
  assert (row["variant"], float(row["learning_rate"])) == ("powersgd_r1", 0.05)
  assert float(row["validation_accuracy"]) == pytest.approx(result.validation_accuracy[0.05], abs=1e-4)
  assert float(row["megabytes_per_device"]) == pytest.approx(result.bits_per_step * 2 / 8 / 1e6, rel=1e-3)
  markdown = pathlib.Path(f"{args.out}.md").read_text()
  assert "the command" in markdown and "seed 0" in markdown
  assert "| powersgd_r1 | " in markdown and "diverged |" in markdown
  assert pathlib.Path(f"{args.out}.png").stat().st_size > 0


def test_every_lr_diverging_is_refused_with_a_message(tmp_path):
  variant = compression_bytes.Variant("none", {"name": "no_compression"})
  with pytest.raises(SystemExit, match="every learning rate of \\[1e\\+30\\] diverged"):
    compression_bytes.variant_result(variant, _args(tmp_path, lrs=(1e30,)), [])


@pytest.mark.parametrize("config, flags, message", [
    ("resnet_tiny_synthetic_cifar:batch=64,seed=1", [], "the variant of 'resnet_tiny_synthetic_cifar:batch=64,seed=1' "
     "sets batch_size, seed, which the experiment sets itself (--batch_size, --seed): drop them there."),
    ("resnet_tiny_synthetic_cifar:lr=0.2", ["--lrs", "0.1,0.2"],
     "sets lr.base, which the experiment sets itself (--lrs)"),
])
def test_a_variant_that_the_flags_would_override_is_refused_before_training(tmp_path, capsys, config, flags, message):
  with pytest.raises(SystemExit) as exit_info:
    compression_bytes.main(["--config", config, *flags, "--out", str(tmp_path / "out"),
                            "--workdir", str(tmp_path / "runs")])
  assert exit_info.value.code == 2 and message in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags", [[], ["--lrs", "0.05,0.1"]])
def test_every_variants_settings_are_checked_before_the_first_trains(tmp_path, capsys, monkeypatch, flags):
  """`none` and `one_bit` are fine; QSGD at 0 levels and PowerSGD at rank 0 are not: nothing trains."""
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  with pytest.raises(SystemExit) as exit_info:
    compression_bytes.main(["--config", TINY_CONFIG, "--batch_size", "16", "--epochs", "0.01", "--qsgd_levels", "0",
                            "--ranks", "1,0", *flags, "--out", str(tmp_path / "out"),
                            "--workdir", str(tmp_path / "runs")])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "python -m experiments.compression_bytes: error: qsgd_s0: Invalid config:\n" \
      "  - config.compression.name='qsgd': lbjax.optim.compression.qsgd refuses its arguments: qsgd: num_levels (s) " \
      "must be >= 1, got 0.\npowersgd_r0: Invalid config:\n" \
      "  - config.compression.name='powersgd': lbjax.optim.compression.powersgd refuses its arguments: powersgd: " \
      "rank must be >= 1, got 0." in err
  assert "none:" not in err and "powersgd_r1" not in err and err.count("qsgd_s0") == 1
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out.csv").exists()


def test_a_variant_learning_rate_is_accepted_without_lrs(tmp_path, monkeypatch):
  class Trained(Exception):
    pass

  def variant_result(variant, args, common):
    raise Trained(args.config)

  monkeypatch.setattr(compression_bytes, "variant_result", variant_result)
  with pytest.raises(Trained):
    compression_bytes.main(["--config", "resnet_tiny_synthetic_cifar:lr=0.2", "--out", str(tmp_path / "out"),
                            "--workdir", str(tmp_path / "runs")])


def test_the_dry_run_lists_every_validation_run_and_how_it_ended_training_nothing(tuned, monkeypatch, capsys):
  args, _, _ = tuned
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
  flags = ["--config", TINY_CONFIG, "--batch_size", "16", "--epochs", "0.5", "--ranks", "1", "--lrs", "0.05,1e30",
           "--out", str(pathlib.Path(args.out).with_name("dry")), "--workdir", args.workdir, "--dry-run"]
  assert compression_bytes.main(flags) == []
  lines = capsys.readouterr().out.splitlines()
  runs = pathlib.Path(args.workdir)
  assert [line.split(":")[0] for line in lines[:-1]] == [
      f"[compression_bytes]   {variant} validation LR {lr}" for variant in ("none", "one_bit", "qsgd_s4", "powersgd_r1")
      for lr in ("0.05", "1e+30")]
  for line, lr in zip(lines[-3:-1], ("0.05", "1e+30")):  # the second diverged
    assert line.endswith(f"{runs / 'powersgd_r1' / f'validation_lr_{lr}'}: ended there: read back")
  assert lines[0].endswith(f"{runs / 'none' / 'validation_lr_0.05'}: new")
  assert lines[-1] == (f"[compression_bytes] then each variant's test run at its best validation LR, in "
                       f"{runs / '<variant>' / 'test_lr_<lr>'}")
  assert not pathlib.Path(args.out).with_name("dry.csv").exists() and not (runs / "none").exists()
