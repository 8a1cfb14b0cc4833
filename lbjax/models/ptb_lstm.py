"""The two-layer word-level PTB language model of papers/001 §5.1.2 (Zaremba et al. 2014, "small").

Tokens are embedded into 200 features, run through two 200-unit BasicLSTMCell layers (each cell
kernel a 400x800 matrix plus an 800 bias) and projected onto the 10,000-word vocabulary:

  e_t = E[w_t],  h^1_t = LSTM_1(h^1_{t-1}, D(e_t)),  h^2_t = LSTM_2(h^2_{t-1}, D(h^1_t)),
  logits_t = D(h^2_t) @ W + b

where D is dropout (Zaremba et al.: on the non-recurrent connections only), active only in
training with `dropout_rate > 0`. Each row (example) n of the batch draws its own masks from its own
key k_n, one per D (the embedding's and each layer's output):

  (k_n^0, ..., k_n^L) = split(k_n, L + 1),   keep^l_n = bernoulli(k_n^l, 1 - rate, [T, F])

with k_n = `dropout_key[n]` when the call is given one key per row, or fold_in(dropout_key, n) when it
is given one key. So a row's masks depend on its key alone, not on which other rows share the call,
how many there are or how the batch is sharded: the trainer gives row n of the global batch the key
fold_in(step key, n), so a micro-batch or a device's share draws the masks of the global batch
(`lbjax.train.step.dropout_keys`). Parameters with the defaults:
10000*200 + 2*(400*800 + 800) + 200*10000 + 10000 = 4,651,600.

The carry (c, h) of every layer is an explicit input and output, so truncated back-propagation
through time carries it across consecutive batches of one epoch; the incoming carry is passed
through `jax.lax.stop_gradient`, so gradients never flow into the previous batch.

Model parallelism (`lbjax.train` reads the two class attributes; the model knows no mesh):
* `PIPELINED_STACK`: the LSTM layers are a stack of identical layers (when embed_size equals
  hidden_size); `__call__(..., run_stack=...)` hands them, stacked, with each layer's carry and
  dropout mask as its per-example state, to a runner such as `lbjax.parallel.pipeline.stack_runner`.
* `TENSOR_PARALLEL_SPECS`: the embedding's rows and the softmax's columns are the vocabulary, split
  over a `model` mesh axis.
"""

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from lbjax.models import validation
from lbjax.models.lstm_cell import LSTMCarry, LSTMCell, lstm_unroll

PtbCarry = tuple[LSTMCarry, ...]
# run_stack(layer_fn, stacked_params, stacked_states, x) -> (stacked_states, x), where
# layer_fn(w, state, h) -> (state, h) is one layer; the unpipelined runner applies the layers in order.
StackRunner = Callable[[Callable, Any, Any, jax.Array], tuple[Any, jax.Array]]


def _keep_mask(shape: tuple[int, ...], rate: float, row_keys: jax.Array) -> jax.Array:
  """[N, ...] keep mask of an activation of `shape` = [N, ...]: row n is bernoulli(row_keys[n], 1 - rate)
  over the row's shape, drawn from its key alone. The threefry draws are vmapped over the rows, so a
  batch sharded over its rows draws each device's rows on that device, with no communication, and
  `jax_threefry_partitionable` (which decides how one key fills a shape, hence the bits of a row) never
  has to partition one key's draw across devices."""
  return jax.vmap(lambda key: jax.random.bernoulli(key, 1.0 - rate, shape[1:]))(row_keys)


def _apply_mask(x: jax.Array, keep: jax.Array, rate: float) -> jax.Array:
  """Inverted dropout: zero where not `keep`, scale the kept entries by 1/(1 - rate)."""
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _dropout(x: jax.Array, rate: float, row_keys: jax.Array) -> jax.Array:
  """Inverted dropout: zero with probability `rate`, scale the kept entries by 1/(1 - rate); row n's
  mask drawn from `row_keys[n]`."""
  return _apply_mask(x, _keep_mask(x.shape, rate, row_keys), rate)


