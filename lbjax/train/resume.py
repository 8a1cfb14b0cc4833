"""Saving and resuming a run in its workdir: `Checkpoints`.

A run with a workdir resumes from the newest checkpoint that passes its checksum, skipping (and
setting aside in `<workdir>/skipped_checkpoints`) each newer one that cannot be read or fails it; a
checkpoint of another recipe (`config.check_resumable`) or of other data (its fingerprint) is refused.
Without a checkpoint of its own, `config.init_from` starts the run from another checkpoint's
parameters. Each start is recorded in `<workdir>/history.jsonl`. Saves run in the background; a
failed one (a full disk) is reported as `CheckpointSaveError` at the next step, save or close.
"""

import contextlib
import dataclasses
import json
import os
import pathlib
import socket
import time
from typing import Any, Callable, Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils

from lbjax.optim import compression
from lbjax.train import config as config_lib
from lbjax.train.checkpointing import Checkpointer, abstract_like, init_source, named_leaves
from lbjax.train.datasets import Dataset
from lbjax.train.errors import (CheckpointCorruptError, CheckpointMismatchError, CheckpointSaveError, ConfigError,
                                DataMismatchError)
from lbjax.train.resolved import ResolvedRun
from lbjax.train.state import TrainState
from lbjax.train.workdir_lock import WorkdirLock

HISTORY_FILE = "history.jsonl"


@dataclasses.dataclass
class Start:
  """Where a run starts: its state and, on a resume, the position and controller state it saved.

  Attributes:
    state: the `TrainState` to start from.
    resumed_from: the step of the checkpoint resumed, or None.
    meta: the resumed checkpoint's meta (stream position, examples seen, carry, batch policy), or {}.
    changes: the optimizer settings changed on purpose (`config.resume_with_changed_optimizer`).
    initialized_from: (workdir, step) of the `config.init_from` checkpoint, or None.
    init_skipped: (step, reason) of each newer checkpoint of `config.init_from` that did not read back.
  """
  state: TrainState
  resumed_from: int | None = None
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)
  changes: dict[str, list] = dataclasses.field(default_factory=dict)
  initialized_from: tuple[pathlib.Path, int] | None = None
  init_skipped: tuple[tuple[int, str], ...] = ()

  @property
  def saved_data_parallel_size(self) -> int | None:
    return self.meta.get("data_parallel_size")


