"""`lbjax-train`: --list, --dry-run, overrides, and errors that are messages (exit 2, no traceback)."""

import json
import re
import subprocess
import sys

import pytest

from lbjax import main as cli
from lbjax.train import workdir_lock


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


def test_true_and_false_are_bools_for_a_field_the_config_does_not_have_yet(capsys):
  """An argument of the named function (optax.sgd's nesterov) is a new field: `false` as for a typed field, not
  the string 'false', which optax tests as true (Nesterov on). So for a variant key of an argument section."""
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.optimizer=sgd", "--config.optimizer.momentum=0.9",
                        "--config.optimizer.nesterov=false", "--dry-run")
  assert status == 0 and "optax.sgd(momentum=0.9, nesterov=False)" in out
  status, out, _ = _run(capsys, "--config", "ptb_lstm:carry_state=FALSE", "--dry-run")
  assert status == 0 and "carry_state=False" in out


def test_a_model_that_does_not_take_the_dataset_s_batches_is_refused_before_training(capsys, tmp_path):
  """The MNIST LSTM on 32x32 RGB images: --dry-run and the run refuse it naming both (exit 2); the run failed
  with a traceback tracing its first step."""
  for mode in (["--dry-run"], ["--workdir", str(tmp_path / "w"), "--config.num_steps=2"]):
    status, _, err = _run(capsys, "--config", "mnist_lstm", "--config.dataset=synthetic_images", *mode)
    assert status == 2 and "Traceback" not in err
    assert "MnistLSTM(num_classes=10) does not take the batches of synthetic_images (images (32, 32, 3)" in err
  assert not (tmp_path / "w" / "checkpoints").exists()


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


