"""The compressor interface shared by 1-bit SGD, QSGD and PowerSGD, and the compressed all-reduce.

A compressor is an Optax transform whose `update` returns what the receiving side decodes from the
message a worker would send, so it can be chained like any optax transform or used for a simulated
compressed all-reduce with `compressed_pmean`. `bits_per_step` counts the message size.
"""

from collections.abc import Callable, Hashable
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lbjax.optim.validation import check_axis_bound
from lbjax.optim.validation import check_axis_name

AxisName = Hashable
FLOAT_BITS = 32


class GradientCompressor(NamedTuple):
  """An Optax transform that replaces each gradient leaf by its compressed-then-decoded value.

  Attributes:
    init: `init(params) -> state`, as in `optax.GradientTransformation`.
    update: `update(grads, state, params=None) -> (decoded_grads, new_state)`.
    bits_per_leaf: `bits_per_leaf(shape) -> bits` sent for one leaf of this shape.
    axis_name: the data-parallel axis the compressor works over (stochastic compressors fold the
      device index into their randomness; aggregating ones all-reduce over it), or None.
    stochastic: whether the compressor draws randomness (then devices must draw differently).
    aggregates: whether `update` itself returns the mean over `axis_name` of the devices' decoded
      gradients (PowerSGD, whose all-reduces are steps of the algorithm), so `compressed_pmean`
      must not average again.
    per_device_state: whether each device's state differs (an error-feedback residual: 1-bit SGD's,
      PowerSGD's), so a data-parallel trainer keeps one per device and checkpoints them all; False for
      a state that is the same on every device (QSGD's key). True unless the compressor says otherwise,
      which is always correct: a replicated state kept per device only costs memory.
  """

  init: optax.TransformInitFn
  update: optax.TransformUpdateFn
  bits_per_leaf: Callable[[tuple[int, ...]], float]
  axis_name: AxisName | None
  stochastic: bool
  aggregates: bool = False
  per_device_state: bool = True


class ErrorFeedbackState(NamedTuple):
  """State of a compressor with error feedback: the residual g - decode(encode(g)) so far."""

  residual: optax.Updates


class BitsPerStep(NamedTuple):
  """Bits sent by one device in one step.

  Attributes:
    compressed: bits of the compressed message, summed over leaves.
    uncompressed: bits of the float32 gradient, 32 per entry.
    ratio: uncompressed / compressed.
  """

  compressed: float
  uncompressed: int
  ratio: float


def device_index(axis_name: AxisName) -> jax.Array:
  """This device's index along `axis_name`; a clear error if the axis is not bound."""
  check_axis_bound(axis_name, f"a compressor built with axis_name={axis_name!r}",
                   "build it with axis_name=None otherwise")
  return jax.lax.axis_index(axis_name)


