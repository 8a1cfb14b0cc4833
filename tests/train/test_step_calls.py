"""`config.steps_per_call`: k steps in one device call train the run of one step per call, step for step."""

import json
import os
import signal

import jax
import numpy as np
import pytest

from lbjax.train import ConfigError, NonFiniteError, train_and_evaluate
from lbjax.train import batch_policy, hooks, validation
from lbjax.train.checkpointing import Checkpointer
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train.run import Run
from tests.train import helpers


def _records(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f)]


def _kinds(records, kind, *fields):
  return [tuple(r.get(f) for f in fields) for r in records if r["kind"] == kind]


# Three batch sizes (4 + 2 + 6 steps of two epochs), an evaluation every half epoch, a window every 3
# steps, a checkpoint every 5: a call of 3 steps fits only where none of them falls inside it.
SCHEDULE = {"batch_sizes": (16, 32, 64), "batch_size_boundaries": (0.25, 0.5), "num_epochs": 2.0,
            "eval_every_epochs": 0.5, "log_every": 3, "checkpoint_every_steps": 5}


def test_calls_of_three_steps_train_the_run_of_one_step_per_call(tmp_path):
  """The same steps, batches, learning rates, records, evaluations and checkpoints; the state equal up
  to float rounding; some steps ran in calls of 3 (a `compile` record says so), the others alone."""
  one = train_and_evaluate(helpers.tiny_classifier_config(**SCHEDULE), tmp_path / "one")
  three = train_and_evaluate(helpers.tiny_classifier_config(steps_per_call=3, **SCHEDULE), tmp_path / "three")
  assert one.step == three.step == 12 and one.examples_seen == three.examples_seen == 512
  helpers.assert_trees_close(one.state.params, three.state.params, rtol=1e-6, atol=1e-7)
  helpers.assert_trees_close(one.state.opt_state, three.state.opt_state, rtol=1e-6, atol=1e-7)
  records_one, records_three = _records(tmp_path / "one"), _records(tmp_path / "three")
  for kind, fields in [("train", ("step", "epoch", "examples_seen", "batch_size", "learning_rate")),
                       ("eval", ("step", "epoch")), ("batch", ("step", "batch_size", "epoch"))]:
    assert _kinds(records_one, kind, *fields) == _kinds(records_three, kind, *fields), kind
  for kind in ("train", "eval"):
    for a, b in zip(_kinds(records_one, kind, "loss"), _kinds(records_three, kind, "loss")):
      assert a[0] == pytest.approx(b[0], rel=1e-5)
  # Steps 1-3 in one call; 4 alone (the next batch is of 32); 5-6 and every later stretch between
  # boundaries are shorter than 3 steps, so they run alone.
  assert _kinds(records_three, "compile", "step", "batch_size", "steps_per_call") == [
      (0, 16, 3), (3, 16, None), (4, 32, None), (6, 64, None)]
  assert Checkpointer(tmp_path / "one").all_steps() == Checkpointer(tmp_path / "three").all_steps()


def test_calls_carry_the_lstm_state_as_single_steps_do(tmp_path):
  """PTB: the carried state goes on from step to step inside a call and starts again at each epoch
  (its first batch starts a call); dropout draws the same masks (the step's key)."""
  config = lambda **o: helpers.tiny_language_model_config(log_every=8, **o)
  one = train_and_evaluate(config(), tmp_path / "one")
  four = train_and_evaluate(config(steps_per_call=4), tmp_path / "four")
  assert one.step == four.step
  helpers.assert_trees_close(one.state.params, four.state.params, rtol=1e-5, atol=1e-6)
  helpers.assert_trees_close(one.state.carry, four.state.carry, rtol=1e-5, atol=1e-6)
  assert one.eval_metrics["perplexity"] == pytest.approx(four.eval_metrics["perplexity"], rel=1e-5)
  assert any(r.get("steps_per_call") == 4 for r in _records(tmp_path / "four") if r["kind"] == "compile")


def test_a_resnet_in_calls_trains_as_in_single_steps(tmp_path):
  """Convolutions and BatchNorm statistics through a call (unrolled on CPU devices, where a loop body
  runs convolutions slowly)."""
  config = lambda **o: helpers.tiny_resnet_config(num_epochs=0.5, log_every=2, **o)
  one = train_and_evaluate(config(), tmp_path / "one")
  two = train_and_evaluate(config(steps_per_call=2), tmp_path / "two")
  assert one.step == two.step == 4
  helpers.assert_trees_close(one.state.params, two.state.params, rtol=1e-5, atol=1e-6)
  helpers.assert_trees_close(one.state.model_state, two.state.model_state, rtol=1e-5, atol=1e-6)
  assert [r.get("steps_per_call") for r in _records(tmp_path / "two") if r["kind"] == "compile"] == [2]


