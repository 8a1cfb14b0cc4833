"""Compiling for an NVIDIA GPU on a machine without one: XLA:GPU's optimised HLO, deviceless.

JAX's CUDA plugin compiles for a GPU described by a target config (XLA's `GpuTargetConfigProto`,
`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)`) with no GPU and
no CUDA libraries present. Nothing runs: the compiled executable is the program a lent GPU would
run, so what it launches can be counted between GPU sessions. Install the plugin matching jax's
version (about 200 MB, kept out of lbjax's extras and of CI):

    pip install "jax[cuda12-local]==$(python -c 'import jax; print(jax.__version__)')"

`cuda_sharding` sets what the plugin needs on a machine without CUDA (its CUDA/cuDNN version check
skipped, JAX's default backend kept on the CPU); call it before anything else uses a JAX backend.

Checked on 2026-11-27 (jax 0.12.0.1): the kernels per ResNet-50 update counted here for the H100
target equal those counted on the lent H200 on 2026-11-26 for momentum SGD (161), `optax.lars`
(528), lbjax `lars` (324) and `optax.lamb` (775); lbjax `lamb` 289 here, 291 there. Autotuning needs a
device, so matmul and convolution choices are XLA's defaults: count elementwise and reduction
programs (an optimizer update) this way, not a model's step.
"""

import os

import jax
from jax.experimental import topologies

# XLA's GpuTargetConfigProto of the GPUs the device machines lend (compute capability 9.0). What the
# fusion passes read (threads, shared memory, cores) is the same for both; the H200 differs in memory.
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
device_description_str: "{name}"
"""
TARGETS = {
    "h100": _HOPPER.format(name="NVIDIA H100 80GB HBM3", bandwidth=3352320000000, memory=84929347584),
    "h200": _HOPPER.format(name="NVIDIA H200", bandwidth=4800000000000, memory=150754820096),
}


class PluginMissing(RuntimeError):
  """JAX's CUDA plugin is not installed (or not of jax's version)."""


def cuda_sharding(target: str) -> jax.sharding.NamedSharding:
  """A replicated sharding on one deviceless GPU of `target` (a key of `TARGETS`): give it to the
  `jax.ShapeDtypeStruct`s a function is lowered with, and `.compile()` compiles for that GPU.

  Raises:
    KeyError: an unknown target.
    PluginMissing: no CUDA plugin of jax's version, with the command that installs it.
  """
  config = TARGETS[target]
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no CUDA libraries here
  jax.config.update("jax_platforms", "cpu")  # the default backend; the plugin still compiles for cuda
  try:
    topology = topologies.get_topology_desc(platform="cuda", target_config=config, topology="1x1x1")
  except (NotImplementedError, RuntimeError) as error:
    raise PluginMissing(
        f"compiling for a deviceless GPU needs JAX's CUDA plugin of jax's version ({error}); install it with "
        f"pip install \"jax[cuda12-local]=={jax.__version__}\"") from error
  mesh = topologies.make_mesh(topology, (1,), ("gpu",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
