"""Errors a user causes and can fix: the CLI prints their message and exits with status 2.

They subclass `ValueError` (a bad value) or `FileNotFoundError` (missing data), so code that drives
the trainer from Python catches them as usual. `print_error` is the one format of such a message on
the console; `exit_on_user_errors` ends a command-line program (`lbjax-train`'s siblings, the
experiment scripts) with it. A run preempted by SIGTERM or SIGINT (`RunPreempted`) ends an experiment
script the same way, with `PREEMPTED_EXIT_STATUS`: nothing is wrong, the same command resumes it.
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


class RunPreempted(KeyboardInterrupt):
  """A run of an experiment saved its checkpoint on SIGTERM or SIGINT and stopped; the message says which
  and where. A `KeyboardInterrupt`, so it stops the experiment as Ctrl-C does (no `except Exception`
  catches it); running the same command again resumes the run."""


# Exit status of an experiment script stopped by `RunPreempted`: BSD's EX_TEMPFAIL ("try again later").
PREEMPTED_EXIT_STATUS = 75

# Errors whose message says what to change: printed without a traceback, exit status 2.
USER_ERRORS = (ConfigError, CheckpointMismatchError, DataMismatchError, CheckpointCorruptError, WorkdirInUseError,
               FileNotFoundError)


def print_error(prog: str, error: BaseException) -> None:
  """The error's message, prefixed by the program, and how to see the traceback."""
  print(f"{prog}: {error}\n(Set {TRACEBACK_ENV}=1 for the traceback.)", file=sys.stderr)


@contextlib.contextmanager
def exit_on_user_errors(prog: str):
  """Ends a command-line program (the experiment scripts) on an error of `USER_ERRORS`, such as a missing
  data folder, with its message and exit status 2 instead of a traceback (kept with LBJAX_TRACEBACK=1),
  and on a preempted run (`RunPreempted`) with its message and `PREEMPTED_EXIT_STATUS`."""
  try:
    yield
  except RunPreempted as e:
    print(f"{prog}: {e}", file=sys.stderr)
    sys.exit(PREEMPTED_EXIT_STATUS)
  except USER_ERRORS as e:
    if os.environ.get(TRACEBACK_ENV):
      raise
    print_error(prog, e)
    sys.exit(2)
