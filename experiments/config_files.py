"""Loading an experiment config file (`configs/<name>.py`) with a variant string, as the CLI does."""

import importlib.util
import pathlib

import ml_collections


def load_config(path: str | pathlib.Path, variant: str | None = None) -> ml_collections.ConfigDict:
  """Returns `get_config(variant)` of the config file at `path`.

  Args:
    path: a Python file defining `get_config(arg=None)`, e.g. `configs/mnist_lstm.py`.
    variant: the variant string passed to `get_config`, e.g. `"batch=512,rule=legw"`.

  Raises:
    FileNotFoundError: if `path` does not exist.
    AttributeError: if the file defines no `get_config`.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"Config file {path} not found; pass a file such as configs/mnist_lstm.py.")
  spec = importlib.util.spec_from_file_location(f"lbjax_experiment_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise AttributeError(f"Config file {path} defines no get_config(arg); every configs/*.py must.")
  return module.get_config(variant or None)