class Checkpoints:
  """The checkpoints of a run in its workdir: resume, save in the background, report failures.

  Attributes:
    checkpointer: the workdir's `Checkpointer`.
    directory: where the checkpoints are.
    skipped: (step, reason) of each newer checkpoint that failed its checksum or could not be read.
    save_failed: whether a save failed (reported by `CheckpointSaveError`).
  """

  def __init__(self, workdir: pathlib.Path, run: ResolvedRun, dataset: Dataset, data_parallel_size: int,
               replicated: jax.sharding.Sharding, lock: WorkdirLock | None):
    self.workdir, self._run, self._dataset, self._lock = workdir, run, dataset, lock
    self._replicated = replicated
    self._data_parallel_size = data_parallel_size
    self.checkpointer = Checkpointer(workdir, max_to_keep=run.watch.keep_checkpoints)
    self.directory = self.checkpointer.directory
    self.skipped: list[tuple[int, str]] = []
    self.save_failed = False
    self._save_in_flight: int | None = None  # the step of a background save not yet known to be written

  def start(self, initial: TrainState, carry_for: Callable[[int, int | None], Any],
            model_description: str) -> Start:
    """The state to start from: the newest good checkpoint's, else `init_from`'s parameters, else
    `initial`; records the start in the history. `carry_for(batch_size, micro_batches)`: the zero
    carry a checkpoint's carry is restored into."""
    start = self._restore_latest(initial, carry_for)
    if start.resumed_from is None and self._run.init_from:
      start = self._start_from(self._run.init_from, initial, model_description)
    self._record_history(start)
    return start

  def _restore_latest(self, initial: TrainState, carry_for: Callable[[int, int | None], Any]) -> Start:
    steps = self.checkpointer.all_steps()
    for step in steps:
      try:
        meta = self.checkpointer.read_meta_verified(step)
        changes = config_lib.check_resumable(meta["config"], self._run.source_config, str(self.workdir),
                                             self._run.learning_rate.reads_num_epochs,
                                             self._run.micro_batches_change_the_update)
        self._check_same_data(meta)
        carry_batch_size = meta["carry_batch_size"]
        state = initial._replace(carry=carry_for(carry_batch_size, meta.get("carry_micro_batches"))
                                 if carry_batch_size else None)
        self._check_compression_state(meta, state)
        self._check_state_structure(step, meta, state)
        state = self.checkpointer.restore_verified(step, meta, abstract_like(state), self._replicated)
      except CheckpointCorruptError as e:
        self._skip(step, str(e))
        continue
      return Start(state, step, meta, changes)
    if steps:
      raise CheckpointCorruptError(
          f"No checkpoint in {self.directory} can be restored: "
          + "; ".join(f"step {step}: {reason}" for step, reason in self.skipped)
          + f". They are kept in {self.workdir / 'skipped_checkpoints'}; use a new --workdir, or start from "
          "one's parameters with --config.init_from=<its folder> if you trust it.")
    return Start(initial)

  def _skip(self, step: int, reason: str) -> None:
    self.skipped.append((step, reason))
    process_index, process_count = jax.process_index(), jax.process_count()
    if process_count > 1:  # every process has read it before process 0 moves it
      multihost_utils.sync_global_devices(f"lbjax_skip_checkpoint_{step}")
    where = self.checkpointer.set_aside(step, reason) if process_index == 0 else None
    if process_count > 1:
      multihost_utils.sync_global_devices(f"lbjax_skipped_checkpoint_{step}")
      self.checkpointer.reload()
    logging.warning("Skipped checkpoint %d in %s: %s. Moved it to %s; trying the one before it.", step,
                    self.directory, reason, where)
    if self._run.watch.progress and process_index == 0:
      print(f"Warning: skipped checkpoint {step}: {reason}. Moved it to {where}.", flush=True)

  def _check_same_data(self, meta: dict[str, Any]) -> None:
    saved = meta.get("data_fingerprint")
    if saved is None or not self._dataset.fingerprint or self._run.resume_with_changed_data:
      return
    now = self._dataset.fingerprint_like(saved)  # taken again in the checkpoint's kind where it differs
    if saved == now:
      return
    differing = "; ".join(f"{split}: checkpoint {saved.get(split)} vs now {now.get(split)}"
                          for split in sorted(set(saved) | set(now)) if saved.get(split) != now.get(split))
    raise DataMismatchError(
        f"The checkpoint in {self.directory} was trained on other data ({differing}). Point "
        "config.data_dir at the data it was trained on, or pass --config.resume_with_changed_data=True to resume "
        "on this data anyway.")

  def _check_compression_state(self, meta: dict[str, Any], state: TrainState) -> None:
    """Refuses a per-device compression state saved on another device count."""
    saved, now = meta.get("data_parallel_size"), self._data_parallel_size
    compressor, kept_state = self._run.build_compressor(), state.compression_state
    if (saved is None or saved == now or compressor is None or not compressor.per_device_state
        or not jax.tree.leaves(kept_state)):
      return
    if isinstance(kept_state, compression.PowerSGDState) and not kept_state.residuals:
      kept = ("its query factors per device (the same on every device without error feedback, but stored once "
              "per device)")
    elif isinstance(kept_state, (compression.ErrorFeedbackState, compression.PowerSGDState)):
      kept = "an error-feedback residual per device"
    else:
      kept = "its state per device (its GradientCompressor has per_device_state=True)"
    raise CheckpointMismatchError(
        f"config.compression.name={self._run.compressor.resolved.name!r} keeps {kept}; "
        f"the checkpoint in {self.directory} holds {saved} of them, this run has {now} data-parallel "
        f"devices. Resume on {saved} devices (config.mesh.num_devices={saved}), or start a new run from its "
        f"parameters: --config.init_from={self.workdir} --workdir=<a new workdir>.")

  def _check_state_structure(self, step: int, meta: dict[str, Any], state: TrainState) -> None:
    """Refuses a checkpoint whose state has other leaves than this run's (its checksums name them): another
    optimizer state, which Orbax cannot restore into this one; the checkpoint is sound and stays in place
    (refused as unreadable, it and every older one were set aside, and a rerun started from step 0)."""
    if "checksums" not in meta:
      return
    saved, now = set(meta["checksums"]), set(named_leaves(state))
    if saved == now:
      return
    differences = "; ".join(f"{what}: {', '.join(sorted(names)[:3])}{' ...' * (len(names) > 3)}" for what, names in
                            (("only in the checkpoint", saved - now), ("only in this run", now - saved)) if names)
    raise CheckpointMismatchError(
        f"Checkpoint {step} in {self.directory} holds a state of another structure than this run's ({differences}): "
        "the optimizer's state differs (another optimizer, momentum, state dtype or layout, or a config saved by "
        "an earlier lbjax). Resume with the settings it was saved with, or start a new run from its parameters: "
        f"--config.init_from={self.workdir} --workdir=<a new workdir>.")

  def _start_from(self, source: str, initial: TrainState, model_description: str) -> Start:
    """The parameters and BatchNorm statistics of the checkpoint `source` (a workdir, its
    `checkpoints/` folder or one step folder); optimizer, step and data start afresh. Of a workdir, the
    newest checkpoint whose arrays read back with the checksums it saved; the source is left as it is."""
    path, step = init_source(source)
    source_checkpointer = Checkpointer(path, max_to_keep=None)
    failed: list[tuple[int, str]] = []
    try:
      steps = [step] if step is not None else source_checkpointer.all_steps()
      if not steps:
        raise ConfigError(f"config.init_from={source!r}: {path / 'checkpoints'} holds no complete checkpoint.")
      fields = abstract_like({"params": initial.params, "model_state": initial.model_state})
      for candidate in steps:
        try:
          restored = source_checkpointer.restore_fields_verified(candidate, fields, self._replicated)
          break
        except CheckpointCorruptError as e:
          failed.append((candidate, str(e)))
        except Exception as e:  # pylint: disable=broad-except  (shapes differ, files unreadable, ...)
          failed.append((candidate, f"its parameters do not fit this run's model {model_description} or cannot "
                                    f"be read: {str(e).strip().splitlines()[-1][:300]}"))
      else:
        raise ConfigError(f"config.init_from={source!r}: no checkpoint there gives this run its parameters: "
                          + "; ".join(f"checkpoint {s}: {reason}" for s, reason in failed) + ".")
    finally:
      source_checkpointer.close()
    for skipped, reason in failed:
      logging.warning("config.init_from: skipped checkpoint %d of %s: %s.", skipped, path, reason)
      if self._run.watch.progress and jax.process_index() == 0:
        print(f"Warning: config.init_from: skipped checkpoint {skipped} of {path}: {reason}; trying the one before "
              "it.", flush=True)
    state = initial._replace(params=restored["params"], model_state=restored["model_state"])
    return Start(state, initialized_from=(path, candidate), init_skipped=tuple(failed))

  def _record_history(self, start: Start) -> None:
    """Appends this start to `<workdir>/history.jsonl`: resumed or new, from where, what changed."""
    if jax.process_index() != 0:
      return
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
              "pid": os.getpid(), "event": "resume" if start.resumed_from is not None else "start",
              "step": start.resumed_from or 0, "data_parallel_size": self._data_parallel_size}
    if start.changes:
      record["changed_optimizer"] = start.changes
    if self.skipped:
      record["skipped_checkpoints"] = [{"step": step, "reason": reason} for step, reason in self.skipped]
    if start.initialized_from:
      record["init_from"] = {"workdir": str(start.initialized_from[0]), "step": start.initialized_from[1]}
      if start.init_skipped:
        record["init_from"]["skipped"] = [{"step": step, "reason": reason} for step, reason in start.init_skipped]
    if start.saved_data_parallel_size not in (None, record["data_parallel_size"]):
      record["saved_data_parallel_size"] = start.saved_data_parallel_size
    if self._lock is not None and self._lock.stale_holder is not None:
      record["stale_lock"] = self._lock.stale_holder
    with open(self.workdir / HISTORY_FILE, "a") as f:
      f.write(json.dumps(record) + "\n")

  def latest_step(self) -> int | None:
    return self.checkpointer.latest_step()

  def needs_save(self, step: int) -> bool:
    """Whether step `step` is neither saved nor being saved."""
    return self.checkpointer.latest_step() != step and self._save_in_flight != step

  def save(self, step: int, state: TrainState, meta: dict[str, Any]) -> None:
    """Starts the background save of `state` at `step` (once the previous one is written)."""
    self.wait_for_save()
    self._save_in_flight = step
    with self._failures_reported():  # written synchronously: directories, meta
      self.checkpointer.save(step, state, meta)

  def check_background_save(self) -> None:
    """Raises `CheckpointSaveError` if the background save has failed (no waiting when it is running)."""
    if self._save_in_flight is None:
      return
    with self._failures_reported():
      self.checkpointer.check_for_errors()
    if not self.checkpointer.is_saving():
      self.wait_for_save()  # finished: joins the writer at once and raises what it left

  def wait_for_save(self) -> None:
    """Blocks until the save in flight is on disk; raises `CheckpointSaveError` if it failed."""
    if self._save_in_flight is None:
      return
    with self._failures_reported():
      self.checkpointer.wait()
    self._save_in_flight = None

  @contextlib.contextmanager
  def _failures_reported(self) -> Iterator[None]:
    """Raises what the checkpointer call inside raises as `CheckpointSaveError`, naming the save in flight
    (which is then over, failed)."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  (Orbax raises what the file system did)
      step, self._save_in_flight = self._save_in_flight, None
      self.save_failed = True
      raise CheckpointSaveError(self.checkpointer.failed_save_message(step, e)) from e

  def close(self) -> None:
    """Waits for the save in flight and closes the checkpointer. After a failed save (already reported as
    `CheckpointSaveError`), what else Orbax raises on closing is dropped."""
    failed_before = self.save_failed
    try:
      with self._failures_reported():
        self.checkpointer.close()
    except CheckpointSaveError:
      if not failed_before:
        raise
