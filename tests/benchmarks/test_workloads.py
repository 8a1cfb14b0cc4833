"""The benchmarks' trainer workloads: the k-step call is k of the trainer's steps."""

import jax
import numpy as np
import pytest

from benchmarks import workloads


@pytest.mark.parametrize("unrolled", [False, True])
def test_the_call_of_k_steps_takes_the_trainer_steps_k_times(unrolled):
  config = workloads.trainer_config("mnist_lstm", 8, num_train_examples=64)
  steps, call_step = workloads.TrainerStep(config), workloads.TrainerStep(config)
  call = workloads.TrainerCall(call_step, 3, unrolled=unrolled)
  for _ in range(3):
    step_metrics = steps()
  call_metrics = call()
  assert call_metrics["loss"].shape == (3,)
  np.testing.assert_allclose(call_metrics["loss"][-1], step_metrics["loss"], rtol=1e-5)
  for got, want in zip(jax.tree.leaves(call_step.state.params), jax.tree.leaves(steps.state.params)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert int(call_step.state.step) == int(steps.state.step) == 3
  steps.close()
  call_step.close()
