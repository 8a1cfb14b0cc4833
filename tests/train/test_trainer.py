"""The trainer: sharding, accumulation, batch-size schedules, exact resume, health and validation."""

import json
import math
import re

import jax
import numpy as np
import pytest

from lbjax import data as lbdata
from lbjax.train import NonFiniteError, train_and_evaluate
from lbjax.train.checkpointing import Checkpointer
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train import hooks
from lbjax.train.build import global_batch
from lbjax.train.run import Run
from tests.train import helpers


def _records(workdir, kind):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_eight_device_run_equals_one_device_run(tmp_path):
  sharded = train_and_evaluate(helpers.tiny_classifier_config(), tmp_path / "8")
  single = train_and_evaluate(helpers.tiny_classifier_config(**{"mesh.num_devices": 1}), tmp_path / "1")
  assert sharded.step == single.step == 8
  helpers.assert_trees_close(sharded.state.params, single.state.params)
  helpers.assert_trees_close(sharded.state.opt_state, single.state.opt_state)
  assert sharded.eval_metrics["accuracy"] == pytest.approx(single.eval_metrics["accuracy"])


def test_accumulating_4_micro_batches_of_16_equals_the_true_batch_of_64(tmp_path):
  """Same update (parameters, momentum and ghost-BN statistics) from 4 x 16 as from one batch of 64."""
  overrides = {"batch_size": 64, "mesh.num_devices": 1, "optimizer.name": "lars", "lr.base": 1.0}
  true_batch = train_and_evaluate(helpers.tiny_resnet_config(**overrides), tmp_path / "true")
  accumulated = train_and_evaluate(
      helpers.tiny_resnet_config(max_device_batch=16, **overrides), tmp_path / "accumulated")
  assert true_batch.step == accumulated.step == 4
  helpers.assert_trees_close(true_batch.state.params, accumulated.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(true_batch.state.model_state, accumulated.state.model_state)
  helpers.assert_trees_close(true_batch.state.opt_state, accumulated.state.opt_state, rtol=2e-5, atol=2e-6)


def test_three_size_batch_schedule_compiles_exactly_three_steps(tmp_path):
  config = helpers.tiny_classifier_config(batch_sizes=(16, 32, 64), batch_size_boundaries=(0.25, 0.5),
                                          num_epochs=1.0)
  result = train_and_evaluate(config, tmp_path)
  assert result.compiled_batch_sizes == (16, 32, 64)
  assert [r["batch_size"] for r in _records(tmp_path, "compile")] == [16, 32, 64]
  # 0.25 epoch of 256 examples at 16, 0.25 at 32, 0.5 at 64: 4 + 2 + 2 steps, every example once.
  assert result.step == 8 and result.examples_seen == 256 and result.epoch == 1.0


@pytest.mark.parametrize("num_epochs, steps_per_call", [(1.0, 1), (2.0, 1), (1.0, 4)])
def test_a_larger_batch_that_the_rest_of_a_token_epoch_cannot_hold_starts_the_next_epoch_at_its_schedule(
    tmp_path, num_epochs, steps_per_call):
  """24 windows of 16 rows per epoch; from epoch 0.9 the schedule says 64 rows, which the 480 tokens left after
  window 22 cannot fill (64 x 11), so that epoch ends there. The first 64-row step starts epoch 1 and takes its
  learning rate (halved at 1.0); a 1-epoch run (halving at 0.5) ends after window 22. That step took epoch 0.92's
  rate, and a 1-epoch run trained a window of epoch 2 (with several steps per call, after the first fix too)."""
  config = helpers.tiny_language_model_config(
      batch_sizes=(16, 64), batch_size_boundaries=(0.9,), num_epochs=num_epochs, eval_every_epochs=5.0,
      steps_per_call=steps_per_call, log_every=1 if steps_per_call == 1 else 7,  # a record each step ends a call
      **{"mesh.num_devices": 1, "lr.decay": "multistep_decay", "lr.boundaries": (min(num_epochs, 2.0) / 2,),
         "lr.decay_factors": 0.5})
  result = train_and_evaluate(config, tmp_path)
  train = _records(tmp_path, "train")
  if steps_per_call > 1:
    assert result.step == 22 and result.epoch == 1.0 and [r["step"] for r in train] == [7, 14, 21, 22]
    return
  # The run's clock after window 22 is where its next batch starts: the rest of epoch 0 is skipped.
  assert [r["batch_size"] for r in train[:22]] == [16] * 22 and train[21]["epoch"] == 1.0
  if num_epochs == 1.0:
    assert result.step == 22 and result.epoch == 1.0
  else:
    assert train[22]["batch_size"] == 64 and train[22]["epoch"] == pytest.approx(1 + 1 / 6)  # 6 windows of 64
    assert train[21]["learning_rate"] == pytest.approx(0.5) and train[22]["learning_rate"] == pytest.approx(0.25)


@pytest.mark.parametrize("make_config", [helpers.tiny_classifier_config, helpers.tiny_language_model_config])
def test_interrupted_and_resumed_run_is_bit_identical(tmp_path, make_config):
  """Stop half-way, restart in the same workdir: parameters, optimizer state, RNG, data position and
  (PTB) the carried LSTM state continue exactly."""
  full = train_and_evaluate(make_config(), tmp_path / "full")
  total = make_config().num_epochs
  train_and_evaluate(make_config(num_epochs=total / 2), tmp_path / "resumed")
  resumed = train_and_evaluate(make_config(), tmp_path / "resumed")
  assert resumed.step == full.step
  helpers.assert_trees_equal(resumed.state, full.state)
  assert resumed.eval_metrics == full.eval_metrics



@pytest.mark.parametrize("make_config", [helpers.tiny_classifier_config, helpers.tiny_language_model_config])
def test_a_run_without_a_workdir_restored_from_another_runs_checkpoint_continues_it_exactly(tmp_path, make_config):
  """`Run.restore_checkpoint` (branching from a reference run): the state, data position, examples seen
  and (PTB) the carried LSTM state of a checkpoint mid-epoch; the rest of the steps end where the
  uninterrupted run ends, and nothing is written to the checkpoint's workdir."""
  full = train_and_evaluate(make_config(), tmp_path / "full")
  train_and_evaluate(make_config(num_epochs=make_config().num_epochs * 3 / 8), tmp_path / "half")
  checkpointer = Checkpointer(tmp_path / "half")
  saved = sorted(path.name for path in (tmp_path / "half").rglob("*"))
  run = Run(make_config())
  try:
    step = checkpointer.latest_step()
    meta = run.restore_checkpoint(checkpointer, step)
    assert run.step_count == step == full.step * 3 // 8 and run.examples_seen == meta["examples_seen"] > 0
    while run.step_count < full.step:
      run.step(run.next_batch())
    helpers.assert_trees_equal(run.state, full.state)
    assert run.evaluate()["loss"] == full.eval_metrics["loss"]
  finally:
    run.close()
    checkpointer.close()
  assert sorted(path.name for path in (tmp_path / "half").rglob("*")) == saved

def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
  """A batch with a NaN loss at step 5: the run stops naming step 5; checkpoints 1-5 hold finite states."""
  next_batch = lbdata.TrainStream.next_batch
  calls = []

  def poisoned_next_batch(self, global_batch_size):
    batch = next_batch(self, global_batch_size)
    calls.append(None)
    return helpers.poisoned(batch) if len(calls) == 6 else batch

  monkeypatch.setattr(lbdata.TrainStream, "next_batch", poisoned_next_batch)
  config = helpers.tiny_classifier_config(checkpoint_every_steps=1, log_every=100)
  with pytest.raises(NonFiniteError, match=r"Non-finite loss or update at step 5: .*last good checkpoint "
                     r"\(step 5\)"):
    train_and_evaluate(config, tmp_path)
  checkpointer = Checkpointer(tmp_path)
  assert checkpointer.latest_step() == 5
  assert checkpointer.restore_meta(5)["examples_seen"] == 5 * 32
  # Each checkpoint wrote the train record of its steps first; nothing was logged past the last good one.
  records = _records(tmp_path, "train")
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and all(math.isfinite(r["loss"]) for r in records)


def test_metrics_reach_the_host_once_per_window_one_step_late(tmp_path, monkeypatch):
  """Between log windows no step transfers anything to the host; a window closed at step N is fetched in
  one `device_get` at step N + 1, and its record still carries step N's clock."""
  run = Run(helpers.tiny_classifier_config(num_steps=12, num_epochs=2.0), tmp_path)
  fetched_at_step = []
  device_get = jax.device_get

  def counting_device_get(tree):
    if jax.tree.leaves(tree):  # (the batch policy fetches its empty list of noise-scale estimates)
      fetched_at_step.append(run.step_count)
    return device_get(tree)

  writer = MetricsWriter(tmp_path)
  window = hooks.WriteMetrics(writer, ProgressLine(2.0, 12, enabled=False), log_every=4,
                              layerwise_rates=run.parts.has_layerwise_rates)
  try:
    monkeypatch.setattr(jax, "device_get", counting_device_get)
    with jax.transfer_guard_device_to_host("disallow"):  # refuses implicit transfers (float(x), np.asarray)
      for _ in range(10):
        window.after_step(run, run.step(run.next_batch()))
    assert fetched_at_step == [5, 9]
    window.flush(run)  # the open window (steps 9 and 10), fetched at once
    assert fetched_at_step == [5, 9, 10]
  finally:
    writer.close()
    run.close()
  records = _records(tmp_path, "train")
  assert [(r["step"], r["examples_seen"]) for r in records] == [(4, 4 * 32), (8, 8 * 32), (10, 10 * 32)]


def test_a_window_record_averages_each_metric_over_the_steps_that_report_it(tmp_path, monkeypatch):
  """A 50-step window whose last 30 steps accumulate (two more metrics): each mean is over the steps that
  report it, the learning rate is the last step's, and the window is stacked on the device 32 steps at a
  time, the second run padded (no transfer per step; one compiled shape)."""
  steps = helpers.window_steps(50, accumulating_from=20)
  stacked_sizes = []
  stack = hooks._stack_columns
  monkeypatch.setattr(hooks, "_stack_columns", lambda columns: stacked_sizes.append(
      {name: len(values) for name, values in columns.items()}) or stack(columns))
  writer = MetricsWriter(tmp_path)
  write = hooks.WriteMetrics(writer, ProgressLine(1.0, 50, enabled=False), log_every=50, layerwise_rates=False)
  run = helpers.MetricsRunView()
  for step, values in enumerate(steps, 1):
    run.step_count = step
    write.after_step(run, {name: jax.numpy.float32(value) for name, value in values.items()})
  write.flush(run)
  writer.close()
  (record,) = _records(tmp_path, "train")
  for name in ("loss", "update_norm", "noise_scale_grad_norm_sq", "noise_scale_trace_sigma"):
    reported = np.float32([values[name] for values in steps if name in values])
    assert record[name] == float(np.mean(reported)), name
  assert record["learning_rate"] == float(np.float32(49.1)) and record["step"] == 50
  assert stacked_sizes == [{"loss": 32, "update_norm": 32, "learning_rate": 32, "noise_scale_grad_norm_sq": 32,
                            "noise_scale_trace_sigma": 32}, {"loss": 32, "update_norm": 32, "learning_rate": 32}]


def test_the_learning_rate_is_placed_once_per_constant_stretch(tmp_path):
  """A new value goes to the step as a numpy scalar (placed by the step's call), a repeated one as one device
  scalar placed on its first repeat and reused (no transfer per step), and every step trains with the
  schedule's float32 value at its epoch: 0.05 for the first half epoch, then 0.005."""
  run = Run(helpers.tiny_classifier_config(**{"lr.decay": "multistep_decay", "lr.boundaries": [0.5],
                                              "lr.decay_factors": 0.1}), tmp_path)
  try:
    epochs, scalars, used = [], [], []
    for _ in range(8):
      epochs.append(run.epoch)
      batch = run.next_batch()
      scalars.append(batch.learning_rate)
      used.append(run.step(batch)["learning_rate"])
  finally:
    run.close()
  assert [isinstance(s, np.ndarray) for s in scalars] == [True, False, False, False] * 2
  assert len({id(s) for s in scalars[1:4]}) == len({id(s) for s in scalars[5:]}) == 1
  expected = [np.float32(run.resolved.learning_rate(e, run.batch_size)) for e in epochs]
  assert expected == [np.float32(0.05)] * 4 + [np.float32(0.005)] * 4
  assert jax.device_get(scalars) == expected and jax.device_get(used) == expected


def test_a_bad_last_step_of_a_window_is_named_from_its_own_batch(tmp_path, monkeypatch):
  """The window's metrics arrive one step late, yet the diagnosis recomputes the bad step's batch."""
  draws = helpers.poison_train_batch(monkeypatch, 4)
  with pytest.raises(NonFiniteError, match=r"at step 3: the loss is not finite \(on the latest batch\)"):
    train_and_evaluate(helpers.tiny_classifier_config(log_every=4), tmp_path)
  assert len(draws) == 5  # stopped at the step after the window, before writing it
  assert not _records(tmp_path, "train")


def test_sigterm_right_after_an_evaluation_keeps_its_checkpoint_and_resumes(tmp_path, monkeypatch):
  """Step 4 ends half an epoch: it is evaluated and saved; a SIGTERM seen there must not save it twice."""
  config = helpers.tiny_classifier_config(eval_every_epochs=0.5)
  monkeypatch.setattr(hooks.PreemptionFlag, "should_stop", lambda self, step: step == 4)
  preempted = train_and_evaluate(config, tmp_path)
  assert preempted.preempted and preempted.step == 4
  assert Checkpointer(tmp_path).latest_step() == 4
  monkeypatch.undo()
  resumed = train_and_evaluate(config, tmp_path)
  assert not resumed.preempted and resumed.step == 8


def test_the_best_evaluation_of_a_resumed_run_counts_the_evaluations_before_the_resume(tmp_path, monkeypatch,
                                                                                      capfd):
  """The summary's `best` line is the best of the whole run, not of the process that finished it."""
  accuracies = iter([0.9, 0.5, 0.6, 0.7])  # epochs 0.25, 0.5 (first process), 0.75, 1.0 (resumed)
  monkeypatch.setattr(Run, "evaluate", lambda self: (lambda a: {"accuracy": a, "loss": 1 - a})(next(accuracies)))
  train_and_evaluate(helpers.tiny_classifier_config(num_epochs=0.5, eval_every_epochs=0.25), tmp_path)
  capfd.readouterr()
  resumed = train_and_evaluate(helpers.tiny_classifier_config(eval_every_epochs=0.25, progress=True), tmp_path)
  assert resumed.step == 8 and resumed.eval_metrics["accuracy"] == 0.7
  summary = capfd.readouterr().out.splitlines()[-2:]
  assert summary == ["final   accuracy 0.7000  loss 0.3000", "best    accuracy 0.9000  loss 0.1000"]
  assert [r["accuracy"] for r in _records(tmp_path, "eval")] == [0.9, 0.5, 0.6, 0.7]


def test_workdir_of_another_run_is_refused(tmp_path):
  train_and_evaluate(helpers.tiny_classifier_config(num_epochs=0.25), tmp_path)
  with pytest.raises(ValueError, match="holds a checkpoint of a different run.*lr"):
    train_and_evaluate(helpers.tiny_classifier_config(**{"lr.base": 0.2}), tmp_path)


def test_trust_ratios_are_logged_for_lars(tmp_path):
  train_and_evaluate(helpers.tiny_classifier_config(**{"optimizer.name": "lars", "lr.base": 1.0}), tmp_path)
  ratios = _records(tmp_path, "trust_ratio")
  assert len(ratios) == 2  # every log_every = 4 of 8 steps
  kernels = {k: v for k, v in ratios[-1].items() if k.endswith("kernel")}
  assert kernels and all(v > 0 for v in kernels.values())


def test_num_steps_stops_early_and_a_longer_run_resumes_from_there(tmp_path):
  stopped = train_and_evaluate(helpers.tiny_classifier_config(num_steps=3), tmp_path)
  assert stopped.step == 3 and stopped.examples_seen == 96
  assert train_and_evaluate(helpers.tiny_classifier_config(), tmp_path).step == 8


def test_tensorboard_mirrors_the_scalars(tmp_path):
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=4, tensorboard=True), tmp_path)
  events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert events and events[0].stat().st_size > 0


