"""One battery of optax-style checks over every public transform of `lbjax.optim`.

Modelled on optax's `optax/_src/alias_test.py`: every transform (the full optimizers, their
layer-wise parts on their own, and the gradient compressors) is a `Case`, and every check is
parametrised over the cases instead of being written per transform.
`test_every_public_name_is_classified` enumerates the public names of `lbjax.optim` and
`lbjax.optim.compression`, so a new transform fails the battery, by name, until it has a case here
(or is listed in `NOT_TRANSFORMS`).

The checks: jit (equal to eager); empty and nested trees; float32, bfloat16 and complex64 (dtype of
the updates and of the state kept); convergence on a parabola and on the Rosenbrock function, in
float32 and complex64; no retrace on the second update; `optax.inject_hyperparams`;
`optax.MultiSteps`; `shard_map` with `axis_name` over 8 devices equal to the global computation;
masks; several steps against the NumPy references of `numpy_reference.py` (the papers' formulas);
all-zero parameters and gradients; a docstring with the formula's equation and References.
"""
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from lbjax import optim
from lbjax.optim import compression
from tests.optim import numpy_reference as ref

# Convergence: a decaying LR over STEPS steps, run in one `lax.scan`.
STEPS = 3000
REF_LR = 0.1  # the LR applied after a scaling or a compressor in the reference checks
WEIGHT_DECAY = 1e-3


def select_all(params):
  """Mask selecting every leaf (the convergence problems are 1-D vectors, which the default
  mask leaves to plain SGD)."""
  return jax.tree.map(lambda _: True, params)


def decay(lr):
  return optax.cosine_decay_schedule(lr, STEPS)


@dataclasses.dataclass(frozen=True)
class Case:
  """One public transform under test.

  Attributes:
    id: test id.
    name: public name of the factory in `lbjax.optim` (or `lbjax.optim.compression`).
    factory: the public factory.
    kwargs: its arguments in every check but convergence.
    kind: "optimizer" (returns the parameter step), "scaling" (a layer-wise rescaling of the
      gradient: an LR is chained after it) or "compressor" (a `GradientCompressor`).
    converge: overrides of `kwargs` for the convergence checks.
    tail_lr: for scalings and compressors, the initial LR of the decaying `optax.sgd(., 0.9)`
      chained after them in the convergence checks.
    sharded: overrides of `kwargs` inside `shard_map` (the mapped axis is "data").
    base: for factories with a `mask`, what a leaf the mask leaves out gets, as a function of
      `kwargs` (momentum SGD, Adam or the identity).
    reference: NumPy reference `(case, params, grads_seq) -> params` of `stepper(case)`.
    static_args: for `optax.inject_hyperparams`.
    complex_ok: complex parameters supported (otherwise a TypeError is expected).
  """

  id: str
  name: str
  factory: Callable[..., Any]
  kwargs: dict
  kind: str
  converge: dict
  tail_lr: float = 0.0
  sharded: dict = dataclasses.field(default_factory=lambda: {"axis_name": "data"})
  base: Callable[[dict], optax.GradientTransformation] | None = None
  reference: Callable[..., dict] | None = None
  static_args: tuple[str, ...] = ()
  complex_ok: bool = True

  def make(self, **overrides):
    return self.factory(**{**self.kwargs, **overrides})

  @property
  def has_mask(self):
    return "mask" in inspect.signature(self.factory).parameters

  @property
  def layerwise(self):
    """Whether the transform keeps per-layer rates (`optim.trust_ratios` reads them)."""
    state = self.make().init({"k": jnp.ones((2, 2))})
    return any(isinstance(x, optim.LayerwiseRateState)
               for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(
                   x, optim.LayerwiseRateState)))


# --- NumPy references (float64, from the papers' formulas in numpy_reference.py) ------------------

SELECTED = {"conv": True, "dense": True, "bias": False}  # the default mask: ndim >= 2


def _lars_rate(case):
  eta, den = case.kwargs["trust_coefficient"], case.kwargs.get("denominator", "paper")
  return lambda w, g, beta: ref.lars_local_lr(w, g, eta, beta, denominator=den)


def _momentum_reference(rate_fn):
  """Momentum SGD with a layer rate (papers/000 Algorithm 1, papers/003 eq. 21)."""

  def reference(case, params, grads_seq):
    kw = case.kwargs
    return ref.layer_rate_momentum(params, grads_seq, kw["learning_rate"], kw["momentum"],
                                   kw["weight_decay"], rate_fn(case), SELECTED)[0]
  return reference


def _scaling_reference(rate_fn):
  """A layer-wise scaling followed by `optax.scale(-REF_LR)`: plain steps with the layer rate."""

  def reference(case, params, grads_seq):
    return ref.layer_rate_momentum(params, grads_seq, REF_LR, 0.0, case.kwargs["weight_decay"],
                                   rate_fn(case), SELECTED)[0]
  return reference


def _lamb_reference(case, params, grads_seq):
  kw = case.kwargs
  w = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m1 = {k: np.zeros_like(v) for k, v in w.items()}
  m2 = {k: np.zeros_like(v) for k, v in w.items()}
  for t, grads in enumerate(grads_seq, start=1):
    for k in w:
      w[k], m1[k], m2[k], _ = ref.lamb_step(w[k], grads[k], m1[k], m2[k], t, kw["learning_rate"],
                                            kw["b1"], kw["b2"], kw["eps"], kw["weight_decay"],
                                            SELECTED[k])
  return w