def _row_keys(dropout_key: jax.Array, num_rows: int) -> jax.Array:
  """[N] keys, one per row: `dropout_key` itself when it holds one key per row, else
  fold_in(dropout_key, n) for row n. Typed keys (`jax.random.key`) or raw uint32 key data
  (`jax.random.PRNGKey`: [2] for one key, [N, 2] for one per row). Raises `ValueError` on anything else."""
  if isinstance(dropout_key, jax.Array) and dropout_key.dtype == jnp.uint32:
    raw_shape = jax.eval_shape(jax.random.PRNGKey, 0).shape  # [2] for the default threefry keys
    if dropout_key.shape[-len(raw_shape):] != raw_shape:
      raise ValueError(f"PtbLSTM expects raw uint32 key data of shape {list(raw_shape)} (one key) or "
                       f"[{num_rows}, {', '.join(map(str, raw_shape))}] (one per row), got shape "
                       f"{list(dropout_key.shape)}.")
    dropout_key = jax.random.wrap_key_data(dropout_key)
  if not (isinstance(dropout_key, jax.Array) and jax.dtypes.issubdtype(dropout_key.dtype, jax.dtypes.prng_key)):
    raise ValueError(f"PtbLSTM expects a PRNG key as dropout_key (`jax.random.key(seed)` or "
                     f"`jax.random.PRNGKey(seed)`), got {getattr(dropout_key, 'dtype', type(dropout_key).__name__)}.")
  if dropout_key.shape == ():
    return jax.vmap(jax.random.fold_in, (None, 0))(dropout_key, jnp.arange(num_rows))
  if dropout_key.shape != (num_rows,):
    raise ValueError(f"PtbLSTM expects dropout_key to be one key or one key per row, shape [] or [{num_rows}], "
                     f"got shape {list(dropout_key.shape)}.")
  return dropout_key


