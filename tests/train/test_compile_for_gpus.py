"""`lbjax-train --compile-only --topology h100:8`: a run compiled for NVIDIA GPUs on a machine without
one (`lbjax.train.gpu_targets`).

The compile test needs JAX's CUDA plugin (`pip install "jax[cuda12-local]==<jax's version>"`, not one
of lbjax's dependencies) and skips where it is absent; the names, messages and memory figures are
tested everywhere.
"""

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

from lbjax import main as cli
from lbjax.train import gpu_targets
from lbjax.train import topology

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["h100", "H100:8", "h200:2x8", "h200:1"])
def test_gpu_names(name):
  assert gpu_targets.is_gpu_name(name)


@pytest.mark.parametrize("name", ["v5p:2x2x1", "v3:32x32", "h300:8", "h100:x8", "h100:8x", "a100"])
def test_other_names_are_not_gpus(name):
  assert not gpu_targets.is_gpu_name(name)


def _compile_error(capsys, tmp_path, name):
  status = cli.main(["--config", "mnist_lstm", "--compile-only", "--topology", name, "--workdir", str(tmp_path)])
  err = capsys.readouterr().err
  assert "Traceback" not in err and not (tmp_path / "compile.json").exists()
  return status, err


def test_no_plugin_says_what_to_install(capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(gpu_targets, "plugin_installed", lambda: False)
  status, err = _compile_error(capsys, tmp_path, "h100:8")
  assert status == 2 and 'pip install "jax[cuda12-local]==' in err and "CUDA plugin" in err


def test_zero_gpus_is_a_message(capsys, tmp_path):
  status, err = _compile_error(capsys, tmp_path, "h100:0x8")
  assert status == 2 and "at least 1" in err


def test_an_unknown_tpu_topology_lists_the_gpu_names_too(monkeypatch):
  monkeypatch.setattr(topology, "libtpu_installed", lambda: True)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  def refuse(**kwargs):
    raise RuntimeError(f"unknown topology {kwargs.get('topology_name')}")

  monkeypatch.setattr(topologies, "get_topology_desc", refuse)
  with pytest.raises(topology.ConfigError, match=r"v3:32x32.*GPUs: h100, h100:8, h200:2x8"):
    topology.topology_devices("v9:1x1")


def test_a_deviceless_gpu_has_the_memory_jax_takes_of_it():
  """75% of the device's memory (XLA_PYTHON_CLIENT_MEM_FRACTION's default), as `bytes_limit` on a real one."""

  def no_runtime():
    raise RuntimeError("no runtime behind a deviceless device")

  device = types.SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3", platform="gpu", memory_stats=no_runtime)
  memory = topology.device_memory(device)
  assert memory.bytes == int(0.75 * 84_929_347_584)
  assert "75%" in memory.source and "XLA_PYTHON_CLIENT_MEM_FRACTION" in memory.source


def _compile_in_a_fresh_process(command: list[str]) -> subprocess.CompletedProcess:
  """`command` (an `lbjax.main --compile-only` line) in a fresh process on the CPU platform, as a user runs it."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "JAX_NUM_CPU_DEVICES")}
  return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                        env=dict(env, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu"))


@pytest.mark.skipif(not gpu_targets.plugin_installed(),
                    reason='JAX\'s CUDA plugin is not installed: pip install "jax[cuda12-local]==<jax version>"')
def test_mnist_lstm_compiles_for_eight_h100s_with_the_gradient_all_reduce(tmp_path):
  """In a fresh process (JAX registers the plugin only when it starts with the version check skipped,
  which lbjax-train arranges): 8 H100s, data parallel, one all-reduce of the float32 gradients. A
  deviceless compile cannot apply `config.deterministic` (XLA refuses it without a GPU): the report says so."""
  transform, hidden = 32, 48
  command = [sys.executable, "-m", "lbjax.main", "--config", "mnist_lstm", "--compile-only", "--topology", "h100:8",
             f"--config.model_options.transform_size={transform}", f"--config.model_options.hidden_size={hidden}",
             "--config.deterministic=True", "--workdir", str(tmp_path)]
  done = _compile_in_a_fresh_process(command)
  assert done.returncode == 0, done.stderr[-2000:]
  report = json.loads((tmp_path / "compile.json").read_text())
  assert report["topology"] == "h100:8" and report["devices"] == 8 and report["platform"] == "gpu"
  assert report["device_kind"] == "NVIDIA H100 80GB HBM3" and report["fits"] is True
  assert report["hbm_bytes"] == int(0.75 * 84_929_347_584)
  parameters = 28 * transform + transform + (transform + hidden) * 4 * hidden + 4 * hidden + hidden * 10 + 10
  # The float32 gradients and the loss and accuracy means, as on a TPU (test_compile_only).
  assert report["collective_bytes"] == {"all-reduce": 4 * parameters + 2 * 4, "reduce-scatter": 0, "all-gather": 0,
                                        "collective-permute": 0, "all-to-all": 0}
  assert report["steps"][0]["memory"]["parameters"] == 4 * parameters
  # No cost analysis for a deviceless GPU: the FLOPs of the step's matmuls, from its HLO. Per row of the batch: the
  # input transform (28 x 28 -> T per row of pixels) and its kernel gradient; the LSTM cell's [x, h] x [T + H, 4H]
  # at each of the 28 time steps, its kernel and input gradients; the classifier H -> 10, likewise.
  batch = report["batch_size"]
  assert report["flops_counted"] == "matmuls_in_hlo"
  assert report["flops_per_step"] == batch * 2 * (2 * 28 * 28 * transform + 3 * 28 * (transform + hidden) * 4 * hidden
                                                  + 3 * hidden * 10)
  assert report["kernels_per_step"] > 2 * 28  # the forward and backward scans launch kernels at every time step
  assert f"kernels launched per step {report['kernels_per_step']:,}" in done.stdout
  assert report["kernel_bytes_per_step"] > 0 and "reading and writing " in done.stdout
  assert "Compiled for topology h100:8: 8 NVIDIA H100 80GB HBM3 device(s)" in done.stdout
  assert "Note: config.deterministic=True is not applied" in done.stdout
  assert report["notes"] and "figures are those of the program without them" in report["notes"][0]


PIXEL_SCALE = """
import re
from lbjax.train import gpu_targets
gpu_targets.allow_plugin_without_cuda()
import jax, jax.numpy as jnp
from lbjax import data
(device,) = gpu_targets.devices("h100")
pixels = jax.ShapeDtypeStruct((128, 28, 28), jnp.uint8, sharding=jax.sharding.SingleDeviceSharding(device))
print(len(re.findall(r" multiply\\(", jax.jit(data.MNIST_NORMALIZATION).lower(pixels).compile().as_text())))
"""


@pytest.mark.skipif(not gpu_targets.plugin_installed(),
                    reason='JAX\'s CUDA plugin is not installed: pip install "jax[cuda12-local]==<jax version>"')
def test_xla_gpu_keeps_the_two_products_of_mnists_pixel_scale():
  """`PixelScale` is exact as `x * high + x * low`; XLA:GPU must not fold it into `x * (high + low)`."""
  done = _compile_in_a_fresh_process([sys.executable, "-c", PIXEL_SCALE])
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split()[-1] == "2"


CONVOLUTION_FLOPS = """
from lbjax.train import gpu_targets
gpu_targets.allow_plugin_without_cuda()
import jax, jax.numpy as jnp
from lbjax.train import hlo_analysis
CONVOLUTIONS = [((3, 3, 3, 16), 1), ((1, 1, 16, 32), 2), ((3, 3, 32, 32), 1)]  # kernel (HWIO), stride

def loss(kernels, x):
  for kernel, (_, stride) in zip(kernels, CONVOLUTIONS):
    x = jax.nn.relu(jax.lax.conv_general_dilated(x, kernel, (stride, stride), "SAME",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC")))
  return x.sum()

(device,) = gpu_targets.devices("h100")
spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(device))
compiled = jax.jit(jax.grad(loss)).lower([spec(k) for k, _ in CONVOLUTIONS], spec((8, 16, 16, 3))).compile()
assert "__cudnn$convBackwardInput" in compiled.as_text()
print(hlo_analysis.analyze(compiled.as_text()).matmul_flops)
"""


@pytest.mark.skipif(not gpu_targets.plugin_installed(),
                    reason='JAX\'s CUDA plugin is not installed: pip install "jax[cuda12-local]==<jax version>"')
def test_the_flops_of_cudnn_convolutions_are_those_of_the_convolutions():
  """The kernel gradients of three bfloat16 convolutions (3x3 over 16x16 images, 1x1 of stride 2, 3x3 over 8x8),
  compiled for an H100: cuDNN's forward, input-gradient and kernel-gradient calls count 2 * positions * |kernel|
  each, the first convolution without an input gradient (the images are not differentiated)."""
  done = _compile_in_a_fresh_process([sys.executable, "-c", CONVOLUTION_FLOPS])
  assert done.returncode == 0, done.stderr[-2000:]
  first, second, third = (2 * 8 * 16 * 16 * (3 * 3 * 3 * 16), 2 * 8 * 8 * 8 * (16 * 32), 2 * 8 * 8 * 8 * (9 * 32 * 32))
  assert float(done.stdout.split()[-1]) == 2 * first + 3 * second + 3 * third


@pytest.mark.skipif(not gpu_targets.plugin_installed(),
                    reason='JAX\'s CUDA plugin is not installed: pip install "jax[cuda12-local]==<jax version>"')
def test_a_bfloat16_resnet_with_float32_kernel_gradients_compiles_for_an_h100(tmp_path):
  """`param_dtype_gradients`' strided 1x1 kernel gradient (a GEMM over every other position) made XLA:GPU
  0.11.2 abort the process (triton_tiling_propagation.cc: Check failed: subdim_size_accumulator == dim_size),
  on an H200 as here; the strided positions are now materialised before the product."""
  command = [sys.executable, "-m", "lbjax.main", "--config", "resnet_tiny_synthetic_cifar", "--compile-only",
             "--topology", "h100", "--config.model_options.dtype=bfloat16",
             "--config.model_options.param_dtype_gradients=True", "--workdir", str(tmp_path)]
  done = _compile_in_a_fresh_process(command)
  assert done.returncode == 0, done.stderr[:2000]
  assert json.loads((tmp_path / "compile.json").read_text())["fits"] is True
