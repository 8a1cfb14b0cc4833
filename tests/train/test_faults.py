"""Fault injection: what a run survives (docs/faults.md).

Real subprocesses of `lbjax-train` and real signals on a tiny synthetic run (tests/experiments/
tiny_sweep_config.py: a 16-unit MNIST LSTM, 8 steps of 32 per epoch): a second run on a workdir in
use, Ctrl-C and a second signal during the save, kill -9 at random points of a save, corrupt
checkpoints, a non-finite step and the ways on from it, a full disk, other data, a resume on another
device count, and the metrics file after a resume.
"""

import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import optax
import pytest

from lbjax import config_files
from lbjax.train import CheckpointMismatchError, NonFiniteError, Run, train_and_evaluate
from lbjax.train import datasets
from lbjax.train import optimizer as optimizer_lib
from lbjax.train.checkpointing import Checkpointer, abstract_like
from lbjax.train.errors import ConfigError, DataMismatchError
from tests.train import helpers

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = str(REPO / "tests" / "experiments" / "tiny_sweep_config.py")
# Runs until stopped: saves every step, so a signal or a kill almost always meets a save in flight.
ENDLESS = ("--config.num_epochs=500", "--config.checkpoint_every_steps=1", "--config.log_every=1",
           "--config.progress=True")


def _tiny(*overrides: str):
  return config_files.load(TINY, list(overrides)).config


class Training:
  """`lbjax-train` in a subprocess; its output goes to files (a pipe nobody reads fills up and blocks it)."""

  def __init__(self, workdir: pathlib.Path, *overrides: str, logs: pathlib.Path | None = None):
    self.logs = logs or workdir.parent / f"{workdir.name}.log"
    self.logs.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "lbjax.main", "--config", TINY, "--workdir", str(workdir), *overrides]
    with open(self.logs / "stdout", "w") as stdout, open(self.logs / "stderr", "w") as stderr:
      self.process = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                                      stdout=stdout, stderr=stderr)
    self.pid = self.process.pid

  def poll(self):
    return self.process.poll()

  def send_signal(self, signum) -> None:
    self.process.send_signal(signum)

  def kill(self) -> None:
    self.process.kill()

  def finish(self, timeout: float = 300) -> tuple[int, str, str]:
    """Waits for the exit; returns (status, stdout, stderr)."""
    status = self.process.wait(timeout=timeout)
    return status, (self.logs / "stdout").read_text(), (self.logs / "stderr").read_text()

  def stderr(self) -> str:
    return (self.logs / "stderr").read_text()[-3000:]


def _wait_for_steps(workdir: pathlib.Path, process: Training, steps: int) -> None:
  """Returns once `metrics.jsonl` has a train record at `steps` or later; fails if the run exits first."""
  metrics, deadline = workdir / "metrics.jsonl", time.monotonic() + 300
  while True:
    if metrics.exists():
      records = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
      if any(r["kind"] == "train" and r["step"] >= steps for r in records):
        return
    assert process.poll() is None, process.stderr()
    assert time.monotonic() < deadline
    time.sleep(0.1)


