"""experiments/tensor_sharding_bytes.py on the 8 simulated devices of tests/conftest.py, for the PTB layers at
V = 1000, D = H = 32, batch 16 x 4 and for the ResNet-50 head at its size: the bytes it reads from the
compiled step are the ring all-reduces of the gradient over `data` and of the activations over `model`,
and the markdown holds them and its command."""

import re

from jax.sharding import PartitionSpec as P
import pytest

from experiments import tensor_sharding_bytes
from lbjax import models

VOCAB, WIDTH = 1000, 32
ARGV = ["--vocab", str(VOCAB), "--width", str(WIDTH), "--batch_size", "16", "--seq_len", "4"]


def _ring(floats: int, group: int) -> float:
  """Bytes one device sends in a ring all-reduce of `floats` float32 values over `group` devices."""
  return 2 * (group - 1) / group * 4 * floats


def test_bytes_are_the_gradient_all_reduce_over_data_and_the_activations_over_model(tmp_path):
  rows = tensor_sharding_bytes.main([*ARGV, "--out", str(tmp_path / "new" / "table")])  # its folder made too
  assert [(r["data"], r["model"]) for r in rows] == [(8, 1), (4, 2), (2, 4), (1, 8)]
  for r in rows:
    assert r["parameter_floats"] == (2 * VOCAB * WIDTH + VOCAB) // r["model"]
    assert (r["model_floats"] == 0) == (r["model"] == 1)
    # the local gradient and the loss over data, the model-axis activations over model
    expected = _ring(r["parameter_floats"] + 1, r["data"]) + _ring(r["model_floats"], r["model"])
    assert r["ring"] == pytest.approx(expected, rel=1e-6), (r["data"], r["model"])
  assert [r["ring"] for r in rows] == sorted((r["ring"] for r in rows), reverse=True)  # activations < parameters
  markdown = (tmp_path / "new" / "table.md").read_text()
  assert f"JAX_NUM_CPU_DEVICES=8 python -m experiments.tensor_sharding_bytes {' '.join(ARGV)} --out " in markdown
  assert f"| 8 x 1 | {2 * VOCAB * WIDTH + VOCAB:,} | 0 | " in markdown


def test_resnet50_head_bytes_are_its_gradient_shard_over_data_and_softmax_and_features_gradient_over_model(tmp_path):
  """The head lowered with the trainer's shardings (ResNet.TENSOR_PARALLEL_SPECS, the classes over `model`):
  over `data` the head's gradient shard and the loss, over `model` the cross-entropy's 3 n floats and the
  features' gradient n x 2048 (n = 256 / data); nothing over `model` at 8 x 1."""
  rows = tensor_sharding_bytes.main(["--model", "resnet50_head", "--out", str(tmp_path / "head")])
  head = 2048 * 1000 + 1000
  assert [(r["data"], r["model"]) for r in rows] == [(8, 1), (4, 2), (2, 4), (1, 8)]
  for r in rows:
    n = 256 // r["data"]
    assert r["specs"] == (models.ResNet.TENSOR_PARALLEL_SPECS if r["model"] > 1
                          else {"head/kernel": P(), "head/bias": P()})
    assert (r["head_floats"], r["parameter_floats"]) == (head, head // r["model"])
    assert r["model_floats"] == (n * (2048 + 3) if r["model"] > 1 else 0)
    expected = _ring(r["parameter_floats"] + 1, r["data"]) + _ring(r["model_floats"], r["model"])
    assert r["ring"] == pytest.approx(expected, rel=1e-6), (r["data"], r["model"])
    assert r["network_floats"] == 25_557_032  # ResNet-50's parameter count (its docstring)
    assert r["network_data_ring"] == pytest.approx(_ring(25_557_032 - head + head // r["model"], r["data"]))
  assert rows[0]["payload"] == 4 * (head + 1)  # 8 x 1: the head's gradient and the loss, nothing else
  assert rows[-1]["network_data_ring"] == 0
  markdown = (tmp_path / "head.md").read_text()
  assert ("JAX_NUM_CPU_DEVICES=8 python -m experiments.tensor_sharding_bytes --model resnet50_head --out "
          in markdown)
  assert f"| 8 x 1 | {head:,} | 0 | {4 * (head + 1) / 1e6:.3f} | {_ring(head + 1, 8) / 1e6:.3f} | " in markdown


@pytest.mark.parametrize("argv, message", [
    (["--model", "resnet50_head", "--vocab", "1000"], r"--vocab size the PTB layers"),
    (["--batch_size", "100"], r"--batch_size must be a positive multiple of 8"),
    (["--vocab", "1001"], r"--vocab a positive multiple of 8"),
])
def test_bad_arguments_are_refused_before_compute(tmp_path, capsys, argv, message):
  with pytest.raises(SystemExit) as exit_info:
    tensor_sharding_bytes.main([*argv, "--out", str(tmp_path / "table")])
  assert exit_info.value.code == 2
  assert re.search(message, capsys.readouterr().err)
  assert not (tmp_path / "table.md").exists()
