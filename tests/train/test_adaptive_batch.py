"""The batch from the gradient noise (lbjax.train.batch_policy, lbjax.schedules.adaptive_batch): the
formulas of McCandlish et al. 2018, AdaScale and Pollux, the controller's decisions in a run, exact
resume after SIGTERM, and the config's refusals."""

import json
import math
import os
import signal

import numpy as np
import pytest

from lbjax import diagnostics
from lbjax.schedules import adaptive_batch
from lbjax.train import batch_policy, train_and_evaluate
from lbjax.train import validation
from lbjax.train.errors import ConfigError
from tests.train import helpers


def _records(workdir, kind):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


@pytest.mark.parametrize("noise_scale", [0.0, 10.0, 300.0, 1e6])
@pytest.mark.parametrize("batch_size", [128, 512, 4096])
def test_adascale_gain_is_s_times_the_statistical_efficiency_and_lies_in_1_s(noise_scale, batch_size):
  """r = (sigma^2 + |G|^2)/(sigma^2/S + |G|^2) with sigma^2 = tr(Sigma)/B0 equals S * E(B)."""
  base, grad_norm_sq = 128, 0.25
  sigma_sq = noise_scale * grad_norm_sq / base  # tr(Sigma) = B_noise |G|^2
  scale = batch_size / base
  gain = (sigma_sq + grad_norm_sq) / (sigma_sq / scale + grad_norm_sq)
  assert adaptive_batch.adascale_gain(noise_scale, batch_size, base) == pytest.approx(gain)
  efficiency = adaptive_batch.statistical_efficiency(noise_scale, batch_size, base)
  assert gain == pytest.approx(scale * efficiency)
  assert 1.0 - 1e-12 <= gain <= scale + 1e-12


def test_statistical_efficiency_limits():
  """E(B0) = 1; E -> B0/B for B_noise << B (extra examples wasted); E -> 1 for B_noise >> B."""
  assert adaptive_batch.statistical_efficiency(50.0, 128, 128) == 1.0
  assert adaptive_batch.statistical_efficiency(0.0, 1024, 128) == pytest.approx(128 / 1024)
  assert adaptive_batch.statistical_efficiency(1e9, 1024, 128) == pytest.approx(1.0, rel=1e-6)
  assert math.isnan(adaptive_batch.statistical_efficiency(math.nan, 1024, 128))
  assert adaptive_batch.adascale_gain(math.nan, 1024, 128) == 1.0


@pytest.mark.parametrize("noise_scale, multiple, never_shrink, current, expected", [
    (1000.0, 2.0, True, 64, 1024),   # 2 x 1000 clamped to the maximum
    (290.0, 1.0, True, 64, 288),     # 290 / 8 = 36.25 micro-batches -> 36 x 8
    (290.0, 0.5, True, 64, 144),     # 145 / 8 = 18.1 -> 18 x 8
    (10.0, 1.0, True, 64, 64),       # below the current batch: never shrinks
    (10.0, 1.0, False, 64, 32),      # ... or, allowed to shrink, clamps to the minimum
    (math.nan, 1.0, False, 48, 48),  # undetermined: keeps the current batch
    (math.inf, 1.0, False, 48, 1024),  # all noise: the maximum
])
def test_noise_proportional_batch_size(noise_scale, multiple, never_shrink, current, expected):
  chosen = adaptive_batch.noise_proportional_batch_size(
      noise_scale, multiple=multiple, micro_batch_size=8, min_batch_size=32, max_batch_size=1024,
      current=current, never_shrink=never_shrink)
  assert chosen == expected and chosen % 8 == 0


def test_host_average_equals_the_device_ema_of_lbjax_diagnostics():
  rng = np.random.default_rng(0)
  estimates = rng.normal(1.0, 0.5, size=(7, 2))
  device = diagnostics.noise_scale_ema(0.8)
  state, host = device.init(), adaptive_batch.NoiseScaleAverage()
  for grad_norm_sq, trace_sigma in estimates:
    state = device.update(state, diagnostics.NoiseScaleEstimate(grad_norm_sq, trace_sigma))
    host = host.update(0.8, grad_norm_sq, trace_sigma)
  value = device.value(state)
  np.testing.assert_allclose(host.debiased(0.8), (value.grad_norm_sq, value.trace_sigma), rtol=1e-5)


