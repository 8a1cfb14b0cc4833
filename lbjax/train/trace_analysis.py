"""How busy the device was in a `jax.profiler` trace: the loop-versus-step question, read from the trace.

A trace of training steps holds, per device, the kernels it ran (XSpace planes `/device:GPU:<n>` or
`/device:TPU:<n>`; on the CPU backend, XLA's thunks on the host's threads, events carrying an `hlo_op`
stat). The union of their intervals over the traced wall time is the fraction of the time the device
computed. A device idles between kernels even when the host keeps it fed (a GPU's launch gaps, the CPU
runtime's work between thunks), so a loop's fraction reads against the bare step's, traced the same way
(`benchmarks/loop_trace.py`): what the loop's lacks of it, the host cost (dispatch, input, metrics, waits).

On a device plane the kernel-level lines count (a GPU's streams, a TPU's `XLA Ops`), not the lines the
profiler derives from them that span the gaps between kernels (`XLA Modules`, `Steps`, ...).

Reads the trace with `jax.profiler.ProfileData` (jax 0.10 and later). `summary_lines` gives a trace's
device time and its kernels by total time (`python -m benchmarks.read_trace` prints them for a trace file).
"""

import collections
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

  def per_step(self, steps: int, wall_seconds: float) -> dict[str, object]:
    """The record's fields for a trace of `steps` steps over `wall_seconds`: busy ms and kernels per step,
    and the busy share of the wall time."""
    return {"device_kind": self.device_kind, "device_busy_ms_per_step": 1e3 * self.busy_seconds / steps,
            "device_busy_fraction": self.busy_seconds / wall_seconds, "kernels_per_step": self.kernels / steps}


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


Kernel = tuple[str, float, float]  # (name, start_ns, duration_ns)


def _device_kernels(plane) -> list[Kernel]:
  lines = {line.name: line for line in plane.lines}
  chosen = [lines[KERNEL_LINE]] if KERNEL_LINE in lines else [
      line for name, line in lines.items() if name not in DERIVED_LINES]
  return [(event.name, event.start_ns, event.duration_ns) for line in chosen for event in line.events]


def _host_thunks(plane) -> Iterator[Kernel]:
  for line in plane.lines:
    for event in line.events:
      if any(name == "hlo_op" for name, _ in event.stats):
        yield event.name, event.start_ns, event.duration_ns


def kernels_by_device(profile: ProfileData, platform: str) -> tuple[str, list[list[Kernel]]]:
  """The device kind and, per device with any, its kernels in `profile`, a trace of devices of `platform`
  ("cpu", "gpu", "tpu"; on a CPU, XLA's thunks, as one device)."""
  planes = list(profile.planes)
  if platform == "cpu":
    host = next((plane for plane in planes if plane.name == HOST_PLANE), None)
    thunks = list(_host_thunks(host)) if host is not None else []
    return "cpu", [thunks] if thunks else []
  devices = [plane for plane in planes if plane.name.startswith(DEVICE_PLANE_PREFIXES)]
  kind = "gpu" if devices and devices[0].name.startswith("/device:GPU:") else "tpu"
  return kind, [k for k in map(_device_kernels, devices) if k]


def device_busy(profile: ProfileData, platform: str) -> DeviceBusy | None:
  """The device time of `profile`, a trace of devices of `platform` ("cpu", "gpu", "tpu"); None when it holds
  none (on a GPU the profiler records kernels only where NVIDIA's CUPTI library loads)."""
  kind, kernels = kernels_by_device(profile, platform)
  if not kernels:
    return None
  busy = sum(union_seconds((start, duration) for _, start, duration in k) for k in kernels) / len(kernels)
  return DeviceBusy(kind, len(kernels), busy, sum(map(len, kernels)))


def kernel_totals(profile: ProfileData, platform: str) -> list[tuple[str, int, float]]:
  """Each kernel name's (name, launches, total seconds) over the trace's devices, the longest total first."""
  counts, seconds = collections.Counter(), collections.Counter()
  for device in kernels_by_device(profile, platform)[1]:
    for name, _, duration in device:
      counts[name] += 1
      seconds[name] += duration * 1e-9
  return [(name, counts[name], total) for name, total in seconds.most_common()]


def latest_trace_file(log_dir: str | pathlib.Path) -> pathlib.Path | None:
  """The newest `*.xplane.pb` that `jax.profiler.stop_trace` wrote under `log_dir` (`plugins/profile/<time>/`)."""
  files = sorted(pathlib.Path(log_dir).glob("plugins/profile/*/*.xplane.pb"), key=lambda path: path.stat().st_mtime)
  return files[-1] if files else None


def read_device_busy(xplane_file: str | pathlib.Path, platform: str) -> DeviceBusy | None:
  """`device_busy` of the trace file `xplane_file`."""
  return device_busy(ProfileData.from_file(str(xplane_file)), platform)


def summary_lines(profile: ProfileData, platform: str, *, steps: int = 1, top: int = 20) -> list[str]:
  """The device time of `profile` and its `top` kernels by total time, per step over `steps` steps."""
  busy = device_busy(profile, platform)
  if busy is None:
    return [f"no {platform} kernels in the trace"]
  lines = [f"{busy.device_kind}: {busy.devices} device(s), {busy.kernels / steps:,.0f} kernels and "
           f"{1e3 * busy.busy_seconds / steps:.3f} ms busy per step (over {steps} step(s))",
           f"{'ms per step':>12} {'share':>6} {'launches':>9}  kernel"]
  totals = kernel_totals(profile, platform)
  total = sum(seconds for _, _, seconds in totals)
  for name, launches, seconds in totals[:top]:
    lines.append(f"{1e3 * seconds / steps:12.3f} {100 * seconds / total:5.1f}% {launches / steps:9.1f}  {name}")
  return lines

