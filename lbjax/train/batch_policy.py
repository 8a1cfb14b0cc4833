"""Who chooses the batch size: `config.batch.policy` = "fixed" | "schedule" | "adaptive".

"schedule" (the default) follows `config.batch_sizes` at `config.batch_size_boundaries` (papers/002), or
`config.batch_size`; "fixed" keeps `config.batch_size`; "adaptive" sets the batch from the gradient noise
scale B_noise = tr(Sigma)/|G|^2 (McCandlish et al. 2018, appendix A.1), with the learning rate from the
scaling rule or AdaScale (Johnson et al. 2020). Every policy logs a `batch` record (noise scale,
statistical efficiency, goodput). The rules, when the host waits for the device, and what a checkpoint
keeps so a resumed run decides as an unbroken one: docs/design.md, "Who chooses the batch".
"""

from collections.abc import Mapping
import math
import time
from typing import Any

import jax
import numpy as np

from lbjax.schedules import adaptive_batch
from lbjax.train.batch_plan import BatchPlan
from lbjax.train.optimizer import LearningRate


class BatchPolicy:
  """The batch size and learning rate of each step, and the noise-scale record of the run.

  `batch_size(epoch)` and `learning_rate(epoch, batch_size)` give the next step's; `after_step` takes
  the step's metrics (device arrays) and, every `adapt_every` steps, folds their noise-scale
  estimates into the averages, decides (adaptive) and queues a `batch` record: at once under the
  adaptive policy, at the next step (or `complete_records`) under the others.
  `state_dict`/`load_state_dict` carry everything a resumed run needs to decide the same.
  """

  def __init__(self, plan: BatchPlan, learning_rate: LearningRate):
    self.plan = plan
    self.policy = plan.policy
    self.base_batch_size = learning_rate.base_batch_size
    self.decay = plan.ema_decay
    self.every = plan.adapt_every
    self.adascale = plan.adascale
    self._schedule = plan.schedule()
    self._learning_rate = learning_rate
    self.average = adaptive_batch.NoiseScaleAverage()
    self.current = plan.first  # adaptive: the batch in force
    self.gain = 1.0  # adascale: the gain in force
    self.scale_invariant_epoch = 0.0  # adascale: progress in base-batch epochs
    self._pending: list[tuple[int, Any, Any]] = []  # (step, |G|^2, tr(Sigma)) estimates not yet folded
    self._due: tuple[int, int, float, float, Any] | None = None  # a record whose step's results are awaited
    self._window = (time.perf_counter(), 0)  # (start time, examples) of the current record window
    self._wall = (time.perf_counter(), 0.0)  # (start of this process's share, seconds of earlier ones)
    self.records: list[tuple[int, dict[str, Any]]] = []  # (step, `batch` record) not yet written

  def batch_size(self, epoch: float) -> int:
    """The batch of the step that starts at `epoch` (the run's clock before its batch is drawn)."""
    return self.current if self.policy == "adaptive" else self._schedule(epoch)

  def learning_rate(self, epoch: float, batch_size: int) -> float:
    """The LR of the step that starts at `epoch` with `batch_size` in force: the run's `LearningRate`;
    under AdaScale, the gain in force times the base-batch recipe at the scale-invariant epoch."""
    if self.adascale:
      return self.gain * self._learning_rate(self.scale_invariant_epoch, self.base_batch_size)
    return self._learning_rate(epoch, batch_size)

  def noise_scale(self) -> float:
    return self.average.noise_scale(self.decay)

  def progress(self, epoch: float) -> float:
    """Training done, in the epochs `config.num_epochs` counts: under AdaScale the scale-invariant
    epochs tau (Johnson et al. 2020, Algorithm 1 trains until tau reaches the base schedule's
    length), else the data epochs `epoch` (the run's clock)."""
    return self.scale_invariant_epoch if self.adascale else epoch

  def after_step(self, step: int, batch_size: int, start_epoch: float, epoch: float,
                 metrics: Mapping[str, Any]) -> None:
    """Records step `step` (1-based) of `batch_size` examples, which took the clock from `start_epoch`
    to `epoch`.

    Waits for this step's results only under the adaptive policy, at a decision."""
    self.scale_invariant_epoch += self.gain * self.base_batch_size / batch_size * (epoch - start_epoch)
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
      plan = self.plan
      self.current = adaptive_batch.noise_proportional_batch_size(
          noise_scale, multiple=plan.noise_multiple, micro_batch_size=plan.micro_batch_size,
          min_batch_size=plan.smallest_adaptive, max_batch_size=plan.max_batch_size,
          current=self.current, never_shrink=plan.never_shrink)
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

  def __init__(self, writer, policy: BatchPolicy):
    self.writer, self.policy = writer, policy

  def acts_at(self, clock) -> bool:
    del clock
    return False

  def after_step(self, run, metrics) -> None:
    del run, metrics
    for step, record in self.policy.records:
      self.writer.write("batch", step, record)
    self.policy.records.clear()

  def flush(self) -> None:
    """Completes the record still awaiting its step's results and writes it (at the end of the loop)."""
    self.policy.complete_records()
    self.after_step(None, None)
