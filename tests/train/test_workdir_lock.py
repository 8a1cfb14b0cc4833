"""`lbjax.train.workdir_lock`: one run per workdir; a crashed run's lock is taken over, once."""

import json
import os
import socket

import pytest

from lbjax.train import workdir_lock
from lbjax.train.errors import WorkdirInUseError


def _holder(pid: int) -> dict:
  return {"host": socket.gethostname(), "pid": pid, "started": 0.0, "command": "lbjax-train ..."}


def _dead_pid() -> int:
  pid = 2**22 - 1
  while workdir_lock._process_exists(pid):  # pylint: disable=protected-access
    pid -= 1
  return pid


def test_a_crashed_run_s_lock_is_taken_over_and_named(tmp_path):
  (tmp_path / "lock").write_text(json.dumps(_holder(_dead_pid())))
  lock = workdir_lock.WorkdirLock(tmp_path)
  lock.acquire()
  assert lock.stale_holder["pid"] == _dead_pid()
  assert json.loads((tmp_path / "lock").read_text())["pid"] == os.getpid()
  assert not (tmp_path / "lock.takeover").exists()
  lock.release()
  assert not (tmp_path / "lock").exists()


@pytest.mark.parametrize("text", ["", "{not json", "[]", "null", '{"host": "h", "pid": "abc"}'])
def test_a_lock_file_that_is_not_a_lock_is_taken_over_once_it_is_5_s_old(tmp_path, text):
  """Not a holder's record (a crash while it was written, or damage): taken over as an unreadable lock. A list or
  a non-integer pid raised AttributeError or ValueError, and `null` was retried for 5 s, then called a race."""
  (tmp_path / "lock").write_text(text)
  os.utime(tmp_path / "lock", (0, 0))
  lock = workdir_lock.WorkdirLock(tmp_path)
  lock.acquire()
  assert lock.stale_holder["command"] == "(unreadable lock file)"
  assert json.loads((tmp_path / "lock").read_text())["pid"] == os.getpid()
  lock.release()


def test_a_stale_lock_another_run_took_over_first_is_not_removed(tmp_path, monkeypatch):
  """Two runs find the same stale lock; the first removes it and makes its own before the second acts: the
  second must find the first's lock and refuse, not remove it (then both would run)."""
  stale, live = _holder(_dead_pid()), _holder(os.getppid())
  (tmp_path / "lock").write_text(json.dumps(stale))
  read = workdir_lock.WorkdirLock._read_holder  # pylint: disable=protected-access
  calls = []

  def read_then_the_other_run_takes_over(self):
    holder = read(self)
    if not calls:  # the second run has read the stale holder; now the first replaces it with its own
      (tmp_path / "lock").write_text(json.dumps(live))
    calls.append(holder)
    return holder

  monkeypatch.setattr(workdir_lock.WorkdirLock, "_read_holder", read_then_the_other_run_takes_over)
  with pytest.raises(WorkdirInUseError, match=f"in use by another run \\(pid {os.getppid()}"):
    workdir_lock.WorkdirLock(tmp_path).acquire()
  assert json.loads((tmp_path / "lock").read_text()) == live


def test_a_takeover_file_left_by_a_run_killed_in_its_turn_is_cleared(tmp_path, monkeypatch):
  (tmp_path / "lock").write_text(json.dumps(_holder(_dead_pid())))
  (tmp_path / "lock.takeover").write_text("")
  monkeypatch.setattr(workdir_lock, "STALE_TAKEOVER_SECONDS", 0.0)
  lock = workdir_lock.WorkdirLock(tmp_path)
  lock.acquire()
  assert lock.stale_holder is not None and not (tmp_path / "lock.takeover").exists()