@pytest.mark.parametrize("flags, message", [
    (["--topology", "v5p:2x2x1", "--workdir", "w"], "add --compile-only"),
    (["--dry-run", "--compile-only"], "keep one, or run them as two commands"),
    (["--layer-table", "--dry-run"], "--layer-table computes the first step's gradients"),
    (["--compile-only", "--distributed"], "--compile-only runs in this one process (for a pod, name it: --topology"),
    (["--layer-table", "--coordinator_address", "127.0.0.1:1234"], "--layer-table runs in this one process; drop "
                                                                   "--coordinator_address"),
    (["--num_processes", "2", "--process_id", "0", "--workdir", "w"], "--num_processes, --process_id set up "
                                                                       "jax.distributed for a multi-host run: add "
                                                                       "--distributed"),
])
def test_a_flag_the_chosen_mode_would_not_use_is_refused_before_the_config_is_read(capsys, flags, message):
  """The config is a typo on purpose: the refusal comes first, so no flag is ever silently dropped."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--config", "no_such_config", *flags])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and message in err and "Traceback" not in err


def test_dry_run_may_be_added_to_a_multi_host_command_line(capsys):
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--distributed", "--num_processes", "2", "--dry-run")
  assert status == 0 and "128 (global)" in out


def test_a_whole_argument_section_on_the_command_line_swaps_its_function(capsys):
  """`--config.optimizer=adamw` drops the arguments set for the config's optimizer (issue 27: mnist_lstm's
  momentum=0.9 made `--config.optimizer.name=adamw` fail); a dict literal gives the new arguments."""
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.optimizer=adamw", "--dry-run")
  assert status == 0 and "optimizer optax.adamw()\n" in out
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.optimizer={'name': 'adamw', 'b1': 0.8}",
                        "--config.optimizer.weight_decay=0.01", "--dry-run")
  assert status == 0 and "optax.adamw(b1=0.8, weight_decay=0.01)" in out
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.optimizer={}", "--dry-run")
  assert status == 0 and "lbjax.optim.momentum()" in out  # the name kept, its arguments dropped
  # lr and scaling keep their recipe fields (the peak LR 0.08, the base batch 128) and swap the function.
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.lr.decay=multistep_decay",
                        "--config.lr.boundaries_epochs=(1,)", "--config.lr.decay_factors=(0.1,)",
                        "--config.lr=cosine_decay", "--config.scaling=sqrt", "--dry-run")
  assert status == 0 and "decay lbjax.schedules.decay.cosine_decay()" in out
  assert "scaling sqrt from batch 128 (LR 0.08" in out
  status, out, _ = _run(capsys, "--config", "mnist_lstm", "--config.compression=qsgd",
                        "--config.compression.num_levels=4", "--dry-run")
  assert status == 0 and "lbjax.optim.compression.qsgd(" in out and "num_levels=4)" in out


def test_a_refused_argument_says_how_to_swap_the_function(capsys):
  status, _, err = _run(capsys, "--config", "mnist_lstm", "--config.optimizer.name=adamw", "--dry-run")
  assert status == 2 and "optax.adamw takes no argument 'momentum'" in err
  assert "--config.optimizer=adamw names it and drops the arguments set for the function before" in err
  status, _, err = _run(capsys, "--config", "mnist_lstm", "--config.model_options.depth=3", "--dry-run")
  assert status == 2 and "--config.model_options={} drops all of the section's arguments" in err


@pytest.mark.parametrize("override, message", [
    ("--config.model_options=ResNet18", "config.model_options holds the keyword arguments of config.model, so it "
                                        "takes a dict: --config.model_options={} drops them all"),
    ("--config.optimizer={'name': {}}", "expected a name or a Python dict literal of the section's fields"),
    ("--config.optimizer={'name': 'adamw'", "expected a name or a Python dict literal of the section's fields"),
    ("--config.mesh=2", "'mesh' is a section; set one of its fields, e.g. --config.mesh.data=...; only the "
                        "argument sections"),
])
def test_a_bad_section_override_is_refused_naming_what_it_takes(capsys, override, message):
  status, _, err = _run(capsys, "--config", "mnist_lstm", override, "--dry-run")
  assert status == 2 and message in err and "Traceback" not in err


SYNTHETIC_PTB = ("--config.dataset=synthetic_ptb", "--config.data_options={}", "--config.mesh.num_devices=1")


@pytest.mark.parametrize("argv, message", [
    # A ZeroDivisionError under --dry-run; a traceback from the first stream made in a run.
    (("--config", "ptb_lstm", *SYNTHETIC_PTB, "--config.data_options.seq_len=0"),
     "seq_len must be a positive integer, got 0"),
    # --dry-run accepted an adaptive policy's largest batch that the run refuses.
    (("--config", "adaptive_batch_ptb:run=adascale,max_batch=100000", *SYNTHETIC_PTB),
     "config.batch.max_batch_size (the adaptive policy's largest batch): a batch of 100000"),
])
@pytest.mark.parametrize("mode", ["--dry-run", "--workdir"])
def test_what_a_run_refuses_of_its_token_data_dry_run_refuses_too(capsys, tmp_path, argv, message, mode):
  status, _, err = _run(capsys, *argv, *([mode] if mode == "--dry-run" else [mode, str(tmp_path / "run")]))
  assert status == 2 and message in err and "Traceback" not in err


def test_a_training_text_shorter_than_one_window_is_refused_naming_its_length(capsys, tmp_path):
  """It ended in a traceback from the training stream, made after the dataset had opened."""
  (tmp_path / "ptb").mkdir()
  for split in ("train", "valid", "test"):
    (tmp_path / "ptb" / f"ptb.{split}.txt").write_text("a b c\n")
  status, _, err = _run(capsys, "--config", "ptb_lstm", f"--config.data_dir={tmp_path}", "--config.num_steps=1",
                        "--config.mesh.num_devices=1", "--workdir", str(tmp_path / "run"))
  assert status == 2 and "Traceback" not in err
  assert "the training split has 4 tokens; windows of seq_len=20 need at least seq_len + 1 = 21" in err


@pytest.mark.parametrize("override, message", [
    ("--config.optimizer.mask=nomatch",
     "config.optimizer (lbjax.optim.mclr(mask='nomatch', momentum=0.9)) does not fit the model's parameters: mask "
     "'nomatch' matches no parameter"),
    ("--config.model_options.num_filters=-2", "config.model_options.num_filters=-2: lbjax.models.ResNetTiny"),
])
def test_dry_run_refuses_what_the_model_and_optimizer_state_shapes_refuse(capsys, override, message):
  """It printed the run; the run refused it after opening the data."""
  status, _, err = _run(capsys, "--config", "resnet_tiny_synthetic_cifar", "--config.optimizer.name=mclr", override,
                        "--dry-run")
  assert status == 2 and message in err and "Traceback" not in err


def test_dry_run_refuses_an_init_from_that_names_no_checkpoint(capsys, tmp_path):
  """It printed 'from the checkpoint /nowhere'; the run refused it only after opening the data."""
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  for source, message in ((tmp_path / "nowhere", "no checkpoints/ folder there"),
                          (tmp_path / "checkpoints" / "3", "there is no checkpoint 3 in .* \\(it holds 4\\)")):
    status, _, err = _run(capsys, "--config", "mnist_lstm", f"--config.init_from={source}", "--dry-run")
    assert status == 2 and "Traceback" not in err
    assert re.search(f"config.init_from='{re.escape(str(source))}': {message}", err), err


def test_mnist_lstm_trains_with_adamw_from_the_command_line_alone(capsys, tmp_path):
  status, _, _ = _run(capsys, "--config", "mnist_lstm", "--config.optimizer=adamw", "--config.lr.base=0.001",
                        "--config.dataset=synthetic_mnist", "--config.num_steps=2", "--config.progress=False",
                        "--workdir", str(tmp_path / "run"))
  assert status == 0
  assert '"optimizer": "optax.adamw()"' in (tmp_path / "run" / "config.json").read_text()
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if r["kind"] == "train"] == [2]


@pytest.mark.parametrize("under", [False, True])
def test_a_workdir_that_is_a_file_is_a_two_line_message(tmp_path, under):
  existing = tmp_path / "notes.txt"
  existing.write_text("not a run")
  workdir = existing / "run" if under else existing
  result = subprocess.run([sys.executable, "-m", "lbjax.main", "--config", "mnist_lstm", "--workdir", str(workdir)],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.splitlines() == [
      f"lbjax-train: --workdir {str(workdir)!r} "
      + (f"lies under {str(existing)!r}, which is a file" if under else "is a file")
      + ", not a directory: name a new directory or one holding a run to resume.",
      "(Set LBJAX_TRACEBACK=1 for the traceback.)"]
  assert existing.read_text() == "not a run"


def test_a_workdir_the_system_refuses_is_named_before_training(tmp_path, monkeypatch):
  def refuse(self, *args, **kwargs):
    raise PermissionError(13, "Permission denied", str(self))

  monkeypatch.setattr(workdir_lock.pathlib.Path, "mkdir", refuse)
  with pytest.raises(cli.ConfigError, match=r"--workdir '.*new' cannot be created: Permission denied\. Name a "):
    workdir_lock.check_workdir(str(tmp_path / "new"))
  monkeypatch.undo()
  monkeypatch.setattr(workdir_lock.os, "access", lambda path, mode: False)
  with pytest.raises(cli.ConfigError, match="is not writable by this process: the run's checkpoints"):
    workdir_lock.check_workdir(str(tmp_path))


def test_a_new_workdir_is_created_before_training(tmp_path):
  workdir_lock.check_workdir(str(tmp_path / "a" / "run"))
  assert (tmp_path / "a" / "run").is_dir()


def test_a_config_file_without_get_config_is_a_message_under_dry_run(tmp_path):
  path = tmp_path / "my_config.py"
  path.write_text("import ml_collections\n\ndef get_config():\n  return ml_collections.ConfigDict({'seed': 1})\n")
  result = subprocess.run([sys.executable, "-m", "lbjax.main", "--config", str(path), "--dry-run"],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert f"lbjax-train: Config file {path}: get_config() returned a config without " in result.stderr
  assert "copy a packaged one, e.g. " in result.stderr and len(result.stderr.splitlines()) == 2


def test_a_compression_argument_the_compressor_refuses_fails_the_dry_run(capsys):
  status, _, err = _run(capsys, "--config", "mnist_lstm", "--config.compression.name=qsgd",
                        "--config.compression.num_levels=0", "--dry-run")
  assert status == 2 and "Traceback" not in err
  assert ("config.compression.name='qsgd': lbjax.optim.compression.qsgd refuses its arguments: qsgd: num_levels (s) "
          "must be >= 1, got 0.") in err


@pytest.mark.parametrize("flags, env, message", [
    (["--coordinator_address", "localhost:12345", "--num_processes", "2", "--process_id", "5"], {},
     "--process_id 5 is not a process of --num_processes 2: processes are numbered 0 to 1"),
    (["--coordinator_address", "nohostport"], {},
     "--coordinator_address 'nohostport' is not host:port: give the host of process 0 and a free port number"),
    (["--coordinator_address", "localhost:http"], {}, "--coordinator_address 'localhost:http' is not host:port"),
    (["--coordinator_address", "localhost:12345"], {},
     "--coordinator_address without --distributed sets the job up by hand: give --num_processes and --process_id"),
    (["--coordinator_address", "localhost:12345", "--num_processes", "2"], {}, "by hand: give --process_id too"),
    (["--distributed", "--num_processes", "0"], {}, "--num_processes 0 must be >= 1"),
    (["--distributed"], {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     "JAX_PROCESS_ID 2 is not a process of JAX_NUM_PROCESSES 2"),
])
def test_multi_host_settings_are_checked_before_the_run_even_under_dry_run(capsys, monkeypatch, flags, env, message):
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  status, out, err = _run(capsys, "--config", "mnist_lstm", *flags, "--dry-run")
  assert status == 2 and message in err and "Traceback" not in err and not out


@pytest.mark.parametrize("config, overrides, message", [
    ("mnist_lstm", ["--config.mesh.data=3"], "global batch size 128 is not divisible by the data-parallel size 3"),
    ("mnist_lstm:eval_split=valid", [], "config.data_options.eval_split='valid': lbjax.train.datasets.mnist takes "
                                        "eval_split 'test' or 'validation' (did you mean 'validation'?)"),
    ("mnist_lstm", ["--config.dataset=ptb"], "lbjax.models.MnistLSTM is a classifier; config.dataset='ptb' is a "
                                             "language-model dataset"),
    ("mnist_lstm", ["--config.batch_size=70000"], "a batch of 70000: the 60000 training examples are fewer than the "
                                                  "batch"),
])
def test_dry_run_refuses_what_the_start_of_a_run_refuses_without_reading_data(capsys, monkeypatch, tmp_path, config,
                                                                               overrides, message):
  monkeypatch.setenv("LBJAX_DATA_DIR", str(tmp_path))  # empty: a check that opened the data would say so
  status, out, err = _run(capsys, "--config", config, *overrides, "--dry-run")
  assert status == 2 and message in err and "Traceback" not in err and not out


@pytest.mark.parametrize("others", [["--config.num_stepz=3"], ["--topology", "foo"], ["--config", "mnist_lstm"],
                                    ["--dry-run"], ["stray"]])
def test_list_takes_no_other_options(capsys, others):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--list", *others])
  out, err = capsys.readouterr()
  assert exit_info.value.code == 2 and not out
  assert f"--list takes no other options; drop {' '.join(others)}" in err


def test_list_into_a_reader_that_stops_early_is_not_an_error():
  """`lbjax-train --list | head -1`: the pipe closes under the listing, which ends it quietly."""
  listing = subprocess.Popen([sys.executable, "-m", "lbjax.main", "--list"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
  listing.stdout.close()  # before the listing is written: as `head -1` exits after its line
  err = listing.stderr.read().decode()
  assert listing.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_an_empty_data_folder_says_where_it_is_what_set_it_and_what_it_should_hold(capsys, monkeypatch, tmp_path):
  monkeypatch.setenv("LBJAX_DATA_DIR", str(tmp_path / "data"))
  (tmp_path / "data").mkdir()
  status, _, err = _run(capsys, "--config", "mnist_lstm", "--workdir", str(tmp_path / "run"))
  assert status == 2 and "Traceback" not in err
  assert f"not found in the data folder {tmp_path / 'data'} (set by LBJAX_DATA_DIR)" in err
  assert "MNIST is read from <data folder>/mnist/" in err and "--config.data_dir=PATH" in err
  assert not (tmp_path / "run" / "metrics.jsonl").exists()