def _momentum_sgd_reference(case, params, grads_seq):
  kw = case.kwargs
  return ref.momentum_sgd(params, grads_seq, kw["learning_rate"], kw["momentum"],
                          kw["weight_decay"], SELECTED)


def _powersgd_reference(case, params, grads_seq):
  names = sorted(k for k in params if compression.compressed_rank(params[k].shape, case.kwargs["rank"]))
  queries = case.make().init({k: jnp.asarray(v, jnp.float32) for k, v in params.items()}).queries
  return ref.powersgd_sgd(params, grads_seq, REF_LR, dict(zip(names, queries)))


def _one_bit_reference(case, params, grads_seq):
  return ref.one_bit_sgd(params, grads_seq, REF_LR, case.kwargs.get("error_feedback", False))


def _identity_reference(case, params, grads_seq):
  del case
  w = {k: np.asarray(v, np.float64) for k, v in params.items()}
  for grads in grads_seq:
    w = {k: w[k] - REF_LR * grads[k] for k in w}
  return w


def _layerwise_sgd_reference(case, params, grads_seq):
  kw = case.kwargs  # the scaling is scale_by_percent_delta(WEIGHT_DECAY)
  return ref.layer_rate_momentum(params, grads_seq, kw["learning_rate"], kw["momentum"],
                                 WEIGHT_DECAY, ref.percent_delta_rate, SELECTED)[0]


_percent_delta_rate = lambda case: ref.percent_delta_rate
_median_rate = lambda case: ref.median_curvature_rate
_lamb_ratio = lambda case: ref.lamb_trust_ratio


def _sgd_base(kw):
  return optax.sgd(kw["learning_rate"], momentum=kw["momentum"])


def _identity_base(kw):
  del kw
  return optax.identity()


def _adam_base(kw):
  return optax.adam(kw["learning_rate"], kw["b1"], kw["b2"], kw["eps"], eps_root=kw["eps_root"])


# --- The cases ------------------------------------------------------------------------------------
#
# Convergence hyper-parameters. On the tiny problems below ||w|| / ||g|| is of order 1, where on a
# network it is 1e2..1e4 (papers/000 Table 2): the LARS coefficient eta = 1e-3 of the paper would
# move the weights by 1e-3 * lr * ||w|| a step, so LARS-type transforms get eta = 0.1 here. Every
# layer-wise rate normalises the step length (LARS and LAMB: lr * eta * ||w||, PercentDelta: a fixed
# relative change, MCLR: lr * |w_m| / |g_m| * g), so at a constant LR the iterate hovers at a
# distance of the order of that step around the minimum (constant-LR LARS ends 0.6 away on the
# parabola): like the papers (poly or cosine decay), every case decays its LR, here by a cosine to 0
# over STEPS steps. Weight decay is 0 there (it moves the minimum).

_LARS_KW = dict(learning_rate=0.5, momentum=0.9, weight_decay=WEIGHT_DECAY, trust_coefficient=1e-2)
_SGD_KW = dict(learning_rate=0.05, momentum=0.9, weight_decay=WEIGHT_DECAY)
_CONVERGE_LARS = dict(learning_rate=decay(1.0), weight_decay=0.0, trust_coefficient=0.1,
                      mask=select_all)
_CONVERGE_SGD = dict(learning_rate=decay(0.05), weight_decay=0.0, mask=select_all)

