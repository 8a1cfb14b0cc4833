"""The devices a run compiles for: a named TPU topology (no TPU needed), named NVIDIA GPUs (no GPU
needed: `lbjax.train.gpu_targets`), or the local ones; and the memory each device has.

`topology_devices("v3:32x32")` returns the 2,048 abstract devices of a full TPU v3 pod from `libtpu`
(`jax.experimental.topologies`), which `jax.jit(...).lower(...).compile()` targets on a machine without
a TPU. A device is what JAX makes of the slice: one TensorCore on v2 and v3 (`v3:2x2`: 4 chips, 8
devices), one chip on v4 and v5p (megacore: both TensorCores as one device, `num_cores` 2, as JAX runs
them; `v4:2x2x1` is 4 devices) and on the one-core chips v5e and v6e, and one TensorCore again on TPU7x
(Ironwood: `tpu7x:2x2x1`, 4 chips, 8 devices). Abstract devices report no
memory, so `device_memory` takes the HBM from `TPU_CHIPS`, a table by `device_kind` of each chip's HBM
and TensorCores (Google's Cloud TPU system-architecture pages), and gives a device its cores' share.
"""

import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
from typing import Any

from lbjax.train import gpu_targets
from lbjax.train.errors import TRACEBACK_ENV, ConfigError

GIB = 2**30
INSTALL_HINT = "pip install 'lbjax[tpu]' (libtpu through jax[tpu], in the version that matches the installed jax)"
EXAMPLES = "v3:32x32, v4:8x8x16, v5p:8x16x16, v5e:16x16, v6e:16x16, tpu7x:8x8x8"
# A TPU topology name as libtpu parses it (its own pattern, `^([a-zA-Z0-9\_ ]+)[=\_:]([0-9x]+)(\_twisted|
# \_untwisted)?$`, with the dimensions numbers between x's): a generation, then the chips along each axis, each at
# least 1 (libtpu divides by them: a 0 ended the process with SIGFPE and no message).
NAME = re.compile(r"^[a-zA-Z0-9_ ]+[=_:]0*[1-9][0-9]*(x0*[1-9][0-9]*)*(_twisted|_untwisted)?$")


@dataclasses.dataclass(frozen=True)
class TpuChip:
  """One TPU chip: its HBM and its TensorCores, and where they are stated."""
  hbm_bytes: int
  cores: int
  source: str


TPU_CHIPS = {
    "TPU v2": TpuChip(16 * GIB, 2, "https://cloud.google.com/tpu/docs/v2 (8 GiB per TensorCore)"),
    "TPU v3": TpuChip(32 * GIB, 2, "https://cloud.google.com/tpu/docs/v3 (32 GiB HBM2 per chip)"),
    "TPU v4": TpuChip(32 * GIB, 2, "https://cloud.google.com/tpu/docs/v4 (32 GiB HBM2 per chip)"),
    "TPU v5 lite": TpuChip(16 * GIB, 1, "https://cloud.google.com/tpu/docs/v5e (16 GiB HBM2 per chip)"),
    # The tpu7x page's table gives v5p 95 GiB; the v5p page's 95 GB, the smaller, is taken.
    "TPU v5": TpuChip(95 * 10**9, 2, "https://cloud.google.com/tpu/docs/v5p (95 GB HBM2e per chip)"),
    "TPU v6 lite": TpuChip(32 * GIB, 1, "https://cloud.google.com/tpu/docs/v6e (32 GB HBM per chip)"),
    "TPU7x": TpuChip(192 * GIB, 2, "https://cloud.google.com/tpu/docs/tpu7x (192 GiB HBM per chip, two TensorCores)"),
}


