"""Orbax checkpointing behind one small class, with a checksum per checkpoint.

A checkpoint is a step directory under `<workdir>/checkpoints/` with two items:
  - `state`: the `TrainState` arrays (params, optimizer state, BN statistics, RNG, carry, progress);
  - `meta`: JSON with the data iterator's position, examples seen, the batch size in force, the
    run's config, the data's fingerprint, the data-parallel size, and the checksums below.
Saves are asynchronous (training continues while the arrays are written) and atomic (Orbax writes to
a temporary directory and renames it when complete). Old checkpoints are removed here, not by Orbax: see
`Checkpointer.__init__`.

Checksums. Orbax commits atomically but does not verify what it reads back: a bit flipped on disk
loads silently. Each save therefore records, per state leaf, two sums of the leaf's raw bits modulo
2^32 (the plain sum and the position-weighted sum, `state_checksums`), computed before the save
(with numpy for arrays in CPU memory, on the device for arrays on an accelerator); the meta JSON
records a SHA-256 of itself. Integer sums modulo 2^32 do not depend on the order of addition, so
they are the same on any mesh and sharding (a resume on another device count verifies too), and any
single flipped bit changes the plain sum. `restore_verified` recomputes them on what it reads and
refuses a checkpoint that differs; the caller then falls back to an older one.
"""

import hashlib
import json
import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from lbjax.optim.leaf_names import leaf_name
from lbjax.train.errors import CheckpointCorruptError, ConfigError

META_CHECKSUM = "meta_sha256"
SKIPPED_DIR = "skipped_checkpoints"