CASES = [
    Case("lars", "lars", optim.lars, _LARS_KW, "optimizer", _CONVERGE_LARS,
         base=_sgd_base, reference=_momentum_reference(_lars_rate)),
    Case("lars-optax_denominator", "lars", optim.lars, {**_LARS_KW, "denominator": "optax"},
         "optimizer", _CONVERGE_LARS, base=_sgd_base, reference=_momentum_reference(_lars_rate)),
    # The multi-tensor layout (`multi_tensor`): the same optimizers on a few flat buffers.
    Case("lars-flat", "lars", optim.lars, {**_LARS_KW, "layout": "flat"}, "optimizer", _CONVERGE_LARS,
         base=_sgd_base, reference=_momentum_reference(_lars_rate)),
    Case("lars-optax_denominator-flat", "lars", optim.lars,
         {**_LARS_KW, "denominator": "optax", "layout": "flat"}, "optimizer", _CONVERGE_LARS,
         base=_sgd_base, reference=_momentum_reference(_lars_rate)),
    # The fused layout (`fused`): Pallas kernels on CUDA GPUs, the per-leaf update here (platform_dependent).
    Case("lars-fused", "lars", optim.lars, {**_LARS_KW, "layout": "fused"}, "optimizer", _CONVERGE_LARS,
         base=_sgd_base, reference=_momentum_reference(_lars_rate)),
    Case("scale_by_lars", "scale_by_lars", optim.scale_by_lars,
         dict(trust_coefficient=1e-2, weight_decay=WEIGHT_DECAY), "scaling",
         dict(trust_coefficient=0.1, weight_decay=0.0, mask=select_all), tail_lr=1.0,
         base=_identity_base, reference=_scaling_reference(_lars_rate)),
    Case("scale_by_lars-optax_denominator", "scale_by_lars", optim.scale_by_lars,
         dict(trust_coefficient=1e-2, weight_decay=WEIGHT_DECAY, denominator="optax"), "scaling",
         dict(trust_coefficient=0.1, weight_decay=0.0, mask=select_all), tail_lr=1.0,
         base=_identity_base, reference=_scaling_reference(_lars_rate)),
    Case("lamb", "lamb", optim.lamb,
         dict(learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0,
              weight_decay=WEIGHT_DECAY),
         "optimizer", dict(learning_rate=decay(0.05), weight_decay=0.0, mask=select_all),
         base=_adam_base, reference=_lamb_reference),
    Case("lamb-flat", "lamb", optim.lamb,
         dict(learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0,
              weight_decay=WEIGHT_DECAY, layout="flat"),
         "optimizer", dict(learning_rate=decay(0.05), weight_decay=0.0, mask=select_all),
         base=_adam_base, reference=_lamb_reference),
    Case("lamb-fused", "lamb", optim.lamb,
         dict(learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0,
              weight_decay=WEIGHT_DECAY, layout="fused"),
         "optimizer", dict(learning_rate=decay(0.05), weight_decay=0.0, mask=select_all),
         base=_adam_base, reference=_lamb_reference),
    # On its own (after the raw gradient) the trust ratio makes normalised gradient descent:
    # a step of lr * ||w|| along g / ||g||.
    Case("scale_by_lamb_trust_ratio", "scale_by_lamb_trust_ratio", optim.scale_by_lamb_trust_ratio,
         dict(weight_decay=WEIGHT_DECAY), "scaling", dict(weight_decay=0.0, mask=select_all),
         tail_lr=0.05, base=_identity_base, reference=_scaling_reference(_lamb_ratio)),
    Case("percent_delta", "percent_delta", optim.percent_delta, _SGD_KW, "optimizer",
         _CONVERGE_SGD, base=_sgd_base, reference=_momentum_reference(_percent_delta_rate)),
    Case("percent_delta-flat", "percent_delta", optim.percent_delta, {**_SGD_KW, "layout": "flat"},
         "optimizer", _CONVERGE_SGD, base=_sgd_base, reference=_momentum_reference(_percent_delta_rate)),
    Case("percent_delta-fused", "percent_delta", optim.percent_delta, {**_SGD_KW, "layout": "fused"},
         "optimizer", _CONVERGE_SGD, base=_sgd_base, reference=_momentum_reference(_percent_delta_rate)),
    Case("scale_by_percent_delta", "scale_by_percent_delta", optim.scale_by_percent_delta,
         dict(weight_decay=WEIGHT_DECAY), "scaling", dict(weight_decay=0.0, mask=select_all),
         tail_lr=0.05, base=_identity_base, reference=_scaling_reference(_percent_delta_rate)),
    Case("mclr", "mclr", optim.mclr, _SGD_KW, "optimizer", _CONVERGE_SGD, base=_sgd_base,
         reference=_momentum_reference(_median_rate)),
    Case("scale_by_median_curvature", "scale_by_median_curvature",
         optim.scale_by_median_curvature, dict(weight_decay=WEIGHT_DECAY), "scaling",
         dict(weight_decay=0.0, mask=select_all), tail_lr=0.05, base=_identity_base,
         reference=_scaling_reference(_median_rate)),
    # The shared transform with a statistic plugged in (LARS's), and the momentum wrapper around a
    # layer-wise scaling (PercentDelta's).
    Case("scale_by_layerwise_rate", "scale_by_layerwise_rate", optim.scale_by_layerwise_rate,
         dict(rate=optim.lars_rate(1e-2), weight_decay=WEIGHT_DECAY), "scaling",
         dict(rate=optim.lars_rate(0.1), weight_decay=0.0, mask=select_all), tail_lr=1.0,
         base=_identity_base, static_args=("rate",),
         reference=_scaling_reference(
             lambda case: lambda w, g, beta: ref.lars_local_lr(w, g, 1e-2, beta))),
    Case("layerwise_sgd", "layerwise_sgd", optim.layerwise_sgd,
         dict(scaling=optim.scale_by_percent_delta(WEIGHT_DECAY), learning_rate=0.05,
              momentum=0.9),
         "optimizer",
         dict(scaling=optim.scale_by_percent_delta(mask=select_all), learning_rate=decay(0.05)),
         sharded=dict(scaling=optim.scale_by_percent_delta(WEIGHT_DECAY, axis_name="data")),
         reference=_layerwise_sgd_reference),
    # Heavy-ball SGD with weight decay on the selected leaves (the baselines' optimizer).
    Case("momentum", "momentum", optim.momentum,
         dict(learning_rate=0.05, momentum=0.9, weight_decay=WEIGHT_DECAY), "optimizer",
         dict(learning_rate=decay(1e-3), weight_decay=0.0), sharded={}, base=_sgd_base,
         reference=_momentum_sgd_reference),
    Case("momentum-fused", "momentum", optim.momentum,
         dict(learning_rate=0.05, momentum=0.9, weight_decay=WEIGHT_DECAY, layout="fused"), "optimizer",
         dict(learning_rate=decay(1e-3), weight_decay=0.0), sharded={}, base=_sgd_base,
         reference=_momentum_sgd_reference),
    Case("no_compression", "no_compression", compression.no_compression, {}, "compressor", {},
         tail_lr=1e-3, sharded={}, reference=_identity_reference),
    Case("one_bit", "one_bit", compression.one_bit, {}, "compressor", {}, tail_lr=1e-3,
         sharded={}, reference=_one_bit_reference, complex_ok=False),
    Case("one_bit-error_feedback", "one_bit", compression.one_bit, dict(error_feedback=True),
         "compressor", {}, tail_lr=1e-3, sharded={}, reference=_one_bit_reference,
         complex_ok=False),
    # Stochastic: no NumPy reference (its moments are checked against papers/004 in
    # test_compression.py).
    Case("qsgd", "qsgd", compression.qsgd, dict(num_levels=2, seed=0), "compressor", {},
         tail_lr=1e-3, static_args=("num_levels", "seed"), complex_ok=False),
    # Rank 1: matrices (and conv kernels as matrices) compressed, vectors sent whole.
    Case("powersgd", "powersgd", compression.powersgd, dict(rank=1, seed=0), "compressor", {},
         tail_lr=1e-3, reference=_powersgd_reference, static_args=("rank", "seed"), complex_ok=False),
]