def test_the_clock_counts_the_batches_stepped_not_those_drawn_ahead(tmp_path):
  """A resumed run (at epoch 0.5) draws two batches for a call: its clock stays at 0.5 until they are
  stepped, then moves one batch at a time (what the hooks read between single steps of one draw)."""
  train_and_evaluate(helpers.tiny_classifier_config(num_epochs=0.5), tmp_path)
  run = Run(helpers.tiny_classifier_config(steps_per_call=2), tmp_path)
  try:
    assert run.epoch == 0.5
    batches = [run.next_batch(), run.next_batch()]
    assert (run.epoch, run.stream.epoch(), run.drawn_ahead) == (0.5, 0.75, 2)
    run.step(batches[0])
    assert (run.epoch, run.step_count, run.drawn_ahead) == (0.625, 5, 1)
    run.step(batches[1])
    assert (run.epoch, run.step_count, run.drawn_ahead) == (0.75, 6, 0)
  finally:
    run.close()


def test_a_run_stopped_by_sigterm_in_a_call_resumes_to_the_unbroken_run(tmp_path, monkeypatch):
  """SIGTERM during a call's steps: the run saves at the call's end (never with batches drawn and not
  stepped) and the resumed run ends bit-identical to the unbroken one."""
  config = lambda: helpers.tiny_classifier_config(steps_per_call=3, log_every=6, num_epochs=2.0)
  unbroken = train_and_evaluate(config(), tmp_path / "unbroken")
  after_step = batch_policy.BatchPolicy.after_step

  def terminate_after(self, step, *args):
    after_step(self, step, *args)
    if step == 4:  # the first step of the second call
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(batch_policy.BatchPolicy, "after_step", terminate_after)
  preempted = train_and_evaluate(config(), tmp_path / "resumed")
  assert preempted.preempted and preempted.step == 6
  monkeypatch.undo()
  resumed = train_and_evaluate(config(), tmp_path / "resumed")
  assert resumed.step == unbroken.step == 16
  helpers.assert_trees_equal(resumed.state.params, unbroken.state.params)
  helpers.assert_trees_equal(resumed.state.opt_state, unbroken.state.opt_state)


def test_a_non_finite_step_inside_a_call_is_named_from_its_own_batch(tmp_path, monkeypatch):
  """The second step of a call of 3 gets labels with a NaN loss: the stop names that step and its batch."""
  helpers.poison_train_batch(monkeypatch, 5)
  with pytest.raises(NonFiniteError, match=r"at step 4: the loss is not finite \(on the latest batch\)"):
    train_and_evaluate(helpers.tiny_classifier_config(steps_per_call=3, log_every=6), tmp_path)


def test_a_window_averages_the_steps_of_calls_and_single_steps_alike(tmp_path):
  """A 10-step window of a call of 4, two single steps and a call of 4 (steps 7-10 accumulate):
  each mean is over the steps that report the metric, the learning rate is the last step's."""
  steps = helpers.window_steps(10, accumulating_from=6)
  writer = MetricsWriter(tmp_path)
  write = hooks.WriteMetrics(writer, ProgressLine(1.0, 10, enabled=False), log_every=10, layerwise_rates=False)
  run = helpers.MetricsRunView()
  for first, count in [(0, 4), (4, 1), (5, 1), (6, 4)]:
    run.step_count, run.latest_call_steps = first + count, count
    chunk = steps[first:first + count]
    metrics = {name: jax.numpy.float32([values[name] for values in chunk]) for name in chunk[0]}
    write.after_step(run, metrics if count > 1 else {name: value[0] for name, value in metrics.items()})
  write.flush(run)
  writer.close()
  (record,) = [r for r in _records(tmp_path) if r["kind"] == "train"]
  for name in ("loss", "update_norm", "noise_scale_grad_norm_sq", "noise_scale_trace_sigma"):
    assert record[name] == pytest.approx(float(np.mean(np.float32([v[name] for v in steps if name in v])))), name
  assert record["learning_rate"] == float(np.float32(9.1)) and record["step"] == 10


@pytest.mark.parametrize("overrides, message", [
    ({"steps_per_call": 0}, "config.steps_per_call must be an integer >= 1"),
    ({"steps_per_call": True}, "config.steps_per_call must be an integer >= 1"),
    ({"steps_per_call": 4, "batch.policy": "adaptive"}, "config.batch.policy='adaptive' decides it"),
    ({"steps_per_call": 4, "batch.micro_batch_size": 8}, "does not combine with config.batch.micro_batch_size=8"),
])
def test_steps_per_call_the_run_cannot_take_are_refused_before_compute(overrides, message):
  with pytest.raises(ConfigError, match=message):
    validation.validate(helpers.tiny_classifier_config(**overrides))
