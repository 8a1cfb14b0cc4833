"""`data_options.carry_state=False` (the PTB datasets): every window starts from a zero LSTM state, in
training and in evaluation; the default carries the state from window to window."""

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


def _run(tmp_path, carry_state):
  options = {"vocab_size": 20, "num_train_tokens": 4000, "num_eval_tokens": 800, "seq_len": 10,
             "carry_state": carry_state}
  config = helpers.tiny_language_model_config(data_options=options, model_options={
      "embed_size": 8, "hidden_size": 8, "dropout_rate": 0.0})
  return Run(config, tmp_path)


def _hand_perplexity(run, carry_state):
  """exp(mean CE) over the eval windows, the carry reset where the batches say so."""
  model = nnx.merge(run.parts.graphdef, run.state.params, run.state.model_state)
  tokens = data.synthetic_ptb_tokens(800, 20, seed=0, split="valid")
  loss_sum = count = 0.0
  carry = model.initial_carry(16)
  for batch in data.ptb_eval_batches(tokens, 16, seq_len=10, carry_state=carry_state):
    if batch["reset_carry"]:
      carry = model.initial_carry(16)
    logits, carry = model(jnp.asarray(batch["inputs"]), carry, train=False)
    cross_entropy = models.per_example_cross_entropy(logits, jnp.asarray(batch["targets"]))
    loss_sum += float(jnp.sum(cross_entropy * batch["mask"]))
    count += float(batch["mask"].sum())
  return float(np.exp(loss_sum / count))


@pytest.mark.parametrize("carry_state", [True, False])
def test_training_resets_the_carry_on_every_window_only_without_carry_state(tmp_path, carry_state):
  run = _run(tmp_path, carry_state)
  zero_before_step = []
  train_step = run.train_step

  def recording_train_step(size, discard_fraction, state, *rest):  # the state each step starts from
    zero_before_step.append(all(not np.any(np.asarray(x)) for x in jax.tree.leaves(state.carry)))
    return train_step(size, discard_fraction, state, *rest)

  run.train_step = recording_train_step
  try:
    resets = [run.step(batch) and batch.reset_carry for batch in (run.next_batch() for _ in range(3))]
    expected = [True, True, True] if not carry_state else [True, False, False]
    assert zero_before_step == resets == expected
    evaluated = run.evaluate()["perplexity"]
    assert evaluated == pytest.approx(_hand_perplexity(run, carry_state), rel=1e-4)
    assert evaluated != pytest.approx(_hand_perplexity(run, not carry_state), rel=1e-4)
  finally:
    run.close()


def test_eval_batches_and_stream_flag_every_window_without_carry_state():
  tokens = data.synthetic_ptb_tokens(800, 20, seed=0, split="valid")
  carried = list(data.ptb_eval_batches(tokens, 4, seq_len=10))
  reset = list(data.ptb_eval_batches(tokens, 4, seq_len=10, carry_state=False))
  assert [bool(b["reset_carry"]) for b in carried] == [True] + [False] * (len(carried) - 1)
  assert all(b["reset_carry"] for b in reset)
  for a, b in zip(carried, reset):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
  stream = data.PtbStream(tokens, seq_len=10, carry_state=False)
  default = data.PtbStream(tokens, seq_len=10)
  for _ in range(25):  # past the end of an epoch (19 windows of 4 rows)
    a, b = default.next_batch(4), stream.next_batch(4)
    np.testing.assert_array_equal(a["targets"], b["targets"])
    assert b["reset_carry"]


@pytest.mark.parametrize("value", ["maybe", "False", 0])
def test_a_carry_state_that_is_not_a_bool_is_refused(value, tmp_path):
  config = helpers.tiny_language_model_config(data_options={"vocab_size": 20, "num_train_tokens": 4000,
                                                            "num_eval_tokens": 800, "carry_state": value})
  with pytest.raises(ConfigError, match=r"config.dataset='synthetic_ptb': .* carry_state must be True or False"):
    Run(config, tmp_path)
  tokens = data.synthetic_ptb_tokens(800, 20, seed=0, split="valid")
  with pytest.raises(ValueError, match=f"carry_state must be True or False, got {value!r}"):
    data.PtbStream(tokens, seq_len=10, carry_state=value)
  with pytest.raises(ValueError, match="carry_state must be True or False"):
    data.ptb_eval_batches(tokens, 4, seq_len=10, carry_state=value)
