"""Pipelined runs evaluate to the end (issue 30): the layouts a user would try, trained and evaluated
repeatedly on the 8 simulated CPU devices.

The evaluation loop used to queue its steps without bound. XLA:CPU launches each device's part of a program
on a worker thread, which blocks there while that device's queue is full; with the other worker threads
blocked in a collective that waits for a device whose part found no thread, the run deadlocked (`all reduce
RendezvousKey{... global_devices=[0, 2] ...}` stuck, then XLA's abort): 2 of 3 runs of
`--config.mesh.stage=2 --config.pipeline.num_microbatches=4` on 4 devices, and reproduced by a loop of
evaluation steps of the PTB LSTM on one core after ~50 steps (a stack dump showed two worker threads in the
all-reduce and two in the launch's semaphore). The evaluation loop (`lbjax.train.evaluation. Evaluator`) now
keeps at most two steps in flight, as training does; this test checks that bound at every evaluation step,
on a model whose evaluation step (a 10,000-word softmax) is slow enough that an unbounded loop runs ahead.
"""

import jax
import pytest

from lbjax.train import Run
from tests.train import helpers

# (mesh.stage, data-parallel devices, pipeline.num_microbatches)
LAYOUTS = [(2, 4, 2), (2, 2, 8), (2, 1, 4), (4, 2, 4), (4, 1, 8)]
EVALUATIONS = 3


def _config(stage: int, data: int, micro: int):
  """The PTB LSTM's shape (its 10,000-word vocabulary, a stack of identical layers) at a smaller width;
  ten evaluation steps of 16 windows."""
  return helpers.tiny_language_model_config(
      model_options={"embed_size": 32, "hidden_size": 32, "num_layers": 4}, batch_size=32, eval_batch_size=16,
      data_options={"vocab_size": 10000, "num_train_tokens": 2000, "num_eval_tokens": 1600, "seq_len": 10},
      **{"mesh.stage": stage, "mesh.num_devices": stage * data, "pipeline.num_microbatches": micro})


@pytest.mark.parametrize("stage, data, micro", LAYOUTS)
def test_a_pipelined_run_trains_and_evaluates_repeatedly_with_two_evaluation_steps_in_flight_at_most(stage, data,
                                                                                                     micro):
  run = Run(_config(stage, data, micro))
  try:
    for _ in range(2):
      run.step(run.next_batch())
    first = run.evaluate()  # compiles the evaluation step
    evaluator = run._evaluate  # pylint: disable=protected-access
    step, outputs, in_flight = evaluator._step, [], []  # pylint: disable=protected-access

    def counting_step(*args):
      in_flight.append(sum(not output.is_ready() for output in outputs))
      sums, carry = step(*args)
      outputs.append(jax.tree.leaves(sums)[0])
      return sums, carry

    evaluator._step = counting_step  # pylint: disable=protected-access
    losses = {run.evaluate()["loss"] for _ in range(EVALUATIONS)}
  finally:
    run.close()
  assert losses == {first["loss"]}  # the same parameters evaluate to the same loss
  assert len(in_flight) == EVALUATIONS * 10 and max(in_flight) <= 2, in_flight