def _committed_steps(workdir: pathlib.Path) -> list[int]:
  """The complete checkpoints, read from the folder names without opening an Orbax manager."""
  folder = workdir / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def _records(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_second_run_is_refused_and_ctrl_c_then_sigterm_during_the_save_keeps_the_saved_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  first = Training(workdir, *ENDLESS)
  _wait_for_steps(workdir, first, 3)
  start = time.monotonic()
  second = subprocess.run([sys.executable, "-m", "lbjax.main", "--config", TINY, "--workdir", str(workdir)],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=120)
  refused_after = time.monotonic() - start
  assert second.returncode == 2, second.stderr[-2000:]
  assert f"in use by another run (pid {first.pid} on host" in second.stderr
  assert refused_after < 60  # seconds on an idle machine (importing JAX); generous for a loaded CI box

  first.send_signal(signal.SIGINT)
  time.sleep(random.Random(0).uniform(0.01, 0.2))
  first.send_signal(signal.SIGTERM)  # a second signal while the run saves
  status, stdout, stderr = first.finish()
  assert "KeyboardInterrupt" not in stderr
  saved = [line for line in stdout.splitlines() if "saved checkpoint" in line]
  assert len(saved) == 1 and saved[0].startswith("SIGINT: saved checkpoint"), stdout[-2000:]
  # A SIGTERM that lands during the save waits for it (exit 0); on a loaded machine it may land only
  # after the run has saved, closed and given the signal back: then it ends the exiting process, and
  # what the log called saved is still there.
  assert status == 0 or (status == -signal.SIGTERM and "again" not in stderr), stderr[-3000:]
  step = int(saved[0].split("saved checkpoint ")[1].split()[0])
  assert Checkpointer(workdir).latest_step() == step
  assert not (workdir / "lock").exists()
  run = Run(_tiny(), workdir)  # verifies the checksums
  try:
    assert run.resumed_from == step and not run.skipped_checkpoints
  finally:
    run.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_at_a_random_point_of_a_save_resumes_the_newest_durable_checkpoint_bit_exactly(tmp_path, seed):
  workdir = tmp_path / "run"
  process = Training(workdir, *ENDLESS)
  _wait_for_steps(workdir, process, 2)
  while not _committed_steps(workdir):  # a first checkpoint is on disk (Orbax renames it when complete)
    assert process.poll() is None, process.stderr()
    time.sleep(0.05)
  time.sleep(random.Random(seed).uniform(0.0, 1.0))
  process.kill()
  process.finish(timeout=60)
  durable = Checkpointer(workdir).all_steps()
  assert durable, "no checkpoint was complete when the run was killed"
  lock = json.loads((workdir / "lock").read_text())
  assert lock["pid"] == process.pid  # left behind by the killed run

  target = durable[0] + 3
  resumed = train_and_evaluate(_tiny(*ENDLESS[:3], f"--config.num_steps={target}"), workdir)
  assert json.loads((workdir / "history.jsonl").read_text().splitlines()[-1])["stale_lock"]["pid"] == process.pid
  resume = [r for r in _records(workdir) if r["kind"] == "resume"]
  assert resume[-1]["step"] == durable[0]  # the newest complete checkpoint, nothing older
  reference = train_and_evaluate(_tiny(*ENDLESS[:3], f"--config.num_steps={target}"), tmp_path / "reference")
  assert resumed.step == reference.step == target
  helpers.assert_trees_equal(resumed.state, reference.state)


def _largest_data_file(checkpoint: pathlib.Path) -> pathlib.Path:
  return max((f for f in (checkpoint / "state").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)


def _replace_arrays_with_readable_other_ones(workdir: pathlib.Path, step: int, other_run: pathlib.Path) -> None:
  """Puts another run's arrays (same shapes, other seed) under checkpoint `step`'s metadata: the
  checkpoint reads back without any error but holds other values than were checksummed, the silent
  corruption (a flipped bit inside the data, a stale file) that only the checksums catch. Flipping
  real bits is not deterministic: which flips Orbax reads back without an error depends on its
  version's file layout."""
  state = workdir / "checkpoints" / str(step) / "state"
  shutil.rmtree(state)
  shutil.copytree(other_run / "checkpoints" / str(step) / "state", state)


@pytest.mark.parametrize("damage", ["other readable arrays", "truncate"])
def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_one_resumed(tmp_path, damage, caplog):
  config = helpers.tiny_classifier_config(checkpoint_every_steps=4, num_steps=8, num_epochs=2.0)
  train_and_evaluate(config, tmp_path)
  if damage == "truncate":
    newest = _largest_data_file(tmp_path / "checkpoints" / "8")
    newest.write_bytes(newest.read_bytes()[:64])
  else:
    other = tmp_path.parent / f"{tmp_path.name}_other_seed"
    train_and_evaluate(helpers.tiny_classifier_config(checkpoint_every_steps=4, num_steps=8, num_epochs=2.0, seed=1),
                       other)
    _replace_arrays_with_readable_other_ones(tmp_path, 8, other)
  resumed = train_and_evaluate(helpers.tiny_classifier_config(checkpoint_every_steps=4, num_steps=12, num_epochs=2.0),
                               tmp_path)
  warnings = [r.getMessage() for r in caplog.records if "Skipped checkpoint 8" in r.getMessage()]
  assert warnings, caplog.text[-2000:]
  assert ("the checksum of" if damage == "other readable arrays" else "its arrays cannot be read") in warnings[0]
  assert (tmp_path / "skipped_checkpoints" / "8" / "reason.txt").exists()
  assert [r for r in _records(tmp_path) if r["kind"] == "resume"][-1]["step"] == 4
  reference = train_and_evaluate(helpers.tiny_classifier_config(checkpoint_every_steps=4, num_steps=12, num_epochs=2.0),
                                 tmp_path / "reference")
  assert resumed.step == 12
  helpers.assert_trees_equal(resumed.state, reference.state)


@pytest.mark.parametrize("damage", ["other readable arrays", "truncate"])
def test_init_from_takes_the_newest_checkpoint_that_reads_back_and_leaves_the_source_as_it_is(tmp_path, damage):
  """`config.init_from` checks the parameters it reads against the checksums saved with them, as a resume does:
  it started from a silently altered checkpoint, and refused a damaged one as not fitting the model."""
  source = tmp_path / "source"
  config = helpers.tiny_classifier_config(checkpoint_every_steps=4, num_steps=8, num_epochs=2.0)
  train_and_evaluate(config, source)
  if damage == "truncate":  # every file of the state: the parameters' too
    for file in (f for f in (source / "checkpoints" / "8" / "state").rglob("*") if f.is_file()):
      file.write_bytes(file.read_bytes()[:64])
  else:
    other = tmp_path / "other_seed"
    train_and_evaluate(helpers.tiny_classifier_config(checkpoint_every_steps=4, num_steps=8, num_epochs=2.0, seed=1),
                       other)
    _replace_arrays_with_readable_other_ones(source, 8, other)
  before = sorted(p.relative_to(source) for p in source.rglob("*"))
  started = Run(helpers.tiny_classifier_config(num_steps=2, init_from=str(source)), tmp_path / "new")
  try:
    reference = Checkpointer(source, max_to_keep=None)
    try:
      saved = reference.restore_fields(4, abstract_like({"params": started.state.params}))["params"]
    finally:
      reference.close()
    helpers.assert_trees_equal(started.state.params, saved)
  finally:
    started.close()
  history = json.loads((tmp_path / "new" / "history.jsonl").read_text())
  assert history["init_from"]["step"] == 4 and history["init_from"]["skipped"][0]["step"] == 8
  assert ("the checksum of params/" if damage == "other readable arrays" else "cannot be read") in \
      history["init_from"]["skipped"][0]["reason"]
  assert sorted(p.relative_to(source) for p in source.rglob("*")) == before
  with pytest.raises(ConfigError, match=r"config.init_from=.*/checkpoints/8.*: no checkpoint there gives this run its "
                                        r"parameters: checkpoint 8: "):
    Run(helpers.tiny_classifier_config(num_steps=2, init_from=str(source / "checkpoints" / "8")), tmp_path / "newest")


def test_a_non_finite_step_names_the_step_and_quantity_and_both_ways_on_work(tmp_path):
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=4), tmp_path)  # a good checkpoint at step 4
  blowup = helpers.tiny_classifier_config(num_steps=8, resume_with_changed_optimizer=True)
  blowup.lr.base = 1e38
  with pytest.raises(NonFiniteError) as error:
    train_and_evaluate(blowup, tmp_path)
  message = str(error.value)
  # Step 4's update (LR 1e38) is finite but huge; step 5's loss is not.
  assert "at step 5: the loss is not finite" in message and "lower config.lr.base" in message
  assert "--config.resume_with_changed_optimizer=True" in message and f"--config.init_from={tmp_path}" in message

  lower = helpers.tiny_classifier_config(num_steps=8)
  lower.lr.base = 0.01
  with pytest.raises(CheckpointMismatchError, match="resume_with_changed_optimizer=True"):
    train_and_evaluate(lower, tmp_path)  # a changed optimizer is refused unless asked for
  lower.resume_with_changed_optimizer = True
  result = train_and_evaluate(lower, tmp_path)
  assert result.step == 8
  history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
  assert history[-1]["event"] == "resume" and history[-1]["changed_optimizer"]["lr"][1]["base"] == 0.01

  fresh = helpers.tiny_classifier_config(num_steps=2, init_from=str(tmp_path),  # another optimizer, too
                                         optimizer={"name": "lars", "momentum": 0.9})
  started = Run(fresh, tmp_path / "from_parameters")
  try:
    helpers.assert_trees_equal(started.state.params, result.state.params)  # the checkpoint's parameters
    assert started.step_count == 0 and started.epoch == 0.0  # a new run
  finally:
    started.close()
  history = json.loads((tmp_path / "from_parameters" / "history.jsonl").read_text())
  assert history["init_from"] == {"workdir": str(tmp_path), "step": 8}


