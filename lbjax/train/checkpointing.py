"""Orbax checkpointing behind one small class.

A checkpoint is a step directory under `<workdir>/checkpoints/` with two items:
  - `state`: the `TrainState` arrays (params, optimizer state, BN statistics, RNG, carry, progress);
  - `meta`: JSON with the data iterator's position, examples seen, the batch size in force and the
    run's config.
Saves are asynchronous (training continues while the arrays are written) and atomic (Orbax writes to
a temporary directory and renames it when complete), and the manager keeps the newest `max_to_keep`.
"""

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores (`TrainState`, meta) pairs in `<workdir>/checkpoints`."""

  def __init__(self, workdir: str | pathlib.Path, *, max_to_keep: int = 3, async_save: bool = True):
    self.directory = pathlib.Path(workdir).absolute() / "checkpoints"
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None when the workdir has none."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts an (asynchronous) save of `state` and `meta` as checkpoint `step`."""
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

  def wait(self) -> None:
    """Blocks until any save in flight is committed to disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def abstract_like(tree: Any) -> Any:
  """The `ShapeDtypeStruct`s (with shardings) of a pytree of arrays, as a restore target."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