def _all_reduce_computations(config):
  """Names of the HLO computations of the compiled train step that hold an all-reduce."""
  run = Run(config)
  batch = global_batch(run.task.dataset.make_train_stream(0, 1).next_batch(32), run.parts.batch_sharding)
  compiled = run.train_step(32, 0.0, run.state, batch, jax.device_put(np.float32(0.1), run.parts.replicated))
  computations = re.split(r"\n(?=\S)", compiled.as_text())
  return [c.split("\n")[0][:60] for c in computations if " all-reduce(" in c]


def test_per_device_gradients_reduce_once_and_equal_the_one_device_run(tmp_path):
  """With the LSTM's time loop, GSPMD all-reduces the kernel gradient inside the loop body;
  per-device gradients in shard_map leave one all-reduce, in the entry computation."""
  gspmd = _all_reduce_computations(helpers.tiny_classifier_config())
  per_device = _all_reduce_computations(helpers.tiny_classifier_config(**{"mesh.per_device_gradients": True}))
  assert any(not name.startswith("ENTRY") for name in gspmd)
  assert len(per_device) == 1 and per_device[0].startswith("ENTRY")
  sharded = train_and_evaluate(helpers.tiny_classifier_config(**{"mesh.per_device_gradients": True}),
                               tmp_path / "8")
  single = train_and_evaluate(helpers.tiny_classifier_config(**{"mesh.num_devices": 1}), tmp_path / "1")
  helpers.assert_trees_close(sharded.state.params, single.state.params)


