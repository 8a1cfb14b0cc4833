"""The newest `keep_checkpoints` are kept, and a failed save never removes a checkpoint."""

import contextlib
import subprocess

import numpy as np
import pytest

from lbjax.train.checkpointing import Checkpointer


def _state(size: int) -> dict[str, np.ndarray]:
  return {"w": np.arange(size, dtype=np.float32)}


def test_only_the_newest_checkpoints_stay_once_each_save_is_complete(tmp_path):
  checkpointer = Checkpointer(tmp_path, max_to_keep=2)
  for step in (1, 2, 3, 4):
    checkpointer.save(step, _state(10), {"step": step})
    checkpointer.wait()
    assert checkpointer.all_steps() == [step, step - 1][:min(step, 2)]
  checkpointer.close()
  assert Checkpointer(tmp_path, max_to_keep=2).all_steps() == [4, 3]


def test_a_save_that_fails_on_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
  """Polled like the trainer polls it. In stop 25's CI run, Orbax's own `max_to_keep` removed step 4
  after save 8 had failed on a full disk (its finalizer goes on to remove old steps when a writer's
  error was already taken by a `check_for_errors` poll, which Orbax raises only once); that thread
  ordering is not reproduced here: the test holds the guarantee that retention is now ours."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(disk)], capture_output=True).returncode:
    pytest.skip("needs permission to mount a small tmpfs as a full disk")
  try:
    checkpointer = Checkpointer(disk / "run", max_to_keep=1)
    checkpointer.save(1, _state(1000), {"step": 1})
    checkpointer.wait()
    with open(disk / "ballast", "wb", buffering=0) as ballast:
      try:
        while True:
          ballast.write(b"\0" * 4096)
      except OSError:
        pass
    with pytest.raises(OSError, match="No space left"):
      checkpointer.save(2, _state(200_000), {"step": 2})
      while checkpointer.is_saving():
        checkpointer.check_for_errors()
      checkpointer.wait()
    with contextlib.suppress(OSError):  # Orbax's finalizer may raise the error again on closing
      checkpointer.close()
    (disk / "ballast").unlink()
    assert Checkpointer(disk / "run", max_to_keep=1).all_steps() == [1]
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)
