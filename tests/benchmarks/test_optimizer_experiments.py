"""The benchmark's experimental LARS designs compute what `lbjax.optim.lars` computes: their times
are only comparable if they do."""

import pytest

from benchmarks import optimizer as bench

# Kernels (ndim >= 2, rate and weight decay) and vectors (plain momentum SGD), sizes that are not
# multiples of the experiments' 1,024-value blocks and one that spans several blocks.
SHAPES = {"conv": (3, 3, 4, 8), "dense": (40, 70), "bias": (8,), "scale": (70,)}
WEIGHT_DECAY = 0.1  # large enough that the paper's and optax's denominators differ clearly


def _difference_from_lbjax_lars(name: str) -> float:
  optimizers = bench.optimizers(wd=WEIGHT_DECAY)
  grads = bench.random_tree(SHAPES, seed=1, scale=1e-2)
  update, lars = (bench.Update(optimizers[n], SHAPES, grads) for n in (name, "lbjax lars"))
  return bench.relative_difference(update.from_start(3), lars.from_start(3))


@pytest.mark.parametrize("name", [bench.FLAT_BUFFER, bench.ONE_REDUCTION, bench.ONE_VECTOR])
def test_experiment_equals_lbjax_lars_after_three_updates(name):
  assert _difference_from_lbjax_lars(name) < 1e-6  # float rounding: the order of summation


def test_the_comparison_tells_another_definition_apart():
  assert _difference_from_lbjax_lars("lbjax lars, optax denominator") > 1e-5  # 1.5e-4


def test_an_update_that_does_not_compile_is_reported_and_the_others_timed(monkeypatch):
  """A GPU session is short: a row its backend cannot compile must not cost the others."""
  def broken(params, state, grads):
    raise NotImplementedError("no kernel for this backend")

  monkeypatch.setattr(bench, "optimizers", lambda: {
      bench.SGD: bench.optax.sgd(0.1, momentum=0.9),
      "broken": bench.optax.GradientTransformation(lambda params: (), broken)})
  grads = bench.random_tree(SHAPES, seed=1, scale=1e-2)
  functions, failed = bench.compiled_updates([bench.SGD, "broken"], SHAPES, grads)
  assert list(functions) == [bench.SGD]
  assert failed == {"broken": "NotImplementedError: no kernel for this backend"}


def test_several_updates_per_call_are_the_same_updates_and_counted_per_update():
  """`--updates-per-call`: the loop runs the one-update program's updates; its figures are per update."""
  grads = bench.random_tree(SHAPES, seed=1, scale=1e-2)
  lars = bench.optimizers(wd=WEIGHT_DECAY)["lbjax lars"]
  one, three = bench.Update(lars, SHAPES, grads), bench.Update(lars, SHAPES, grads, updates_per_call=3)
  assert bench.relative_difference(three.from_start(1), one.from_start(3)) < 1e-6
  (kernels_one, _), (kernels_three, _) = bench.per_update_figures(one), bench.per_update_figures(three)
  assert kernels_one <= kernels_three <= kernels_one + 3  # the loop's control and copies (CPU: 2.7)


def test_a_traced_call_gives_the_device_time_per_update_and_the_kernels_that_take_it():
  """`--trace`: the busy time of the backend's kernels (on the CPU, XLA's thunks) over the call's updates."""
  grads = bench.random_tree(SHAPES, seed=1, scale=1e-2)
  update = bench.Update(bench.optimizers(wd=WEIGHT_DECAY)["lbjax lars"], SHAPES, grads, updates_per_call=2)
  busy_ms, lines = bench.traced(update)
  assert busy_ms > 0
  assert lines[0].startswith("cpu: 1 device(s)") and "over 2 step(s)" in lines[0]
  assert len(lines) > 2  # the header, then the kernels by time


def test_a_trace_that_fails_is_reported_not_raised(monkeypatch):
  """The timed table must survive a backend whose profiler cannot start (its rows read "not traced")."""
  def broken(directory):
    raise RuntimeError("no profiler here")

  monkeypatch.setattr(bench.jax.profiler, "start_trace", broken)
  grads = bench.random_tree(SHAPES, seed=1, scale=1e-2)
  busy_ms, lines = bench.traced(bench.Update(bench.optimizers()["lbjax lars"], SHAPES, grads))
  assert busy_ms is None and lines == ["the trace failed: RuntimeError: no profiler here"]


def test_the_notes_describe_the_rows_that_ran_and_the_cpu_bytes_only_on_a_cpu():
  gpu_rows = [bench.SGD, "optax.lars", "lbjax lars", bench.LARS_FLAT]
  gpu = bench.notes(gpu_rows, "gpu", 0.05, bench.PER_CALL[False])
  assert bench.ROW_NOTES["flat layout"] in gpu
  for key in (bench.ONE_VECTOR, bench.FLAT_BUFFER, "bfloat16", "fused layout"):
    assert bench.ROW_NOTES[key] not in gpu, key
  assert bench.CPU_BYTES_NOTES not in gpu
  cpu = bench.notes(list(bench.optimizers()), "cpu", 0.1, bench.PER_CALL[False])
  assert all(text in cpu for text in bench.ROW_NOTES.values()) and bench.CPU_BYTES_NOTES in cpu
