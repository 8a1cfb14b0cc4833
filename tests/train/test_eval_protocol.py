"""PTB `data_options.eval_protocol`: "windows" (batched rows, the default) and "stream" (TensorFlow
`ptb_word_lm`'s test protocol, papers/001's PTB baseline: batch 1, one state carried from the start of the
split through all of it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lbjax import data
from lbjax import models
from lbjax.train.errors import ConfigError
from lbjax.train.run import Run
from tests.train import helpers

NUM_EVAL_TOKENS = 300


def _config(**data_options):
  options = {"vocab_size": 20, "num_train_tokens": 4000, "num_eval_tokens": NUM_EVAL_TOKENS, "seq_len": 10}
  return helpers.tiny_language_model_config(data_options={**options, **data_options})


def _token_by_token_perplexity(run):
  """ptb_word_lm's loop: one token at a time from a zero state, the state carried through the split."""
  model = nnx.merge(run.parts.graphdef, run.state.params, run.state.model_state)
  graphdef, state = nnx.split(model)

  @jax.jit
  def one_token(state, token, target, carry):
    logits, carry = nnx.merge(graphdef, state)(token[None, None], carry, train=False)
    return models.per_example_cross_entropy(logits, target[None, None])[0, 0], carry

  tokens = data.synthetic_ptb_tokens(NUM_EVAL_TOKENS, 20, seed=0, split="valid")
  carry = model.initial_carry(1)
  total = 0.0
  for t in range(len(tokens) - 1):
    cross_entropy, carry = one_token(state, jnp.asarray(tokens[t]), jnp.asarray(tokens[t + 1]), carry)
    total += float(cross_entropy)
  return float(np.exp(total / (len(tokens) - 1)))


def _trained_perplexities(tmp_path, **data_options):
  """Trains a tiny LSTM 3 steps, then evaluates it (eval_batch_size 8: one row per simulated device)."""
  run = Run(helpers.set_fields(_config(**data_options), {"eval_batch_size": 8}), tmp_path)
  try:
    for _ in range(3):
      run.step(run.next_batch())
    return run, run.evaluate()["perplexity"]
  finally:
    run.close()


def test_stream_protocol_equals_a_token_by_token_loop(tmp_path):
  run, stream = _trained_perplexities(tmp_path / "stream", eval_protocol="stream", stream_window=37)
  assert stream == pytest.approx(_token_by_token_perplexity(run), rel=1e-5)
  _, long_window = _trained_perplexities(tmp_path / "long", eval_protocol="stream", stream_window=1000)
  assert long_window == pytest.approx(stream, rel=1e-5)  # the window changes device calls, not results
  _, windows = _trained_perplexities(tmp_path / "windows")
  assert windows != pytest.approx(stream, rel=1e-4)  # 8 rows start 8 states: another protocol


def test_stream_batches_score_every_prediction_once_on_row_zero_of_process_zero():
  tokens = data.synthetic_ptb_tokens(NUM_EVAL_TOKENS, 20, seed=0, split="valid")
  batches = list(data.ptb_stream_eval_batches(tokens, 4, window=64))
  assert len(batches) == -(-(len(tokens) - 1) // 64)
  assert [bool(b["reset_carry"]) for b in batches] == [True] + [False] * (len(batches) - 1)
  mask = np.concatenate([b["mask"] for b in batches], axis=1)
  assert mask[0].sum() == len(tokens) - 1 and not mask[1:].any()
  inputs = np.concatenate([b["inputs"] for b in batches], axis=1)[0, :len(tokens) - 1]
  targets = np.concatenate([b["targets"] for b in batches], axis=1)[0, :len(tokens) - 1]
  np.testing.assert_array_equal(inputs, tokens[:-1])
  np.testing.assert_array_equal(targets, tokens[1:])
  second_process = list(data.ptb_stream_eval_batches(tokens, 4, window=64, process_index=1, process_count=2))
  assert all(b["inputs"].shape == (2, 64) and not b["mask"].any() for b in second_process)


@pytest.mark.parametrize("options, message", [
    ({"eval_protocol": "token"}, r"eval_protocol='token': lbjax.train.datasets.synthetic_ptb takes eval_protocol "
                                 r"'windows' or 'stream'"),
    ({"eval_protocol": "stream", "carry_state": False}, "contradicts carry_state=False"),
    ({"eval_protocol": "stream", "stream_window": 0}, "stream_window must be a positive integer"),
])
def test_bad_protocol_settings_are_config_errors_before_any_compute(tmp_path, options, message):
  with pytest.raises(ConfigError, match=message):
    Run(_config(**options), tmp_path)
