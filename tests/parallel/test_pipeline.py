"""GPipe (lbjax.parallel.pipeline) on 8 simulated devices: equal to the unpipelined stack."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from lbjax.models import PtbLSTM
from lbjax.parallel import pipeline, stacks
from lbjax.train import hlo_analysis


def _mesh(num_stages: int, data: int) -> jax.sharding.Mesh:
  return jax.make_mesh((data, num_stages), ("data", "stage"), axis_types=(AxisType.Auto, AxisType.Auto),
                       devices=jax.devices()[:data * num_stages])


def _assert_trees_close(actual, expected, rtol):
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * float(jnp.abs(e).max()))


@pytest.mark.parametrize("num_stages, num_microbatches", [(2, 1), (2, 4), (4, 2), (4, 8)])
def test_pipelined_mlp_stack_equals_the_unpipelined_one_in_outputs_and_gradients(num_stages, num_microbatches):
  """S stages x (8/S) data shards on 8 devices; the loss and every gradient equal the sequential stack's."""
  params = stacks.init_mlp_stack(jax.random.key(0), num_layers=8, width=16)
  x = jax.random.normal(jax.random.key(1), (32, 16))
  target = jax.random.normal(jax.random.key(2), (32, 16))
  apply = pipeline.pipeline(stacks.mlp_block, _mesh(num_stages, 8 // num_stages), num_microbatches,
                            batch_axis="data")
  loss = lambda forward: lambda p: jnp.mean((forward(p) - target) ** 2)
  value, grads = jax.jit(jax.value_and_grad(loss(lambda p: apply(p, x).outputs)))(params)
  expected_value, expected_grads = jax.value_and_grad(loss(lambda p: pipeline.sequential(stacks.mlp_block, p, x)))(
      params)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  _assert_trees_close(grads, expected_grads, rtol=1e-5)


@pytest.mark.parametrize("num_layers", [1, 8])
def test_each_layer_of_an_mlp_stack_is_lecun_normal_whatever_the_depth(num_layers):
  """Variance 1/D per layer (the stack's kernel was drawn with fan-in L D: its scale shrank as 1/sqrt(L))."""
  kernel = stacks.init_mlp_stack(jax.random.key(0), num_layers=num_layers, width=256)["kernel"]
  assert float(jnp.std(kernel)) == pytest.approx(1 / 16, rel=0.05)


def test_pipelined_lstm_layers_with_rematerialization_equal_the_unpipelined_stack():
  """Four 8-unit LSTM layers (the PTB LSTM's layer, from a zero carry) in 2 stages x 4 data shards."""
  params = stacks.init_lstm_stack(jax.random.key(0), num_layers=4, hidden_size=8)
  x = jax.random.normal(jax.random.key(1), (16, 5, 8))
  apply = pipeline.pipeline(stacks.lstm_layer, _mesh(2, 4), 2, batch_axis="data", remat=True)
  loss = lambda forward: lambda p: jnp.sum(jnp.sin(forward(p)))
  value, grads = jax.jit(jax.value_and_grad(loss(lambda p: apply(p, x).outputs)))(params)
  expected_value, expected_grads = jax.value_and_grad(
      loss(lambda p: pipeline.sequential(stacks.lstm_layer, p, x)))(params)
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  _assert_trees_close(grads, expected_grads, rtol=1e-5)


def test_the_bubble_ticks_leave_no_nan_in_the_gradient_of_a_layer_undefined_at_zero():
  """An RMS-normalised layer without an epsilon has no derivative at a zero input, which the stages after the
  first held on the fill ticks: their outputs were dropped, yet their 0 * nan reached the gradient."""
  layer = lambda w, h: (h @ w) / jnp.sqrt(jnp.mean(jnp.square(h @ w), axis=-1, keepdims=True))
  params = jax.random.normal(jax.random.key(0), (4, 8, 8))
  x = jax.random.normal(jax.random.key(1), (8, 8))
  apply = pipeline.pipeline(layer, _mesh(4, 2), 2, batch_axis="data", remat=True)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(apply(p, x).outputs))))(params)
  expected = jax.grad(lambda p: jnp.sum(jnp.sin(pipeline.sequential(layer, p, x))))(params)
  assert np.all(np.isfinite(grads))
  _assert_trees_close(grads, expected, rtol=1e-5)


@pytest.mark.parametrize("num_stages, num_microbatches", [(2, 1), (2, 16), (4, 4), (8, 3)])
def test_executed_schedule_has_the_gpipe_bubble(num_stages, num_microbatches):
  """Stage s holds micro-batch t - s at tick t; the idle fraction is (S-1)/(M+S-1), twice papers/004's
  1/2 (1 - m/(k-1+m))."""
  params = stacks.init_mlp_stack(jax.random.key(0), num_layers=num_stages, width=4)
  x = jnp.ones((num_microbatches * 2, 4))
  active = np.asarray(jax.jit(pipeline.pipeline(stacks.mlp_block, _mesh(num_stages, 1), num_microbatches))(
      params, x).active)
  ticks = np.arange(num_microbatches + num_stages - 1)
  expected = (ticks[None] >= np.arange(num_stages)[:, None]) & (ticks[None] < np.arange(num_stages)[:, None]
                                                                 + num_microbatches)
  np.testing.assert_array_equal(active, expected)
  idle = 1 - active.mean()
  assert idle == pytest.approx((num_stages - 1) / (num_microbatches + num_stages - 1))
  lecture = 0.5 * (1 - num_microbatches / (num_stages - 1 + num_microbatches))
  assert idle == pytest.approx(2 * lecture)


