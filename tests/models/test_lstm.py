"""LSTMCell, MnistLSTM and PtbLSTM against a hand-written NumPy LSTM; counts, carry, dropout."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lbjax.models import LSTMCell, MnistLSTM, PtbLSTM, ResNetTiny
from lbjax.models import lstm_cell


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _np_lstm_step(kernel, bias, c, h, x, forget_bias=1.0):
  """TensorFlow BasicLSTMCell: gates i, j, f, o from one fused matmul over [x, h]."""
  gates = np.concatenate([x, h], axis=1) @ kernel + bias
  i, j, f, o = np.split(gates, 4, axis=1)
  c = c * _sigmoid(f + forget_bias) + _sigmoid(i) * np.tanh(j)
  return c, np.tanh(c) * _sigmoid(o)


def _np(x):
  return np.asarray(x, np.float64)


def _count(model):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _randomise(model, seed=0):
  """Gives every parameter (biases included) random values so that no gate term hides."""
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(
      lambda x: jnp.asarray(0.5 * rng.standard_normal(x.shape), jnp.float32), state))
  return model


# ------------------------------------------------------------------------------------ LSTMCell


def test_cell_forget_bias_on_f_gate_by_hand():
  cell = LSTMCell(3, 2, rngs=nnx.Rngs(0))
  cell.kernel[...] = jnp.zeros_like(cell.kernel[...])
  # All gate pre-activations 0: c' = c * sigmoid(0 + 1) + sigmoid(0) * tanh(0) = c * sigmoid(1).
  (c, h), out = cell((jnp.ones((1, 2)), jnp.zeros((1, 2))), jnp.ones((1, 3)))
  np.testing.assert_allclose(c, _sigmoid(1.0) * np.ones((1, 2)), rtol=1e-6)
  np.testing.assert_allclose(h, np.tanh(_sigmoid(1.0)) * 0.5 * np.ones((1, 2)), rtol=1e-6)
  np.testing.assert_array_equal(out, h)


def test_cell_and_unroll_match_numpy():
  cell = _randomise(LSTMCell(3, 2, forget_bias=0.7, rngs=nnx.Rngs(0)))
  assert cell.kernel.shape == (5, 8) and cell.bias.shape == (8,)
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  xs = jax.random.normal(k1, (2, 4, 3))
  carry = (jax.random.normal(k2, (2, 2)), jax.random.normal(k3, (2, 2)))
  kernel, bias = _np(cell.kernel[...]), _np(cell.bias[...])
  c, h = _np(carry[0]), _np(carry[1])
  expected = []
  for t in range(4):
    c, h = _np_lstm_step(kernel, bias, c, h, _np(xs[:, t]), forget_bias=0.7)
    expected.append(h)
  (c_t, h_t), outputs = cell.unroll(carry, xs)
  np.testing.assert_allclose(outputs, np.stack(expected, axis=1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(c_t, c, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h_t, h, rtol=1e-5, atol=1e-6)
  (c_1, h_1), out_1 = cell(carry, xs[:, 0])
  np.testing.assert_allclose(out_1, outputs[:, 0], rtol=1e-6)


def test_unroll_keeps_only_the_gates_for_its_gradient_with_the_same_numbers():
  """`lstm_unroll`'s gradient (the gates' nonlinearities recomputed from the kept pre-activations) equals, bit
  for bit, that of a plain scan of `lstm_step`, which keeps every intermediate, in less memory."""
  num, steps, inputs, hidden = 16, 12, 8, 32
  keys = jax.random.split(jax.random.key(0), 3)
  kernel = 0.3 * jax.random.normal(keys[0], (inputs + hidden, 4 * hidden))
  bias = 0.1 * jax.random.normal(keys[1], (4 * hidden,))
  xs = jax.random.normal(keys[2], (num, steps, inputs))
  zeros = (jnp.zeros((num, hidden)), jnp.zeros((num, hidden)))

  def unrolled(kernel, bias, xs):
    (c, _), outputs = lstm_cell.lstm_unroll(kernel, bias, zeros, xs, 1.0)
    return (outputs ** 2).sum() + c.sum()

  def scanned(kernel, bias, xs):
    step = lambda carry, x: lstm_cell.lstm_step(kernel, bias, carry, x, 1.0)
    (c, _), outputs = jax.lax.scan(step, zeros, jnp.swapaxes(xs, 0, 1))
    return (outputs ** 2).sum() + c.sum()

  kept, plain = (jax.jit(jax.grad(f, argnums=(0, 1, 2))) for f in (unrolled, scanned))
  for got, want in zip(kept(kernel, bias, xs), plain(kernel, bias, xs)):
    np.testing.assert_array_equal(got, want)
  temporaries = [f.lower(kernel, bias, xs).compile().memory_analysis().temp_size_in_bytes for f in (kept, plain)]
  assert temporaries[0] < 0.75 * temporaries[1]


def test_cell_validation():
  with pytest.raises(ValueError, match="hidden_size must be a positive int"):
    LSTMCell(3, 0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="forget_bias must be a finite number, got nan"):
    LSTMCell(3, 2, forget_bias=float("nan"), rngs=nnx.Rngs(0))
  cell = LSTMCell(3, 2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"inputs of shape \[N, 3\], got shape \(1, 4\)"):
    cell(cell.initial_carry(1), jnp.ones((1, 4)))
  with pytest.raises(ValueError, match=r"carry \(c, h\) of two arrays of shape \[1, 2\]"):
    cell(cell.initial_carry(2), jnp.ones((1, 3)))
  with pytest.raises(ValueError, match=r"inputs of shape \[N, T, 3\]"):
    cell.unroll(cell.initial_carry(1), jnp.ones((1, 3)))


# ----------------------------------------------------------------------------------- MnistLSTM


def test_mnist_lstm_matches_paper_shapes_and_count():
  model = nnx.eval_shape(lambda: MnistLSTM(rngs=nnx.Rngs(0)))
  # papers/001 §5.1.1: 128x28 transform, 256x512 cell kernel, 10-way classifier on 128 units.
  assert model.transform.kernel.shape == (28, 128)
  assert model.cell.kernel.shape == (256, 512) and model.cell.bias.shape == (512,)
  assert model.classifier.kernel.shape == (128, 10)
  assert _count(model) == (28 * 128 + 128) + (256 * 512 + 512) + (128 * 10 + 10) == 136_586


def test_mnist_lstm_matches_numpy_unroll():
  model = _randomise(MnistLSTM(num_classes=3, input_size=4, transform_size=5, hidden_size=6,
                               rngs=nnx.Rngs(0)))
  images = jax.random.uniform(jax.random.key(2), (2, 7, 4))
  x = _np(images) @ _np(model.transform.kernel[...]) + _np(model.transform.bias[...])
  c = h = np.zeros((2, 6))
  for t in range(7):
    c, h = _np_lstm_step(_np(model.cell.kernel[...]), _np(model.cell.bias[...]), c, h, x[:, t])
  expected = h @ _np(model.classifier.kernel[...]) + _np(model.classifier.bias[...])
  logits = model(images, train=True)
  assert logits.shape == (2, 3) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(model(images[..., None], train=False), logits)


def test_mnist_lstm_validation():
  with pytest.raises(ValueError, match="transform_size must be a positive int"):
    MnistLSTM(transform_size=0, rngs=nnx.Rngs(0))
  model = MnistLSTM(num_classes=3, input_size=4, transform_size=5, hidden_size=6,
                    rngs=nnx.Rngs(0))
  expected = r"images of shape \[N, T, 4\] or \[N, T, 4, 1\]"
  with pytest.raises(ValueError, match=expected + r", got shape \(2, 7, 5\)"):
    model(jnp.ones((2, 7, 5)), train=False)
  with pytest.raises(ValueError, match=expected + r", got shape \(2, 7, 4, 3\)"):
    model(jnp.ones((2, 7, 4, 3)), train=False)
  with pytest.raises(ValueError, match=expected + r", got shape \(28,\)"):
    model(jnp.ones((28,)), train=False)
  with pytest.raises(ValueError, match="floating-point array"):
    model(jnp.ones((2, 7, 4), jnp.uint8), train=False)


# ------------------------------------------------------------------------------------- PtbLSTM


def _tiny_ptb(dropout_rate=0.0):
  return _randomise(PtbLSTM(vocab_size=11, embed_size=4, hidden_size=3, num_layers=2,
                            dropout_rate=dropout_rate, rngs=nnx.Rngs(0)))


def _tokens(n=2, t=6, seed=3):
  return jax.random.randint(jax.random.key(seed), (n, t), 0, 11, jnp.int32)


def test_ptb_lstm_matches_paper_shapes_and_count():
  model = nnx.eval_shape(lambda: PtbLSTM(rngs=nnx.Rngs(0)))
  # papers/001 §5.1.2: embedding 200, two layers with 400x800 cell kernels, 10k-way softmax.
  assert model.embed.embedding.shape == (10000, 200)
  assert [layer.kernel.shape for layer in model.layers] == [(400, 800), (400, 800)]
  assert model.softmax.kernel.shape == (200, 10000)
  assert _count(model) == 10000 * 200 + 2 * (400 * 800 + 800) + (200 * 10000 + 10000)
  assert _count(model) == 4_651_600
  assert not nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))


def test_ptb_lstm_matches_numpy_and_returns_final_carry():
  model = _tiny_ptb()
  tokens = _tokens()
  x = _np(model.embed.embedding[...])[np.asarray(tokens)]
  final = []
  for layer in model.layers:
    c = h = np.zeros((2, 3))
    outputs = []
    for t in range(tokens.shape[1]):
      c, h = _np_lstm_step(_np(layer.kernel[...]), _np(layer.bias[...]), c, h, x[:, t])
      outputs.append(h)
    x = np.stack(outputs, axis=1)
    final.append((c, h))
  expected = x @ _np(model.softmax.kernel[...]) + _np(model.softmax.bias[...])
  logits, carry = model(tokens, model.initial_carry(2), train=False)
  assert logits.shape == (2, 6, 11) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  for (c, h), (c_np, h_np) in zip(carry, final):
    np.testing.assert_allclose(c, c_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, h_np, rtol=1e-5, atol=1e-6)


def test_ptb_lstm_two_halves_with_carry_equal_whole_sequence():
  model = _tiny_ptb()
  tokens = _tokens(t=6)
  whole, whole_carry = model(tokens, model.initial_carry(2), train=False)
  first, carry = model(tokens[:, :3], model.initial_carry(2), train=False)
  second, carry = model(tokens[:, 3:], carry, train=False)
  np.testing.assert_allclose(jnp.concatenate([first, second], axis=1), whole, rtol=1e-5,
                             atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               carry, whole_carry)


def test_ptb_lstm_truncates_gradients_at_the_incoming_carry():
  model = _tiny_ptb()
  carry = jax.tree.map(lambda x: x + 0.3, model.initial_carry(2))

  def loss(carry):
    return jnp.sum(model(_tokens(), carry, train=False)[0] ** 2)

  grads = jax.grad(loss)(carry)
  jax.tree.map(lambda g: np.testing.assert_array_equal(g, 0.0), grads)


def test_ptb_lstm_dropout_is_deterministic_by_key_and_off_in_eval():
  model = _tiny_ptb(dropout_rate=0.5)
  tokens, carry = _tokens(), model.initial_carry(2)
  key_a, key_b = jax.random.key(0), jax.random.key(1)
  a1, _ = model(tokens, carry, train=True, dropout_key=key_a)
  a2, _ = model(tokens, carry, train=True, dropout_key=key_a)
  b, _ = model(tokens, carry, train=True, dropout_key=key_b)
  evaluated, _ = model(tokens, carry, train=False, dropout_key=key_a)
  np.testing.assert_array_equal(a1, a2)
  assert not np.allclose(a1, b)
  assert not np.allclose(a1, evaluated)
  no_dropout = _tiny_ptb(dropout_rate=0.0)
  np.testing.assert_array_equal(no_dropout(tokens, carry, train=True)[0],
                                no_dropout(tokens, carry, train=False)[0])
  np.testing.assert_allclose(evaluated, no_dropout(tokens, carry, train=False)[0], rtol=1e-6)


def test_ptb_lstm_one_dropout_key_is_row_n_folded_into_it_and_rows_draw_alone():
  """One key k gives row n the key fold_in(k, n); with one key per row, a row's output depends on its own
  key only (the other rows' keys changed, it stays)."""
  model = _tiny_ptb(dropout_rate=0.5)
  tokens, carry = _tokens(n=4), model.initial_carry(4)
  key = jax.random.key(5)
  row_keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(4))
  one_key, _ = model(tokens, carry, train=True, dropout_key=key)
  per_row, _ = model(tokens, carry, train=True, dropout_key=row_keys)
  np.testing.assert_array_equal(one_key, per_row)
  raw_one, _ = model(tokens, carry, train=True, dropout_key=jax.random.key_data(key))  # `jax.random.PRNGKey` data
  raw_rows, _ = model(tokens, carry, train=True, dropout_key=jax.random.key_data(row_keys))
  np.testing.assert_array_equal(raw_one, one_key)
  np.testing.assert_array_equal(raw_rows, one_key)
  others = jnp.concatenate([row_keys[:1], jax.random.split(jax.random.key(6), 3)])
  changed, _ = model(tokens, carry, train=True, dropout_key=others)
  np.testing.assert_allclose(changed[0], per_row[0], rtol=1e-6)
  assert not np.allclose(changed[1:], per_row[1:])