def libtpu_installed() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def topology_devices(name: str) -> list[Any]:
  """The abstract devices of the TPU topology `name` (any name `get_topology_desc` takes), or of the
  GPUs it names (`gpu_targets.devices`: `h100:8`).

  Raises:
    ConfigError: libtpu (or for GPUs JAX's CUDA plugin) is not installed (what to install), or `name`
      is not a topology.
  """
  if gpu_targets.is_gpu_name(name):
    return gpu_targets.devices(name)
  if not NAME.match(name):
    raise ConfigError(f"--topology {name!r} is not a TPU topology name: names look like {EXAMPLES} (a TPU "
                      f"generation, a colon, the chips along each axis, at least 1 each), or GPUs: "
                      f"{gpu_targets.EXAMPLES}.")
  if not libtpu_installed():
    raise ConfigError(f"--topology {name} names no GPU lbjax knows ({gpu_targets.EXAMPLES}), so a TPU topology, "
                      f"which needs libtpu: {INSTALL_HINT}.")
  # Compiling opens no TPU, so several processes (pytest workers, a plan beside a run) may load libtpu at once;
  # without this libtpu refuses all but the first ("libtpu multi-process lockfile").
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:  # megacore where the chip has it (v4, v5p): one device per chip, as JAX runs them and its meshes need
    with _libtpu_start_up_quiet():
      return list(topologies.get_topology_desc(platform="tpu", topology_name=name,
                                               chip_config_name="megacore").devices)
  except Exception:  # pylint: disable=broad-except  (no megacore config: v2, v3, v5e, v6e, TPU7x have one device per core)
    pass
  try:
    with _libtpu_start_up_quiet():
      return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except Exception as e:  # pylint: disable=broad-except  (libtpu's JaxRuntimeError/RuntimeError: a bad name)
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"--topology {name!r} is not a TPU topology libtpu knows ({reason}); names look like "
                      f"{EXAMPLES} (GPUs: {gpu_targets.EXAMPLES}).") from e


@contextlib.contextmanager
def _libtpu_start_up_quiet():
  """Drops what libtpu writes to file descriptor 2 while it starts on a machine without TPUs (its lookups of
  TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES fail, five lines that say nothing about the compile; its
  refusal of a topology comes back as the exception). Kept on the console with LBJAX_TRACEBACK=1."""
  if os.environ.get(TRACEBACK_ENV):
    yield
    return
  sys.stderr.flush()
  console = os.dup(2)
  try:
    with open(os.devnull, "wb") as sink:
      os.dup2(sink.fileno(), 2)
      try:
        yield
      finally:
        os.dup2(console, 2)
  finally:
    os.close(console)


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
  """The memory one device can hold (`bytes`, None where unknown) and where the figure comes from."""
  bytes: int | None
  source: str


def device_memory(device: Any, local_devices: int = 1) -> DeviceMemory:
  """The memory of `device`: what a real accelerator reports (`memory_stats()["bytes_limit"]`), else
  the `TPU_CHIPS` HBM of its chip divided among the chip's TensorCores by the cores it spans, else (a
  deviceless GPU) the share of its memory JAX takes by default, else (a CPU device) the host's
  physical memory shared by the `local_devices` CPU devices."""
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except  (abstract TPU devices raise: no runtime behind them)
    stats = None
  if stats and stats.get("bytes_limit"):
    return DeviceMemory(int(stats["bytes_limit"]), f"{device.device_kind}: memory_stats()['bytes_limit']")
  chip = TPU_CHIPS.get(device.device_kind)
  if chip is not None:
    cores = getattr(device, "num_cores", 1) or 1
    share = "the chip" if cores >= chip.cores else f"{cores} of the chip's {chip.cores} TensorCores"
    return DeviceMemory(chip.hbm_bytes * min(cores, chip.cores) // chip.cores,
                        f"{device.device_kind}: {share}; {chip.source}")
  gpu = gpu_targets.device_target(device)
  if gpu is not None:
    fraction = gpu_targets.JAX_MEMORY_FRACTION
    return DeviceMemory(int(gpu.memory_bytes * fraction),
                        f"{device.device_kind}: {fraction:.0%} of {gpu.memory_bytes / GIB:.1f} GiB, what a JAX process "
                        f"takes by default (XLA_PYTHON_CLIENT_MEM_FRACTION); {gpu.source}")
  if device.platform == "cpu":
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceMemory(host // max(local_devices, 1), f"host memory shared by {local_devices} CPU device(s)")
  return DeviceMemory(None, f"{device.device_kind}: unknown")