# Public names of lbjax.optim that are not transforms, and why.
NOT_TRANSFORMS = {
    "compression": "submodule: its public names are classified one by one",
    "lars_rate": "a SummedRate statistic (plugged into scale_by_layerwise_rate: case above)",
    "lamb_rate": "a SummedRate statistic",
    "percent_delta_rate": "a SummedRate statistic",
    "median_curvature_rate": "a LayerRate statistic",
    "LayerRate": "protocol type",
    "SummedRate": "statistic type",
    "LayerRates": "state type (the rates vector)",
    "RatesLayout": "static layout of the rates vector",
    "LayerReducer": "reduction helper of a LayerRate",
    "LayerwiseRateState": "state type",
    "default_mask": "mask helper",
    "safe_quotient": "numeric helper",
    "trust_ratios": "reads rates out of a state",
    "compression.BitsPerStep": "result type",
    "compression.ErrorFeedbackState": "state type",
    "compression.QSGDState": "state type",
    "compression.PowerSGDState": "state type",
    "compression.compressed_rank": "which leaves PowerSGD compresses, at what rank",
    "compression.matrix_shape": "the matrix view of a leaf",
    "compression.powersgd_bits": "message-size count",
    "compression.GradientCompressor": "transform type",
    "compression.FLOAT_BITS": "constant",
    "compression.bits_per_step": "message-size count",
    "compression.qsgd_dense_bits": "message-size count",
    "compression.qsgd_elias_bits": "message-size count",
    "compression.compressed_pmean": "a collective over compressed gradients (checked in "
                                    "test_shard_map_equals_global for the compressors)",
}

# Checks a transform is known to fail, with why: strict xfails, so a fix shows up as an XPASS failure
# (then delete the entry).
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def battery(test=None, *, only=lambda case: True):
  """Parametrises `test` over the cases (those `only` keeps), with the known failures marked."""

  def parametrise(test):
    params = []
    for case in filter(only, CASES):
      reason = KNOWN_FAILURES.get((case.id, test.__name__))
      marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
      params.append(pytest.param(case, id=case.id, marks=marks))
    return pytest.mark.parametrize("case", params)(test)

  return parametrise(test) if test is not None else parametrise


# --- helpers --------------------------------------------------------------------------------------

def stepper(case, **overrides):
  """What the reference describes: the transform, with `optax.scale(-REF_LR)` after a scaling or a
  compressor."""
  opt = case.make(**overrides)
  return opt if case.kind == "optimizer" else optax.chain(opt, optax.scale(-REF_LR))


class Shape(tuple):
  """A leaf shape in a tree of shapes (where plain tuples are containers)."""


def is_shape(x):
  return isinstance(x, Shape)


def random_tree(seed, shapes, dtype=jnp.float32, scale=1.0):
  rng = np.random.default_rng(seed)
  def leaf(shape):
    x = scale * rng.normal(size=shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
      x = x + 1j * scale * rng.normal(size=shape)
    return jnp.asarray(x, dtype)
  return jax.tree.map(leaf, shapes, is_leaf=is_shape)


def run(opt, params, grads_seq, jit=True):
  """Applies `opt` to `params` with each gradient of `grads_seq`: (params, state, last updates)."""
  state = opt.init(params)
  update = jax.jit(opt.update) if jit else opt.update
  updates = None
  for grads in grads_seq:
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params, state, updates


def run_under_shard_map(opt, mesh, spec, params, grads_seq):
  """The parameters after `opt`'s updates with each gradient of `grads_seq`, every array split over
  `mesh` by `spec` inside one jitted `shard_map`."""

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
  def steps(p, gs):
    state = opt.init(p)
    for g in gs:
      updates, state = opt.update(g, state, p)
      p = optax.apply_updates(p, updates)
    return p

  return jax.jit(steps)(params, grads_seq)


def assert_trees_close(actual, desired, rtol=1e-6, atol=1e-7, err_msg=""):
  assert jax.tree.structure(actual) == jax.tree.structure(desired), (
      f"{jax.tree.structure(actual)} != {jax.tree.structure(desired)}")
  for (path, a), d in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(desired)):
    np.testing.assert_allclose(np.asarray(a, np.complex128), np.asarray(d, np.complex128),
                               rtol=rtol, atol=atol,
                               err_msg=f"{err_msg} {jax.tree_util.keystr(path)}")