def _raw_bits(x: jax.Array) -> jax.Array:
  """The leaf's bits as uint32 (one per element; narrower types widened)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _sums(tree: Any) -> dict[str, jax.Array]:
  sums = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    bits = _raw_bits(leaf).reshape(-1)
    position = jnp.arange(1, bits.size + 1, dtype=jnp.uint32)
    sums[leaf_name(path)] = jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * position, dtype=jnp.uint32)])
  return sums


_CHUNK = 1 << 20  # elements per numpy pass: the chunk and its temporaries stay in cache
_POSITIONS = np.arange(1, _CHUNK + 1, dtype=np.uint32)


def _host_sums(leaf: np.ndarray) -> list[int]:
  """`_sums` of one leaf in numpy: the same two sums modulo 2^32, chunk by chunk. A chunk starting at
  element `start` adds sum(bits x position_in_chunk) + start x sum(bits) to the weighted sum."""
  flat = leaf.reshape(-1)
  if flat.dtype == np.bool_:
    flat = flat.view(np.uint8)
  flat = flat.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[flat.dtype.itemsize])
  plain = weighted = 0
  for start in range(0, flat.size, _CHUNK):
    bits = flat[start:start + _CHUNK].astype(np.uint32, copy=False)
    chunk_sum = int(np.sum(bits, dtype=np.uint32))
    plain += chunk_sum
    weighted += int(np.sum(bits * _POSITIONS[:bits.size], dtype=np.uint32)) + start * chunk_sum
  return [plain % 2**32, weighted % 2**32]


def _on_host_cpu(leaf: Any) -> bool:
  """Whether this process holds all of `leaf` in CPU memory (so numpy reads it without a transfer)."""
  return (isinstance(leaf, jax.Array) and leaf.is_fully_addressable
          and all(device.platform == "cpu" for device in leaf.sharding.device_set))


def init_source(source: str) -> tuple[pathlib.Path, int | None]:
  """The workdir and the step (None: its latest) that `config.init_from=source` names: a workdir, its
  `checkpoints/` folder or one step folder in it.

  Raises:
    ConfigError: there is no `checkpoints/` folder there, or no such step in it.
  """
  path = pathlib.Path(source).expanduser().absolute()
  step = None
  if path.name.isdigit() and path.parent.name == "checkpoints":
    path, step = path.parent.parent, int(path.name)
  elif path.name == "checkpoints":
    path = path.parent
  if not (path / "checkpoints").is_dir():
    raise ConfigError(f"config.init_from={source!r}: no checkpoints/ folder there; give a workdir, its "
                      "checkpoints/ folder or one step folder in it.")
  if step is not None and not (path / "checkpoints" / str(step)).is_dir():
    steps = sorted(int(p.name) for p in (path / "checkpoints").iterdir() if p.name.isdigit())
    raise ConfigError(f"config.init_from={source!r}: there is no checkpoint {step} in {path / 'checkpoints'} "
                      f"(it holds {', '.join(map(str, steps)) or 'none'}).")
  return path, step


def named_leaves(state: Any) -> dict[str, Any]:
  """The leaves of `state` by the names its checksums are recorded under (`state_checksums`)."""
  return {leaf_name(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def state_checksums(state: Any, replicated: jax.sharding.Sharding) -> dict[str, list[int]]:
  """Per leaf of `state`: [sum of its raw bits, sum of bits x (position + 1)], both modulo 2^32.

  Leaves in CPU memory are summed with numpy where they lie (on ResNet-50's parameters and momentum,
  25.5 ms against 105.4 ms for the compiled sums on a 2-core CPU, 2026-11-30:
  `benchmarks/checkpoint_checksums.py` and its section of benchmarks/README.md); leaves on an
  accelerator, or spread over several processes, are summed on their devices. Both give the same
  numbers (sums modulo 2^32 depend neither on the order of addition nor on the sharding).
  """
  named = named_leaves(state)
  on_host = {name for name, leaf in named.items() if _on_host_cpu(leaf)}
  checksums = {name: _host_sums(np.asarray(named[name])) for name in on_host}
  elsewhere = {name: leaf for name, leaf in named.items() if name not in on_host}
  if elsewhere:
    sums = jax.jit(_sums, out_shardings=replicated)(elsewhere)
    checksums.update({name: [int(v) for v in value] for name, value in jax.device_get(sums).items()})
  return {name: checksums[name] for name in named}


def _check_sums(meta: dict[str, Any], restored: Any, replicated: jax.sharding.Sharding, whole: bool) -> None:
  """Raises `CheckpointCorruptError` naming the leaves of `restored` whose checksums differ from those `meta`
  records; `whole`: `restored` is the whole state, so a leaf only one of them has differs too."""
  expected = meta.get("checksums")
  if expected is None:
    return
  found = state_checksums(restored, replicated)
  names = set(expected) | set(found) if whole else set(found) & set(expected)
  differing = sorted(name for name in names if expected.get(name) != found.get(name))
  if differing:
    raise CheckpointCorruptError(f"the checksum of {', '.join(differing[:3])} differs from the one "
                                 "saved (the files changed on disk)")


def _meta_digest(meta: dict[str, Any]) -> str:
  body = {k: v for k, v in meta.items() if k != META_CHECKSUM}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


_OS_FAILURES = ("No space left on device", "Disk quota exceeded", "File too large", "Permission denied",
                "Read-only file system", "Input/output error")


def _save_failure_cause(error: BaseException) -> str:
  """What made a save fail, in a few words (Orbax's and TensorStore's messages run to kilobytes)."""
  text = str(error)
  for failure in _OS_FAILURES:
    if failure in text:
      return failure.lower()
  return _short(error)


def _short(error: BaseException) -> str:
  """An exception's type and the last line of its message (Orbax and TensorStore errors run long)."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  return f"{type(error).__name__}: {lines[-1][:300] if lines else ''}"