def test_per_device_gradients_accumulate_on_each_device_and_still_reduce_once(tmp_path):
  """8 devices x 2 micro-batches of 2: one all-reduce, the 1-device true-batch update, noise scale logged."""
  overrides = {"mesh.per_device_gradients": True, "max_device_batch": 2}
  computations = _all_reduce_computations(helpers.tiny_classifier_config(**overrides))
  assert len(computations) == 1 and computations[0].startswith("ENTRY")
  accumulated = train_and_evaluate(helpers.tiny_classifier_config(**overrides), tmp_path / "8x2")
  single = train_and_evaluate(helpers.tiny_classifier_config(**{"mesh.num_devices": 1}), tmp_path / "1")
  helpers.assert_trees_close(accumulated.state.params, single.state.params)
  assert all(r["gradient_noise_scale"] == r["gradient_noise_scale"] for r in _records(tmp_path / "8x2", "train"))


def test_cifar10_from_tfds_trains_on_uint8_batches_and_resumes_mid_epoch_bit_identically(tmp_path, monkeypatch):
  """The TFDS stream hands over uint8 images, the step normalises them on the device; a run stopped
  mid-epoch and resumed (checkpoint, data fingerprint, stream position) equals the uninterrupted one.
  TFDS's mock data is not "prepared" on disk, so the fingerprint is the one a prepared split gives."""
  tfds = pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("cv2")
  from lbjax.train import datasets  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(datasets, "_tfds_fingerprint", lambda name, data_dir, splits: {
      role: f"tfds:{name}:3.0.2:{split} (24 rows)" for role, split in zip(("train", "eval"), splits)})
  overrides = {"dataset": "cifar10", "data_options": {}, "data_dir": str(tmp_path / "tfds"),
               "batch_size": 16, "eval_batch_size": 16, "num_epochs": 2.0, "mesh.num_devices": 1}
  with tfds.testing.mock_data(num_examples=24):
    full = train_and_evaluate(helpers.tiny_resnet_config(**overrides), tmp_path / "full")
    train_and_evaluate(helpers.tiny_resnet_config(**{**overrides, "num_epochs": 0.75}), tmp_path / "resumed")
    resumed = train_and_evaluate(helpers.tiny_resnet_config(**overrides), tmp_path / "resumed")
  assert full.step == resumed.step == 3 and np.isfinite(full.eval_metrics["loss"])
  helpers.assert_trees_equal(resumed.state, full.state)
  assert resumed.eval_metrics == full.eval_metrics


