"""Where metrics go: JSON lines in the workdir (always), TensorBoard (optional), a console line.

Only process 0 writes. Values arrive as host numbers (the loop fetches device metrics in one
`jax.device_get` every `log_every` steps, one step after the window closed), so writing never syncs
with the device.
"""

import json
import math
import pathlib
import sys
import time
from typing import Any, TextIO

import numpy as np


def _plain(value: Any) -> Any:
  """JSON-friendly numbers: numpy scalars to Python, non-finite floats to strings."""
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricsWriter:
  """Appends one JSON object per record to `<workdir>/metrics.jsonl`; optionally mirrors scalars to
  TensorBoard event files in `<workdir>/tensorboard` (needs the `tensorboard` extra)."""

  def __init__(self, workdir: str | pathlib.Path, *, enabled: bool = True, tensorboard: bool = False):
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self._enabled = enabled
    self._file: TextIO | None = None
    self._tensorboard = None
    if enabled:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._file = self.path.open("a")
      if tensorboard:
        try:
          from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
        except ImportError as e:
          raise ImportError("config.tensorboard=True needs tensorboardX: pip install 'lbjax[tensorboard]'"
                            ) from e
        self._tensorboard = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

  def set_aside(self) -> pathlib.Path | None:
    """Moves the records already in `metrics.jsonl` to `metrics.jsonl.<UTC time>.earlier` and starts the file
    anew; returns where they went (None if there were none). For a run that starts from step 0 in a workdir
    where an earlier run wrote records but left no checkpoint: its curves would be mixed with this run's."""
    if not self._enabled or not self.path.exists() or self.path.stat().st_size == 0:
      return None
    self._file.close()
    aside = self.path.with_name(f"{self.path.name}.{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.earlier")
    self.path.replace(aside)
    self._file = self.path.open("a")
    return aside

  def truncate_after(self, step: int) -> int:
    """Drops the records of steps after `step` (a resumed run redoes them); returns how many it dropped.

    A line cut short by a crash is dropped too. The file is rewritten atomically (a new file renamed
    over the old one).
    """
    if not self._enabled or not self.path.exists():
      return 0
    kept, dropped = [], 0
    for line in self.path.read_text().splitlines():
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        dropped += 1
        continue
      if isinstance(record, dict) and int(record.get("step", 0)) > step:
        dropped += 1
        continue
      kept.append(line)
    if dropped:
      self._file.close()
      temporary = self.path.with_suffix(".jsonl.tmp")
      temporary.write_text("".join(line + "\n" for line in kept))
      temporary.replace(self.path)
      self._file = self.path.open("a")
    return dropped

  def records(self, kind: str) -> list[tuple[int, dict[str, float]]]:
    """The `(step, values)` of the file's `kind` records, in file order ([] if none)."""
    if not self._enabled or not self.path.exists():
      return []
    found = []
    for line in self.path.read_text().splitlines():
      record = json.loads(line)
      if record.get("kind") == kind:
        found.append((record["step"], {k: v for k, v in record.items() if k not in ("kind", "step", "epoch", "final")}))
    return found

  def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
    """Writes a record `{"kind": kind, "step": step, **values}`."""
    if not self._enabled:
      return
    record = {"kind": kind, "step": int(step), **{k: _plain(v) for k, v in values.items()}}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._tensorboard is not None:
      for name, value in values.items():
        if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
          self._tensorboard.add_scalar(f"{kind}/{name}", float(value), int(step))

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tensorboard is not None:
      self._tensorboard.close()


class ProgressLine:
  """The console: a progress line per log interval (epoch, step, loss, LR, batch size, examples/s and
  an ETA that respects both stop rules, epochs and steps), one line per evaluation, and a summary.
  `stream`: where the lines go; default the `sys.stdout` of the moment the run starts (so
  `contextlib.redirect_stdout` and a notebook's output capture take them)."""

  def __init__(self, num_epochs: float, num_steps: int = 0, *, enabled: bool = True, stream: TextIO | None = None):
    self._num_epochs = num_epochs
    self._num_steps = num_steps
    self._enabled = enabled
    self._stream = sys.stdout if stream is None else stream
    self._start = time.perf_counter()
    self._excluded: list[tuple[float, float]] = []  # host time kept out of the throughput (`exclude`)
    self.reset_window(0, 0.0, 0)

  def reset_window(self, examples_seen: int, epoch: float, step: int = 0) -> None:
    """Starts a new throughput window (after compilation, evaluation or a restore)."""
    self._last = (time.perf_counter(), examples_seen, epoch, step)

  def exclude(self, start: float, end: float) -> None:
    """Keeps the time from `start` to `end` (`time.perf_counter()`) out of the examples/s of the window that
    holds it, whether or not that window is still open (the loop shows a window one step after it closed)."""
    self._excluded.append((start, end))

  def _eta(self, elapsed: float, epoch: float, step: int) -> float:
    _, _, last_epoch, last_step = self._last
    candidates = []
    if epoch > last_epoch:
      candidates.append(max(self._num_epochs - epoch, 0.0) * elapsed / (epoch - last_epoch))
    if self._num_steps and step > last_step:
      candidates.append(max(self._num_steps - step, 0) * elapsed / (step - last_step))
    return min(candidates) if candidates else math.inf

  def show(self, step: int, epoch: float, examples_seen: int, loss: float, learning_rate: float = math.nan,
           batch_size: int = 0, *, now: float | None = None) -> float:
    """Prints the line and returns the examples/s measured since the last call.

    `now`: the `time.perf_counter()` at the end of the window (default: now), for a window shown
    after it ended (the loop fetches its metrics one step late).
    """
    now = time.perf_counter() if now is None else now
    excluded = sum(max(0.0, min(end, now) - max(start, self._last[0])) for start, end in self._excluded)
    self._excluded = [(start, end) for start, end in self._excluded if end > now]
    elapsed = max(now - self._last[0] - excluded, 1e-9)
    rate = (examples_seen - self._last[1]) / elapsed
    eta = self._eta(elapsed, epoch, step)
    self._last = (now, examples_seen, epoch, step)
    if self._enabled:
      eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if math.isfinite(eta) else "?"
      steps = f"/{self._num_steps}" if self._num_steps else ""
      print(f"epoch {epoch:7.3f}/{self._num_epochs:g} | step {step:>7d}{steps} | loss {loss:.4f} | "
            f"lr {learning_rate:.4g} | batch {batch_size} | {rate:,.0f} ex/s | ETA {eta_text}",
            file=self._stream, flush=True)
    return rate

  def evaluation(self, step: int, epoch: float, metrics: dict[str, float], split: str) -> None:
    if self._enabled:
      shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
      print(f"eval  epoch {epoch:7.3f} | step {step:>7d} | {split}: {shown}", file=self._stream, flush=True)

  def summary(self, *, step: int, epoch: float, examples_seen: int, final: dict[str, float],
              best: dict[str, float], preempted: bool) -> None:
    if not self._enabled:
      return
    elapsed = time.perf_counter() - self._start
    status = "preempted: checkpoint saved, rerun the same command to resume" if preempted else "done"
    lines = [f"{status}: step {step}, epoch {epoch:.3f}, {time.strftime('%H:%M:%S', time.gmtime(elapsed))} "
             f"in this process, {examples_seen / max(elapsed, 1e-9):,.0f} examples/s overall"]
    if final:
      lines.append("final   " + "  ".join(f"{k} {v:.4f}" for k, v in final.items()))
    if best:
      lines.append("best    " + "  ".join(f"{k} {v:.4f}" for k, v in best.items()))
    print("\n".join(lines), file=self._stream, flush=True)