class Checkpointer:
  """Saves and restores (`TrainState`, meta) pairs in `<workdir>/checkpoints`."""

  def __init__(self, workdir: str | pathlib.Path, *, max_to_keep: int | None = 3, async_save: bool = True):
    """
    Args:
      workdir: the run's directory; checkpoints go to `<workdir>/checkpoints`.
      max_to_keep: how many complete checkpoints to keep (None: all).
      async_save: write the arrays in the background while training goes on.

    Retention is ours, not Orbax's `max_to_keep`: Orbax removes the old steps once a save's writer
    thread ends, also when that writer failed if the error was already taken by a `check_for_errors`
    call (Orbax raises a writer's error only once; the trainer polls it every step), which on a full
    disk left no checkpoint at all. Here the old steps go only after a save is known to be complete
    (`wait` returned without error), and only those beyond the newest `max_to_keep` on disk.
    """
    self.workdir = pathlib.Path(workdir).absolute()
    self.directory = self.workdir / "checkpoints"
    self.max_to_keep = max_to_keep
    self._save_failed = False
    options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None when the workdir has none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """The complete checkpoints' steps, newest first."""
    return sorted(self._manager.all_steps(), reverse=True)

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts an (asynchronous) save of `state` and `meta` as checkpoint `step`; `meta` gets its digest."""
    meta = dict(meta)
    meta[META_CHECKSUM] = _meta_digest(meta)
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)

  def restore_meta(self, step: int) -> dict[str, Any]:
    """Reads only the JSON part of checkpoint `step`."""
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore_state(self, step: int, abstract_state: Any) -> Any:
    """Restores the arrays of checkpoint `step` onto the shardings given in `abstract_state`.

    Args:
      step: the checkpoint to read.
      abstract_state: a pytree of `jax.ShapeDtypeStruct` with `.sharding`, e.g. from `jax.eval_shape`
        plus the run's shardings; the restored arrays take exactly these shapes and shardings.
    """
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored["state"]

  def restore_fields(self, step: int, abstract_fields: dict[str, Any]) -> dict[str, Any]:
    """Restores only some fields of checkpoint `step`'s state (e.g. `params` and `model_state` for a new
    run from its parameters), onto the shapes and shardings of `abstract_fields`."""
    restore_args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), abstract_fields)
    return self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=abstract_fields, restore_args=restore_args, partial_restore=True)))["state"]

  def reload(self) -> None:
    """Re-reads which checkpoints exist (after another process moved one)."""
    self._manager.reload()

  def read_meta_verified(self, step: int) -> dict[str, Any]:
    """The meta of checkpoint `step`; raises `CheckpointCorruptError` when unreadable or altered."""
    try:
      meta = self.restore_meta(step)
    except Exception as e:  # pylint: disable=broad-except  (any failure to read means unusable)
      raise CheckpointCorruptError(f"its meta cannot be read ({_short(e)})") from e
    if not isinstance(meta, dict):
      raise CheckpointCorruptError("its meta is not a JSON object")
    if META_CHECKSUM in meta and meta[META_CHECKSUM] != _meta_digest(meta):
      raise CheckpointCorruptError("its meta does not match its SHA-256")
    return meta

  def restore_verified(self, step: int, meta: dict[str, Any], abstract_state: Any,
                       replicated: jax.sharding.Sharding) -> Any:
    """The state of checkpoint `step`, checked against the checksums its meta records.

    Raises:
      CheckpointCorruptError: the arrays cannot be read, or a leaf's checksum differs (named).
    """
    try:
      state = self.restore_state(step, abstract_state)
    except Exception as e:  # pylint: disable=broad-except  (truncated files, bad headers, ...)
      raise CheckpointCorruptError(f"its arrays cannot be read ({_short(e)})") from e
    _check_sums(meta, state, replicated, whole=True)
    return state

  def restore_fields_verified(self, step: int, abstract_fields: dict[str, Any],
                              replicated: jax.sharding.Sharding) -> dict[str, Any]:
    """`restore_fields`, checked against the checksums checkpoint `step`'s meta records for those fields.

    Raises:
      CheckpointCorruptError: the meta is unreadable or altered, or a restored leaf's checksum differs (named).
      Exception: what Orbax raises when the arrays cannot be read into `abstract_fields` (other shapes, damaged
        files): the two look alike.
    """
    meta = self.read_meta_verified(step)
    fields = self.restore_fields(step, abstract_fields)
    _check_sums(meta, fields, replicated, whole=False)
    return fields

  def set_aside(self, step: int, reason: str) -> pathlib.Path:
    """Moves checkpoint `step` to `<workdir>/skipped_checkpoints/<step>` (kept for inspection, out of
    the way of new saves) with a `reason.txt`; returns where it went."""
    target = self.workdir / SKIPPED_DIR / str(step)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
      shutil.rmtree(target)
    (self.directory / str(step)).rename(target)
    (target / "reason.txt").write_text(reason + "\n")
    self._manager.reload()
    return target

  def failed_save_message(self, step: int | None, error: BaseException) -> str:
    """What failed (checkpoint `step`, the cause in a few words), the last good checkpoint, the space a
    checkpoint takes and the space free, and what to do."""
    self._manager.reload()
    good = [s for s in self.all_steps() if s != step]
    kept = f"the last good checkpoint is step {good[0]} in {self.directory}" if good else "no earlier checkpoint exists"
    space = ""
    if good:
      size = sum(f.stat().st_size for f in (self.directory / str(good[0])).rglob("*") if f.is_file())
      free = shutil.disk_usage(self.directory).free
      space = f" A checkpoint takes about {size / 2**20:.1f} MiB; {free / 2**20:.1f} MiB are free there."
    logs = self.workdir / "logs"
    reports = f" Orbax's reports, as far as they could be written, are in {logs}." if logs.is_dir() else ""
    return (f"Saving checkpoint {step} failed ({_save_failure_cause(error)}); {kept}, and training stopped.{space} "
            f"Free space (or fix the cause) and rerun the same command to resume.{reports}")

  def check_for_errors(self) -> None:
    """Raises the error of a background save that failed since the last call (cheap: no waiting)."""
    try:
      self._manager.check_for_errors()
    except BaseException:
      self._save_failed = True
      raise

  def is_saving(self) -> bool:
    return self._manager.is_saving_in_progress()

  def wait(self) -> None:
    """Blocks until any save in flight is committed to disk, then removes the checkpoints beyond the
    newest `max_to_keep`. After a failed save nothing is removed."""
    try:
      self._manager.wait_until_finished()
    except BaseException:
      self._save_failed = True
      raise
    self._remove_old()

  def _remove_old(self) -> None:
    if self.max_to_keep is None or self._save_failed:
      return
    if jax.process_count() == 1:
      self._manager.reload()
      for step in self.all_steps()[self.max_to_keep:]:
        self._manager.delete(step)
      return
    # Multi-host: here the processes may list different steps (process 0 renames the newest one into place,
    # the others may look before), and Orbax's `delete` ends in a collective that every process must enter:
    # a process that found nothing to delete went on to the next step's collectives and the job hung. So
    # process 0 alone removes them, without a collective; the others do not list the steps (a listing
    # reads each step's metadata, which process 0 may be removing).
    if jax.process_index() == 0:
      self._manager.reload()
      for step in self.all_steps()[self.max_to_keep:]:
        _remove_step(self.directory / str(step))
      self._manager.reload()

  def close(self) -> None:
    self.wait()
    self._manager.close()


def _remove_step(path: pathlib.Path) -> None:
  """Deletes a checkpoint folder, renamed first to a temporary name so that it never looks complete when
  half removed."""
  removing = path.with_name(f"{path.name}.orbax-checkpoint-tmp-removing")
  path.rename(removing)
  shutil.rmtree(removing)


def complete_steps(directory: str | pathlib.Path) -> list[int]:
  """The steps of the complete (finalized) checkpoints in `directory`, newest first, read from the folders
  without a `CheckpointManager` (so without joining a multi-host job). A save still being written, or cut
  off by a lost host, is a temporary folder Orbax has not finalized: not listed."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return []
  return sorted((int(p.name) for p in directory.iterdir()
                 if p.is_dir() and p.name.isdigit() and ocp.step.is_checkpoint_finalized(p)), reverse=True)


def abstract_like(tree: Any) -> Any:
  """The `ShapeDtypeStruct`s (with shardings) of a pytree of arrays, as a restore target."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