def test_the_advised_clip_resumes_and_a_state_of_another_structure_is_refused_where_it_lies(tmp_path, monkeypatch):
  """A clip set on resume (what a non-finite step advises) restores the checkpoint: it was refused as
  unreadable, every checkpoint was set aside, and the next run started from step 0. A checkpoint whose
  optimizer state has another structure (here: one saved with the clip as an optax.chain, as lbjax did) is
  refused as a mismatch, and stays where it is."""
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=4), tmp_path / "advised")
  clipped = train_and_evaluate(helpers.tiny_classifier_config(num_steps=6, clip_global_norm=1.0,
                                                              resume_with_changed_optimizer=True), tmp_path / "advised")
  history = [json.loads(line) for line in (tmp_path / "advised" / "history.jsonl").read_text().splitlines()]
  assert clipped.step == 6 and history[-1]["event"] == "resume" and history[-1]["step"] == 4

  with monkeypatch.context() as patch:
    patch.setattr(optimizer_lib, "_clipped", lambda transform, norm: optax.chain(optax.clip_by_global_norm(norm),
                                                                                 transform))
    train_and_evaluate(helpers.tiny_classifier_config(num_steps=4, clip_global_norm=1.0), tmp_path / "chained")
  saved = sorted(path.name for path in (tmp_path / "chained" / "checkpoints").iterdir())
  with pytest.raises(CheckpointMismatchError, match=r"Checkpoint 4 in .* holds a state of another structure than "
                                                    r"this run's \(only in the checkpoint: opt_state"):
    train_and_evaluate(helpers.tiny_classifier_config(num_steps=6, clip_global_norm=1.0), tmp_path / "chained")
  assert sorted(path.name for path in (tmp_path / "chained" / "checkpoints").iterdir()) == saved
  assert not (tmp_path / "chained" / "skipped_checkpoints").exists()


