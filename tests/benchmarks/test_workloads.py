"""The benchmarks' trainer workloads: the k-step call is k of the trainer's steps."""

import jax
import jax.numpy as jnp
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


def test_the_step_with_the_state_in_xlas_layouts_trains_as_the_trainer_step():
  config = workloads.trainer_config("resnet_tiny", 8, num_train_examples=64, image_size=8)
  row_major, chosen = workloads.TrainerStep(config), workloads.TrainerStep(config, state_layouts="xla")
  formats = jax.tree.leaves(chosen.compiled.input_formats[0][0])
  for got, want in zip(jax.tree.leaves(chosen.state), formats):
    assert got.format == want  # placed as the step was compiled: no relayout per call
  for _ in range(2):
    want, got = row_major(), chosen()
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  for got, want in zip(jax.tree.leaves(chosen.state.params), jax.tree.leaves(row_major.state.params)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  row_major.close()
  chosen.close()


def test_the_state_layouts_are_checked():
  with pytest.raises(ValueError, match="state_layouts must be one of default, xla"):
    workloads.TrainerStep(workloads.trainer_config("mnist_lstm", 8, num_train_examples=64), state_layouts="auto")


def test_a_program_with_xlas_state_layouts_leaves_only_the_state_s_layouts_to_xla():
  from jax.experimental.layout import Format, Layout
  from lbjax.train import compile_only
  config = workloads.trainer_config("mnist_lstm", 8, num_train_examples=64)
  program = compile_only.abstract_run(config, jax.devices()[:1]).programs[0]
  chosen = workloads.with_state_layouts_chosen_by_xla(program)
  for tree in (chosen.in_shardings[0], chosen.out_shardings[0]):
    formats = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, Format))
    assert formats and all(isinstance(f, Format) and f.layout == Layout.AUTO for f in formats)
  assert chosen.in_shardings[1:] == program.in_shardings[1:] and chosen.out_shardings[1:] == program.out_shardings[1:]
  compiled, _ = compile_only.compile_program(chosen)
  assert len(jax.tree.leaves(compiled.input_formats[0][0])) == len(jax.tree.leaves(program.in_shardings[0]))


def test_a_traced_step_gives_its_device_time_and_its_longest_kernels(tmp_path):
  matrix = jnp.ones((256, 256))
  step = jax.jit(lambda: jnp.tanh(matrix @ matrix).sum())
  traced = workloads.trace_steps(step, 3, tmp_path)
  assert traced["steps"] == 3 and traced["trace"].startswith(str(tmp_path))
  assert 0 < traced["device_busy_fraction"] <= 1.01 and traced["kernels_per_step"] >= 1
  name, launches, milliseconds = traced["top_kernels"][0]
  assert launches == 1 and milliseconds > 0 and isinstance(name, str)


@pytest.mark.parametrize("model", ["mnist_lstm", "ptb_lstm"])
def test_the_hand_written_step_takes_the_trainer_steps_first_loss(model):
  """benchmarks.train_step compares the trainer's step with a hand-written one: same model, batch and loss."""
  trainer_step = workloads.TrainerStep(workloads.trainer_config(model, 8, num_train_examples=64))
  hand_step = workloads.HandStep(trainer_step)
  np.testing.assert_allclose(hand_step(), trainer_step()["loss"], rtol=1e-5)
  trainer_step.close()
