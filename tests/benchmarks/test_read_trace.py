"""`benchmarks.read_trace` lists a trace's device time and its longest kernels per step (how the GPU suite's
traces are read here), and names a path that holds no trace, a file that is not one, and the platforms a trace
holds when it has no kernels of the one asked for."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import read_trace


@pytest.fixture(name="cpu_trace")
def _cpu_trace(tmp_path):
  """A folder `jax.profiler` wrote a CPU trace of 4 calls of one jitted step to."""
  matrix = jnp.ones((128, 128))
  step = jax.jit(lambda: jnp.tanh(matrix @ matrix))
  jax.block_until_ready(step())
  jax.profiler.start_trace(str(tmp_path))
  for _ in range(4):
    result = step()
  jax.block_until_ready(result)
  jax.profiler.stop_trace()
  return tmp_path


def _refused(capsys, argv) -> str:
  with pytest.raises(SystemExit) as exit_info:
    read_trace.main(argv)
  captured = capsys.readouterr()
  assert exit_info.value.code == 2 and not captured.out and "Traceback" not in captured.err
  return captured.err


def test_a_trace_folder_is_read_per_step(cpu_trace, capsys):
  read_trace.main([str(cpu_trace), "--platform", "cpu", "--steps", "4", "--top", "3"])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].endswith(".xplane.pb") and lines[1].startswith("cpu: 1 device(s), ")
  assert "per step (over 4 step(s))" in lines[1] and lines[2].split() == ["ms", "per", "step", "share", "launches",
                                                                            "kernel"]
  assert 1 <= len(lines[3:]) <= 3 and float(lines[3].split()[2]) == 1.0  # one launch of it per step


def test_a_path_without_a_trace_is_named(tmp_path, capsys):
  err = _refused(capsys, [str(tmp_path), "--platform", "gpu"])
  assert f"{tmp_path} is neither a trace file nor a folder holding plugins/profile" in err


def test_a_file_that_is_not_a_trace_is_named_with_what_is_read(tmp_path, capsys):
  junk = tmp_path / "junk.csv"
  junk.write_text("a,b\n1,2\n")
  err = _refused(capsys, [str(junk), "--platform", "cpu"])
  assert (f"{junk} is not a jax.profiler trace (Failed to parse XSpace from array); give a .xplane.pb file, or a "
          "folder holding plugins/profile/*/*.xplane.pb (what jax.profiler.start_trace writes)." in err)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_a_trace_read_as_another_platform_names_the_one_it_holds(cpu_trace, capsys, platform):
  err = _refused(capsys, [str(cpu_trace), "--platform", platform])
  assert f".xplane.pb holds no {platform} kernels; it holds cpu kernels: rerun with --platform cpu." in err


def test_a_trace_without_kernels_says_so(tmp_path, capsys):
  empty = tmp_path / "empty.xplane.pb"  # an empty XSpace: a trace of nothing
  empty.write_bytes(b"")
  err = _refused(capsys, [str(empty), "--platform", "gpu"])
  assert f"{empty} holds no gpu kernels; it holds no kernels of any platform (on a GPU the profiler records" in err
