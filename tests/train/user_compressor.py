"""A compressor written outside lbjax, as a user would (`config.compression.name='tests.train.user_compressor:
scaled_sign'`): signed sign-SGD scaled by the mean magnitude, with error feedback in its own state type, which
differs per device."""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lbjax.optim import compression


class ScaledSignState(NamedTuple):
  residual: optax.Updates


def scaled_sign() -> compression.GradientCompressor:
  """Sends mean|p| sign(p) for p = g + r, keeps r = p - sent: n sign bits and one float per leaf."""

  def init(params):
    return ScaledSignState(jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params))

  def update(grads, state, params=None):
    del params
    corrected = jax.tree.map(jnp.add, grads, state.residual)
    sent = jax.tree.map(lambda p, g: (jnp.mean(jnp.abs(p)) * jnp.sign(p)).astype(g.dtype), corrected, grads)
    return sent, ScaledSignState(jax.tree.map(jnp.subtract, corrected, sent))

  return compression.GradientCompressor(init, update, lambda shape: float(math.prod(shape) + 32), None, False)
