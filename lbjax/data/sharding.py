"""Which part of a global batch each process reads.

A global batch of B rows is split into P equal contiguous shares; process p reads rows
`[p*B/P, (p+1)*B/P)`. The content of the global batch therefore does not depend on P.
"""

import numbers
from typing import Any


def check_process(process_index: Any, process_count: Any) -> None:
  """Raises unless `0 <= process_index < process_count` are integers."""
  for name, value in (("process_index", process_index), ("process_count", process_count)):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise TypeError(f"{name} must be an integer, got {value!r}.")
  if process_count < 1:
    raise ValueError(f"process_count must be >= 1, got {process_count}.")
  if not 0 <= process_index < process_count:
    raise ValueError(
        f"process_index must lie in [0, process_count={process_count}), got {process_index}.")


def process_slice(global_batch_size: Any, process_index: int, process_count: int) -> slice:
  """Rows `[p*B/P, (p+1)*B/P)` of a global batch of B rows that process p of P reads.

  Raises:
    ValueError: B is not a positive integer or not divisible by P.
  """
  check_process(process_index, process_count)
  if (isinstance(global_batch_size, bool) or not isinstance(global_batch_size, numbers.Integral)
      or global_batch_size < 1):
    raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}.")
  if global_batch_size % process_count:
    raise ValueError(
        f"global_batch_size={global_batch_size} is not divisible by process_count="
        f"{process_count}; every process must get an equal share. Choose a batch size that is a "
        f"multiple of {process_count}.")
  share = int(global_batch_size) // process_count
  return slice(process_index * share, (process_index + 1) * share)
