"""lbjax's optimizer state classes in `flax.serialization` (`to_bytes`, `to_state_dict`; what Flax's TrainState
and `flax.training.checkpoints` save with), once flax is loaded.

`layerwise.LayerRates` and `multi_tensor.FlatTree` are pytrees with static metadata (their layouts), which
`flax.serialization` does not know: `to_bytes` of a LARS state raised "can not serialize 'LayerRates' object".
lbjax.optim imports no flax, so they are registered when lbjax.optim is imported and again when a state is
made (`init`), if flax is loaded by then. A state dict holds the arrays by position ("0", "1", ...); restoring
takes the layout from the target state. (Orbax saves them as it saves any pytree.)
"""

import dataclasses
import functools
import sys
from typing import Any


def register_if_flax_is_loaded(cls: type, field: str) -> None:
  """Registers `cls`, a dataclass whose arrays are the tuple `field`, with `flax.serialization`, if flax has been
  imported (once)."""
  if "flax" not in sys.modules:
    return
  from flax import serialization  # pylint: disable=import-outside-toplevel
  if not serialization.is_serializable(cls):
    serialization.register_serialization_state(cls, functools.partial(_to_state_dict, field=field),
                                               functools.partial(_from_state_dict, field=field))


def _to_state_dict(value: Any, field: str) -> dict[str, Any]:
  from flax import serialization  # pylint: disable=import-outside-toplevel
  return {str(i): serialization.to_state_dict(array) for i, array in enumerate(getattr(value, field))}


def _from_state_dict(target: Any, state: dict[str, Any], field: str) -> Any:
  from flax import serialization  # pylint: disable=import-outside-toplevel
  arrays = getattr(target, field)
  restored = tuple(serialization.from_state_dict(array, state[str(i)], name=str(i)) if str(i) in state else None
                   for i, array in enumerate(arrays))
  saved = [tuple(state[key].shape) for key in sorted(state, key=int)]
  if len(state) != len(arrays) or any(tuple(r.shape) != tuple(a.shape) for r, a in zip(restored, arrays)):
    raise ValueError(f"{type(target).__name__}: the saved state holds arrays of shapes {saved}, the target "
                     f"{[tuple(a.shape) for a in arrays]}: restore into the state of the same optimizer and "
                     "parameters it was saved from.")
  return dataclasses.replace(target, **{field: restored})
