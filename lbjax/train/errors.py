"""Errors a user causes and can fix: the CLI prints their message and exits with status 2.

They subclass `ValueError` (a bad value) or `FileNotFoundError` (missing data), so code that drives
the trainer from Python catches them as usual.
"""


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
