r"""Vocabulary-sharded embedding and softmax over a `model` mesh axis (tensor model parallelism).

The PTB LSTM's embedding E [V, D] and softmax (W [H, V], b [V]) hold 2 V D + V of its parameters
(V = 10,000; papers/001 §5.1.2). Over a mesh axis `model` of size k, shard j holds the vocabulary
rows [jV/k, (j+1)V/k) of E and the same columns of W and b (`NamedSharding` P('model', None) and
P(None, 'model')), so each device stores 1/k of them; a `data` axis alongside splits the batch.

Embedding, for n tokens:   e = sum_j [token in shard j] E_j[token - jV/k]    (psum over `model`)
Softmax cross-entropy, with shard j's logits z_j = h W_j + b_j of width V/k:
  m = max_j max z_j (pmax; a constant shift, so no gradient flows through it),
  log sum_v exp z_v = m + log sum_j sum exp(z_j - m)                          (psum)
  z_label = sum_j [label in shard j] z_j[label - jV/k]                        (psum)
  loss = log sum_v exp z_v - z_label
so neither E nor the [n, V] logits are ever gathered. Cross-device floats per step and device
group along `model` (forward + backward; `vocab_parallel_floats`): the embedding's all-reduce of
n D, the softmax's three all-reduces of n, and in the backward pass the all-reduce of the hidden
states' gradient, n H. The parameter gradients stay sharded (their data-parallel all-reduce, over
`data`, carries (2 V D + V)/k floats per device instead of 2 V D + V).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MODEL_AXIS = "model"


def embedding_spec(model_axis: str = MODEL_AXIS) -> P:
  """E [V, D]: vocabulary rows split over `model_axis`."""
  return P(model_axis, None)


def softmax_specs(model_axis: str = MODEL_AXIS) -> dict[str, P]:
  """W [H, V] and b [V]: vocabulary columns split over `model_axis`."""
  return {"kernel": P(None, model_axis), "bias": P(model_axis)}


def _vocabulary_offset(local_size: int, model_axis: str) -> jax.Array:
  return jax.lax.axis_index(model_axis) * local_size


def _in_vocabulary(ids: jax.Array, local_size: int, model_axis: str) -> jax.Array:
  """Whether each id lies in [0, V), V = k V/k the whole vocabulary (an id outside gives NaN, as the unsharded
  layers do, so that the trainer stops on it rather than train on a made-up row)."""
  return (ids >= 0) & (ids < local_size * jax.lax.psum(1, model_axis))


def vocab_parallel_embed(local_table: jax.Array, tokens: jax.Array, model_axis: str = MODEL_AXIS) -> jax.Array:
  """Embedding lookup inside `shard_map`: this shard's rows [V/k, D], tokens [...] -> [..., D] (NaN rows for
  tokens outside [0, V))."""
  local_size = local_table.shape[0]
  local_ids = tokens - _vocabulary_offset(local_size, model_axis)
  here = (local_ids >= 0) & (local_ids < local_size)
  rows = jnp.take(local_table, jnp.where(here, local_ids, 0), axis=0)
  embedded = jax.lax.psum(jnp.where(here[..., None], rows, 0.0), model_axis)
  return jnp.where(_in_vocabulary(tokens, local_size, model_axis)[..., None], embedded, jnp.nan)


def vocab_parallel_cross_entropy(hidden: jax.Array, local_kernel: jax.Array, local_bias: jax.Array,
                                 labels: jax.Array, model_axis: str = MODEL_AXIS) -> jax.Array:
  """Softmax cross-entropy inside `shard_map`: hidden [..., H], this shard's W [H, V/k] and b [V/k],
  labels [...] -> the per-example loss [...] over the whole vocabulary (NaN for labels outside [0, V))."""
  logits = hidden @ local_kernel + local_bias
  local_size = logits.shape[-1]
  shift = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1)), model_axis)
  log_normalizer = shift + jnp.log(jax.lax.psum(jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1), model_axis))
  local_labels = labels - _vocabulary_offset(local_size, model_axis)
  here = (local_labels >= 0) & (local_labels < local_size)
  picked = jnp.take_along_axis(logits, jnp.where(here, local_labels, 0)[..., None], axis=-1)[..., 0]
  loss = log_normalizer - jax.lax.psum(jnp.where(here, picked, 0.0), model_axis)
  return jnp.where(_in_vocabulary(labels, local_size, model_axis), loss, jnp.nan)


BatchAxis = str | tuple[str, ...] | None  # a mesh axis, several (the trainer's ('data', 'fsdp')), or None


def sharded_embed(mesh: Mesh, model_axis: str = MODEL_AXIS, batch_axis: BatchAxis = "data"
                  ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """`embed(table [V, D], tokens [N, ...]) -> [N, ..., D]` with the table split over `model_axis`
  and the tokens over `batch_axis` (None: replicated)."""
  _check_axes(mesh, model_axis, batch_axis)
  specs = (embedding_spec(model_axis), P(batch_axis))
  lookup = jax.shard_map(lambda table, tokens: vocab_parallel_embed(table, tokens, model_axis), mesh=mesh,
                         in_specs=specs, out_specs=P(batch_axis))
  return lambda table, tokens: lookup(*_placed(mesh, specs, (table, tokens)))


def sharded_cross_entropy(mesh: Mesh, model_axis: str = MODEL_AXIS, batch_axis: BatchAxis = "data"
                          ) -> Callable[[jax.Array, dict[str, jax.Array], jax.Array], jax.Array]:
  """`loss(hidden [N, ..., H], {'kernel': W [H, V], 'bias': b [V]}, labels [N, ...]) -> [N, ...]`, the
  per-example softmax cross-entropy with W and b split over `model_axis`, the batch over `batch_axis`."""
  _check_axes(mesh, model_axis, batch_axis)
  specs = (P(batch_axis), softmax_specs(model_axis), P(batch_axis))
  loss = jax.shard_map(
      lambda h, softmax, y: vocab_parallel_cross_entropy(h, softmax["kernel"], softmax["bias"], y, model_axis),
      mesh=mesh, in_specs=specs, out_specs=P(batch_axis))
  return lambda hidden, softmax, labels: loss(*_placed(mesh, specs, (hidden, softmax, labels)))


def _placed(mesh: Mesh, specs: tuple, arrays: tuple) -> tuple:
  """`arrays` laid out as `specs` say. On a mesh of `Explicit` axes (`jax.make_mesh`'s default from jax 0.7),
  `shard_map` takes only arrays already laid out so: tokens made whole on one device would be refused. On `Auto`
  axes it lays them out itself."""
  if all(axis_type != AxisType.Explicit for axis_type in mesh.axis_types):
    return arrays
  return jax.tree.map(lambda spec, x: jax.sharding.reshard(x, NamedSharding(mesh, spec)), specs, arrays,
                      is_leaf=lambda x: isinstance(x, P))


def place(mesh: Mesh, embedding: jax.Array, softmax: dict[str, jax.Array], model_axis: str = MODEL_AXIS
          ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Puts E and {W, b} on `mesh` split over the vocabulary (`NamedSharding`), replicated over other axes."""
  embedding = jax.device_put(embedding, NamedSharding(mesh, embedding_spec(model_axis)))
  softmax = {k: jax.device_put(v, NamedSharding(mesh, softmax_specs(model_axis)[k])) for k, v in softmax.items()}
  return embedding, softmax


def vocab_parallel_floats(num_tokens: int, embed_size: int, hidden_size: int) -> dict[str, int]:
  """Floats all-reduced over `model` per step for `num_tokens` tokens of one data shard (module docstring)."""
  return {"embedding_forward": num_tokens * embed_size, "softmax_forward": 3 * num_tokens,
          "hidden_gradient": num_tokens * hidden_size}


def _check_axes(mesh: Mesh, model_axis: str, batch_axis: BatchAxis) -> None:
  batch_axes = () if batch_axis is None else (batch_axis,) if isinstance(batch_axis, str) else tuple(batch_axis)
  for axis in (model_axis, *batch_axes):
    if axis not in mesh.shape:
      raise ValueError(f"the mesh has axes {tuple(mesh.shape)} but not {axis!r}; build it with one, e.g. "
                       f"jax.make_mesh((2, 4), ('data', 'model')).")