def adaptive_config(**overrides):
  """An adaptive run on the tiny classifier: micro-batches of 8, from 16 up to 64, decisions every 2 steps."""
  fields = {"batch.policy": "adaptive", "batch.micro_batch_size": 8, "batch_size": 16, "batch.max_batch_size": 64,
            "batch.adapt_every": 2, "batch.ema_decay": 0.5, "scaling.base_batch_size": 16, "scaling.rule": "sqrt",
            "num_epochs": 2.0, "checkpoint_every_steps": 0}
  return helpers.tiny_classifier_config(**dict(fields, **overrides))


def adascale_config(**overrides):
  """The adaptive run with AdaScale's learning rate (constant base LR 0.05 at B0 = 16)."""
  return adaptive_config(**{"batch.learning_rate": "adascale", "scaling.rule": "none", **overrides})


def test_each_decision_is_the_policy_of_the_logged_noise_scale_and_compiles_nothing(tmp_path):
  result = train_and_evaluate(adaptive_config(), tmp_path)
  decisions = _records(tmp_path, "batch")
  assert [d["step"] for d in decisions] == list(range(2, result.step + 1, 2))
  current = 16
  for d in decisions:
    noise_scale = float(d["noise_scale"])
    assert d["next_batch_size"] == adaptive_batch.noise_proportional_batch_size(
        noise_scale, multiple=1.0, micro_batch_size=8, min_batch_size=16, max_batch_size=64, current=current,
        never_shrink=True)
    current = d["next_batch_size"]
    # sqrt rule at the batch in force: LR x sqrt(B / 16)
    assert d["learning_rate"] == pytest.approx(0.05 * math.sqrt(d["batch_size"] / 16), rel=1e-6)
    if not math.isnan(noise_scale):
      efficiency = adaptive_batch.statistical_efficiency(noise_scale, d["batch_size"], 16)
      assert d["statistical_efficiency"] == pytest.approx(efficiency)
      assert d["goodput"] == pytest.approx(d["examples_per_second"] * efficiency)
  sizes = {d["batch_size"] for d in decisions}
  assert len(sizes) >= 2, f"the batch never changed: {decisions}"
  assert result.compiled_batch_sizes == (16,)  # two programs compiled at the first step, never again


def schedule_config(**overrides):
  """The tiny classifier on a 2-size schedule (16, then 32) of micro-batches of 8, records every 2 steps."""
  fields = {"batch.micro_batch_size": 8, "batch_sizes": (16, 32), "batch_size_boundaries": (1.0,),
            "batch.adapt_every": 2, "batch.ema_decay": 0.5, "scaling.base_batch_size": 16, "num_epochs": 2.0,
            "checkpoint_every_steps": 0, "log_every": 1}
  return helpers.tiny_classifier_config(**dict(fields, **overrides))


class _DeviceScalar:
  """A stand-in for a step's device scalar that notes, when the host reads it, whether the host had
  moved past its step (`clock[0]` is the step whose `after_step` is running)."""

  def __init__(self, value, step, clock, early_reads):
    self.value, self.step, self.clock, self.early_reads = value, step, clock, early_reads

  def __array__(self, dtype=None, copy=None):
    del copy
    if self.clock[0] <= self.step:
      self.early_reads.append(self.step)
    return np.asarray(self.value, dtype)


@pytest.mark.parametrize("policy, waits", [("schedule", False), ("fixed", False), ("adaptive", True)])
def test_only_the_adaptive_policy_waits_for_the_step_just_dispatched(policy, waits):
  """`after_step(n)` of the fixed and schedule policies reads only results of steps before n, yet
  their records hold the averages of the estimates up to their own step; the adaptive policy must
  read step n's results to decide."""
  config = adaptive_config() if policy == "adaptive" else schedule_config(
      **({"batch.policy": "fixed", "batch_sizes": (), "batch_size_boundaries": ()} if policy == "fixed" else {}))
  resolved = validation.validate(config)
  policy_ = batch_policy.BatchPolicy(resolved.batch, resolved.learning_rate)
  rng = np.random.default_rng(0)
  estimates = rng.uniform(0.5, 2.0, size=(9, 2))
  clock, early_reads, examples = [0], [], 0
  for step, (grad_norm_sq, trace_sigma) in enumerate(estimates, start=1):
    size = policy_.batch_size(examples / 256)
    examples += size
    clock[0] = step
    scalar = lambda value: _DeviceScalar(value, step, clock, early_reads)
    policy_.after_step(step, size, (examples - size) / 256, examples / 256, {
        "noise_scale_grad_norm_sq": scalar(grad_norm_sq), "noise_scale_trace_sigma": scalar(trace_sigma),
        "learning_rate": scalar(0.05)})
  clock[0] = math.inf
  policy_.complete_records()
  assert bool(early_reads) == waits, early_reads
  assert [step for step, _ in policy_.records] == [2, 4, 6, 8]
  for step, record in policy_.records:
    average = adaptive_batch.NoiseScaleAverage()
    for grad_norm_sq, trace_sigma in estimates[:step]:
      average = average.update(0.5, grad_norm_sq, trace_sigma)
    assert record["noise_scale"] == average.noise_scale(0.5)


