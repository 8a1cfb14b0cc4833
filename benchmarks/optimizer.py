"""Speed of one optimizer update (update + apply_updates, jitted, donated buffers) against memory.

Compares lbjax's layer-wise optimizers with optax's and with plain momentum SGD on the real ResNet-50
parameter tree (25.6M parameters, 161 leaves) and the PTB LSTM tree (4.65M parameters, 7 leaves),
checks that lbjax LARS with the optax denominator gives optax.lars's numbers, and writes the table
into benchmarks/README.md.

    python -m benchmarks.optimizer [--rounds 61] [--seconds-per-round 0.05] [--max-spread 0.1]
        [--trees resnet50,ptb_lstm] [--optimizers 'NAME;...'] [--updates-per-call 1] [--trace] [--no-readme]
    python -m benchmarks.optimizer --collectives [--optimizers 'NAME;...'] [--no-readme]
    python -m benchmarks.optimizer --kernels-for h100 [--trees ...] [--optimizers 'NAME;...'] [--no-readme]

All optimizers of a tree and a STREAM-like scale (`a = s * a`, donated, over as many float32 values
as the tree has parameters: one read and one write of every value) run in interleaved rounds in one
process. Each row gives the median time per update over rounds with its interquartile range, the
per-round ratio to momentum SGD (median [quartiles]), XLA's count of the bytes the update accesses
(`compiled.cost_analysis()`) and the rate at which it moves them, as a fraction of the scale's
measured bandwidth. The run exits with status 3 (README untouched) if the 95% confidence interval of
a ratio's median is wider than --max-spread of it. `--updates-per-call K` runs K updates per jitted call
(`lax.fori_loop`), as a train step runs its update, so that the host's dispatch of a call's hundreds of
arrays is spread over K; `--trace` then traces one call of each row with `jax.profiler` and adds the
device's busy time per update (its kernels' own time) and each row's kernels by device time.

`--collectives` times nothing: it compiles each update over 8 CPU devices with the ResNet-50 tree
sharded FSDP-style (every leaf split along its largest axis divisible by 8) and counts the
collectives of the optimised HLO: what a design adds in communication when parameters are sharded
under `jit`.

`--kernels-for h100` (or h200) times nothing either: it compiles each update for that GPU on this
machine, without one (`lbjax.train.gpu_targets`: JAX's CUDA plugin, deviceless), and counts the
kernels of XLA:GPU's optimised HLO, the figure a lent GPU's `kernels` column gives.
"""

import argparse
import dataclasses
import math
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.profiler import ProfileData

from benchmarks import report
from lbjax import optim
from lbjax.optim.lars import lars_rate
from lbjax.optim import fused
from lbjax.optim import layerwise
from lbjax.train import gpu_targets
from lbjax.train.errors import ConfigError
from lbjax.train import hlo_analysis
from lbjax.train import trace_analysis

SGD = "momentum SGD (optax.sgd)"
SGD_FUSED = "momentum SGD (lbjax momentum), fused layout"
STREAM = "STREAM scale a = s * a"
ONE_REDUCTION = "lars, both sums in one reduction (experiment)"
FLAT_BUFFER = "lars, norms from one flat buffer (experiment)"
ONE_VECTOR = "lars, one rate vector (the design of 2026-11-26, experiment)"
LARS_FLAT = "lbjax lars, flat layout"
LAMB_FLAT = "lbjax lamb (all leaves), flat layout"
LARS_FUSED = "lbjax lars, fused layout"
LAMB_FUSED = "lbjax lamb (all leaves), fused layout"
PERCENT_DELTA_FUSED = "lbjax percent_delta, fused layout"


def resnet50_shapes() -> dict[str, tuple[int, ...]]:
  """The parameter shapes of ResNet-50 v1 (flax layout: HWIO kernels, BN scale/bias, no conv bias)."""
  shapes = {"stem/conv/kernel": (7, 7, 3, 64), "stem/bn/scale": (64,), "stem/bn/bias": (64,)}
  in_features = 64
  for stage, (blocks, features) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
    for block in range(blocks):
      name = f"stage{stage + 1}/block{block + 1}"
      convs = [(1, 1, in_features, features), (3, 3, features, features),
               (1, 1, features, 4 * features)]
      if block == 0:
        convs.append((1, 1, in_features, 4 * features))
      for i, kernel in enumerate(convs):
        label = "proj" if i == 3 else f"conv{i + 1}"
        shapes[f"{name}/{label}/kernel"] = kernel
        shapes[f"{name}/{label}_bn/scale"] = (kernel[-1],)
        shapes[f"{name}/{label}_bn/bias"] = (kernel[-1],)
      in_features = 4 * features
  shapes["head/kernel"] = (2048, 1000)
  shapes["head/bias"] = (1000,)
  return shapes


def ptb_lstm_shapes() -> dict[str, tuple[int, ...]]:
  """The parameter shapes of the 2x200 PTB LSTM (papers/001): embedding, 2 cells, softmax."""
  return {
      "embedding": (10000, 200),
      "lstm1/kernel": (400, 800), "lstm1/bias": (800,),
      "lstm2/kernel": (400, 800), "lstm2/bias": (800,),
      "softmax/kernel": (200, 10000), "softmax/bias": (10000,),
  }


TREES = {"resnet50": ("ResNet-50", resnet50_shapes), "ptb_lstm": ("PTB LSTM", ptb_lstm_shapes)}


def random_tree(shapes, seed, scale):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray((scale * rng.standard_normal(s)).astype(np.float32))
          for k, s in shapes.items()}