def _split(tree, keys):
  """The sub-dict of `tree` with `keys`."""
  return {k: tree[k] for k in keys}


def assert_finite(tree, what):
  for path, x in jax.tree_util.tree_leaves_with_path(tree):
    if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact):
      assert np.all(np.isfinite(np.asarray(x, np.complex128))), (
          f"{what}: non-finite values in {jax.tree_util.keystr(path)}")


def shape_dtypes(tree):
  return jax.tree.map(lambda x: (jnp.shape(x), jnp.asarray(x).dtype), tree)


SHAPES = {"k": Shape((4, 3)), "b": Shape((3,))}
NESTED = {"a": {"k": Shape((4, 3)), "b": Shape((3,))}, "c": [Shape((2, 2, 3)), (Shape((2,)),)]}


# --- the battery ----------------------------------------------------------------------------------

def _public_names():
  names = {n for n in optim.__all__}
  names |= {f"compression.{n}" for n in compression.__all__}
  # Public attributes missing from __all__ are caught too.
  for prefix, module in (("", optim), ("compression.", compression)):
    for n in dir(module):
      obj = getattr(module, n)
      if not n.startswith("_") and getattr(obj, "__module__", "").startswith("lbjax.optim"):
        names.add(prefix + n)
  return names


def _case_name(case):
  return ("compression." if case.factory.__module__.startswith(compression.__name__) else "") + case.name


def test_every_public_name_is_classified():
  tested = {_case_name(c) for c in CASES}
  public = _public_names()
  missing = sorted(public - tested - set(NOT_TRANSFORMS))
  assert not missing, (
      f"public names of lbjax.optim neither in the battery nor in NOT_TRANSFORMS: {missing}. "
      "Add a Case to tests/optim/test_battery.py (or list the name in NOT_TRANSFORMS with why).")
  stale = sorted((tested | set(NOT_TRANSFORMS)) - public)
  assert not stale, f"battery entries that are no longer public names: {stale}"


@battery
def test_factory_documents_formula_and_references(case):
  doc = inspect.getdoc(case.factory) or ""
  assert "References:" in doc, f"{case.name}: docstring has no References: section"
  # Lecture slides (papers/004) number no equations: the slide holding the equation is named.
  assert re.search(r"\b([Ee]q\.|eq \d|Algorithm|equation|Lemma|Theorem)", doc), (
      f"{case.name}: docstring names no equation or algorithm of its paper")


@battery
def test_jit_equals_eager(case):
  params = random_tree(0, {"k": SHAPES["k"]})
  grads = random_tree(1, {"k": SHAPES["k"]}, scale=0.1)
  opt = case.make()
  state = opt.init(params)
  assert_trees_close(jax.jit(opt.init)(params), state)
  assert_trees_close(jax.jit(opt.update)(grads, state, params), opt.update(grads, state, params),
                     rtol=1e-5, atol=1e-7)


@battery
def test_empty_tree(case):
  opt = case.make()
  state = jax.jit(opt.init)({})
  updates, _ = jax.jit(opt.update)({}, state, {})
  assert updates == {}


@battery
def test_nested_tree_and_no_retrace(case):
  """Nested dicts, lists and tuples keep their structure, shapes and dtypes (updates and state), and
  a jitted step is traced once over three updates (optax: no recompile on the second update)."""
  traces = []
  opt = case.make()

  @jax.jit
  def step(params, state, grads):
    traces.append(1)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, updates

  params = random_tree(0, NESTED)
  state = opt.init(params)
  initial_state = shape_dtypes(state)
  for t in range(3):
    params, state, updates = step(params, state, random_tree(1 + t, NESTED, scale=0.1))
  assert len(traces) == 1, f"{case.id}: the update was traced {len(traces)} times in 3 steps"
  assert jax.tree.structure(updates) == jax.tree.structure(params)
  assert shape_dtypes(updates) == shape_dtypes(params)
  assert shape_dtypes(state) == initial_state
  assert_finite((params, updates), case.id)