def test_a_schedule_runs_records_are_the_averages_up_to_their_step_and_none_is_lost(tmp_path):
  """In a real run (records completed a step late), the record of step n holds the averages of the
  estimates of steps 1..n (read from the per-step `train` records), and the last step's record is
  written at the end."""
  result = train_and_evaluate(schedule_config(), tmp_path)
  train = _records(tmp_path, "train")
  assert [r["step"] for r in train] == list(range(1, result.step + 1))
  decisions = _records(tmp_path, "batch")
  assert [d["step"] for d in decisions] == list(range(2, result.step + 1, 2)) and result.step % 2 == 0
  for d in decisions:
    average = adaptive_batch.NoiseScaleAverage()
    for r in train[:d["step"]]:
      average = average.update(0.5, r["noise_scale_grad_norm_sq"], r["noise_scale_trace_sigma"])
    assert (d["grad_norm_sq"], d["trace_sigma"]) == average.debiased(0.5)
    np.testing.assert_equal(float(d["noise_scale"]), average.noise_scale(0.5))  # nan while |G|^2 <= 0
    assert d["batch_size"] == (16 if d["epoch"] <= 1.0 else 32) and d["next_batch_size"] is None


@pytest.mark.parametrize("make_config, stop_after", [(adaptive_config, 7), (schedule_config, 8),
                                                     (adascale_config, 7)], ids=["adaptive", "schedule", "adascale"])
def test_sigterm_mid_run_resumes_with_the_same_decisions_and_final_parameters(tmp_path, monkeypatch, make_config,
                                                                               stop_after):
  """A real SIGTERM after step 7 of the adaptive runs (between decisions, so step 7's estimate is
  pending; AdaScale's progress tau mid-way), or after step 8 of the schedule run (a record step, whose
  record waits for step 9): the run saves and stops; resumed, it makes the decisions (records, tau),
  stops at the same step and reaches the parameters of the unbroken run."""
  unbroken = train_and_evaluate(make_config(), tmp_path / "unbroken")
  after_step = batch_policy.BatchPolicy.after_step

  def terminate_after(self, step, *args):
    after_step(self, step, *args)
    if step == stop_after:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(batch_policy.BatchPolicy, "after_step", terminate_after)
  preempted = train_and_evaluate(make_config(), tmp_path / "resumed")
  monkeypatch.undo()
  assert preempted.preempted and preempted.step == stop_after
  resumed = train_and_evaluate(make_config(), tmp_path / "resumed")
  assert resumed.step == unbroken.step
  decision = lambda r: (r["step"], r["batch_size"], r["next_batch_size"], r["noise_scale"], r["learning_rate"],
                        r["scale_invariant_epoch"])
  assert ([decision(r) for r in _records(tmp_path / "resumed", "batch")]
          == [decision(r) for r in _records(tmp_path / "unbroken", "batch")])
  helpers.assert_trees_equal(resumed.state, unbroken.state)


def test_adascale_counts_scale_invariant_epochs_and_stops_when_they_reach_num_epochs(tmp_path):
  """Each step's LR is r x the base LR and adds r x B0 examples' worth to tau (Johnson et al. 2020,
  Algorithm 1), r the gain in force; the run ends at the first step where tau >= num_epochs = 2,
  which takes more than 2 data epochs once the batch outgrows what it buys (r < S = B/B0)."""
  result = train_and_evaluate(adascale_config(**{"batch.adapt_every": 1}), tmp_path)
  decisions = _records(tmp_path, "batch")
  assert [d["step"] for d in decisions] == list(range(1, result.step + 1))
  gain, tau, epoch = 1.0, 0.0, 0.0
  for d in decisions:
    assert d["learning_rate"] == pytest.approx(0.05 * gain, rel=1e-6)
    tau += gain * 16 / d["batch_size"] * (d["epoch"] - epoch)
    assert d["scale_invariant_epoch"] == pytest.approx(tau, rel=1e-12)
    gain, epoch = adaptive_batch.adascale_gain(float(d["noise_scale"]), d["next_batch_size"], 16), d["epoch"]
  assert decisions[-2]["scale_invariant_epoch"] < 2.0 <= decisions[-1]["scale_invariant_epoch"]
  assert result.epoch == decisions[-1]["epoch"] > 2.0
  assert max(d["batch_size"] for d in decisions) > 16


