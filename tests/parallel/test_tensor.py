"""Vocabulary-sharded embedding and softmax (lbjax.parallel.tensor) on 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from lbjax.parallel import tensor
from lbjax.train import hlo_analysis

VOCAB, WIDTH, BATCH, STEPS = 1000, 16, 8, 5


def _problem():
  keys = jax.random.split(jax.random.key(0), 5)
  embedding = jax.random.normal(keys[0], (VOCAB, WIDTH))
  softmax = {"kernel": 0.1 * jax.random.normal(keys[1], (WIDTH, VOCAB)),
             "bias": 0.1 * jax.random.normal(keys[2], (VOCAB,))}
  tokens = jax.random.randint(keys[3], (BATCH, STEPS), 0, VOCAB)
  labels = jax.random.randint(keys[4], (BATCH, STEPS), 0, VOCAB)
  return embedding, softmax, tokens, labels


def _unsharded_loss(embedding, softmax, tokens, labels):
  logits = jnp.tanh(embedding[tokens]) @ softmax["kernel"] + softmax["bias"]
  return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[..., None], -1)[..., 0])


@pytest.mark.parametrize("data, model", [(2, 4), (1, 8)])
def test_sharded_embedding_and_softmax_equal_the_unsharded_layers_and_send_the_stated_bytes(data, model):
  embedding, softmax, tokens, labels = _problem()
  mesh = jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
  embed, cross_entropy = tensor.sharded_embed(mesh), tensor.sharded_cross_entropy(mesh)
  loss = lambda e, s: jnp.mean(cross_entropy(jnp.tanh(embed(e, tokens)), s, labels))
  placed = tensor.place(mesh, embedding, softmax)
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  value, grads = step(*placed)
  expected_value, expected_grads = jax.value_and_grad(_unsharded_loss, argnums=(0, 1))(
      embedding, softmax, tokens, labels)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads), strict=True):
    np.testing.assert_allclose(g, e, atol=1e-7)
  assert grads[0].sharding.spec == tensor.embedding_spec()
  assert grads[1]["kernel"].sharding.spec == tensor.softmax_specs()["kernel"]
  # Payload of the compiled step's collectives: the model-axis all-reduces of the docstring, the data-axis
  # all-reduce of the 1/k parameter gradients (emitted, and sending nothing, for data = 1) and, for data > 1,
  # the scalar mean loss.
  floats = tensor.vocab_parallel_floats(BATCH * STEPS // data, WIDTH, WIDTH)
  sharded_parameters = (2 * VOCAB * WIDTH + VOCAB) // model
  expected_bytes = 4 * (sum(floats.values()) + sharded_parameters + (data > 1))
  payload = sum(hlo_analysis.analyze(step.lower(*placed).compile().as_text()).collective_payload_bytes.values())
  assert payload == expected_bytes


def test_a_mesh_without_the_axes_is_refused():
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  with pytest.raises(ValueError, match="not 'model'"):
    tensor.sharded_embed(mesh)


def test_a_mesh_of_explicit_axes_and_a_batch_over_several_axes_give_the_same_loss():
  """`jax.make_mesh`'s default axes (Explicit from jax 0.7) take only arrays laid out as `shard_map` wants them:
  the layers lay out tokens and labels given whole. The trainer's batch axes ('data', 'fsdp') are accepted."""
  embedding, softmax, tokens, labels = _problem()
  expected = _unsharded_loss(embedding, softmax, tokens, labels)
  meshes = {"explicit": (jax.make_mesh((2, 4), ("data", "model")), "data"),
            "data and fsdp": (jax.make_mesh((2, 2, 2), ("data", "fsdp", "model"), axis_types=(AxisType.Auto,) * 3),
                              ("data", "fsdp"))}
  for name, (mesh, batch_axis) in meshes.items():
    embed = tensor.sharded_embed(mesh, batch_axis=batch_axis)
    cross_entropy = tensor.sharded_cross_entropy(mesh, batch_axis=batch_axis)
    loss = jax.jit(lambda e, s: jnp.mean(cross_entropy(jnp.tanh(embed(e, tokens)), s, labels)))
    np.testing.assert_allclose(loss(*tensor.place(mesh, embedding, softmax)), expected, rtol=1e-6, err_msg=name)


def test_ids_outside_the_vocabulary_give_nan_as_the_unsharded_layers_do():
  """A token or label outside [0, V) (a corrupt batch) is NaN, so the trainer stops on it: the shards held no row
  for it, and the sum over them was a zero embedding or a loss without the label's logit."""
  embedding, softmax, tokens, labels = _problem()
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
  bad = jnp.array([[VOCAB, -1, 0, 1, 2]] + [[0] * STEPS] * (BATCH - 1))
  embedded = tensor.sharded_embed(mesh)(tensor.place(mesh, embedding, softmax)[0], bad)
  losses = tensor.sharded_cross_entropy(mesh)(jnp.zeros((BATCH, STEPS, WIDTH)), tensor.place(mesh, embedding,
                                                                                             softmax)[1], bad)
  assert np.isnan(embedded[0, :2]).all() and np.isfinite(embedded[0, 2:]).all() and np.isfinite(embedded[1:]).all()
  assert np.isnan(losses[0, :2]).all() and np.isfinite(losses[0, 2:]).all() and np.isfinite(losses[1:]).all()
