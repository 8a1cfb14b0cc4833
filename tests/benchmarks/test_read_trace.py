"""`benchmarks.read_trace` lists a trace's device time and its longest kernels per step (how the GPU suite's
traces are read here), and names a path that holds no trace."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import read_trace


def test_a_trace_folder_is_read_per_step(tmp_path, capsys):
  matrix = jnp.ones((128, 128))
  step = jax.jit(lambda: jnp.tanh(matrix @ matrix))
  jax.block_until_ready(step())
  jax.profiler.start_trace(str(tmp_path))
  for _ in range(4):
    result = step()
  jax.block_until_ready(result)
  jax.profiler.stop_trace()
  read_trace.main([str(tmp_path), "--platform", "cpu", "--steps", "4", "--top", "3"])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].endswith(".xplane.pb") and lines[1].startswith("cpu: 1 device(s), ")
  assert "per step (over 4 step(s))" in lines[1] and lines[2].split() == ["ms", "per", "step", "share", "launches",
                                                                            "kernel"]
  assert 1 <= len(lines[3:]) <= 3 and float(lines[3].split()[2]) == 1.0  # one launch of it per step


def test_a_path_without_a_trace_is_named(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    read_trace.main([str(tmp_path), "--platform", "gpu"])
  assert exit_info.value.code == 2
  assert f"{tmp_path} is neither a trace file nor a folder holding plugins/profile" in capsys.readouterr().err
