"""experiments/tensor_sharding_bytes.py at V = 1000, D = H = 32, batch 16 x 4 on the 8 simulated devices
of tests/conftest.py: the bytes it reads from the compiled step are the ring all-reduces of the
gradient over `data` and of the activations over `model`, and the markdown holds them and its command."""

import pytest

from experiments import tensor_sharding_bytes

VOCAB, WIDTH = 1000, 32
ARGV = ["--vocab", str(VOCAB), "--width", str(WIDTH), "--batch_size", "16", "--seq_len", "4"]


def _ring(floats: int, group: int) -> float:
  """Bytes one device sends in a ring all-reduce of `floats` float32 values over `group` devices."""
  return 2 * (group - 1) / group * 4 * floats


def test_bytes_are_the_gradient_all_reduce_over_data_and_the_activations_over_model(tmp_path):
  rows = tensor_sharding_bytes.main([*ARGV, "--out", str(tmp_path / "table")])
  assert [(r["data"], r["model"]) for r in rows] == [(8, 1), (4, 2), (2, 4), (1, 8)]
  for r in rows:
    assert r["parameter_floats"] == (2 * VOCAB * WIDTH + VOCAB) // r["model"]
    assert (r["model_floats"] == 0) == (r["model"] == 1)
    # the local gradient and the loss over data, the model-axis activations over model
    expected = _ring(r["parameter_floats"] + 1, r["data"]) + _ring(r["model_floats"], r["model"])
    assert r["ring"] == pytest.approx(expected, rel=1e-6), (r["data"], r["model"])
  assert [r["ring"] for r in rows] == sorted((r["ring"] for r in rows), reverse=True)  # activations < parameters
  markdown = (tmp_path / "table.md").read_text()
  assert f"JAX_NUM_CPU_DEVICES=8 python -m experiments.tensor_sharding_bytes {' '.join(ARGV)} --out " in markdown
  assert f"| 8 x 1 | {2 * VOCAB * WIDTH + VOCAB:,} | 0 | " in markdown