def test_bad_inputs_are_refused_before_compute():
  params = stacks.init_mlp_stack(jax.random.key(0), num_layers=6, width=4)
  with pytest.raises(ValueError, match="divisible by the 4 stages"):
    pipeline.pipeline(stacks.mlp_block, _mesh(4, 2), 2)(params, jnp.ones((8, 4)))
  params = stacks.init_mlp_stack(jax.random.key(0), num_layers=4, width=4)
  with pytest.raises(ValueError, match="use a multiple of 8"):
    pipeline.pipeline(stacks.mlp_block, _mesh(4, 2), 4, batch_axis="data")(params, jnp.ones((12, 4)))
  with pytest.raises(ValueError, match="not 'model'"):
    pipeline.pipeline(stacks.mlp_block, _mesh(4, 2), 4, stage_axis="model")
  with pytest.raises(ValueError, match="num_microbatches"):
    pipeline.pipeline(stacks.mlp_block, _mesh(4, 2), 0)


@pytest.mark.parametrize("build, message", [
    (lambda mesh: pipeline.pipeline(None, mesh, 2), r"layer_fn must be a function of \(w, h\)"),
    (lambda mesh: pipeline.pipeline_with_state("lstm", mesh, 2), "layer_fn must be a function"),
    (lambda mesh: pipeline.pipeline(stacks.mlp_block, "mesh", 2), "mesh must be a jax.sharding.Mesh, e.g."),
    (lambda mesh: pipeline.pipeline(stacks.mlp_block, mesh, 2, remat="yes"), "remat must be True or False"),
    (lambda mesh: pipeline.stack_runner(mesh, 2.5), r"num_microbatches \(M\) must be an int >= 1, got 2.5"),
    (lambda mesh: pipeline.stack_runner(mesh, 2, batch_axis="dp"), "not 'dp'"),
    (lambda mesh: pipeline.pipeline(stacks.mlp_block, mesh, 2)(stacks.init_mlp_stack(jax.random.key(0), 4, 4),
                                                               jnp.ones(())), r"x must be a batch \[B, ...\]"),
    (lambda mesh: stacks.init_mlp_stack(jax.random.key(0), 0, 4), "num_layers must be a positive int, got 0"),
    (lambda mesh: stacks.init_lstm_stack(jax.random.key(0), 2, -1), "hidden_size must be a positive int, got -1"),
])
def test_arguments_that_are_not_a_pipeline_are_refused_when_it_is_built(build, message):
  with pytest.raises(ValueError, match=message):
    build(_mesh(2, 2))


def test_ptb_lstm_pipelined_with_carries_and_dropout_equals_its_layer_loop():
  """PtbLSTM's four layers through `stack_runner` (2 stages x 4 data shards, 2 micro-batches, remat): the
  logits, each layer's new carry and the gradients equal the model's own loop, dropout masks included."""
  model = PtbLSTM(vocab_size=20, embed_size=8, hidden_size=8, num_layers=4, dropout_rate=0.1, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tokens = jax.random.randint(jax.random.key(1), (16, 5), 0, 20)
  carry = tuple((jax.random.normal(jax.random.key(i), (16, 8)), jax.random.normal(jax.random.key(10 + i), (16, 8)))
                for i in range(4))
  run_stack = pipeline.stack_runner(_mesh(2, 4), 2, batch_axis="data", remat=True)

  def loss(params, tokens, run_stack):
    logits, new_carry = nnx.merge(graphdef, params)(tokens, carry, train=True, dropout_key=jax.random.key(3),
                                                   run_stack=run_stack)
    return jnp.mean(jnp.sin(logits)), new_carry

  grad = lambda run_stack: jax.value_and_grad(lambda p, t: loss(p, t, run_stack), has_aux=True)
  (value, new_carry), grads = jax.jit(grad(run_stack))(params, tokens)
  (expected_value, expected_carry), expected_grads = jax.jit(grad(None))(params, tokens)
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  _assert_trees_close(new_carry, expected_carry, rtol=1e-5)
  _assert_trees_close(grads, expected_grads, rtol=1e-5)


def test_the_data_parallel_gradient_all_reduce_happens_once_whatever_the_schedule():
  """2 LSTM layers (5 time steps) in 2 stages x 4 data shards: the compiled backward pass all-reduces
  over `data` the same bytes for 1 and 4 micro-batches, fewer than one stage's gradients per tick and
  time step (what it sent before the parameters were cast to per-shard values)."""
  params = stacks.init_lstm_stack(jax.random.key(0), num_layers=2, hidden_size=8)
  x = jax.random.normal(jax.random.key(1), (16, 5, 8))

  def all_reduce_bytes(num_microbatches):
    apply = pipeline.pipeline(stacks.lstm_layer, _mesh(2, 4), num_microbatches, batch_axis="data")
    grad = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(apply(p, x).outputs))))
    return hlo_analysis.analyze(grad.lower(params).compile().as_text()).collective_payload_bytes["all-reduce"]

  stage_gradient_bytes = (16 * 32 + 32) * 4  # one layer per stage: kernel [2H, 4H] and bias [4H], float32
  assert all_reduce_bytes(1) == all_reduce_bytes(4) < 2 * 5 * stage_gradient_bytes
