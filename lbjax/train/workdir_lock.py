"""One run per workdir: `<workdir>/lock` names the run that holds it (host, pid, start time, command).

Two runs writing one workdir would replace each other's checkpoints and metrics, so a run takes the
lock before it builds anything and a second run refuses to start, naming the first. A run that
crashed (or was killed with -9) cannot remove its lock; the next run finds it stale when it names
this host and a process that no longer exists, says so, and takes it over. A lock of another host
cannot be checked from here: the message names it and how to remove it once that run is gone.

The lock file is created with `O_CREAT | O_EXCL`, atomic on local and NFS v3+ file systems, so of two
runs starting together exactly one gets it.

`check_workdir` refuses, before any compute, a workdir that cannot hold a run (a file, or a directory
that cannot be created or written) and creates it: lbjax-train's check; `workdir_problem` finds the same
without creating anything: the experiment scripts' check of their arguments.
"""

import json
import os
import pathlib
import socket
import sys
import time

from absl import logging

from lbjax.train.errors import ConfigError
from lbjax.train.errors import WorkdirInUseError

LOCK_NAME = "lock"
STALE_TAKEOVER_SECONDS = 10.0  # a takeover file older than this was left by a run killed while taking over


def blocked_folder(folder: str | os.PathLike[str]) -> tuple[pathlib.Path, str] | None:
  """What keeps this process from creating or writing the directory `folder`, found without creating anything:
  `(path, "file")` for a file at `folder` or above it, `(path, "dangling link")` for a symbolic link there to a
  path that does not exist, `(path, "unwritable")` for the nearest existing directory on the way if this
  process cannot write or enter it; None if nothing."""
  path = pathlib.Path(folder)
  for candidate in (path, *path.parents):
    try:
      if candidate.is_symlink() and not candidate.exists():
        return candidate, "dangling link"
      if not candidate.exists():
        continue
    except OSError:  # a folder above it this process cannot enter: that one is named below
      continue
    if not candidate.is_dir():
      return candidate, "file"
    return None if os.access(candidate, os.W_OK | os.X_OK) else (candidate, "unwritable")
  return None


def blocked_reason(where: pathlib.Path, kind: str) -> str:
  """`blocked_folder`'s finding in words, e.g. "'/a/b' is a file"."""
  if kind == "dangling link":
    return f"{str(where)!r} is a link to {os.readlink(where)!r}, which does not exist"
  return f"{str(where)!r} is {'a file' if kind == 'file' else 'not writable by this process'}"


def workdir_problem(workdir: str) -> str:
  """What keeps `workdir` from holding a run, found without creating anything (`blocked_folder`), or "" if
  nothing."""
  blocked = blocked_folder(workdir)
  if blocked is None:
    return ""
  where, kind = blocked
  if kind == "file":
    what = "is a file" if where == pathlib.Path(workdir) else f"lies under {str(where)!r}, which is a file"
    return f"--workdir {workdir!r} {what}, not a directory: name a new directory or one holding a run to resume."
  if kind == "unwritable" and where == pathlib.Path(workdir):
    return (f"--workdir {workdir!r} is not writable by this process: the run's checkpoints, metrics and lock go "
            "there. Name a directory it can write, or change its permissions.")
  return (f"--workdir {workdir!r} cannot be created: {blocked_reason(where, kind)}. Name a directory this process "
          "can create and write.")


def check_workdir(workdir: str) -> None:
  """A workdir is a directory, new or holding a run, that this process can write: a file at its path or
  above it, or a directory the system refuses to create or write (a read-only or virtual file system,
  no permission), is a user error (`workdir_problem`). Creates the directory."""
  if problem := workdir_problem(workdir):
    raise ConfigError(problem)
  try:
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"--workdir {workdir!r} cannot be created: {e.strerror}. Name a directory this process can "
                      "create and write.") from e


def _process_exists(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  return True


def _describe(holder: dict) -> str:
  started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("started", 0)))
  return (f"pid {holder.get('pid')} on host {holder.get('host')!r}, started {started}: "
          f"{holder.get('command', '?')}")


