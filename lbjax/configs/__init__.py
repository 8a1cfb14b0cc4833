"""The experiment configs shipped with lbjax: `lbjax-train --config mnist_lstm`, `lbjax-train --list`.

Each module is a config of the shape `lbjax.config_files` describes: `get_config()`, the `VARIANTS` it
understands (`Variant`, below) and, where settings follow from others, `finalize(config, presets)`.
Configs use the trainer's public API; `lbjax.config_files` (the command line's) finds and loads them.
"""

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Variant:
  """A key of a config's variant string.

  Attributes:
    help: what it sets, for `--list` and messages.
    field: the config field it is an alias of; None for a preset handled by `finalize`.
    type: a preset's type (int, float, str, bool).
    default: a preset's value when not given.
    choices: a preset's allowed values, if limited.
    only_with: `(key, values)`: the key applies only where preset `key` has one of `values`; given elsewhere it
      is refused (an experiment that gives every run the same keys drops it from the runs it does not apply to).
  """
  help: str
  field: str | None = None
  type: type = str
  default: Any = None
  choices: tuple[Any, ...] = ()
  only_with: tuple[str, tuple[Any, ...]] | None = None
