"""NVIDIA GPUs to compile for on a machine without one (`--compile-only --topology h100:8`).

JAX's CUDA plugin compiles for a GPU described by a target config (XLA's `GpuTargetConfigProto`,
`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=..., topology=...)`)
with no GPU and no CUDA library present: the executable is the program the GPUs would run, its memory
analysis what they would need. The plugin (about 200 MB) is not one of lbjax's dependencies:

    pip install "jax[cuda12-local]==<the installed jax's version>"

A name is `h100` or `h200`, then optionally `:N` (N GPUs in one host) or `:HxN` (H hosts of N GPUs
each): `h100:8` is one 8-GPU host, `h200:2x8` sixteen GPUs in two. Autotuning needs a device, so matmul
and convolution algorithms are XLA's defaults; the memory, the collectives and the kernels of the
compiled program are what count here. XLA's cost model gives no FLOPs or times for a deviceless GPU
(`lbjax.train.hlo_analysis` counts the matmul FLOPs and the kernels in the compiled HLO).

Checked on 2026-11-27 (jax 0.12.0.1): the kernels per ResNet-50 optimizer update counted this way for
the H100 equal those counted on a lent H200 (`benchmarks/README.md`, section `optimizer-gpu-kernels`).
"""

import contextlib
import dataclasses
import importlib.util
import os
import re
from typing import Any

from lbjax.train.errors import ConfigError

# The share of its memory a JAX process takes on a GPU by default (XLA_PYTHON_CLIENT_MEM_FRACTION;
# JAX's "GPU memory allocation" page): what `memory_stats()["bytes_limit"]` reports on a real one.
JAX_MEMORY_FRACTION = 0.75
NAME = re.compile(r"^(?P<target>[a-z0-9]+)(?::(?:(?P<hosts>\d+)x)?(?P<per_host>\d+))?$")
EXAMPLES = "h100, h100:8, h200:2x8"
_PLUGIN = "jax_plugins.xla_cuda12"


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """One GPU: its device kind as JAX names it, its memory and where that is stated, and XLA's target
  config of it."""
  device_kind: str
  memory_bytes: int
  source: str
  target_config: str


# XLA's GpuTargetConfigProto for compute capability 9.0 (Hopper). What the fusion passes read (threads,
# shared memory, cores) is the same for both GPUs; they differ in memory and its bandwidth.
_HOPPER = """\
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{
    major: 9
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 7
}}
device_description_str: "{kind}"
"""


def _hopper(kind: str, memory: int, bandwidth: int, source: str) -> GpuTarget:
  return GpuTarget(kind, memory, source, _HOPPER.format(kind=kind, memory=memory, bandwidth=bandwidth))


TARGETS = {
    "h100": _hopper("NVIDIA H100 80GB HBM3", 84_929_347_584, 3_352_320_000_000,
                    "H100 SXM5, 80 GB HBM3: the device_memory_size of an H100's XLA target config "
                    "(jax-ml/jax issue 28376)"),
    "h200": _hopper("NVIDIA H200", 150_754_820_096, 4_800_000_000_000,
                    "H200 SXM, 141 GB HBM3e: 143,771 MiB, as nvidia-smi listed the lent H200 (2026-11-26)"),
}


def _parse(name: str) -> re.Match | None:
  """`name` matched as GPUs of `TARGETS` (groups `target`, `hosts`, `per_host`), or None."""
  found = NAME.match(name.lower())
  return found if found is not None and found["target"] in TARGETS else None


def is_gpu_name(name: str) -> bool:
  """Whether `name` names GPUs (`h100...`, `h200...`) rather than a TPU topology."""
  return _parse(name) is not None


def plugin_installed() -> bool:
  try:
    return importlib.util.find_spec(_PLUGIN) is not None
  except ModuleNotFoundError:  # no jax_plugins package at all
    return False


def allow_plugin_without_cuda() -> None:
  """Lets JAX register its CUDA plugin on a machine without CUDA libraries (their version check
  skipped; compiling needs none of them). Takes effect only before JAX starts its backends."""
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def devices(name: str) -> list[Any]:
  """The deviceless GPUs `name` describes, ready to compile for (`jax.jit(...).lower(...).compile()`).

  Raises:
    ConfigError: a malformed count, no CUDA plugin (what to install), or a plugin JAX did not register.
  """
  found = _parse(name)
  if found is None:
    raise ConfigError(f"{name!r} names no GPU lbjax knows; GPU names look like {EXAMPLES} "
                      f"(GPUs: {', '.join(TARGETS)}).")
  hosts, per_host = int(found["hosts"] or 1), int(found["per_host"] or 1)
  if hosts < 1 or per_host < 1:
    raise ConfigError(f"GPUs {name!r}: the number of hosts and of GPUs per host must be at least 1.")
  import jax  # pylint: disable=import-outside-toplevel
  if not plugin_installed():
    raise ConfigError(f"compiling for {name} (NVIDIA GPUs) needs JAX's CUDA plugin: pip install "
                      f"\"jax[cuda12-local]=={jax.__version__}\".")
  allow_plugin_without_cuda()
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    topology = topologies.get_topology_desc(platform="cuda", target_config=TARGETS[found["target"]].target_config,
                                            topology=f"1x{hosts}x{per_host}")
  except NotImplementedError as e:  # the plugin was not registered when JAX started its backends
    raise ConfigError(f"compiling for {name}: JAX started without its CUDA plugin ({e}); start Python with "
                      "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 set (lbjax-train sets it before JAX starts) and check "
                      f"that the plugin's version is jax's ({jax.__version__}).") from e
  return list(topology.devices)


def lowering_for(devices: Any) -> contextlib.AbstractContextManager:
  """Where to lower a program that runs on `devices`: on GPUs with one of them as JAX's default device,
  since Pallas's GPU lowering (the fused optimizer layout, `lbjax.optim.fused`) takes the GPU it compiles
  for from the default device, which without a GPU is the CPU; elsewhere as it is."""
  device = min(devices, key=lambda d: d.id)
  if device.platform != "gpu":
    return contextlib.nullcontext()
  import jax  # pylint: disable=import-outside-toplevel
  return jax.default_device(device)


def device_target(device: Any) -> GpuTarget | None:
  """The `TARGETS` entry of a deviceless GPU (None for any other device)."""
  return next((t for t in TARGETS.values() if t.device_kind == device.device_kind), None)