def test_ptb_lstm_init_scale_draws_every_weight_uniform_as_ptb_word_lm():
  model = PtbLSTM(vocab_size=50, embed_size=20, hidden_size=20, init_scale=0.1, rngs=nnx.Rngs(0))
  params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for path, param in params.items():
    value = np.asarray(param[...])
    if path[-1] == "bias" and path[0] == "layers":  # BasicLSTMCell's biases start at zero
      assert np.all(value == 0.0), path
      continue
    # uniform(-0.1, 0.1): inside the interval, spread over it (a sample's extremes near its ends), mean ~0.
    assert np.all(np.abs(value) <= 0.1) and value.max() > 0.09 and value.min() < -0.09, path
    assert abs(value.mean()) < 0.2 * 0.1 / np.sqrt(3), path
    assert np.std(value) == pytest.approx(0.1 / np.sqrt(3), rel=0.25), path
  default = PtbLSTM(vocab_size=50, embed_size=20, hidden_size=20, rngs=nnx.Rngs(0))
  glorot_limit = np.sqrt(6.0 / (40 + 80))  # the default LSTM kernel: Glorot-uniform over [D + H, 4H]
  kernel = np.asarray(default.layers[0].kernel[...])
  assert np.abs(kernel).max() <= glorot_limit and np.abs(kernel).max() > 0.9 * glorot_limit
  assert sum(np.size(v[...]) for v in params.values()) == sum(
      np.size(v[...]) for v in dict(nnx.to_flat_state(nnx.state(default, nnx.Param))).values())


