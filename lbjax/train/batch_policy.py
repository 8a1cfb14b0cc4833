"""Who chooses the batch size: `config.batch.policy` = "fixed" | "schedule" | "adaptive".

"schedule" (the default) follows `config.batch_sizes` at `config.batch_size_boundaries` (papers/002), or
`config.batch_size`; "fixed" keeps `config.batch_size`; "adaptive" sets the batch from the gradient noise
scale B_noise = tr(Sigma)/|G|^2 (McCandlish et al. 2018, appendix A.1), with the learning rate from the
scaling rule or AdaScale (Johnson et al. 2020). Every policy logs a `batch` record (noise scale,
statistical efficiency, goodput). The rules, when the host waits for the device, and what a checkpoint
keeps so a resumed run decides as an unbroken one: docs/design.md, "Who chooses the batch".
"""

import math
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from lbjax.schedules import adaptive_batch
from lbjax.train import config as config_lib
from lbjax.train import optimizer as optimizer_lib
from lbjax.train.errors import ConfigError

POLICIES = ("fixed", "schedule", "adaptive")
LEARNING_RATE_MODES = ("scaling_rule", "adascale")
# Fields only the adaptive policy reads, with their defaults (set away from them elsewhere: refused).
ADAPTIVE_FIELDS = {"min_batch_size": 0, "max_batch_size": 0, "noise_multiple": 1.0, "never_shrink": True,
                   "learning_rate": "scaling_rule"}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def problems(config: ml_collections.ConfigDict, data_parallel_size: int) -> list[str]:
  """Every problem of `config.batch` and its interplay with the batch fields (validation.py)."""
  batch, found = config.batch, []
  if batch.policy not in POLICIES:
    return [f"config.batch.policy={batch.policy!r} is not one of {', '.join(POLICIES)}."]
  micro = batch.micro_batch_size
  if not _is_int(micro) or micro < 0:
    return [f"config.batch.micro_batch_size must be an integer >= 0 (0 = one compiled step per batch size), "
            f"got {micro!r}."]
  if not _is_int(batch.adapt_every) or batch.adapt_every < 1:
    found.append(f"config.batch.adapt_every must be an integer >= 1 (steps), got {batch.adapt_every!r}.")
  if not 0.0 <= batch.ema_decay < 1.0:
    found.append(f"config.batch.ema_decay must be in [0, 1), got {batch.ema_decay!r}.")
  if micro:
    if micro % data_parallel_size:
      found.append(f"config.batch.micro_batch_size={micro} is split over the data-parallel size "
                   f"{data_parallel_size}; use a multiple of {data_parallel_size}.")
    if config.max_device_batch:
      found.append("config.batch.micro_batch_size and config.max_device_batch both split the batch; set "
                   "config.max_device_batch=0 (the micro-batch already bounds the memory).")
  if batch.policy != "adaptive":
    changed = [f"batch.{k}" for k, default in ADAPTIVE_FIELDS.items() if batch[k] != default]
    if changed:
      found.append(f"config.{', config.'.join(changed)} only apply with config.batch.policy='adaptive' "
                   f"(it is {batch.policy!r}); remove them or set the policy.")
  if batch.policy == "fixed" and config.batch_sizes:
    found.append("config.batch.policy='fixed' uses config.batch_size only, but config.batch_sizes is set; "
                 "set config.batch.policy='schedule' for a batch-size schedule.")
  sizes = config_lib.batch_sizes(config)
  if batch.policy == "adaptive":
    found += _adaptive_problems(config)
  elif micro:
    for size in sizes:
      if _is_int(size) and size % micro:
        found.append(f"batch size {size} is not a whole number of micro-batches of "
                     f"config.batch.micro_batch_size={micro}; use a multiple of {micro}.")
  return found