@battery
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "complex64"])
def test_dtypes_are_preserved(case, dtype):
  """Updates have the gradients' dtype; the state keeps its shapes and dtypes across updates (as
  optax's test_preserve_dtype and test_state_shape_dtype_shard_stability)."""
  dtype = jnp.dtype(dtype)
  params = random_tree(0, SHAPES, dtype)
  grads = random_tree(1, SHAPES, dtype, scale=0.1)
  opt = case.make()
  state = jax.jit(opt.init)(params)
  if dtype == jnp.complex64 and not case.complex_ok:
    with pytest.raises(TypeError, match="complex"):
      jax.jit(opt.update)(grads, state, params)
    return
  update = jax.jit(opt.update)
  updates, new_state = update(grads, state, params)
  updates, newer_state = update(grads, new_state, params)
  assert jax.tree.map(lambda u: u.dtype, updates) == jax.tree.map(lambda g: g.dtype, grads)
  assert shape_dtypes(new_state) == shape_dtypes(state)
  assert shape_dtypes(newer_state) == shape_dtypes(state)
  new_params = optax.apply_updates(params, updates)
  assert jax.tree.map(lambda p: p.dtype, new_params) == jax.tree.map(lambda p: p.dtype, params)
  assert_finite((updates, newer_state), case.id)
  if case.layerwise:  # the layer rates are real, float32 or wider
    for rate in jax.tree.leaves(optim.trust_ratios(newer_state)):
      assert rate.dtype == jnp.float32


def parabola(dtype):
  """optax's `_setup_parabola`: sum |x - x*|^2, x* scaled by 1 + 1j for complex."""
  x0 = jnp.array([-1.0, 10.0, 1.0], dtype)
  target = jnp.array([1.0, -1.0, 1.0], dtype)
  if jnp.iscomplexobj(x0):
    target = target * (1 + 1j)
  return x0, target, lambda x: jnp.sum(jnp.abs(x - target) ** 2)


def rosenbrock(dtype):
  """optax's `_setup_rosenbrock`: |a - x0|^2 + 100 |x1 - x0^2|^2, a = 1 (1 + 1j for complex)."""
  a = 1.0 + 1j if jnp.issubdtype(dtype, jnp.complexfloating) else 1.0
  x0 = jnp.zeros(2, dtype)
  target = jnp.array([a, a**2], dtype)
  return x0, target, lambda x: jnp.abs(a - x[0]) ** 2 + 100 * jnp.abs(x[1] - x[0] ** 2) ** 2


@battery
@pytest.mark.parametrize("target", [parabola, rosenbrock], ids=["parabola", "rosenbrock"])
@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_convergence(case, target, dtype):
  if dtype == "complex64" and not case.complex_ok:
    pytest.skip(f"{case.name} does not support complex gradients (a TypeError: test_dtypes)")
  opt = case.make(**case.converge)
  if case.kind != "optimizer":
    opt = optax.chain(opt, optax.sgd(decay(case.tail_lr), momentum=0.9))
  x0, target_x, objective = target(jnp.dtype(dtype))

  def step(carry, _):
    x, state = carry
    # Complex gradients are conjugated before being added to the parameters, as in optax.
    grad = jnp.conj(jax.grad(objective)(x))
    updates, state = opt.update(grad, state, x)
    return (optax.apply_updates(x, updates), state), None

  @jax.jit
  def solve(x):
    (x, _), _ = jax.lax.scan(step, (x, opt.init(x)), None, length=STEPS)
    return x

  x = solve(x0)
  assert x.dtype == x0.dtype
  np.testing.assert_allclose(x, target_x, rtol=3e-2, atol=3e-2)


@battery
def test_inject_hyperparams(case):
  params = random_tree(0, SHAPES)
  grads_seq = [random_tree(1 + t, SHAPES, scale=0.1) for t in range(2)]
  injected = optax.inject_hyperparams(case.factory, static_args=case.static_args)(**case.kwargs)
  want_params, want_state, _ = run(case.make(), params, grads_seq)
  got_params, got_state, _ = run(injected, params, grads_seq)
  # Injected hyper-parameters are float32 arrays where the plain transform computes with Python
  # floats (b2 = 0.999 rounds): agreement to float32 rounding, not bit for bit.
  assert_trees_close(got_params, want_params, rtol=1e-5)
  assert_trees_close(got_state.inner_state, want_state, rtol=1e-4)
  if "learning_rate" in got_state.hyperparams:  # the injected LR is the one used
    state = injected.init(params)
    state.hyperparams["learning_rate"] = 2 * state.hyperparams["learning_rate"]
    doubled, _ = jax.jit(injected.update)(grads_seq[0], state, params)
    single, _ = jax.jit(injected.update)(grads_seq[0], injected.init(params), params)
    assert_trees_close(doubled, jax.tree.map(lambda u: 2 * u, single), rtol=1e-6)


@battery
def test_multisteps_equals_one_step_on_the_mean_gradient(case):
  params = random_tree(0, SHAPES)
  micro = [random_tree(1 + i, SHAPES, scale=0.1) for i in range(6)]
  means = [jax.tree.map(lambda *g: sum(g) / 3, *micro[i:i + 3]) for i in (0, 3)]
  want, _, _ = run(case.make(), params, means)
  got, _, _ = run(optax.MultiSteps(case.make(), every_k_schedule=3), params, micro)
  assert_trees_close(got, want, rtol=1e-5, atol=1e-6)


SHARDED_SHAPES = {"w": Shape((16, 3)), "s": Shape((8, 2, 2)), "b": Shape((8,))}