def test_a_failed_save_on_a_full_disk_stops_with_a_short_message_and_keeps_the_previous_checkpoint(tmp_path):
  disk = tmp_path / "disk"
  disk.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True).returncode:
    pytest.skip("needs permission to mount a small tmpfs as a full disk")
  process = None
  try:
    workdir = disk / "run"
    ballast = disk / "ballast"
    process = Training(workdir, "--config.num_epochs=500", "--config.checkpoint_every_steps=4",
                       "--config.keep_checkpoints=1", "--config.log_every=1", "--config.eval_every_epochs=1000",
                       logs=tmp_path / "logs")
    _wait_for_steps(workdir, process, 5)  # checkpoint 4 is being written or on disk
    while not _committed_steps(workdir):
      time.sleep(0.05)
    with open(ballast, "wb", buffering=0) as f:  # fill the disk
      try:
        while True:
          f.write(b"\0" * 4096)
      except OSError:
        pass
    status, _, stderr = process.finish()
    assert status == 3, stderr[-3000:]
    # Orbax's failing writer threads may still be printing when the message is written, so a fragment of
    # their output can precede it on its line (seen on the oldest pins under load): find it in the line.
    start = "lbjax-train: Saving checkpoint"
    message = [line[line.index(start):] for line in stderr.splitlines() if start in line]
    assert message and "the last good checkpoint is step" in message[0] and "MiB are free" in message[0], stderr[-3000:]
    # One thing on the console: Orbax's writers' failures and tracebacks are in the workdir's log (issue 30).
    # asyncio's "Event loop is closed" tracebacks that Orbax's storage callbacks print from C++ (PyErr_Print,
    # which calls sys.excepthook) go there too since 2026-11-26 (orbax_log); before, up to 139 of them (416
    # lines) reached the console in CI under load. How many trials show that all of them pass through the hook
    # is in docs/faults.md, so the test still tolerates them, by kind: every other line is lbjax's message or
    # its hint.
    asyncio_noise = re.compile(r"Traceback \(most recent call last\):|asyncio/base_events\.py|_check_closed\(\)|"
                               r"Event loop is closed")
    python_lines = [line for line in stderr.splitlines() if not re.match(r"[EWI]\d{4} ", line)]  # not XLA's own
    console = [line for line in python_lines if start in line or (line.strip() and not asyncio_noise.search(line))]
    assert len(console) == 2 and start in console[0], stderr
    assert console[1] == "(Set LBJAX_TRACEBACK=1 for the traceback.)", stderr
    assert f"Orbax's reports, as far as they could be written, are in {workdir / 'logs'}" in message[0]
    last_good = int(message[0].split("the last good checkpoint is step ")[1].split()[0])
    failed = int(message[0].split("Saving checkpoint ")[1].split()[0])
    last_step = max(r["step"] for r in _records(workdir) if r["kind"] == "train")
    # Polled at every step, the writer's failure stops training within a few steps (when it surfaces
    # depends on the writer thread: 3 steps on a loaded CI machine); at the latest, the next save
    # (4 steps on) waits for it and stops there, so no later checkpoint is attempted.
    assert last_step <= failed + 4
    ballast.unlink()
    assert Checkpointer(workdir).latest_step() == last_good
    resumed = Run(_tiny("--config.keep_checkpoints=1"), workdir)
    assert resumed.resumed_from == last_good and not resumed.skipped_checkpoints
    resumed.close()
  finally:
    if process is not None and process.poll() is None:
      process.kill()
      process.finish(timeout=60)
    subprocess.run(["umount", "--lazy", str(disk)], check=False)  # even while a killed child holds a file


