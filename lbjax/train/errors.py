"""Errors a user causes and can fix: the CLI prints their message and exits with status 2.

They subclass `ValueError` (a bad value) or `FileNotFoundError` (missing data), so code that drives
the trainer from Python catches them as usual. `print_error` is the one format of such a message on
the console; `exit_on_user_errors` ends a command-line program (`lbjax-train`'s siblings, the
experiment scripts) with it.
"""

import contextlib
import os
import sys

TRACEBACK_ENV = "LBJAX_TRACEBACK"


class ConfigError(ValueError):
  """A config, variant or command-line override that cannot run; the message says what to change."""


class CheckpointMismatchError(ValueError):
  """The workdir holds a checkpoint of a different run."""


class WorkdirInUseError(RuntimeError):
  """Another run holds the workdir's lock (`lbjax.train.workdir_lock`)."""


class CheckpointCorruptError(ValueError):
  """No checkpoint in the workdir passes its checksum; the message lists each and why."""


class CheckpointSaveError(OSError):
  """A checkpoint could not be written (e.g. a full disk); the previous checkpoints are kept."""


class DataMismatchError(ValueError):
  """The checkpoint was trained on different data than the run now reads."""


# Errors whose message says what to change: printed without a traceback, exit status 2.
USER_ERRORS = (ConfigError, CheckpointMismatchError, DataMismatchError, CheckpointCorruptError, WorkdirInUseError,
               FileNotFoundError)


def print_error(prog: str, error: BaseException) -> None:
  """The error's message, prefixed by the program, and how to see the traceback."""
  print(f"{prog}: {error}\n(Set {TRACEBACK_ENV}=1 for the traceback.)", file=sys.stderr)


@contextlib.contextmanager
def exit_on_user_errors(prog: str):
  """Ends a command-line program (the experiment scripts) on an error of `USER_ERRORS`, such as a missing
  data folder, with its message and exit status 2 instead of a traceback (kept with LBJAX_TRACEBACK=1)."""
  try:
    yield
  except USER_ERRORS as e:
    if os.environ.get(TRACEBACK_ENV):
      raise
    print_error(prog, e)
    sys.exit(2)