def _adaptive_problems(config: ml_collections.ConfigDict) -> list[str]:
  batch, found = config.batch, []
  micro = batch.micro_batch_size
  if config.batch_sizes:
    found.append("config.batch.policy='adaptive' chooses the batch itself: remove config.batch_sizes and "
                 "config.batch_size_boundaries (config.batch_size is the first batch).")
  if not micro:
    return found + ["config.batch.policy='adaptive' measures the noise from micro-batch gradients: set "
                    "config.batch.micro_batch_size > 0 (e.g. the smallest batch you would use)."]
  low = batch.min_batch_size or config.batch_size
  high = batch.max_batch_size
  if batch.learning_rate not in LEARNING_RATE_MODES:
    found.append(f"config.batch.learning_rate={batch.learning_rate!r} is not one of "
                 f"{', '.join(LEARNING_RATE_MODES)}.")
  if batch.learning_rate == "adascale" and config.scaling.rule != "none":
    found.append(f"config.batch.learning_rate='adascale' scales the LR by its own gain; set "
                 f"config.scaling.rule='none' (got {config.scaling.rule!r}).")
  if not (isinstance(batch.noise_multiple, (int, float)) and batch.noise_multiple > 0):
    found.append(f"config.batch.noise_multiple must be > 0, got {batch.noise_multiple!r}.")
  if not _is_int(high) or high <= 0:
    return found + [f"config.batch.max_batch_size must be set (a positive multiple of the micro-batch "
                    f"{micro}) with the adaptive policy, got {high!r}."]
  for name, value in (("config.batch.min_batch_size", low), ("config.batch.max_batch_size", high),
                      ("config.batch_size", config.batch_size)):
    if not _is_int(value) or value % micro:
      found.append(f"{name}={value!r} is not a whole number of micro-batches of "
                   f"config.batch.micro_batch_size={micro}; use a multiple of {micro}.")
  if _is_int(low) and low < 2 * micro:
    found.append(f"the smallest adaptive batch ({low}) must hold at least 2 micro-batches of {micro}: the "
                 "noise scale needs two batch sizes. Raise config.batch.min_batch_size or lower the micro-batch.")
  if not low <= config.batch_size <= high:
    found.append(f"config.batch_size={config.batch_size} (the first batch) must lie in "
                 f"[config.batch.min_batch_size, config.batch.max_batch_size] = [{low}, {high}].")
  if not found and batch.learning_rate == "scaling_rule":
    try:  # the rule's LR and warm-up at the largest batch must be a valid schedule too (LEGW's warm-up)
      optimizer_lib.learning_rate_schedule(_at_batch_size(config, high))
    except ConfigError as e:
      found.append(f"at config.batch.max_batch_size={high}: {e}")
  return found


def _at_batch_size(config: ml_collections.ConfigDict, batch_size: int) -> ml_collections.ConfigDict:
  """The config as a fixed-batch run at `batch_size` (for its scaled LR schedule)."""
  fixed = ml_collections.ConfigDict(config.to_dict())
  fixed.batch_size = batch_size
  fixed.batch_sizes = ()
  fixed.batch_size_boundaries = ()
  return fixed