def _symmetric_uniform(scale: float) -> jax.nn.initializers.Initializer:
  """uniform(-scale, scale), TensorFlow's `random_uniform_initializer(-scale, scale)`."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)
  return init


def _given(**initializers) -> dict:
  """The initializer arguments that are set (None: the layer's own default)."""
  return {name: init for name, init in initializers.items() if init is not None}


class PtbLSTM(nnx.Module):
  """Embedding -> `num_layers` LSTM layers -> softmax layer over the vocabulary."""

  PIPELINED_STACK = "layers"
  TENSOR_PARALLEL_SPECS = {"embed/embedding": P("model", None), "softmax/kernel": P(None, "model"),
                           "softmax/bias": P("model")}

  def __init__(self, vocab_size: int = 10000, embed_size: int = 200, hidden_size: int = 200,
               num_layers: int = 2, dropout_rate: float = 0.0, init_scale: float = 0.0, *, rngs: nnx.Rngs):
    """Builds the model.

    Args:
      vocab_size: number of words V.
      embed_size: word-embedding size.
      hidden_size: units per LSTM layer.
      num_layers: number of stacked LSTM layers.
      dropout_rate: probability of dropping an activation on the non-recurrent connections
        (embedding output, between layers, before the softmax layer), in [0, 1).
      init_scale: if > 0, every weight is drawn from uniform(-init_scale, init_scale) as in
        TensorFlow's ptb_word_lm (its "small" config: 0.1): the embedding, the LSTM kernels and the
        softmax kernel and bias (the LSTM biases start at zero, as BasicLSTMCell's). 0: flax's
        defaults for the embedding and the softmax layer, Glorot-uniform LSTM kernels.
      rngs: `nnx.Rngs` for parameter initialisation.

    Raises:
      ValueError: on `rngs` that is not an `nnx.Rngs`, non-positive sizes, `dropout_rate` outside [0, 1) or a
        negative or infinite `init_scale`.
    """
    validation.check_rngs(rngs)
    validation.check_positive_int("vocab_size", vocab_size)
    validation.check_positive_int("embed_size", embed_size)
    validation.check_positive_int("hidden_size", hidden_size)
    validation.check_positive_int("num_layers", num_layers)
    if not validation.is_real(dropout_rate) or not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be a number in [0, 1), got {dropout_rate!r}.")
    if not validation.is_real(init_scale) or not 0.0 <= init_scale < math.inf:
      raise ValueError(f"init_scale must be a finite number >= 0 (0: the default initialisers), got {init_scale!r}.")
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_layers = num_layers
    self.dropout_rate = float(dropout_rate)
    uniform = _symmetric_uniform(init_scale) if init_scale > 0.0 else None
    self.embed = nnx.Embed(vocab_size, embed_size, rngs=rngs, **_given(embedding_init=uniform))
    self.layers = nnx.List([
        LSTMCell(embed_size if i == 0 else hidden_size, hidden_size, forget_bias=1.0, rngs=rngs,
                 **_given(kernel_init=uniform))
        for i in range(num_layers)])
    self.softmax = nnx.Linear(hidden_size, vocab_size, rngs=rngs, **_given(kernel_init=uniform, bias_init=uniform))

  def initial_carry(self, batch_size: int) -> PtbCarry:
    """Zero carry: one (c, h) pair of [batch_size, hidden_size] float32 arrays per layer."""
    return tuple(layer.initial_carry(batch_size) for layer in self.layers)

  def _check_carry(self, carry: object, batch_size: int) -> None:
    expected = (batch_size, self.hidden_size)
    ok = (isinstance(carry, (tuple, list)) and len(carry) == self.num_layers
          and all(isinstance(pair, (tuple, list)) and len(pair) == 2
                  and all(getattr(a, "shape", None) == expected for a in pair)
                  for pair in carry))
    if not ok:
      raise ValueError(
          f"PtbLSTM expects a carry of {self.num_layers} (c, h) pairs of arrays of shape "
          f"{list(expected)}, got {jax.tree.map(jnp.shape, carry)}; build it with "
          "`initial_carry(batch_size)`.")

  def __call__(self, tokens: jax.Array, carry: PtbCarry, *, train: bool,
               dropout_key: jax.Array | None = None, run_stack: StackRunner | None = None
               ) -> tuple[jax.Array, PtbCarry]:
    """Runs the model over a [N, T] int block of tokens.

    Args:
      tokens: [N, T] integer word ids in [0, vocab_size). Concrete tokens out of that range raise
        a `ValueError`; traced ones (under `jit`) cannot be checked, so an out-of-range id embeds
        as NaN and the loss turns non-finite (never silently wraps around).
      carry: the state after the previous block (or `initial_carry(N)`).
      train: enables dropout when `dropout_rate > 0`.
      dropout_key: typed PRNG key for dropout, one [] (row n then uses fold_in(key, n)) or one per row
        [N]; required when `train` and `dropout_rate > 0`. See the module docstring.
      run_stack: runs the LSTM layers as one stack (e.g. pipelined over devices); None applies them
        in order. Needs embed_size == hidden_size (identical layers).

    Returns:
      (logits [N, T, vocab_size] float32, new carry).

    Raises:
      ValueError: on a wrong token rank/dtype, out-of-range concrete tokens, a malformed carry or a
        missing or malformed `dropout_key`.
    """
    shape = getattr(tokens, "shape", None)
    if shape is None or len(shape) != 2 or 0 in shape:
      raise ValueError(f"PtbLSTM expects tokens of shape [N, T] (N, T >= 1), got shape {shape}.")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"PtbLSTM expects integer tokens of shape [N, T], got dtype "
                       f"{tokens.dtype}; convert with `.astype(jnp.int32)`.")
    if not isinstance(tokens, jax.core.Tracer):
      with jax.ensure_compile_time_eval():  # concrete tokens inside a trace (a jitted closure's constant) too
        low, high = int(jnp.min(tokens)), int(jnp.max(tokens))
      if low < 0 or high >= self.vocab_size:
        raise ValueError(f"PtbLSTM tokens must be word ids in [0, {self.vocab_size}), got values "
                         f"in [{low}, {high}].")
    self._check_carry(carry, shape[0])
    use_dropout = train and self.dropout_rate > 0.0
    if use_dropout and dropout_key is None:
      raise ValueError(
          f"PtbLSTM with dropout_rate={self.dropout_rate} needs a dropout_key when train=True; "
          "pass `dropout_key=jax.random.key(...)` (a fresh key per step).")
    # [L+1, N] keys: the embedding's and each layer's, per row.
    keys = (jax.vmap(lambda key: jax.random.split(key, self.num_layers + 1), out_axes=1)(
        _row_keys(dropout_key, shape[0])) if use_dropout else [None] * (self.num_layers + 1))

    def maybe_dropout(x, key):
      return _dropout(x, self.dropout_rate, key) if use_dropout else x

    in_range = (tokens >= 0) & (tokens < self.vocab_size)
    embedded = jnp.where(in_range[..., None], self.embed(tokens), jnp.nan)
    x = maybe_dropout(embedded, keys[0])
    if run_stack is not None:
      x, new_carry = self._run_stack(run_stack, x, carry, keys[1:] if use_dropout else None)
      return self.softmax(x).astype(jnp.float32), new_carry
    new_carry = []
    for layer, layer_carry, key in zip(self.layers, carry, keys[1:]):
      layer_carry = jax.tree.map(jax.lax.stop_gradient, tuple(layer_carry))
      layer_carry, x = layer.unroll(layer_carry, x)
      new_carry.append(layer_carry)
      x = maybe_dropout(x, key)
    return self.softmax(x).astype(jnp.float32), tuple(new_carry)

  def _run_stack(self, run_stack: StackRunner, x: jax.Array, carry: PtbCarry, keys) -> tuple[jax.Array, PtbCarry]:
    """The LSTM layers (and the dropout after each) as one stack: kernels [L, 2H, 4H], biases [L, 4H];
    per layer and example the carry (c, h) and, with dropout, the keep mask of the layer's output (the
    mask `_dropout` draws from the same row keys, so the result equals the loop of `__call__`)."""
    shapes = {layer.kernel.shape for layer in self.layers}
    if len(shapes) != 1:
      raise ValueError(f"PtbLSTM runs its layers as one stack only when they are identical; the kernels have "
                       f"shapes {sorted(shapes)}: set embed_size equal to hidden_size ({self.hidden_size}).")
    params = {"kernel": jnp.stack([layer.kernel[...] for layer in self.layers]),
              "bias": jnp.stack([layer.bias[...] for layer in self.layers])}
    carry = jax.tree.map(jax.lax.stop_gradient, tuple(tuple(pair) for pair in carry))
    states = {"c": jnp.stack([c for c, _ in carry]), "h": jnp.stack([h for _, h in carry])}
    if keys is not None:
      shape = x.shape[:-1] + (self.hidden_size,)
      states["keep"] = jnp.stack([_keep_mask(shape, self.dropout_rate, key) for key in keys])
    forget_bias = self.layers[0].forget_bias

    def layer_fn(w, state, h):
      (c, h_last), outputs = lstm_unroll(w["kernel"], w["bias"], (state["c"], state["h"]), h, forget_bias)
      if "keep" in state:
        outputs = _apply_mask(outputs, state["keep"], self.dropout_rate)
      return dict(state, c=c, h=h_last), outputs

    states, x = run_stack(layer_fn, params, states, x)
    return x, tuple((states["c"][i], states["h"][i]) for i in range(self.num_layers))
