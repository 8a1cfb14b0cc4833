"""The train state: everything that changes during training and is checkpointed."""

from typing import Any, NamedTuple

import jax
import optax


class TrainState(NamedTuple):
  """The device-side state of a run.

  Attributes:
    step: number of applied parameter updates (int32).
    params: model parameters, a nested dict (`nnx.to_pure_dict` of the `nnx.Param` state).
    opt_state: the optimizer state (an `optax.inject_hyperparams` state).
    model_state: non-trained model variables (BatchNorm running statistics), a nested dict.
    rng: raw PRNG key data (uint32[2]); step s gives row n of its global batch the dropout key
      fold_in(fold_in(rng, s), n) (`lbjax.train.step.dropout_keys`).
    carry: recurrent state carried across batches (PTB LSTM) or `None`.
    first_nonfinite_step: -1 while every loss and update has been finite; otherwise the step at which
      the first non-finite value appeared. From then on the step leaves the state untouched, so the
      state stays the last good one.
    compression_state: the gradient compressor's state (QSGD's key; 1-bit SGD's error-feedback
      residual, one per device along a leading axis) or `None` without compression.
  """
  step: jax.Array
  params: Any
  opt_state: optax.OptState
  model_state: Any
  rng: jax.Array
  carry: Any
  first_nonfinite_step: jax.Array
  compression_state: Any = None