# Over this size a file cannot grow once the limit is set: under the tiny run's largest checkpoint file
# (about 11 KiB), above what its metrics.jsonl reaches before the run stops (under 4 KiB).
_FILE_SIZE_LIMIT = 8 * 1024


@pytest.mark.skipif(not hasattr(__import__("resource"), "prlimit"), reason="needs resource.prlimit (Linux)")
def test_a_failed_save_without_mount_rights_stops_with_a_short_message_and_keeps_the_previous_checkpoint(tmp_path):
  """The full-disk fault without a tmpfs: once checkpoint 4 is on disk, the running `lbjax-train` gets an
  RLIMIT_FSIZE (`prlimit`, no privilege needed), so the writers of checkpoint 8 fail with EFBIG ("File too
  large") as they would with ENOSPC on a full disk. Its output goes to a pipe, which the limit spares."""
  import resource  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  command = [sys.executable, "-m", "lbjax.main", "--config", TINY, "--workdir", str(workdir),
             "--config.num_epochs=500", "--config.checkpoint_every_steps=4", "--config.keep_checkpoints=1",
             "--config.log_every=1", "--config.eval_every_epochs=1000", "--config.progress=False"]
  process = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines = []  # read as it comes: XLA's warnings alone can fill a pipe nobody reads and block the run
  reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
  reader.start()
  try:
    deadline = time.monotonic() + 300
    while 4 not in _committed_steps(workdir):
      assert process.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
      time.sleep(0.02)
    resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT))
    process.wait(timeout=300)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait(timeout=60)
    reader.join(timeout=60)
    process.stderr.close()
  stderr = "".join(lines)
  assert process.returncode == 3, stderr[-3000:]
  start = "lbjax-train: Saving checkpoint"
  message = [line[line.index(start):] for line in stderr.splitlines() if start in line]
  assert message and "the last good checkpoint is step 4" in message[0] and "MiB are free" in message[0], \
      stderr[-3000:]
  failed = int(message[0].split("Saving checkpoint ")[1].split()[0])
  assert failed == 8 and max(r["step"] for r in _records(workdir) if r["kind"] == "train") <= failed + 4
  assert Checkpointer(workdir).latest_step() == 4
  resumed = Run(_tiny("--config.keep_checkpoints=1"), workdir)
  assert resumed.resumed_from == 4 and not resumed.skipped_checkpoints
  resumed.close()