def test_the_flat_optimizer_layout_trains_as_the_per_leaf_one_and_resumes_bit_identically(tmp_path):
  """`optimizer.layout='flat'` (lbjax.optim.multi_tensor) over 8 devices: the same parameters as the
  per-leaf layout to float32 rounding, and its state of flat buffers checkpointed and resumed exactly."""
  overrides = {"optimizer.name": "lars", "lr.base": 1.0}
  per_leaf = train_and_evaluate(helpers.tiny_resnet_config(**overrides), tmp_path / "per_leaf")
  flat = {**overrides, "optimizer.layout": "flat"}
  full = train_and_evaluate(helpers.tiny_resnet_config(**flat), tmp_path / "full")
  helpers.assert_trees_close(full.state.params, per_leaf.state.params, rtol=2e-5, atol=2e-6)
  train_and_evaluate(helpers.tiny_resnet_config(num_epochs=0.5, **flat), tmp_path / "resumed")
  resumed = train_and_evaluate(helpers.tiny_resnet_config(**flat), tmp_path / "resumed")
  assert resumed.step == full.step == 8
  helpers.assert_trees_equal(resumed.state, full.state)


@pytest.mark.parametrize("overrides, eval_steps", [
    # Every step is exactly 0.1 epoch: 0.3 / 0.1 is 2.9999999999999996 in floating point, and the steps at
    # epochs 0.3 and 0.6 were not evaluated (nor checkpointed).
    ({"eval_every_epochs": 0.1, "data_options.num_train_examples": 320}, list(range(1, 11))),
    # A num_steps end on an evaluation boundary: evaluated once (the final evaluation), not twice.
    ({"eval_every_epochs": 0.5, "num_steps": 4}, [4]),
])
def test_every_evaluation_boundary_evaluates_once(tmp_path, overrides, eval_steps):
  train_and_evaluate(helpers.tiny_classifier_config(**overrides, log_every=100), tmp_path)
  assert [r["step"] for r in _records(tmp_path, "eval")] == eval_steps