@battery
def test_shard_map_equals_global(case):
  """Layer-wise transforms: parameters split over 8 devices, norms reduced with `axis_name`, equal
  to the unsharded computation. Compressors: `compressed_pmean` of per-device gradients equals the
  mean of the per-device decodes (computed under `vmap` with the same axis name)."""
  assert len(jax.devices()) >= 8, "tests/conftest.py sets JAX_NUM_CPU_DEVICES=8 before jax starts"
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  params = random_tree(0, SHARDED_SHAPES)
  if case.kind == "compressor":
    local = random_tree(1, {k: Shape((8,) + SHARDED_SHAPES[k]) for k in ("w", "b")}, scale=0.1)
    comp = case.make(**({"axis_name": "data"} if case.name in ("qsgd", "powersgd") else {}))
    state = comp.init(_split(params, ["w", "b"]))
    per_device = jax.vmap(lambda g: comp.update(g, state)[0], axis_name="data")(local)
    want = jax.tree.map(lambda u: u.mean(0), per_device)

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("data"), out_specs=P())
    def reduce(g):
      return compression.compressed_pmean(jax.tree.map(lambda x: x[0], g), state, comp, "data")[0]

    assert_trees_close(jax.jit(reduce)(local), want, rtol=1e-5, atol=1e-7)
    return

  grads_seq = [random_tree(1 + t, SHARDED_SHAPES, scale=0.1) for t in range(2)]
  want, _, _ = run(case.make(), params, grads_seq)
  got = run_under_shard_map(case.make(**case.sharded), mesh, P("data"), params, grads_seq)
  assert_trees_close(got, want, rtol=1e-5, atol=1e-7)


MASK = {"k": True, "b": False, "k2": False}
MASK_SHAPES = {"k": Shape((4, 3)), "b": Shape((3,)), "k2": Shape((2, 3))}


@battery(only=lambda case: case.has_mask)
def test_mask_argument(case):
  """`mask` as a pytree and as a callable agree; a selected leaf gets the transform, exactly as if
  it were alone; a leaf left out gets the base update (momentum SGD, Adam or the identity); the
  default mask leaves 1-D leaves out.
  """
  params = random_tree(0, MASK_SHAPES)
  grads_seq = [random_tree(1 + t, MASK_SHAPES, scale=0.1) for t in range(2)]
  sub = lambda keys: (_split(params, keys), [_split(g, keys) for g in grads_seq])
  got, state, _ = run(case.make(mask=MASK), params, grads_seq)  # "k" selected
  by_callable, _, _ = run(case.make(mask=lambda p: MASK), params, grads_seq)
  by_regex, _, _ = run(case.make(mask="^k$"), params, grads_seq)  # on the leaves' names: k, b, k2
  by_default, default_state, _ = run(case.make(), params, grads_seq)  # "k", "k2" selected
  alone, _, _ = run(case.make(mask=select_all), *sub(["k", "k2"]))
  base, _, _ = run(case.base(case.kwargs), *sub(["b", "k2"]))
  assert_trees_close(by_callable, got, rtol=0, atol=0)
  assert_trees_close(by_regex, got, rtol=0, atol=0)
  assert_trees_close(_split(got, ["k"]), _split(alone, ["k"]), rtol=1e-6)
  assert_trees_close(_split(got, ["b", "k2"]), base, rtol=1e-6)
  assert_trees_close(_split(by_default, ["k", "k2"]), alone, rtol=1e-6)
  assert_trees_close(_split(by_default, ["b"]), _split(base, ["b"]), rtol=1e-6)
  if case.layerwise:
    ratios = optim.trust_ratios(state)
    assert np.isfinite(ratios["k"]) and np.isnan(ratios["b"]) and np.isnan(ratios["k2"])
    default_ratios = optim.trust_ratios(default_state)
    assert np.isfinite(default_ratios["k"]) and np.isfinite(default_ratios["k2"])
    assert np.isnan(default_ratios["b"])


@battery
def test_optax_masked(case):
  """Under `optax.masked`, left-out leaves pass through and selected ones are transformed as if
  they were alone."""
  params = random_tree(0, MASK_SHAPES)
  grads_seq = [random_tree(1 + t, MASK_SHAPES, scale=0.1) for t in range(2)]
  _, _, updates = run(optax.masked(case.make(), MASK), params, grads_seq)
  _, _, alone = run(case.make(), _split(params, ["k"]), [_split(g, ["k"]) for g in grads_seq])
  assert_trees_close(_split(updates, ["k"]), alone, rtol=1e-6)
  assert_trees_close(_split(updates, ["b", "k2"]), _split(grads_seq[-1], ["b", "k2"]), rtol=0,
                     atol=0)


REF_SHAPES = {"conv": Shape((3, 3, 4, 8)), "dense": Shape((16, 8)), "bias": Shape((8,))}


@battery
def test_several_steps_match_the_numpy_reference(case):
  if case.reference is None:
    pytest.skip(f"{case.id} is stochastic: no NumPy reference (moments in test_compression.py)")
  params = random_tree(0, REF_SHAPES)
  grads_seq = [random_tree(10 + t, REF_SHAPES, scale=0.01 * (t + 1)) for t in range(4)]
  got, _, _ = run(stepper(case), params, grads_seq)
  np_params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  np_grads = [{k: np.asarray(v, np.float64) for k, v in g.items()} for g in grads_seq]
  want = case.reference(case, np_params, np_grads)
  for k in REF_SHAPES:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{case.id} {k}")