def test_resuming_on_other_data_is_refused_unless_asked_for(tmp_path):
  """The same recipe on other files: PTB from a data_dir whose training text changed after the checkpoint."""
  data = tmp_path / "data" / "ptb"
  data.mkdir(parents=True)
  for split in ("train", "valid", "test"):
    (data / f"ptb.{split}.txt").write_text(" a b c <unk> d e f \n" * 100)
  config = lambda **o: helpers.tiny_language_model_config(dataset="ptb", data_options={"seq_len": 10},
                                                          data_dir=str(tmp_path / "data"), **o)
  train_and_evaluate(config(num_steps=4), tmp_path / "run")
  (data / "ptb.train.txt").write_text(" a b c <unk> d f e \n" * 100)
  with pytest.raises(DataMismatchError,
                     match="trained on other data .*train: checkpoint sha256:.*resume_with_changed_data=True"):
    train_and_evaluate(config(num_steps=8), tmp_path / "run")
  assert train_and_evaluate(config(num_steps=8, resume_with_changed_data=True), tmp_path / "run").step == 8


def test_an_empty_evaluation_split_fails_before_training(tmp_path):
  data = tmp_path / "ptb"
  data.mkdir()
  (data / "ptb.train.txt").write_text(" a b c <unk> d e f \n" * 200)
  (data / "ptb.valid.txt").write_text("")
  (data / "ptb.test.txt").write_text(" a b \n")
  config = helpers.tiny_language_model_config(dataset="ptb", data_options={"seq_len": 10}, data_dir=str(tmp_path))
  with pytest.raises(ValueError, match=r"evaluation split \(valid\) of config.dataset='ptb'"):
    train_and_evaluate(config, tmp_path / "run")
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_metrics_are_cut_at_the_resumed_step_and_a_device_change_is_noted(tmp_path, capsys):
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=8, num_epochs=2.0, checkpoint_every_steps=4, log_every=2),
                     tmp_path)
  with open(tmp_path / "metrics.jsonl", "a") as f:  # what a run killed after checkpoint 8 had written
    f.write(json.dumps({"kind": "train", "step": 9, "loss": 1.0}) + "\n" + '{"kind": "tra')
  resumed = train_and_evaluate(helpers.tiny_classifier_config(num_steps=12, num_epochs=2.0, log_every=2, progress=True,
                                                              **{"mesh.num_devices": 4}), tmp_path)
  assert resumed.step == 12
  records = _records(tmp_path)
  steps = [r["step"] for r in records if r["kind"] == "train"]
  assert steps == sorted(set(steps)) and not [r for r in records if r.get("loss") == 1.0]
  resume = [r for r in records if r["kind"] == "resume"][-1]
  assert resume == {**resume, "step": 8, "dropped_records": 2, "data_parallel_size": 4, "saved_data_parallel_size": 8}
  assert "saved on 8 data-parallel devices and resumes on 4" in capsys.readouterr().out
  rerun = train_and_evaluate(helpers.tiny_classifier_config(num_steps=12, num_epochs=2.0, log_every=2), tmp_path)
  assert rerun.eval_metrics == resumed.eval_metrics
  assert len([r for r in _records(tmp_path) if r["kind"] == "eval" and r["step"] == 12]) == 1