def check_real(grads: optax.Updates, where: str) -> None:
  """Raises TypeError for complex leaves, which a real compressor would cut to their real part."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
    if jnp.iscomplexobj(leaf):
      raise TypeError(
          f"{where} compresses real gradients; the leaf {jax.tree_util.keystr(path)} is "
          f"{jnp.result_type(leaf)} (complex). Compress its real and imaginary parts as separate "
          "real leaves, or leave it uncompressed.")


def no_compression() -> GradientCompressor:
  """The identity compressor: sends the raw float32 gradient (32 bits per entry).

      decode(encode(g)) = g

  so that data-parallel SGD takes the exact minibatch-mean gradient, the equation of papers/004's
  slide "Stochastic gradient descent".

  The baseline against which compressors are compared; `compressed_pmean` with it is exactly
  `jax.lax.pmean`.

  References:
    Vojnovic, M. Scaling up distributed machine learning. ST446 Distributed Computing for Big Data,
      Lecture 9, London School of Economics, 2021 (papers/004, slides "Data parallel computation"
      and "Computation and communication costs": the float32 gradient exchanged by data-parallel
      SGD).
  """

  def init(params: optax.Params) -> optax.EmptyState:
    del params
    return optax.EmptyState()

  def update(grads, state, params=None):
    del params
    return grads, state

  return GradientCompressor(init, update, lambda shape: float(FLOAT_BITS * math.prod(shape)), None, False,
                            per_device_state=False)


def compressed_pmean(
    grads: optax.Updates,
    state: optax.OptState,
    compressor: GradientCompressor,
    axis_name: AxisName,
) -> tuple[optax.Updates, optax.OptState]:
  """Data-parallel mean of compressed gradients, inside `shard_map` or `pmap`.

  Each device compresses its local gradient, and the decoded values (what a receiver reconstructs
  from the messages) are averaged: mean_k decode(encode(g_k)) via `jax.lax.pmean`. The all-reduce
  itself carries floats; this simulates the result of exchanging compressed messages. An
  aggregating compressor (PowerSGD) all-reduces its own factors and returns the mean itself.

  Args:
    grads: this device's gradient pytree.
    state: this device's compressor state. The QSGD key is the same on every device (pass it
      replicated); an error-feedback residual is per device (shard it over `axis_name`).
    compressor: a `GradientCompressor`; a stochastic or aggregating one must have been built with
      the same `axis_name`.
    axis_name: the data-parallel axis bound by the enclosing `shard_map`/`pmap`.

  Returns:
    (mean of decoded gradients over the axis, new compressor state of this device).
  """
  check_axis_name(axis_name, "compressed_pmean")
  if axis_name is None:
    raise ValueError("compressed_pmean: axis_name is required (the shard_map/pmap axis).")
  if not isinstance(compressor, GradientCompressor):
    raise TypeError(
        f"compressed_pmean: compressor must be a GradientCompressor (one_bit, qsgd, powersgd, "
        f"no_compression), got {type(compressor).__name__}.")
  if compressor.stochastic and compressor.axis_name != axis_name:
    raise ValueError(
        f"compressed_pmean: the compressor was built with axis_name={compressor.axis_name!r} "
        f"but the reduction is over {axis_name!r}; devices would share randomness. Build it with "
        f"axis_name={axis_name!r}, e.g. qsgd(s, axis_name={axis_name!r}).")
  if compressor.aggregates and compressor.axis_name != axis_name:
    raise ValueError(
        f"compressed_pmean: the compressor was built with axis_name={compressor.axis_name!r} "
        f"but the reduction is over {axis_name!r}; it all-reduces its factors over the axis it was "
        f"built with. Build it with axis_name={axis_name!r}, e.g. powersgd(2, axis_name={axis_name!r}).")
  check_axis_bound(axis_name, "compressed_pmean")
  decoded, new_state = compressor.update(grads, state)
  if compressor.aggregates:
    return decoded, new_state
  return jax.lax.pmean(decoded, axis_name), new_state


def bits_per_step(params: optax.Params, compressor: GradientCompressor) -> BitsPerStep:
  """Bits one device sends per step with `compressor`, vs the uncompressed float32 gradient.

  Counted per leaf of n entries: no_compression 32n; one_bit n + 64 (signs + two float means);
  qsgd per its `encoding` (`qsgd_dense_bits`; with "elias" one bit more than the shorter of
  `qsgd_elias_bits` and `qsgd_dense_bits`); powersgd 32 r (rows + cols) for a compressed matrix
  (`powersgd_bits`), 32n for a leaf it sends whole.

  Args:
    params: pytree of arrays or `jax.ShapeDtypeStruct` with the gradient's shapes.
    compressor: a `GradientCompressor`.

  Returns:
    `BitsPerStep(compressed, uncompressed, ratio)`.
  """
  if not isinstance(compressor, GradientCompressor):
    raise TypeError(
        f"bits_per_step: compressor must be a GradientCompressor, got {type(compressor).__name__}.")
  shapes = [tuple(jnp.shape(leaf)) for leaf in jax.tree.leaves(params)]
  if not shapes:
    raise ValueError("bits_per_step: params has no leaves.")
  compressed = float(sum(compressor.bits_per_leaf(shape) for shape in shapes))
  uncompressed = FLOAT_BITS * sum(math.prod(shape) for shape in shapes)
  return BitsPerStep(compressed, uncompressed, uncompressed / compressed)