@battery
def test_zero_parameters_and_gradients_stay_finite(case):
  zeros = jax.tree.map(jnp.zeros, SHAPES, is_leaf=is_shape)
  nonzero = random_tree(1, SHAPES)
  for grads in (zeros, nonzero):
    params, state, updates = run(case.make(), zeros, [grads] * 3)
    assert_finite((params, state, updates), f"{case.id} with zero parameters")


# --- bad arguments: refused when built (or at the first update), naming the argument ---------------

BAD_VALUES = {
    "learning_rate": [-0.1, float("nan"), float("inf")],
    "momentum": [-0.1, 1.0, float("nan")],
    "weight_decay": [-1e-4, float("nan")],
    "trust_coefficient": [0.0, -1e-3, float("inf")],
    "b1": [1.0, -0.1],
    "b2": [1.0, -0.1],
    "eps": [-1.0],
    "eps_root": [-1.0],
}


def numeric_hyperparameters(case):
  """The names of `case`'s numeric arguments (each must have bad values in `BAD_VALUES`)."""
  names = [k for k, v in case.kwargs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
  assert set(names) <= set(BAD_VALUES), f"add bad values for {set(names) - set(BAD_VALUES)}"
  return names


@battery(only=lambda case: case.kind != "compressor")
def test_bad_hyperparameter_values_are_refused_when_built(case):
  for name in numeric_hyperparameters(case):
    for value in BAD_VALUES[name]:
      with pytest.raises(ValueError, match=f"{name} must"):
        case.make(**{name: value})
  if "learning_rate" in case.kwargs:
    with pytest.raises(TypeError, match="learning_rate must be a scalar number or a schedule"):
      case.make(learning_rate="0.1")


@battery(only=lambda case: case.kind != "compressor")
def test_a_schedule_where_a_number_is_needed_is_refused_when_built(case):
  """Only the learning rate is a schedule of the step count; any other hyper-parameter given one
  (which would fail deep in the first update) is refused, pointing to `optax.inject_hyperparams`."""
  for name in numeric_hyperparameters(case):
    if name != "learning_rate":
      with pytest.raises(TypeError, match=f"{name} must be a number, not a schedule.*inject_hyperparams"):
        case.make(**{name: optax.constant_schedule(0.5)})


@battery(only=lambda case: case.has_mask)
@pytest.mark.parametrize("mask, message", [
    ({"k": True}, "mask must have the same tree structure as the parameters"),
    (lambda params: jax.tree.map(lambda _: "yes", params), "mask for leaf .* must be a Python bool"),
    (lambda params: True, "mask must have the same tree structure as the parameters"),
    ("k(", r"mask 'k\(' is not a regular expression \(missing \), unterminated subpattern"),
    ("^kernel$", "mask '\\^kernel\\$' matches no parameter; their names: b, k, k2."),
], ids=["structure", "leaves", "callable-structure", "regex", "regex-matching-nothing"])
@pytest.mark.parametrize("weight_decay", [None, 0.0], ids=["decay", "no_decay"])
def test_bad_mask_is_a_clear_error(case, mask, message, weight_decay):
  """Also where weight_decay=0 leaves momentum()'s mask unused (it was silently accepted)."""
  overrides = {} if weight_decay is None or "weight_decay" not in case.kwargs else {"weight_decay": weight_decay}
  params = random_tree(0, MASK_SHAPES)
  with pytest.raises(ValueError, match=message):
    run(case.make(mask=mask, **overrides), params, [params])


def _takes_axis_name(case):
  return case.kind != "compressor" and "axis_name" in str(case.sharded)


@battery(only=_takes_axis_name)
def test_axis_name_where_no_such_axis_is_bound_is_a_clear_error(case):
  """Outside shard_map/pmap (eagerly or under jit), or inside a shard_map over other mesh axes: not
  JAX's "unbound axis name" (or, inside shard_map, a bare AssertionError) from deep in the update."""
  params = random_tree(0, SHARDED_SHAPES)
  opt = case.make(**case.sharded)  # axis_name="data"
  state = opt.init(params)
  message = r"axis 'data' is not bound here.*jax.shard_map.*axis_name=None"
  for update in (opt.update, jax.jit(opt.update)):
    with pytest.raises(ValueError, match=message):
      update(params, state, params)
  mesh = Mesh(np.array(jax.devices()[:1]), ("other",))
  in_shard_map = jax.shard_map(lambda g, s, p: opt.update(g, s, p)[0], mesh=mesh, in_specs=P(), out_specs=P())
  with pytest.raises(ValueError, match=message):
    in_shard_map(params, state, params)


@battery(only=lambda case: case.kind != "compressor"
         and "axis_name" in inspect.signature(case.factory).parameters)
def test_axis_name_of_the_wrong_type_is_refused_when_built(case):
  with pytest.raises(TypeError, match="axis_name must be None, a mesh axis name"):
    case.make(axis_name=0)


@battery(only=lambda case: "nesterov" in inspect.signature(case.factory).parameters)
def test_a_nesterov_that_is_not_a_bool_is_refused_when_built(case):
  """A string from a config ("False") would otherwise count as True."""
  with pytest.raises(TypeError, match="nesterov must be True or False"):
    case.make(nesterov="False")
