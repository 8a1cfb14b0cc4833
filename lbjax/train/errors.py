"""Errors a user causes and can fix: the CLI prints their message and exits with status 2.

They subclass `ValueError` (a bad value) or `FileNotFoundError` (missing data), so code that drives
the trainer from Python catches them as usual.
"""


class ConfigError(ValueError):
  """A config, variant or command-line override that cannot run; the message says what to change."""


class CheckpointMismatchError(ValueError):
  """The workdir holds a checkpoint of a different run."""
