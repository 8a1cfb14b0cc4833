"""How busy the device was in a `jax.profiler` trace: the loop-versus-step question, read from the trace.

A trace of training steps holds, per device, the kernels it ran (XSpace planes `/device:GPU:<n>` or
`/device:TPU:<n>`; on the CPU backend, XLA's thunks on the host's threads, events carrying an `hlo_op`
stat). The union of their intervals over the traced wall time is the fraction of the time the device
computed; `1 - busy` is what the host cost: dispatch, input, metrics, waits. A loop that keeps the device
fed reads near 1, one that does not shows its host overhead directly, without timing a bare step to compare.

On a device plane the kernel-level lines count (a GPU's streams, a TPU's `XLA Ops`), not the lines the
profiler derives from them that span the gaps between kernels (`XLA Modules`, `Steps`, ...).

Reads the trace with `jax.profiler.ProfileData` (jax 0.10 and later).
"""

import dataclasses
import pathlib
from typing import Iterable, Iterator

from jax.profiler import ProfileData

DEVICE_PLANE_PREFIXES = ("/device:GPU:", "/device:TPU:")
HOST_PLANE = "/host:CPU"
# Lines the profiler derives on a device plane from its kernels: each event spans a module, a step, a
# framework op or a source line, gaps between kernels included, so they would count idle time as busy.
DERIVED_LINES = frozenset({"Steps", "XLA Modules", "Framework Ops", "Framework Name Scope", "Source code",
                           "Launch Stats", "Async XLA Ops", "Host Offload Ops", "_counters_", "Sparse Core Steps",
                           "Sparse Core Modules", "Sparse Core Ops"})
KERNEL_LINE = "XLA Ops"  # where a device plane has it (TPUs), the kernel-level line


@dataclasses.dataclass(frozen=True)
class DeviceBusy:
  """The device time of one trace.

  Attributes:
    device_kind: "gpu", "tpu" or "cpu" (XLA's thunks on the host, the CPU backend).
    devices: the device planes with kernels (1 on the CPU backend).
    busy_seconds: per device, the union of its kernels' intervals, in seconds (the mean over devices).
    kernels: the kernel events read, over all devices.
  """
  device_kind: str
  devices: int
  busy_seconds: float
  kernels: int


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
  """The length of the union of `(start_ns, duration_ns)` intervals, in seconds."""
  total, end = 0.0, float("-inf")
  for start, duration in sorted(intervals):
    stop = start + duration
    if stop <= end:
      continue
    total += stop - max(start, end)
    end = stop
  return total * 1e-9


def _device_kernels(plane) -> list[tuple[float, float]]:
  lines = {line.name: line for line in plane.lines}
  chosen = [lines[KERNEL_LINE]] if KERNEL_LINE in lines else [
      line for name, line in lines.items() if name not in DERIVED_LINES]
  return [(event.start_ns, event.duration_ns) for line in chosen for event in line.events]


def _host_thunks(plane) -> Iterator[tuple[float, float]]:
  for line in plane.lines:
    for event in line.events:
      if any(name == "hlo_op" for name, _ in event.stats):
        yield event.start_ns, event.duration_ns


def device_busy(profile: ProfileData, platform: str) -> DeviceBusy | None:
  """The device time of `profile`, a trace of devices of `platform` ("cpu", "gpu", "tpu"); None when it holds
  none (on a GPU the profiler records kernels only where NVIDIA's CUPTI library loads)."""
  planes = list(profile.planes)
  if platform == "cpu":
    host = next((plane for plane in planes if plane.name == HOST_PLANE), None)
    thunks = list(_host_thunks(host)) if host is not None else []
    return DeviceBusy("cpu", 1, union_seconds(thunks), len(thunks)) if thunks else None
  devices = [plane for plane in planes if plane.name.startswith(DEVICE_PLANE_PREFIXES)]
  kernels = [k for k in map(_device_kernels, devices) if k]
  if not kernels:
    return None
  kind = "gpu" if devices[0].name.startswith("/device:GPU:") else "tpu"
  return DeviceBusy(kind, len(kernels), sum(map(union_seconds, kernels)) / len(kernels), sum(map(len, kernels)))


def latest_trace_file(log_dir: str | pathlib.Path) -> pathlib.Path | None:
  """The newest `*.xplane.pb` that `jax.profiler.stop_trace` wrote under `log_dir` (`plugins/profile/<time>/`)."""
  files = sorted(pathlib.Path(log_dir).glob("plugins/profile/*/*.xplane.pb"), key=lambda path: path.stat().st_mtime)
  return files[-1] if files else None


def read_device_busy(xplane_file: str | pathlib.Path, platform: str) -> DeviceBusy | None:
  """`device_busy` of the trace file `xplane_file`."""
  return device_busy(ProfileData.from_file(str(xplane_file)), platform)
