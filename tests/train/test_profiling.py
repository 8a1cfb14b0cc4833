"""`config.profile`: a `jax.profiler` trace of exactly the asked steps, annotated as XProf's steps, the
device's busy time read back from it, the run unchanged; and the trace reader's rules on device planes."""

import json
import types

import jax
from jax.profiler import ProfileData
import pytest

from lbjax.train import ConfigError, train_and_evaluate
from lbjax.train import profiling
from lbjax.train import trace_analysis
from lbjax.train.metrics import ProgressLine
from tests.train import helpers


def _records(workdir, kind):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if r["kind"] == kind]


def _step_annotations(workdir):
  """The `step_num`s of the trace's "train" annotations, in order."""
  profile = ProfileData.from_file(str(trace_analysis.latest_trace_file(workdir / "profile")))
  host = next(plane for plane in profile.planes if plane.name == trace_analysis.HOST_PLANE)
  numbers = [dict(event.stats)["step_num"] for line in host.lines for event in line.events if event.name == "train"]
  return sorted(int(n) for n in numbers)


def test_a_traced_run_records_its_steps_and_trains_as_an_untraced_one(tmp_path):
  plain = train_and_evaluate(helpers.tiny_classifier_config(), tmp_path / "plain")
  traced = train_and_evaluate(helpers.tiny_classifier_config(**{"profile.num_steps": 3, "profile.skip_steps": 2}),
                              tmp_path / "traced")
  helpers.assert_trees_equal(plain.state.params, traced.state.params)
  assert plain.eval_metrics == traced.eval_metrics
  [record] = _records(tmp_path / "traced", "profile")
  assert (record["step"], record["first_step"], record["steps"]) == (5, 3, 3)
  assert record["directory"] == str(tmp_path / "traced" / "profile")
  assert record["trace"] == str(trace_analysis.latest_trace_file(tmp_path / "traced" / "profile"))
  assert record["device_kind"] == "cpu" and record["kernels_per_step"] > 0
  assert 0 < record["device_busy_ms_per_step"] <= 1.01 * record["wall_ms_per_step"]
  assert record["device_busy_fraction"] == pytest.approx(
      record["device_busy_ms_per_step"] / record["wall_ms_per_step"])
  assert _step_annotations(tmp_path / "traced") == [3, 4, 5]  # exactly the traced steps, XProf's steps


def test_the_trace_follows_device_calls_and_each_session(tmp_path):
  """With 2 steps per call the trace starts and stops where calls end, one annotation per call; a resumed
  session skips its own first steps before its trace."""
  config = lambda **o: helpers.tiny_classifier_config(
      steps_per_call=2, log_every=2, checkpoint_every_steps=4,
      **{"profile.num_steps": 4, "profile.skip_steps": 2}, **o)
  train_and_evaluate(config(num_steps=4), tmp_path)
  train_and_evaluate(config(), tmp_path)  # resumes at step 4, traces steps 7-10 of 8: stops at the end
  first, second = _records(tmp_path, "profile")
  assert (first["first_step"], first["steps"]) == (3, 2)  # the first session ended after step 4
  assert (second["first_step"], second["steps"]) == (7, 2)
  assert _step_annotations(tmp_path) == [7]


def test_no_skipped_steps_traces_from_the_first_step(tmp_path):
  train_and_evaluate(helpers.tiny_classifier_config(**{"profile.num_steps": 2, "profile.skip_steps": 0}), tmp_path)
  [record] = _records(tmp_path, "profile")
  assert (record["first_step"], record["steps"]) == (1, 2)
  assert _step_annotations(tmp_path) == [1, 2]


def test_a_trace_already_running_is_a_warning_and_the_run_goes_on(tmp_path):
  jax.profiler.start_trace(str(tmp_path / "outside"))
  try:
    result = train_and_evaluate(helpers.tiny_classifier_config(**{"profile.num_steps": 2, "profile.skip_steps": 1}),
                                tmp_path / "run")
  finally:
    jax.profiler.stop_trace()
  assert result.step == 8
  [record] = _records(tmp_path / "run", "profile")
  assert "could not start" in record["error"] and "jax.profiler.stop_trace()" in record["error"]


@pytest.mark.parametrize("skip_steps, words", [(8, "ended at step 8, where its trace started"),
                                               (9, "ended after step 8, before step 10")])
def test_a_session_that_ends_before_its_trace_says_so(tmp_path, skip_steps, words):
  train_and_evaluate(helpers.tiny_classifier_config(**{"profile.num_steps": 2, "profile.skip_steps": skip_steps}),
                     tmp_path)
  [record] = _records(tmp_path, "profile")
  assert words in record["error"] and "Lower profile.skip_steps or train longer." in record["error"]


