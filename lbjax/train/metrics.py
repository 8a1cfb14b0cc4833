"""Where metrics go: JSON lines in the workdir (always), TensorBoard (optional), a console line.

Only process 0 writes. Values arrive as host numbers (the loop fetches device metrics in one
`jax.device_get` every `log_every` steps), so writing never syncs with the device.
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
  """Console progress: step, epoch, loss, examples/s over the last window, ETA."""

  def __init__(self, num_epochs: float, *, enabled: bool = True, stream: TextIO = sys.stdout):
    self._num_epochs = num_epochs
    self._enabled = enabled
    self._stream = stream
    self.reset_window(0, 0.0)

  def reset_window(self, examples_seen: int, epoch: float) -> None:
    """Starts a new throughput window (after compilation, evaluation or a restore)."""
    self._last = (time.perf_counter(), examples_seen, epoch)

  def show(self, step: int, epoch: float, examples_seen: int, loss: float) -> float:
    """Prints the line and returns the examples/s measured since the last call."""
    now = time.perf_counter()
    last_time, last_examples, last_epoch = self._last
    elapsed = max(now - last_time, 1e-9)
    rate = (examples_seen - last_examples) / elapsed
    epochs_per_second = (epoch - last_epoch) / elapsed
    self._last = (now, examples_seen, epoch)
    eta = max(self._num_epochs - epoch, 0.0) / epochs_per_second if epochs_per_second > 0 else math.inf
    if self._enabled:
      eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if math.isfinite(eta) else "?"
      print(f"step {step:>7d} | epoch {epoch:7.3f}/{self._num_epochs:g} | loss {loss:.4f} | "
            f"{rate:,.0f} ex/s | ETA {eta_text}", file=self._stream, flush=True)
    return rate