class WorkdirLock:
  """Holds `<workdir>/lock` from `acquire()` until `release()`.

  Attributes:
    path: the lock file.
    stale_holder: the record of a crashed run whose lock this run took over, or None.
  """

  def __init__(self, workdir: str | os.PathLike[str]):
    self.path = pathlib.Path(workdir).absolute() / LOCK_NAME
    self.stale_holder: dict | None = None
    self._held = False
    self._record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                    "command": " ".join(sys.argv)}

  def acquire(self) -> None:
    """Takes the lock, or raises `WorkdirInUseError` naming the run that holds it."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(50):  # tries again after removing a stale lock or finding one half-written
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self._read_holder()
        if holder is None:  # removed between our open and read, or being written: try again
          time.sleep(0.1)
          continue
        if holder.get("host") == self._record["host"] and not _process_exists(int(holder.get("pid", -1))):
          if self._remove_stale(holder):
            logging.warning("Workdir lock %s was left by a run that no longer exists (%s); taking it over.",
                            self.path, _describe(holder))
            self.stale_holder = holder
          continue
        raise self._in_use(holder) from None
      with os.fdopen(fd, "w") as f:
        json.dump(self._record, f)
        f.flush()
        os.fsync(f.fileno())
      self._held = True
      return
    raise WorkdirInUseError(f"Could not take the workdir lock {self.path}: other runs keep replacing it.")

  def refuse_if_held_here(self) -> None:
    """Raises `WorkdirInUseError` if a live process of this host holds the lock (a run of it is going on), without
    taking it: the check of a multi-host job's supervisors before they write the workdir's logs (the lock is
    process 0's training process's to take, and the other processes would wait for it in a collective)."""
    holder = self._read_holder()
    if holder is not None and holder.get("host") == self._record["host"] and _process_exists(
        int(holder.get("pid", -1))):
      raise self._in_use(holder)

  def _in_use(self, holder: dict) -> WorkdirInUseError:
    hint = ("" if holder.get("host") == self._record["host"] else
            f" It is held from another host; if that run is gone, delete {self.path}.")
    return WorkdirInUseError(
        f"The workdir {self.path.parent} is in use by another run ({_describe(holder)}). Wait for it "
        f"to finish, stop it, or use another --workdir.{hint}")

  def _remove_stale(self, holder: dict) -> bool:
    """Removes the lock of the crashed run `holder` unless it changed since it was read; returns whether it
    removed it. Two runs that found the same stale lock take turns through `<lock>.takeover` (created with
    O_EXCL) and read the lock again there: otherwise the second could remove the lock the first had just made
    (both would run)."""
    takeover = self.path.with_name(LOCK_NAME + ".takeover")
    try:
      fd = os.open(takeover, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      try:
        if time.time() - takeover.stat().st_mtime > STALE_TAKEOVER_SECONDS:  # left by a run killed in its turn
          takeover.unlink(missing_ok=True)
      except FileNotFoundError:
        pass
      time.sleep(0.1)
      return False
    try:
      if self._read_holder() != holder:
        return False
      self.path.unlink(missing_ok=True)
      return True
    finally:
      os.close(fd)
      takeover.unlink(missing_ok=True)

  def _read_holder(self) -> dict | None:
    try:
      text = self.path.read_text()
    except FileNotFoundError:
      return None
    try:
      holder = json.loads(text)
    except json.JSONDecodeError:
      holder = None
    if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
      return holder
    # Written by a run that died between creating and filling it, being written right now, or damaged.
    age = time.time() - self.path.stat().st_mtime
    if age < 5:
      return None
    return {"host": self._record["host"], "pid": -1, "started": self.path.stat().st_mtime,
            "command": "(unreadable lock file)"}

  def release(self) -> None:
    """Removes the lock if this run holds it."""
    if self._held:
      self.path.unlink(missing_ok=True)
      self._held = False
