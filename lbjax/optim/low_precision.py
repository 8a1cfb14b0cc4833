"""Optimizer state stored in a narrower dtype than it is computed in (bfloat16 momentum and moments).

optax's `accumulator_dtype` and `mu_dtype` store the state in their dtype and also compute with it:
`optax.trace` takes `decay * v` with `v` in bfloat16, and a Python float `decay` is then rounded to
bfloat16 too (0.9 becomes 0.8984375, so the momentum sum's gain 1 / (1 - m) drops from 10 to 9.85;
Adam's b2 = 0.999 becomes 1.0 and the second moment would never decay). Here the state is widened
to the update's dtype (float32 for a float32 model; `stored_in`: float32 at least) for the arithmetic
and rounded only where stored:

    trace:      v_t = round(m * widen(v_{t-1}) + u_t),  the step is widen(v_t)   (w moves by the stored v)
    stored_in:  s_t = round(f(widen(s_{t-1}), u_t)),    the step uses the unrounded f(...)   (Adam)

The momentum steps along its stored value so that XLA can write `v_t` and read it back for the
weights instead of computing `m * v + u` twice (no multi-output fusion on XLA:CPU): 30 bytes per
parameter for a bfloat16 LARS update against 36 in float32.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax


def stored_in(inner: optax.GradientTransformation, **dtypes: Any) -> optax.GradientTransformation:
  """`inner` with the named fields of its NamedTuple state stored in the given dtypes.

  Each field named (e.g. `trace=jnp.bfloat16` for `optax.trace`, `mu=..., nu=...` for
  `optax.scale_by_adam`) is widened, leaf by leaf, to the wider of its dtype, the incoming update's
  and float32 before `inner.update` runs, and the new value is rounded back to the stored dtype after;
  the updates are widened likewise (a float16 gradient's square overflows above 256) and `inner`'s
  result is returned in their dtype. A None dtype keeps the dtype `inner.init` gives the field
  (the parameters', for optax's moments): the state's dtypes never change from step to step, as a
  `lax.scan` carry and a jitted step's donated state need (optax's Adam alone stores float32 moments after
  a float32 gradient of bfloat16 parameters).

  Args:
    inner: a transform whose state is a NamedTuple with the named fields, each a pytree like the
      updates.
    **dtypes: field name -> dtype (already checked, e.g. by `validation.state_dtype`) or None.

  Returns:
    An `optax.GradientTransformation` with `inner`'s state type.

  References:
    optax.trace and optax.scale_by_adam (`accumulator_dtype`, `mu_dtype`), google-deepmind/optax,
    optax/_src/transform.py: the same state dtypes, computed in the stored dtype.
  """
  def init_fn(params):
    state = inner.init(params)
    return state._replace(**{
        name: jax.tree.map(lambda x, dtype=dtype: x.astype(dtype), getattr(state, name))
        for name, dtype in dtypes.items() if dtype is not None})

  def update_fn(updates, state, params=None):
    widen = lambda stored, update: stored.astype(jnp.promote_types(jnp.result_type(stored, update), jnp.float32))
    wide = {name: jax.tree.map(widen, getattr(state, name), updates) for name in dtypes}
    wide_updates = jax.tree.map(lambda u: u.astype(jnp.promote_types(u.dtype, jnp.float32)), updates)
    new_updates, new_state = inner.update(wide_updates, state._replace(**wide), params)
    new_updates = jax.tree.map(lambda new, update: new.astype(update.dtype), new_updates, updates)
    stored = {name: jax.tree.map(lambda new, old: new.astype(old.dtype), getattr(new_state, name),
                                 getattr(state, name))
              for name in dtypes}
    return new_updates, new_state._replace(**stored)

  return optax.GradientTransformation(init_fn, update_fn)


def trace(decay: Any, nesterov: bool = False, accumulator_dtype: Any = None) -> optax.GradientTransformation:
  """`optax.trace` with the momentum stored in `accumulator_dtype` and computed in the wider of that and the
  update's dtype (float32 for float32 gradients; bfloat16 gradients of bfloat16 parameters compute in
  bfloat16, as optax does, where m = 0.9 rounds to 0.8984375).

      v_t = round(m * widen(v_{t-1}) + u_t),   returns widen(v_t)   (Nesterov: u_t + m * widen(v_t))

  With `accumulator_dtype` None the momentum has the parameters' dtype, round and widen are the
  identity, and this is `optax.trace` exactly.

  Args:
    decay: m, the momentum.
    nesterov: return `u_t + m * v_t` instead of `v_t`.
    accumulator_dtype: dtype of the stored momentum (already checked), or None.

  Returns:
    An `optax.GradientTransformation` whose state is an `optax.TraceState`.

  References:
    optax.trace, google-deepmind/optax, optax/_src/transform.py (`accumulator_dtype`).
  """

  def init_fn(params):
    return optax.TraceState(trace=jax.tree.map(lambda p: jnp.zeros_like(p, dtype=accumulator_dtype), params))

  def update_fn(updates, state, params=None):
    del params

    def step(u, v):
      wide = jnp.result_type(u, v)
      stored = (u + decay * v.astype(wide)).astype(v.dtype)
      new_v = stored.astype(wide)
      return (u + decay * new_v if nesterov else new_v), stored

    treedef = jax.tree.structure(updates)
    steps = [step(u, v) for u, v in zip(treedef.flatten_up_to(updates), treedef.flatten_up_to(state.trace))]
    return (treedef.unflatten([s[0] for s in steps]),
            optax.TraceState(trace=treedef.unflatten([s[1] for s in steps])))

  return optax.GradientTransformation(init_fn, update_fn)