@pytest.mark.parametrize("overrides, message", [
    ({"batch.policy": "grow"}, r"config.batch.policy='grow' is not one of fixed, schedule, adaptive"),
    ({"batch.policy": "adaptive"}, r"set config.batch.micro_batch_size > 0"),
    ({"batch.policy": "adaptive", "batch.micro_batch_size": 8}, r"config.batch.max_batch_size must be set"),
    ({"batch.policy": "adaptive", "batch.micro_batch_size": 32, "batch.max_batch_size": 64},
     r"must hold at least 2 micro-batches of 32"),
    ({"batch.policy": "adaptive", "batch.micro_batch_size": 8, "batch.max_batch_size": 60},
     r"config.batch.max_batch_size=60 is not a whole number of micro-batches"),
    ({"batch.policy": "adaptive", "batch.micro_batch_size": 8, "batch.max_batch_size": 64,
      "batch.learning_rate": "adascale", "scaling.rule": "linear"}, r"set config.scaling.rule='none'"),
    ({"batch.max_batch_size": 64}, r"only apply with config.batch.policy='adaptive'"),
    ({"batch.policy": "fixed", "batch_sizes": (16, 32), "batch_size_boundaries": (0.5,)},
     r"set config.batch.policy='schedule'"),
    ({"batch.micro_batch_size": 12}, r"batch size 32 is not a whole number of micro-batches"),
    ({"batch.micro_batch_size": 8, "max_device_batch": 8}, r"set config.max_device_batch=0"),
    ({"batch.adapt_every": 0}, r"config.batch.adapt_every must be an integer >= 1"),
    ({"batch.adapt_every": 1, "batch.ema_decay": 0.5},
     r"config.batch.adapt_every=1, config.batch.ema_decay=0.5 set how the gradient noise scale is averaged and "
     r"recorded \(`batch` records\), but no step of this run measures it"),
    ({"batch.ema_decay": 0.5, "max_device_batch": 32}, r"config.batch.ema_decay=0.5 set how the gradient noise"),
])
def test_bad_batch_configs_are_refused_before_compute(overrides, message):
  with pytest.raises(ConfigError, match=message):
    validation.validate(helpers.tiny_classifier_config(**overrides), data_parallel_size=1)


def test_the_noise_scale_settings_are_accepted_where_a_step_measures_it():
  """Micro-batches (the any-batch step) measure it, and so does accumulation: a device's share of the batch
  (32 examples over 1 device; 4 over 8) above max_device_batch=8."""
  noise = {"batch.adapt_every": 1, "batch.ema_decay": 0.5}
  validation.validate(helpers.tiny_classifier_config(**noise, **{"batch.micro_batch_size": 8}), data_parallel_size=1)
  accumulating = helpers.tiny_classifier_config(**noise, max_device_batch=8)
  validation.validate(accumulating, data_parallel_size=1)
  with pytest.raises(ConfigError, match=r"config.batch.adapt_every=1, config.batch.ema_decay=0.5 set how"):
    validation.validate(accumulating, data_parallel_size=8)


@pytest.mark.parametrize("run, policy, sizes", [
    ("baseline", "fixed", (128,)), ("legw", "fixed", (1024,)), ("grow_batch", "schedule", (128, 640, 3200, 16000)),
    ("adaptive", "adaptive", (128,)), ("adascale", "adaptive", (128,))])
def test_the_experiment_config_sets_each_runs_policy_and_validates(run, policy, sizes):
  from lbjax import config_files  # pylint: disable=g-import-not-at-top
  config = config_files.load(f"adaptive_batch_mnist:run={run},epochs=2").config
  validation.validate(config, data_parallel_size=1)
  assert config.batch.policy == policy and config.batch.micro_batch_size == 64
  assert (tuple(config.batch_sizes) or (config.batch_size,)) == sizes
  assert (config.batch.learning_rate == "adascale") == (run == "adascale")