@pytest.mark.parametrize("field, value, message", [
    ("num_steps", -1, "config.profile.num_steps must be an integer >= 0, got -1 (0 = no trace)."),
    ("skip_steps", True, "config.profile.skip_steps must be an integer >= 0, got True"),
    ("python_calls", "yes", "config.profile.python_calls must be True or False, got 'yes'."),
    ("perfetto_trace", 1, "config.profile.perfetto_trace must be True or False, got 1."),
])
def test_bad_profile_fields_are_refused_before_any_compute(tmp_path, field, value, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
    train_and_evaluate(helpers.tiny_classifier_config(**{f"profile.{field}": value}), tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()


def test_the_profilers_own_time_is_kept_out_of_the_examples_per_second():
  """A window closed at t=10 and shown later keeps its rate; the 5 s of writing the trace after it closed
  (t=11 to 16) come out of the next window, not the one shown."""
  progress = ProgressLine(num_epochs=1.0, enabled=False)
  progress._last = (0.0, 0, 0.0, 0)
  progress.exclude(11.0, 16.0)
  assert progress.show(10, 0.1, 1000, 1.0, now=10.0) == pytest.approx(100.0)
  assert progress.show(20, 0.2, 2000, 1.0, now=25.0) == pytest.approx(1000 / 10.0)
  assert progress.show(30, 0.3, 3000, 1.0, now=35.0) == pytest.approx(1000 / 10.0)  # nothing left to exclude


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_a_window_that_closes_on_a_compiling_step_keeps_a_true_rate(tmp_path, steps_per_call):
  """The compile record started a new window after the window of its step had closed but before it was shown:
  that window was shown as lasting 1e-9 s, B * 1e9 examples/s (and an ETA of 0)."""
  log_every = 1 if steps_per_call == 1 else 4  # the compiling step or call ends a window
  train_and_evaluate(helpers.tiny_classifier_config(num_steps=8, log_every=log_every, steps_per_call=steps_per_call),
                     tmp_path)
  rates = [r["examples_per_second"] for r in _records(tmp_path, "train")]
  assert len(rates) == 8 // log_every and all(0 < rate < 1e9 for rate in rates)


def test_a_trace_that_cannot_be_read_back_says_why_and_the_run_goes_on(tmp_path, monkeypatch):
  def unreadable(path, platform):
    raise ValueError("truncated")
  monkeypatch.setattr(trace_analysis, "read_device_busy", unreadable)
  train_and_evaluate(helpers.tiny_classifier_config(**{"profile.num_steps": 2, "profile.skip_steps": 2}), tmp_path)
  [record] = _records(tmp_path, "profile")
  assert record["steps"] == 2 and record["device_time"] == "not read: ValueError: truncated"
  assert "device_busy_fraction" not in record


def test_each_process_of_several_traces_into_its_own_folder(tmp_path):
  assert profiling.trace_directory(tmp_path, 0, 1) == tmp_path / "profile"
  assert profiling.trace_directory(tmp_path, 1, 2) == tmp_path / "profile" / "process_1"


def test_the_summary_names_the_traced_steps():
  request = profiling.TraceRequest(num_steps=5, skip_steps=10, python_calls=True, perfetto_trace=False)
  assert request.describe() == "5 steps traced after the first 10 of each session, Python calls included"
  assert profiling.TraceRequest(0, 10, False, False).describe() == "off"


def test_union_of_intervals():
  assert trace_analysis.union_seconds([]) == 0
  # [0, 10) and [5, 20) overlap, [8, 9) nests, [30, 31) is apart: 20 + 1 ns
  assert trace_analysis.union_seconds([(5, 15), (0, 10), (8, 1), (30, 1)]) == pytest.approx(21e-9)


def _plane(name, lines):
  event = lambda start, duration, **stats: types.SimpleNamespace(
      name="e", start_ns=start, duration_ns=duration, stats=list(stats.items()))
  return types.SimpleNamespace(name=name, lines=[
      types.SimpleNamespace(name=line, events=[event(*interval, **stats) for *interval, stats in events])
      for line, events in lines.items()])


def test_device_time_counts_kernels_not_the_lines_derived_from_them():
  """A GPU's streams count, its `XLA Modules` and `Steps` lines (spanning the gaps) do not; a TPU's `XLA Ops`
  line counts alone; the mean over devices; the CPU backend's thunks are the host events with an `hlo_op`."""
  gpu = lambda n, kernels: _plane(f"/device:GPU:{n}", {
      "Stream #1": kernels, "Stream #2": [(100, 50, {})],
      "XLA Modules": [(0, 1000, {})], "Steps": [(0, 1000, {})]})
  busy = trace_analysis.device_busy(types.SimpleNamespace(planes=[
      _plane("/host:CPU", {"python": [(0, 1000, {})], "tf_XLAExecute/1": [(0, 1000, {"hlo_op": "launch"})]}),
      gpu(0, [(0, 100, {}), (120, 80, {})]),  # with stream 2's [100, 150): [0, 200)
      gpu(1, [(0, 300, {})])]), "gpu")  # [0, 300)
  assert (busy.device_kind, busy.devices, busy.kernels) == ("gpu", 2, 5)
  assert busy.busy_seconds == pytest.approx((200e-9 + 300e-9) / 2)

  totals = trace_analysis.kernel_totals(types.SimpleNamespace(planes=[gpu(0, [(0, 100, {}), (120, 80, {})])]), "gpu")
  assert totals == [("e", 3, pytest.approx(230e-9))]  # every kernel named "e": 100 + 80 + stream 2's 50 ns

  tpu = trace_analysis.device_busy(types.SimpleNamespace(planes=[_plane("/device:TPU:0", {
      "XLA Ops": [(0, 10, {})], "XLA Modules": [(0, 100, {})], "Framework Ops": [(0, 100, {})]})]), "tpu")
  assert (tpu.device_kind, tpu.busy_seconds, tpu.kernels) == ("tpu", pytest.approx(10e-9), 1)

  cpu = trace_analysis.device_busy(types.SimpleNamespace(planes=[_plane("/host:CPU", {
      "python": [(0, 1000, {})], "tf_XLAExecute/1": [(10, 20, {"hlo_op": "fusion"}), (40, 5, {})]})]), "cpu")
  assert (cpu.device_kind, cpu.busy_seconds, cpu.kernels) == ("cpu", pytest.approx(20e-9), 1)

  assert trace_analysis.device_busy(types.SimpleNamespace(planes=[_plane("/host:CPU", {"python": []})]), "cpu") is None
  # a GPU trace without CUPTI's kernels: the host's thunk launches are not the device's time
  launches_only = types.SimpleNamespace(planes=[_plane("/host:CPU", {"t": [(0, 10, {"hlo_op": "fusion"})]})])
  assert trace_analysis.device_busy(launches_only, "gpu") is None
