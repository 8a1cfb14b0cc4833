"""Where the real datasets live: `$LBJAX_DATA_DIR`, else `../shared/data` next to the repo or cwd.

The expected layout is that of the shared data folder: `<data_dir>/mnist/*-idx?-ubyte.gz` and
`<data_dir>/ptb/ptb.{train,valid,test}.txt`.
"""

import os
import pathlib

DATA_DIR_ENV = "LBJAX_DATA_DIR"

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def default_data_dir() -> pathlib.Path:
  """Returns the folder with the real MNIST/PTB files.

  Looked up in this order:
    1. the environment variable `LBJAX_DATA_DIR` (must name an existing folder);
    2. `../shared/data` relative to the lbjax repository root;
    3. `../shared/data` relative to the current working directory.

  Raises:
    FileNotFoundError: naming every place that was tried and how to point lbjax at the data.
  """
  from_env = os.environ.get(DATA_DIR_ENV)
  if from_env:
    path = pathlib.Path(from_env).expanduser()
    if not path.is_dir():
      raise FileNotFoundError(
          f"{DATA_DIR_ENV}={from_env!r} is not a directory. Point it at the folder holding "
          "mnist/ and ptb/ (e.g. the shared data folder), or unset it.")
    return path
  candidates = [_REPO_ROOT.parent / "shared" / "data",
                pathlib.Path.cwd().parent / "shared" / "data"]
  for path in candidates:
    if path.is_dir():
      return path
  tried = ", ".join(str(path) for path in candidates)
  raise FileNotFoundError(
      f"No data folder found: {DATA_DIR_ENV} is unset and none of [{tried}] exists. Set "
      f"{DATA_DIR_ENV} to the folder holding mnist/ and ptb/, or pass data_dir explicitly.")


def how_to_set(subfolder: str) -> str:
  """How to point a loader at another data folder, for messages (`subfolder`: "mnist/")."""
  return (f"Set {DATA_DIR_ENV} or config.data_dir (lbjax-train: --config.data_dir=PATH) to the folder that holds "
          f"{subfolder}")


def origin(data_dir: str | os.PathLike[str] | None) -> str:
  """Where a loader's data folder came from, for its messages: `data_dir` as given (a loader's argument,
  lbjax-train's `config.data_dir`), or None: `default_data_dir()` (`LBJAX_DATA_DIR`, else the shared folder)."""
  if data_dir is not None:
    return "set by data_dir, lbjax-train's config.data_dir"
  if os.environ.get(DATA_DIR_ENV):
    return f"set by {DATA_DIR_ENV}"
  return f"the default, {DATA_DIR_ENV} and config.data_dir being unset"