class BatchPolicy:
  """The batch size and learning rate of each step, and the noise-scale record of the run.

  `batch_size(epoch)` and `learning_rate(epoch, batch_size)` give the next step's; `after_step` takes
  the step's metrics (device arrays) and, every `adapt_every` steps, folds their noise-scale
  estimates into the averages, decides (adaptive) and queues a `batch` record: at once under the
  adaptive policy, at the next step (or `complete_records`) under the others.
  `state_dict`/`load_state_dict` carry everything a resumed run needs to decide the same.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.policy = config.batch.policy
    self.base_batch_size = config.scaling.base_batch_size
    self.decay = config.batch.ema_decay
    self.every = config.batch.adapt_every
    self.adascale = self.policy == "adaptive" and config.batch.learning_rate == "adascale"
    self._schedule = optimizer_lib.batch_size_schedule(config)
    self._learning_rates: dict[int, Any] = {}
    self._fixed_learning_rate = optimizer_lib.learning_rate_schedule(config)  # "fixed" and "schedule"
    self.average = adaptive_batch.NoiseScaleAverage()
    self.current = config.batch_size  # adaptive: the batch in force
    self.gain = 1.0  # adascale: the gain in force
    self.scale_invariant_epoch = 0.0  # adascale: progress in base-batch epochs
    self._pending: list[tuple[int, Any, Any]] = []  # (step, |G|^2, tr(Sigma)) estimates not yet folded
    self._due: tuple[int, int, float, float, Any] | None = None  # a record whose step's results are awaited
    self._epoch = 0.0  # the clock when the latest batch was chosen
    self._window = (time.perf_counter(), 0)  # (start time, examples) of the current record window
    self._wall = (time.perf_counter(), 0.0)  # (start of this process's share, seconds of earlier ones)
    self.records: list[tuple[int, dict[str, Any]]] = []  # (step, `batch` record) not yet written

  def batch_size(self, epoch: float) -> int:
    """The batch of the step that starts at `epoch` (the run's clock before its batch is drawn)."""
    self._epoch = epoch
    return self.current if self.policy == "adaptive" else self._schedule(epoch)

  def _schedule_at(self, batch_size: int):
    if batch_size not in self._learning_rates:
      self._learning_rates[batch_size] = optimizer_lib.learning_rate_schedule(
          _at_batch_size(self.config, batch_size))
    return self._learning_rates[batch_size]

  def learning_rate(self, epoch: float, batch_size: int) -> float:
    if self.policy != "adaptive":
      return self._fixed_learning_rate(epoch)
    if self.adascale:
      return self.gain * self._schedule_at(self.base_batch_size)(self.scale_invariant_epoch)
    return self._schedule_at(batch_size)(epoch)

  def noise_scale(self) -> float:
    return self.average.noise_scale(self.decay)

  def progress(self, epoch: float) -> float:
    """Training done, in the epochs `config.num_epochs` counts: under AdaScale the scale-invariant
    epochs tau (Johnson et al. 2020, Algorithm 1 trains until tau reaches the base schedule's
    length), else the data epochs `epoch` (the run's clock)."""
    return self.scale_invariant_epoch if self.adascale else epoch

  def after_step(self, step: int, batch_size: int, epoch: float, metrics: dict[str, Any]) -> None:
    """Records step `step` (1-based) of `batch_size` examples, which took the clock to `epoch`.

    Waits for this step's results only under the adaptive policy, at a decision."""
    self.scale_invariant_epoch += self.gain * self.base_batch_size / batch_size * (epoch - self._epoch)
    self.complete_records()  # the previous step's record, if due: its results are ready by now
    if "noise_scale_grad_norm_sq" in metrics:
      self._pending.append((step, metrics["noise_scale_grad_norm_sq"], metrics["noise_scale_trace_sigma"]))
    self._window = (self._window[0], self._window[1] + batch_size)
    if step % self.every:
      return
    self._due = (step, batch_size, epoch, self.scale_invariant_epoch, metrics["learning_rate"])
    if self.policy == "adaptive":
      self.complete_records()

  def _fold_pending(self) -> None:
    """Folds the estimates of the steps up to the due record's (all, when none is due) into the averages."""
    last = self._due[0] if self._due is not None else math.inf
    ready = [(g, t) for step, g, t in self._pending if step <= last]
    for grad_norm_sq, trace_sigma in jax.device_get(ready):
      if np.isfinite(grad_norm_sq) and np.isfinite(trace_sigma):
        self.average = self.average.update(self.decay, float(grad_norm_sq), float(trace_sigma))
    self._pending = [entry for entry in self._pending if entry[0] > last]

  def complete_records(self) -> None:
    """Decides (adaptive) and queues the `batch` record of the due step, waiting for its results."""
    if self._due is None:
      return
    step, batch_size, epoch, scale_invariant_epoch, learning_rate = self._due
    measured = any(entry[0] <= step for entry in self._pending) or self.average.count > 0
    self._fold_pending()
    self._due = None
    noise_scale = self.noise_scale()
    if self.policy == "adaptive":
      batch = self.config.batch
      self.current = adaptive_batch.noise_proportional_batch_size(
          noise_scale, multiple=batch.noise_multiple, micro_batch_size=batch.micro_batch_size,
          min_batch_size=batch.min_batch_size or self.config.batch_size, max_batch_size=batch.max_batch_size,
          current=self.current, never_shrink=batch.never_shrink)
      if self.adascale:
        self.gain = adaptive_batch.adascale_gain(noise_scale, self.current, self.base_batch_size)
    start, examples = self._window
    now = time.perf_counter()
    self._window = (now, 0)
    if not measured:
      return
    grad_norm_sq, trace_sigma = self.average.debiased(self.decay)
    efficiency = adaptive_batch.statistical_efficiency(noise_scale, batch_size, self.base_batch_size)
    examples_per_second = examples / (now - start) if now > start else math.nan
    self.records.append((step, {
        "epoch": epoch, "batch_size": batch_size,
        "next_batch_size": self.current if self.policy == "adaptive" else None,
        "noise_scale": noise_scale, "grad_norm_sq": grad_norm_sq, "trace_sigma": trace_sigma,
        "statistical_efficiency": efficiency,
        "adascale_gain": adaptive_batch.adascale_gain(noise_scale, batch_size, self.base_batch_size),
        "learning_rate": float(jax.device_get(learning_rate)),
        "scale_invariant_epoch": scale_invariant_epoch,
        "examples_per_second": examples_per_second, "goodput": examples_per_second * efficiency,
        "wall_seconds": self.wall_seconds()}))

  def wall_seconds(self) -> float:
    """Wall-clock seconds of the run so far, over all its resumptions (a record only: no decision
    depends on it)."""
    return self._wall[1] + time.perf_counter() - self._wall[0]

  def state_dict(self) -> dict[str, Any]:
    """The controller's state as JSON-ready host numbers (the due record completed and the pending
    estimates folded in first)."""
    self.complete_records()
    self._fold_pending()
    return {"average": list(self.average), "current": self.current, "gain": self.gain,
            "scale_invariant_epoch": self.scale_invariant_epoch, "wall_seconds": self.wall_seconds()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    grad_norm_sq, trace_sigma, count = state["average"]
    self.average = adaptive_batch.NoiseScaleAverage(grad_norm_sq, trace_sigma, count)
    self.current, self.gain = state["current"], state["gain"]
    self.scale_invariant_epoch = state["scale_invariant_epoch"]
    self._wall = (time.perf_counter(), state["wall_seconds"])


class RecordBatchDecisions:
  """A hook: writes the policy's queued `batch` records (noise scale, decision, goodput)."""

  def __init__(self, writer):
    self.writer = writer

  def after_step(self, run, metrics) -> None:
    del metrics
    for step, record in run.batch_policy.records:
      self.writer.write("batch", step, record)
    run.batch_policy.records.clear()

  def flush(self, run) -> None:
    """Completes the record still awaiting its step's results and writes it (at the end of the loop)."""
    run.batch_policy.complete_records()
    self.after_step(run, None)