def test_a_start_from_step_0_sets_aside_the_records_of_an_earlier_run_that_left_no_checkpoint(tmp_path):
  """A run killed before its first checkpoint leaves metrics.jsonl behind; the next run starts at step 0 and
  appended to it (steps repeated, two runs' curves mixed). Its records are kept beside, not lost."""
  earlier = [{"kind": "train", "step": step, "loss": 9.0} for step in (2, 4, 6)]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=4, log_every=2), tmp_path)
  steps = [r["step"] for r in _records(tmp_path) if r["kind"] == "train"]
  assert steps == [2, 4] and not [r for r in _records(tmp_path) if r.get("loss") == 9.0]
  (aside,) = tmp_path.glob("metrics.jsonl.*.earlier")
  assert [json.loads(line) for line in aside.read_text().splitlines()] == earlier


def test_a_checkpoint_is_saved_after_the_train_records_of_the_steps_it_holds(tmp_path, monkeypatch):
  """The record of a log window is fetched a step after the window closes; a checkpoint at the window's last
  step was saved before it, so a run killed in the next step lost that record for good (a resume keeps the
  records up to the checkpoint's step)."""
  written_at_save = {}
  save = Run.save

  def save_and_look(self, *args, **kwargs):
    written_at_save[self.step_count] = [r["step"] for r in _records(tmp_path) if r["kind"] == "train"]
    return save(self, *args, **kwargs)

  monkeypatch.setattr(Run, "save", save_and_look)
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=8, log_every=4, checkpoint_every_steps=4,
                                                    eval_every_epochs=100.0), tmp_path)
  assert written_at_save[4] == [4] and written_at_save[8][:2] == [4, 8]


@pytest.mark.parametrize("compressor, kept", [
    ({"compression.name": "one_bit", "compression.error_feedback": True}, "an error-feedback residual per device"),
    # It said "an error-feedback residual" of a PowerSGD without error feedback, whose state has none.
    ({"compression.name": "powersgd", "compression.rank": 1, "compression.error_feedback": False},
     "its query factors per device")])
def test_a_per_device_compression_state_is_refused_clearly_on_another_device_count(tmp_path, compressor, kept):
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=2, **compressor), tmp_path)
  fewer = helpers.tiny_classifier_config(num_steps=4, **compressor, **{"mesh.num_devices": 4})
  with pytest.raises(CheckpointMismatchError, match=f"keeps {kept}.* holds 8 .* has 4"):
    train_and_evaluate(fewer, tmp_path)


def test_a_checkpoint_compares_its_data_fingerprint_in_the_kind_it_recorded(tmp_path, monkeypatch):
  """Written with whole-array SHA-256s, resumed where the arrays are sampled, and back: the same data
  resumes both ways (other data is refused: `test_resuming_on_other_data_is_refused_unless_asked_for`)."""
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=4), tmp_path / "run")
  saved = Checkpointer(tmp_path / "run").restore_meta(4)["data_fingerprint"]
  assert saved["train"].startswith("sha256:")
  monkeypatch.setattr(datasets, "SAMPLE_ABOVE_BYTES", 1000)  # every array now sampled
  assert train_and_evaluate(helpers.tiny_classifier_config(num_steps=6), tmp_path / "run").step == 6
  assert Checkpointer(tmp_path / "run").restore_meta(6)["data_fingerprint"]["train"].startswith("sampled-sha256:")
  monkeypatch.undo()
  assert train_and_evaluate(helpers.tiny_classifier_config(num_steps=8), tmp_path / "run").step == 8


@pytest.mark.parametrize("make_config, bad_step", [
    (helpers.tiny_classifier_config, 2),  # step 1's mean of micro-batch losses is still finite (1e37)
    (helpers.tiny_language_model_config, 1),  # with one carry per micro-batch
])
def test_a_non_finite_step_of_the_any_batch_step_names_the_step_and_quantity(tmp_path, make_config, bad_step):
  """The diagnosis recomputes the bad step on its micro-batches (a list, `lbjax.train.any_batch`)."""
  blowup = make_config(num_steps=4, checkpoint_every_steps=0, **{"batch.micro_batch_size": 8})
  blowup.lr.base = 1e38
  with pytest.raises(NonFiniteError, match=rf"at step {bad_step}: the loss is not finite \(on the latest batch\)"):
    train_and_evaluate(blowup, tmp_path)