def kernels(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def everything(params):
  return jax.tree.map(lambda _: True, params)


def lars_one_reduction(lr, wd, trust_coefficient=1e-3):
  """An experiment, not in the library: lbjax LARS with ||w||^2 and ||g||^2 of each kernel from one
  variadic `lax.reduce` over (w * w, g * g), so that one kernel reads w and g once for both sums
  (leaves without stacked layers only). Same numbers as `lbjax lars` up to the order of summation."""
  paper = lars_rate(trust_coefficient)

  def sums(w, g, weight_decay, layer):
    del weight_decay, layer  # the whole leaf is one layer here
    return jax.lax.reduce((w * w, g * g), (jnp.float32(0), jnp.float32(0)),
                          lambda a, b: (a[0] + b[0], a[1] + b[1]), tuple(range(w.ndim)))

  rate = layerwise.SummedRate(sums, paper.rate)
  return layerwise.layerwise_sgd(layerwise.scale_by_layerwise_rate(rate, weight_decay=wd), lr, 0.9, False)


def lars_one_vector(lr, wd):
  """The design of 2026-11-26 to 11-30, as an experiment: lbjax LARS with every layer's rate computed as one
  vector from the stacked sums of all layers (`SummedRate.leaf_local` off), so that every leaf's update
  waits for all the reductions. Same numbers as `lbjax lars`."""
  rate = dataclasses.replace(lars_rate(), leaf_local=False)
  return layerwise.layerwise_sgd(layerwise.scale_by_layerwise_rate(rate, weight_decay=wd), lr, 0.9, False)


def lars_flat_buffer(lr, wd, trust_coefficient=1e-3, block=1024):
  """An experiment, not in the library: lbjax LARS with the norms taken from one flat buffer of all
  kernels (each padded to whole blocks of `block` values, so that every block belongs to one layer):
  one reduction per buffer gives the block sums, `segment_sum` the layer sums, and every layer's
  rate is one vector, as a multi-tensor LARS on a GPU would compute them. The update is lbjax's, leaf
  by leaf. Same numbers as `lbjax lars` up to the order of summation."""
  paper = lars_rate(trust_coefficient)

  def flat(tree, keys):
    parts = [jnp.pad(tree[k].ravel(), (0, -tree[k].size % block)) for k in keys]
    return jnp.concatenate(parts).reshape(-1, block)

  def update(updates, state, params=None):
    keys = [k for k in params if params[k].ndim >= 2]
    segments = np.repeat(np.arange(len(keys)), [-(-params[k].size // block) for k in keys])
    block_sums = [jnp.sum(x * x, axis=1) for x in (flat(params, keys), flat(updates, keys))]
    layer_sums = [jax.ops.segment_sum(b, segments, len(keys), indices_are_sorted=True) for b in block_sums]
    rates = paper.rate(tuple(layer_sums), wd)
    scaled = dict(updates)
    for i, k in enumerate(keys):
      scaled[k] = rates[i] * updates[k] + (rates[i] * wd) * params[k]
    return scaled, state

  scaling = optax.GradientTransformation(lambda params: optax.EmptyState(), update)
  return layerwise.layerwise_sgd(scaling, lr, 0.9, False)


def optimizers(lr=0.1, wd=1e-4):
  """name -> optax.GradientTransformation; LARS variants select the kernels (ndim >= 2)."""
  return {
      SGD: optax.sgd(lr, momentum=0.9),
      SGD_FUSED: optim.momentum(lr, momentum=0.9, layout="fused"),
      "optax.lars": optax.lars(lr, weight_decay=wd, weight_decay_mask=kernels,
                               trust_ratio_mask=kernels),
      "lbjax lars": optim.lars(lr, weight_decay=wd),
      "lbjax lars, bfloat16 momentum": optim.lars(lr, weight_decay=wd, accumulator_dtype="bfloat16"),
      "lbjax lars, optax denominator": optim.lars(lr, weight_decay=wd, denominator="optax"),
      ONE_REDUCTION: lars_one_reduction(lr, wd),
      FLAT_BUFFER: lars_flat_buffer(lr, wd),
      ONE_VECTOR: lars_one_vector(lr, wd),
      LARS_FLAT: optim.lars(lr, weight_decay=wd, layout="flat"),
      LARS_FUSED: optim.lars(lr, weight_decay=wd, layout="fused"),
      "optax.lamb": optax.lamb(lr, weight_decay=wd),
      "lbjax lamb (all leaves)": optim.lamb(lr, weight_decay=wd, mask=everything),
      "lbjax lamb (all leaves), bfloat16 moments": optim.lamb(
          lr, weight_decay=wd, mask=everything, mu_dtype="bfloat16", nu_dtype="bfloat16"),
      LAMB_FLAT: optim.lamb(lr, weight_decay=wd, mask=everything, layout="flat"),
      LAMB_FUSED: optim.lamb(lr, weight_decay=wd, mask=everything, layout="fused"),
      "lbjax percent_delta": optim.percent_delta(lr, weight_decay=wd),
      "lbjax percent_delta, flat layout": optim.percent_delta(lr, weight_decay=wd, layout="flat"),
      PERCENT_DELTA_FUSED: optim.percent_delta(lr, weight_decay=wd, layout="fused"),
      "lbjax mclr": optim.mclr(lr, weight_decay=wd),
  }


# The fused layout's updates are added by its own multi-tensor kernel (`lbjax.optim.fused.apply_updates`).
APPLY_UPDATES = {name: fused.apply_updates for name in (SGD_FUSED, LARS_FUSED, LAMB_FUSED, PERCENT_DELTA_FUSED)}


def make_step(opt, apply_updates=optax.apply_updates, updates_per_call=1):
  """The jitted, donating update (`opt.update` and `apply_updates`); `updates_per_call` > 1 runs that many in
  one call (`lax.fori_loop`, as a train step runs its update: launched by the device, not dispatched by the
  host one call at a time)."""
  def update(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return apply_updates(params, updates), state

  def step(params, state, grads):
    if updates_per_call == 1:
      return update(params, state, grads)
    return jax.lax.fori_loop(0, updates_per_call, lambda _, carry: update(*carry, grads), (params, state))

  return jax.jit(step, donate_argnums=(0, 1))


class Update:
  """One optimizer's jitted, donating update on its own copy of the parameters, called repeatedly
  (`updates_per_call` updates per call); `compile_seconds`: how long XLA took to compile it."""

  def __init__(self, opt, shapes, grads, apply_updates=optax.apply_updates, updates_per_call=1):
    self.opt, self.shapes, self.grads, self.updates_per_call = opt, shapes, grads, updates_per_call
    self.params = random_tree(shapes, seed=0, scale=0.05)
    self.state = opt.init(self.params)
    self.state_bytes_per_parameter = (sum(x.nbytes for x in jax.tree.leaves(self.state)) /
                                      sum(p.size for p in jax.tree.leaves(self.params)))
    lowered = make_step(opt, apply_updates, updates_per_call).lower(self.params, self.state, grads)
    start = time.perf_counter()
    self.compiled = lowered.compile()
    self.compile_seconds = time.perf_counter() - start

  def __call__(self):
    self.params, self.state = self.compiled(self.params, self.state, self.grads)
    return self.params

  def from_start(self, calls):
    """The parameters after `calls` calls from the first parameters and state (the timed copy untouched)."""
    params = random_tree(self.shapes, seed=0, scale=0.05)
    state = self.opt.init(params)
    for _ in range(calls):
      params, state = self.compiled(params, state, self.grads)
    return params


class StreamScale:
  """`a = s * a` over `size` float32 values, donated: reads and writes each value once."""

  def __init__(self, size: int):
    self.array = jnp.ones((size,), jnp.float32)
    self.factor = jnp.float32(1.0)  # an argument, so XLA cannot fold the multiply away
    self.compiled = jax.jit(lambda a, s: s * a, donate_argnums=(0,)).lower(
        self.array, self.factor).compile()
    self.bytes = 2 * 4 * size

  def __call__(self):
    self.array = self.compiled(self.array, self.factor)
    return self.array


def bytes_accessed(compiled) -> float:
  """XLA's count of the bytes one call of `compiled` reads and writes."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, list):  # older jax: one dict per computation
    analysis = analysis[0]
  return float(analysis.get("bytes accessed", float("nan")))


def compiled_updates(names, shapes, grads, updates_per_call=1):
  """`Update`s of the optimizers `names`, and the error of each that failed to compile: a row that a backend
  cannot compile (a GPU session is short) is reported, the others are timed."""
  all_optimizers = optimizers()
  functions, failed = {}, {}
  for name in names:
    try:
      functions[name] = Update(all_optimizers[name], shapes, grads, APPLY_UPDATES.get(name, optax.apply_updates),
                               updates_per_call)
      print(f"{name}: compiled in {functions[name].compile_seconds:.1f} s", flush=True)
    except Exception as error:  # pylint: disable=broad-exception-caught
      if name == SGD:  # every ratio is to it
        raise
      failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
      print(f"{name}: did not compile ({failed[name]})", flush=True)
  return functions, failed


def per_update_figures(update: Update) -> tuple[float, float]:
  """The kernels one update launches and the bytes they move: `hlo_analysis.kernel_count` and XLA's
  `cost_analysis()` of a one-update call; with several updates per call, `hlo_analysis`'s counts of the
  whole call (every iteration of the loop, its control included) over their number."""
  if update.updates_per_call == 1:
    return hlo_analysis.kernel_count(update.compiled), bytes_accessed(update.compiled)
  figures = hlo_analysis.analyze(update.compiled.as_text())
  return figures.kernels / update.updates_per_call, figures.kernel_bytes / update.updates_per_call


def traced(update: Update) -> tuple[float | None, list[str]]:
  """One call of `update` traced with `jax.profiler`: the device's busy milliseconds per update (the union of
  its kernels' intervals, without the host's dispatch or the gaps between launches;
  `lbjax.train.trace_analysis`; None where the trace holds no kernels, a GPU without NVIDIA's CUPTI) and the
  call's kernels by device time. A trace that fails is reported in the lines (the timed table still stands)."""
  with tempfile.TemporaryDirectory() as directory:
    try:
      jax.profiler.start_trace(directory)
      try:
        jax.block_until_ready(update())
      finally:
        jax.profiler.stop_trace()
      profile = ProfileData.from_file(str(trace_analysis.latest_trace_file(directory)))
    except Exception as error:  # pylint: disable=broad-exception-caught  (a profiler the backend lacks)
      return None, [f"the trace failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"]
  platform = jax.default_backend()
  busy = trace_analysis.device_busy(profile, platform)
  lines = trace_analysis.summary_lines(profile, platform, steps=update.updates_per_call, top=6)
  return (None if busy is None else 1e3 * busy.busy_seconds / update.updates_per_call), lines


def benchmark(shapes, names, rounds, seconds_per_round, check, tree_label, updates_per_call=1, trace=False):
  """Rows of the table for one tree: timings, ratios, bytes (and with `trace` the traced device time); the
  `Update`s (for `numerics`); the traced kernels per row (with `trace`); and the optimizers that did not
  compile."""
  grads = random_tree(shapes, seed=1, scale=1e-2)
  functions, failed = compiled_updates(names, shapes, grads, updates_per_call)
  updates = dict(functions)
  names = [name for name in names if name in functions]
  size = sum(int(np.prod(s)) for s in shapes.values())
  functions[STREAM] = StreamScale(size)
  repeats = {name: report.repeats_for(f, seconds_per_round) for name, f in functions.items()}
  times = report.round_seconds(functions, rounds=rounds, repeats=repeats)
  times.update({name: [t / updates_per_call for t in times[name]] for name in names})
  stream_bytes_per_s = functions[STREAM].bytes / report.Spread.of(times[STREAM]).median
  rows, kernel_lines = [], {}
  for name in names:
    spread = report.Spread.of(times[name])
    ratio = report.paired_ratios(times, name, SGD)
    if name != SGD:
      check.record(f"{tree_label}: {name} / {SGD}", ratio)
    kernel_count, moved = per_update_figures(functions[name])
    rate = moved / spread.median
    rows.append([tree_label, name, spread.format(1e3), ratio.format(digits=2),
                 f"{moved / 2**20:,.0f}", f"{rate / 1e9:.1f}",
                 f"{100 * rate / stream_bytes_per_s:.0f}%", f"{kernel_count:g}",
                 f"{functions[name].state_bytes_per_parameter:.2f}", f"{functions[name].compile_seconds:.1f}"])
    if trace:
      busy_ms, kernel_lines[name] = traced(functions[name])
      rows[-1].append("not traced" if busy_ms is None else f"{busy_ms:.3f}")
  stream = report.Spread.of(times[STREAM])
  rows.append([tree_label, STREAM, stream.format(1e3), "", f"{functions[STREAM].bytes / 2**20:,.0f}",
               f"{stream_bytes_per_s / 1e9:.1f}", "100%", hlo_analysis.kernel_count(functions[STREAM].compiled),
               "", ""] + [""] * trace)
  ratios = {}
  for name, baseline in (("lbjax lars", SGD), ("lbjax lars", "optax.lars"),
                         ("lbjax lamb (all leaves)", "optax.lamb"), (ONE_REDUCTION, "lbjax lars"),
                         (FLAT_BUFFER, "lbjax lars"), ("lbjax lars", ONE_VECTOR),
                         (LARS_FLAT, "optax.lars"), (LARS_FLAT, "lbjax lars"),
                         (LAMB_FLAT, "optax.lamb"), (LAMB_FLAT, "lbjax lamb (all leaves)"),
                         (LARS_FUSED, "optax.lars"), (LARS_FUSED, LARS_FLAT),
                         (LAMB_FUSED, "optax.lamb"), (LAMB_FUSED, LAMB_FLAT)):
    if name in times and baseline in times:
      ratios[(name, baseline)] = report.paired_ratios(times, name, baseline)
      if SGD not in (name, baseline):
        check.record(f"{tree_label}: {name} / {baseline}", ratios[(name, baseline)])
  return rows, ratios, updates, kernel_lines, failed


def relative_difference(a, b) -> float:
  """Largest |a - b| / max|b| over the leaves of two parameter trees."""
  return max(float(jnp.max(jnp.abs(x - y)) / jnp.max(jnp.abs(y)))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def numerics(updates: dict[str, Update], steps: int) -> dict[str, float]:
  """Comparable pairs among the compiled `updates`: lbjax vs optax with the same definition, after about
  `steps` updates from the same start (whole calls of the timed programs: none compiled again)."""
  pairs = (("lbjax lars, optax denominator", "optax.lars"), ("lbjax lamb (all leaves)", "optax.lamb"),
           (ONE_REDUCTION, "lbjax lars"), (FLAT_BUFFER, "lbjax lars"), (ONE_VECTOR, "lbjax lars"),
           (LARS_FLAT, "lbjax lars"), (LAMB_FLAT, "lbjax lamb (all leaves)"), (LARS_FUSED, "lbjax lars"),
           (SGD_FUSED, SGD), (LAMB_FUSED, "lbjax lamb (all leaves)"), (PERCENT_DELTA_FUSED, "lbjax percent_delta"),
           ("lbjax lars, bfloat16 momentum", "lbjax lars"),
           ("lbjax lamb (all leaves), bfloat16 moments", "lbjax lamb (all leaves)"))
  calls = lambda update: math.ceil(steps / update.updates_per_call)
  return {f"{a} vs {b}": relative_difference(updates[a].from_start(calls(updates[a])),
                                             updates[b].from_start(calls(updates[b])))
          for a, b in pairs if a in updates and b in updates}


TIMING_NOTES = """\
Time per update: median over interleaved rounds [first and third quartiles], in ms; one round runs
each variant back to back for ~{seconds:g} s. {per_call} x SGD: the per-round ratio to momentum SGD, median
[quartiles]. Bytes: XLA's `cost_analysis()` of the compiled update (what its fusions read and
write); GB/s: those bytes over the median time; the last column compares that with the STREAM-like
scale measured in the same rounds (the memory bandwidth this process got under the same load);
above 100%, part of what XLA counts came from cache. Kernels: how
many kernels one update (with its apply_updates) launches (`hlo_analysis.kernel_count`: fusions,
reductions, copies, library calls in the optimised HLO of the backend that ran it, loop bodies once
per iteration; a GPU merges some by multi-output and horizontal fusion). State bytes / parameter: the optimizer
state's bytes over the number of parameters. Compile s: seconds XLA took to compile the row's program on
this machine (the fused rows: mostly Triton's compiler, which grows faster than linearly with the leaves).
LARS variants select the kernels (`ndim >= 2`) in both lbjax and optax; the LAMB rows select every
leaf so that they compute what `optax.lamb` computes.

Multi-tensor layer-wise rates: lbjax's LARS, LAMB and PercentDelta take each layer's sums in one
reduction per leaf and sum (where the leaf lies: no gather when it is sharded), keep every layer's rate
in one vector as the state, and update each leaf in one elementwise pass. LAMB and PercentDelta compute
the rates as one vector from the stacked sums of all layers (one psum under `shard_map`): every update
waits for all the reductions. LARS, under `jit`, computes each leaf's rates from that leaf's own sums
(`SummedRate.leaf_local`), so that XLA:CPU can update a leaf right after its reductions, while it is in
cache."""

# A paragraph for each kind of row, in the notes only when the table has such a row (a name containing the key).
ROW_NOTES = {
    ONE_VECTOR: "The one-vector row is LARS computed the other way (the design of 2026-11-26), timed in the "
                "same rounds, with the same numbers.",
    FLAT_BUFFER: "The flat-buffer row is the design the issue proposed: all kernels concatenated, "
                 "block-padded (1,024), one reduction per buffer and `segment_sum` per layer, the update leaf "
                 "by leaf; on XLA:CPU the concatenation is materialised and `segment_sum` is a scatter, and with "
                 "sharded parameters it needs gathers (see the collectives section).",
    "flat layout": "The flat-layout rows (`layout=\"flat\"`, `lbjax.optim.multi_tensor`) keep the state in a "
                   "few block-padded buffers and take every layer's sums in a few kernels, for GPUs, where an "
                   "update is launch-bound; each update concatenates w and g into the layout (full copies "
                   "XLA cannot alias), so on a CPU, which is not launch-bound, the per-leaf rows are faster.",
    "bfloat16": "The bfloat16 rows store the momentum (LAMB: both moments) in bfloat16, computed in float32 "
                "(`lbjax.optim.low_precision`): LARS then moves 30 bytes per parameter instead of 36, since its "
                "weights step along the stored momentum.",
    "fused layout": "The fused rows (`layout=\"fused\"`, `lbjax.optim.fused`, their updates added by "
                    "`fused.apply_updates`) run Pallas kernels of up to 96 leaves each on a CUDA GPU only: on "
                    "any other backend they are the per-leaf update (and `optax.apply_updates`), so their CPU or "
                    "TPU times are the per-leaf rows' and their numerics equal them exactly.",
}

CPU_BYTES_NOTES = """\
On this CPU the PTB LSTM tree (18.6 MB) and the small leaves of ResNet-50 fit in the 32 MiB L3, so the
PTB scale runs at cache speed. Bytes an update must move: momentum SGD reads w, g, v and writes w, v (5 x 4
bytes per parameter, 487 MiB on ResNet-50). XLA:CPU writes v and w in two fusions (no multi-output fusion
on CPU), so `optax.sgd` moves 6 x 4 bytes per parameter (585 MiB). LARS needs the norms of w and g of every
kernel before it can update it: one more read of each, and its momentum pass reads w for the
weight decay: 9 x 4 bytes per parameter (877 MiB), 1.5x SGD by bytes. With multi-output fusion
(GPU) the update could write v and w in one pass and, carrying ||w_t+1|| from that pass, read only
g for its norms: 6 x 4 bytes, SGD's count on CPU. On XLA:CPU neither is available: a reduction is
a kernel of its own (YNNPACK), so a carried norm would be a separate pass over w_t+1 at the end of
the previous update (the read moves, it is not saved) and would be exact only when the updates are
applied unchanged; lbjax does not carry it. At 1.5x the bytes, 1.2x SGD's time needs the norms to
come from cache, which a 100 MiB tree on a 32 MiB L3 does not allow. Two ways to read w and g once
for both sums were tried in this benchmark: stacking w * w and g * g for one reduction
materialises the stack (1,266 MiB, not kept in the table); one variadic `lax.reduce` (the
one-reduction row) moves the same 877 MiB as `lbjax lars` but runs on XLA's generic reduction
loop instead of YNNPACK's, which is slower, and the SPMD partitioner gathers its sharded inputs.
PercentDelta's rate is arithmetic only (no `where`), so XLA fuses its |d / w| and nonzero count
into their reductions (1,172 MiB accessed, 45 MiB temporaries; a select-based version: 1,363 MiB
and 195 MiB)."""


def notes(names, backend, seconds, per_call):
  """The notes under the optimizer table: how it is measured, a paragraph for each kind of row in
  `names`, and, on a CPU, what its bytes say."""
  parts = [TIMING_NOTES.format(seconds=seconds, per_call=per_call)]
  parts += [text for key, text in ROW_NOTES.items() if any(key in name for name in names)]
  if backend == "cpu":
    parts.append(CPU_BYTES_NOTES)
  return "\n\n".join(parts) + "\n"


PER_CALL = {
    False: "One update per jitted call: the time includes the host's dispatch of the call (its arguments and "
           "results: hundreds of arrays).",
    True: "{k} updates per jitted call (`lax.fori_loop`), as a train step runs its update: the host's dispatch "
          "spread over them; kernels and MiB are `hlo_analysis`'s counts of a call over {k} (the loop's control "
          "and any copies of its carry included).",
}

def fsdp_spec(shape, devices):
  """The leaf split along its largest axis divisible by `devices` (replicated if none is)."""
  for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
    if shape[axis] % devices == 0:
      return jax.sharding.PartitionSpec(*(("fsdp" if a == axis else None) for a in range(len(shape))))
  return jax.sharding.PartitionSpec()


def collective_counts(names, devices=8):
  """Rows: the collectives in the compiled update of each optimizer on the FSDP-sharded ResNet-50 tree."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("fsdp",))
  shapes = resnet50_shapes()

  def shard(tree):
    return {k: jax.device_put(v, jax.sharding.NamedSharding(mesh, fsdp_spec(v.shape, devices)))
            for k, v in tree.items()}

  params, grads = shard(random_tree(shapes, 0, 0.05)), shard(random_tree(shapes, 1, 1e-2))
  all_optimizers = optimizers()
  rows = []
  for name in names:
    opt = all_optimizers[name]
    hlo = make_step(opt, APPLY_UPDATES.get(name, optax.apply_updates)).lower(
        params, jax.jit(opt.init)(params), grads).compile().as_text()
    counts = hlo_analysis.analyze(hlo).collective_counts
    rows.append([name] + [counts[kind] for kind in hlo_analysis.COLLECTIVES])
    print(rows[-1], flush=True)
  return rows


COLLECTIVE_NOTES = """\
Collective operations in the optimised HLO of one update (update + apply_updates, jitted) over 8
CPU devices, the ResNet-50 tree split FSDP-style (each leaf along its largest axis divisible by 8;
leaves with none replicated), gradients sharded like the parameters. XLA combines the per-leaf
norm reductions of lbjax's LARS into one all-reduce; concatenating the sharded leaves into one flat
buffer (the flat-buffer experiment, and the multi-tensor `layout="flat"`) makes the SPMD partitioner
gather them first, which is why the trainer refuses the flat layout on a mesh that splits parameters."""


def kernel_figures(compiled) -> tuple[int, str]:
  """The kernels one call of `compiled` launches and the GiB they read and write (`hlo_analysis`)."""
  figures = hlo_analysis.analyze(compiled.as_text())
  return figures.kernels, f"{figures.kernel_bytes / 2**30:.2f}"


def gpu_kernel_counts(target, trees, names):
  """Rows: the kernels of each update compiled for the deviceless GPU `target` (nothing runs)."""
  (device,) = gpu_targets.devices(target)
  sharding = jax.sharding.SingleDeviceSharding(device)
  all_optimizers = optimizers()
  rows = []
  for tree in trees:
    label, shapes_fn = TREES[tree]
    params = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for k, s in shapes_fn().items()}
    for name in names:
      opt = all_optimizers[name]
      state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                           jax.eval_shape(opt.init, params))
      with gpu_targets.lowering_for({device}):
        lowered = make_step(opt, APPLY_UPDATES.get(name, optax.apply_updates)).lower(params, state, params)
      start = time.perf_counter()
      compiled = lowered.compile()
      rows.append([label, name, *kernel_figures(compiled), f"{time.perf_counter() - start:.1f}"])
      print(rows[-1], flush=True)
  return rows


# The trainer's ResNet-50 step (bfloat16, the whole per-GPU batch in one call) with each optimizer section.
STEP_CONFIG = ("resnet50_imagenet:batch=256", ["--config.max_device_batch=0"])
STEP_OPTIMIZERS = {  # row -> the optimizer section, from the config's
    "lbjax lars (the config's)": lambda section: section,
    "lbjax lars, flat layout (the config's)": lambda section: {**section, "layout": "flat"},
    "momentum SGD (lbjax momentum)": lambda section: {"name": "momentum", "momentum": 0.9},
}


def gpu_step_kernel_counts(target):
  """Rows: the kernels of the trainer's ResNet-50 train step (`STEP_CONFIG`) compiled for the deviceless
  GPU `target` with LARS (per leaf and in the flat layout) and with momentum SGD: what the optimizer adds
  inside the step; each also with the train state in the layouts XLA prefers (`workloads.STATE_LAYOUTS`)."""
  from benchmarks import workloads  # pylint: disable=import-outside-toplevel  (the trainer: only for these rows)
  from lbjax import config_files  # pylint: disable=import-outside-toplevel
  from lbjax.train import compile_only  # pylint: disable=import-outside-toplevel
  devices = gpu_targets.devices(target)
  rows = []
  for name, section in STEP_OPTIMIZERS.items():
    config = config_files.load(*STEP_CONFIG).config
    config.optimizer = section(config.optimizer.to_dict())
    train = compile_only.abstract_run(config, devices).programs[0]
    variants = {name: train, f"{name}, state in XLA's layouts": workloads.with_state_layouts_chosen_by_xla(train)}
    for row_name, program in variants.items():
      start = time.perf_counter()
      compiled, _ = compile_only.compile_program(program)
      rows.append([f"ResNet-50 train step, {STEP_CONFIG[0]}", row_name, *kernel_figures(compiled),
                   f"{time.perf_counter() - start:.1f}"])
      print(rows[-1], flush=True)
  return rows


GPU_KERNEL_NOTES = """\
Kernels one update (with its apply_updates, jitted, donated) launches on the GPU, counted as the `kernels`
column of the timed table (`hlo_analysis.kernel_count`) in the optimised HLO that XLA:GPU compiles on this
machine for the named GPU, deviceless (`lbjax.train.gpu_targets`; nothing runs, no times but the compile's
own: `compile s`, on this machine's CPU cores, which for the fused rows were 0.8x the H200 machine's on
2026-11-30), and the bytes those kernels read and write (`HloFigures.kernel_bytes`: each kernel's results and
operands, a fusion's operand only as far as it slices it; what bounds the time of memory-bound kernels;
cuDNN's and cuBLAS's calls count their operands and results too). The counts of the designs the lent H200
ran match (2026-11-26: momentum SGD 161, optax.lars 528, optax.lamb 775; lbjax lars 324 there, the one-rate-
vector row here, since `lbjax lars` takes leaf-local rates: 380; lbjax lamb 291 there, 289 here). Issue
29's target: at most 20 for `lars` and `lamb`. In the per-leaf layout XLA:GPU fuses each leaf's
momentum and weight update into one kernel (SGD: one per leaf) and adds one reduction kernel per sum and leaf.
The flat layout (`layout="flat"`, `lbjax.optim.multi_tensor`: every leaf in one block-padded buffer per dtype,
the optimizer's state in that layout, block sums and one `segment_sum` per sum, one elementwise pass) launches
a few concatenation, scatter and elementwise kernels and one kernel per group of equally shaped leaves to
write the weights back: XLA groups sibling slices of a buffer by shape, and ResNet-50's 161 leaves have 22
shapes, so a design whose outputs are the leaves stays above 20 on this tree within XLA. The fused layout
(`layout="fused"`, `lbjax.optim.fused`) is not: two passes of Pallas (Triton) kernels, in which each program
takes a chunk of 4,096 values of whichever leaf it covers, write every leaf (LARS: the norms, then the update
and the momentum in place; LAMB: Adam's moments, direction and the norms, then the update), a few small XLA
kernels turn the chunk sums into the rates, and a third pass adds the updates to the weights in place
(`fused.apply_updates`, which its rows use instead of `optax.apply_updates`: XLA cannot fuse an addition into
a kernel it did not write, and would add each leaf in a kernel of its own); a kernel covers up to 96 leaves
(Triton's compile grows with the square of a kernel's leaves), so a pass over ResNet-50's 161 is two. Its bytes are
the per-leaf layout's plus one write and one read of the update (4 + 4 bytes per parameter). bfloat16 LAMB
moments add kernels on the GPU (436 vs 289; 132 of them are copies of small bfloat16 moment leaves). The train-step rows
(`--step-kernels`) compile the trainer's whole ResNet-50 step (bfloat16, batch 256 on one GPU, no accumulation
loop) with the config's LARS in both layouts and with momentum SGD: what LARS adds to the launches of a step
(issue 29's target there: at most 1.02x the momentum step's time). "State in XLA's layouts": the same step
compiled with `Layout.AUTO` for the train state (`benchmarks.workloads.STATE_LAYOUTS`; the trainer places it
row-major): XLA then keeps the 4-d convolution kernels and their optimizer state in cuDNN's OHWI order (O the
major dimension) instead of transposing them between the parameters' HWIO and OHWI around the convolutions.
The suite's `step_options` part times both (`--compare-state-layouts`)."""


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  report.add_spread_arguments(parser, rounds=61)
  parser.add_argument("--seconds-per-round", type=float, default=0.05,
                      help="time of one variant's turn in a round (at least one update): short "
                           "turns keep the two sides of a ratio close in time")
  parser.add_argument("--updates-per-call", type=int, default=1,
                      help="updates per jitted call (lax.fori_loop), each row's time being a call's over this: "
                           "above 1 the host's dispatch of the call's hundreds of arrays is spread over them, as in "
                           "a train step (one update per call took at least 1.2 ms on the H200 for ResNet-50's "
                           "tree, whether it launched 2 kernels or 161)")
  parser.add_argument("--trace", action="store_true",
                      help="after the timed rounds, trace one call of each row with jax.profiler: the device's busy "
                           "time per update (its kernels' time alone) and each row's kernels by device time")
  parser.add_argument("--trees", default=",".join(TREES), help=f"from {', '.join(TREES)}")
  parser.add_argument("--optimizers", default="",
                      help="semicolon-separated names from the table (default: all but lbjax mclr, "
                           "~50x SGD, whose 31-pass median would set the pace of every round); "
                           "momentum SGD is always included")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  parser.add_argument("--collectives", action="store_true",
                      help="count the collectives of each update over 8 CPU devices (FSDP-sharded ResNet-50 tree)")
  parser.add_argument("--kernels-for", choices=sorted(gpu_targets.TARGETS),
                      help="count the kernels of each update compiled for this GPU, deviceless (times nothing; "
                           "needs JAX's CUDA plugin: lbjax.train.gpu_targets)")
  parser.add_argument("--step-kernels", action="store_true",
                      help="with --kernels-for: also the trainer's ResNet-50 step with LARS (both layouts) and "
                           "momentum SGD (about 2.5 min of compiling each on 2 cores)")
  args = parser.parse_args()
  if args.step_kernels and not args.kernels_for:
    parser.error("--step-kernels adds the train step's kernels to those --kernels-for counts: add --kernels-for h100 "
                 "(or h200).")
  if args.kernels_for and args.collectives:
    parser.error("--kernels-for counts kernels on a GPU, --collectives collectives over 8 CPU devices: keep one, or "
                 "run them as two commands.")
  mode = f"--kernels-for {args.kernels_for}" if args.kernels_for else "--collectives" if args.collectives else ""
  timing = report.flags_given(parser, args, ["rounds", "seconds_per_round", "max_spread", "write_noisy",
                                             "updates_per_call", "trace"])
  if mode and timing:
    parser.error(f"{mode} times nothing: drop {', '.join(timing)}.")
  if args.collectives and args.trees != parser.get_default("trees"):
    parser.error("--collectives counts on the FSDP-sharded ResNet-50 tree alone: drop --trees.")
  if args.rounds < 2 or args.seconds_per_round <= 0 or args.updates_per_call < 1:
    parser.error("--rounds must be >= 2, --seconds-per-round > 0 and --updates-per-call >= 1")
  trees = [t.strip() for t in args.trees.split(",") if t.strip()]
  if not trees or any(t not in TREES for t in trees):
    parser.error(f"--trees takes names from {', '.join(TREES)}, got {args.trees!r}")
  names = [name for name in optimizers() if name != "lbjax mclr"]
  if args.optimizers:
    chosen = [n.strip() for n in args.optimizers.split(";") if n.strip()]
    known = list(optimizers())
    unknown = [n for n in chosen if n not in known]
    if unknown:
      parser.error(f"unknown optimizers {unknown}; choose from {known}")
    names = [n for n in known if n == SGD or n in chosen]
  if args.kernels_for:
    gpu_targets.allow_plugin_without_cuda()  # before JAX starts its backends
    try:
      rows = gpu_kernel_counts(args.kernels_for, trees, names)
      if args.step_kernels:
        rows += gpu_step_kernel_counts(args.kernels_for)
    except ConfigError as error:  # no CUDA plugin: what to install
      parser.error(str(error))
    body = report.markdown_table(["tree", "update", "kernels", "GiB read and written by the kernels",
                                  "compile s (this machine)"], rows)
    print(body)
    report.publish(args, "optimizer-gpu-kernels",
                   f"Optimizer update: kernels on a GPU ({args.kernels_for}, compiled here without one)",
                   body + "\n\n" + GPU_KERNEL_NOTES)
    return
  if args.collectives:
    jax.config.update("jax_num_cpu_devices", 8)
    rows = collective_counts([n for n in names if n != "lbjax mclr"])
    body = report.markdown_table(["update"] + list(hlo_analysis.COLLECTIVES), rows)
    print(body)
    report.publish(args, "optimizer-collectives", "Optimizer update: collectives with FSDP-sharded parameters",
                   body + "\n\n" + COLLECTIVE_NOTES)
    return
  check = report.SpreadCheck(args.max_spread)
  rows, ratios, diffs, failed, kernel_lines = [], {}, {}, {}, {}
  steps = 3 if args.updates_per_call == 1 else args.updates_per_call  # of the numerics
  for tree in trees:
    label, shapes_fn = TREES[tree]
    shapes = shapes_fn()
    count = sum(int(np.prod(s)) for s in shapes.values())
    print(f"{label}: {len(shapes)} leaves, {count / 1e6:.2f}M parameters", flush=True)
    tree_rows, tree_ratios, updates, tree_kernels, tree_failed = benchmark(
        shapes, names, args.rounds, args.seconds_per_round, check, label, args.updates_per_call, args.trace)
    kernel_lines.update({(label, name): lines for name, lines in tree_kernels.items()})
    rows += tree_rows
    ratios.update({(label,) + key: value for key, value in tree_ratios.items()})
    failed.update({(label, name): error for name, error in tree_failed.items()})
    diffs[label] = numerics(updates, steps)
  table = report.markdown_table(
      ["tree", "update", "ms per update", "x SGD", "MiB accessed (XLA)", "GB/s", "of STREAM", "kernels",
       "state bytes / parameter", "compile s"] + ["device ms per update (traced)"] * args.trace, rows)
  lines = [table, "", "Ratios of time per update (per-round ratios: median [quartiles], and the 95% "
           "confidence interval of the median):", ""]
  for (tree, name, baseline), spread in ratios.items():
    lines.append(f"- {tree}: {name} / {baseline} = {spread.format(digits=3)}, interval "
                 f"[{spread.median_low:.3f}, {spread.median_high:.3f}]")
  lines += ["", f"Numerics after {steps} steps (max |a - b| / max |b| over leaves):", ""]
  for tree, pairs in diffs.items():
    for pair, diff in pairs.items():
      lines.append(f"- {tree}: {pair}: {diff:.1e}")
  if kernel_lines:
    lines += ["", "Kernels by device time per update (one traced call of each row, `lbjax.train.trace_analysis`; "
              "its steps are updates):"]
    for (tree, name), row_lines in kernel_lines.items():
      lines += ["", f"{tree}, {name}:", "", "```", *row_lines, "```"]
  if failed:
    lines += ["", "Did not compile on this backend (not timed):", ""]
    lines += [f"- {tree}: {name}: {error}" for (tree, name), error in failed.items()]
  body = "\n".join(lines)
  print(body)
  per_call = PER_CALL[args.updates_per_call > 1].format(k=args.updates_per_call)
  check.finish(args, "optimizer", "Optimizer update: `benchmarks/optimizer.py`",
               body + "\n\n" + notes(names, jax.default_backend(), args.seconds_per_round, per_call))


if __name__ == "__main__":
  main()