def test_ptb_lstm_validation():
  for rate in (1.0, "0.5", None, float("nan")):  # a string or None raised TypeError from the comparison
    with pytest.raises(ValueError, match=r"dropout_rate must be a number in \[0, 1\), got"):
      PtbLSTM(dropout_rate=rate, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"init_scale must be a finite number >= 0 \(0: the default initialisers\), "
                                       r"got -0.1"):
    PtbLSTM(init_scale=-0.1, rngs=nnx.Rngs(0))
  for scale in ("abc", float("inf")):  # inf drew uniform(-inf, inf): NaN weights
    with pytest.raises(ValueError, match=r"init_scale must be a finite number >= 0 .*, got"):
      PtbLSTM(init_scale=scale, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="vocab_size must be a positive int"):
    PtbLSTM(vocab_size=0, rngs=nnx.Rngs(0))
  model = _tiny_ptb(dropout_rate=0.5)
  carry = model.initial_carry(2)
  with pytest.raises(ValueError, match="needs a dropout_key when train=True"):
    model(_tokens(), carry, train=True)
  with pytest.raises(ValueError, match="expects a PRNG key as dropout_key .* got float32"):
    model(_tokens(), carry, train=True, dropout_key=jnp.zeros((), jnp.float32))
  with pytest.raises(ValueError,
                     match=r"raw uint32 key data of shape \[2\] \(one key\) or \[2, 2\] .* got shape \[3\]"):
    model(_tokens(), carry, train=True, dropout_key=jnp.zeros(3, jnp.uint32))
  with pytest.raises(ValueError, match=r"one key or one key per row, shape \[\] or \[2\], got shape \[3\]"):
    model(_tokens(), carry, train=True, dropout_key=jax.random.split(jax.random.key(0), 3))
  with pytest.raises(ValueError, match=r"tokens of shape \[N, T\] \(N, T >= 1\), got shape \(6,\)"):
    model(_tokens()[0], carry, train=False)
  with pytest.raises(ValueError, match=r"word ids in \[0, 11\), got values in \[-1, 10\]"):
    model(_tokens().at[0, 0].set(-1).at[0, 1].set(10), carry, train=False)
  traced = jax.jit(lambda t: model(t, carry, train=False)[0])(_tokens().at[0, 0].set(11))
  assert np.all(np.isnan(traced[0])) and np.all(np.isfinite(traced[1]))
  with pytest.raises(ValueError, match="integer tokens"):
    model(_tokens().astype(jnp.float32), carry, train=False)
  with pytest.raises(ValueError, match=r"carry of 2 \(c, h\) pairs of arrays of shape \[2, 3\]"):
    model(_tokens(), carry[:1], train=False)
  with pytest.raises(ValueError, match=r"carry of 2 \(c, h\) pairs of arrays of shape \[2, 3\]"):
    model(_tokens(), model.initial_carry(3), train=False)
  with pytest.raises(ValueError, match="batch_size must be a positive int"):
    model.initial_carry(0)


@pytest.mark.parametrize("build", [
    lambda rngs: LSTMCell(3, 2, rngs=rngs),
    lambda rngs: MnistLSTM(rngs=rngs),
    lambda rngs: PtbLSTM(vocab_size=10, embed_size=4, hidden_size=4, rngs=rngs),
    lambda rngs: ResNetTiny(num_classes=10, rngs=rngs),
], ids=["LSTMCell", "MnistLSTM", "PtbLSTM", "ResNetTiny"])
@pytest.mark.parametrize("rngs, hint", [(0, "nnx.Rngs(0)"), (jax.random.key(0), "nnx.Rngs(0)"), (None, "nnx.Rngs(0)"),
                                        (7, "nnx.Rngs(7)")])
def test_a_seed_or_key_given_as_rngs_is_refused_with_the_call_to_make(build, rngs, hint):
  with pytest.raises(ValueError, match=rf"rngs must be an nnx.Rngs, e.g. rngs={re.escape(hint)}; got "):
    build(rngs)
