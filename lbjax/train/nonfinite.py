"""Which quantity went non-finite first, named for the researcher.

The compiled step records only *that* a loss or update went non-finite (`first_nonfinite_step`) and
from then on leaves the state untouched, so the state is the last good one. `first_nonfinite`
recomputes, on that state and the latest batch, the quantities in the order the step computes them
(parameters and optimizer state as restored, the loss, the gradient, the optimizer's update) and
names the first one that is not finite, with its leaf, and what to change.
"""

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lbjax.train import protocols
from lbjax.train.any_batch import whole_batch


def _first_nonfinite_leaf(tree: Any, replicated: jax.sharding.Sharding) -> str | None:
  """The path of the first leaf holding a non-finite value (flags reduced on the device, so sharded
  leaves of a multi-host run need no gathering), or None."""
  finite = jax.jit(lambda t: jax.tree.map(lambda x: jnp.all(jnp.isfinite(x)), t), out_shardings=replicated)(tree)
  for path, leaf_finite in jax.tree_util.tree_leaves_with_path(jax.device_get(finite)):
    if not leaf_finite:
      return jax.tree_util.keystr(path)
  return None


def first_nonfinite(state, batch, *, graphdef: nnx.GraphDef, task, optimizer: optax.GradientTransformation,
                    replicated: jax.sharding.Sharding) -> tuple[str, str]:
  """(the first non-finite quantity, what to change) for a `TrainState` and the latest `run.Batch`
  (None when no step was taken)."""
  for what, tree in (("parameter", state.params), ("optimizer state", state.opt_state),
                     ("BatchNorm statistic", state.model_state)):
    leaf = _first_nonfinite_leaf(tree, replicated)
    if leaf is not None:
      return (f"the {what} {leaf} is not finite (it was so in the checkpoint or at initialisation)",
              "Check the checkpoint (a corrupt one) and the initialisation.")
  if batch is None:
    return "no step was taken", "Check the data."
  arrays, carry = whole_batch(batch.arrays, state.carry)
  arrays = protocols.model_inputs(arrays)

  def loss_fn(params, arrays, carry):  # the batch an argument, so the model sees it traced as in the step
    model = nnx.merge(graphdef, params, state.model_state)
    return task.train_loss(model, arrays, carry, jax.random.key(0), batch.discard_fraction)[0]

  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(state.params, arrays, carry)
  if not np.isfinite(float(loss)):
    return "the loss is not finite (on the latest batch)", "Check the data, and lower config.lr.base."
  leaf = _first_nonfinite_leaf(grads, replicated)
  if leaf is not None:
    return (f"the gradient of {leaf} is not finite (on the latest batch)",
            "Lower config.lr.base, lengthen config.lr.warmup_epochs, or set config.clip_global_norm.")
  updates, _ = jax.jit(optimizer.update)(grads, state.opt_state, state.params)
  leaf = _first_nonfinite_leaf(updates, replicated)
  if leaf is not None:
    return (f"the optimizer's update of {leaf} is not finite (loss and gradient are finite)",
            "Check the optimizer settings (config.optimizer) and lower config.lr.base.")
  return ("the latest batch does not reproduce it: the loss, gradient or update went non-finite on an earlier "
          "batch", "Lower config.lr.base or lengthen the warm-up, and check the data.")
