"""Threads for reading and decoding the examples of a batch (TFDS reads, JPEG decodes and crops release the GIL)."""

from collections.abc import Callable, Sequence
import concurrent.futures
import numbers
import os
from typing import Any


def default_num_threads() -> int:
  """Threads for decoding and augmenting a batch: the CPU count, at most 16."""
  return min(16, os.cpu_count() or 1)


def check_num_threads(num_threads: Any) -> int:
  """`num_threads` as an int (None: `default_num_threads()`); raises unless it is a positive integer."""
  if num_threads is None:
    return default_num_threads()
  if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral):
    raise TypeError(f"num_threads must be a positive integer or None, got {num_threads!r}.")
  if num_threads < 1:
    raise ValueError(f"num_threads must be >= 1, got {num_threads}.")
  return int(num_threads)


def map_threaded(fn: Callable[[Any], Any], items: Sequence[Any], num_threads: int) -> list[Any]:
  """`[fn(x) for x in items]`, on up to `num_threads` threads, results in order."""
  if num_threads <= 1 or len(items) <= 1:
    return [fn(item) for item in items]
  with concurrent.futures.ThreadPoolExecutor(min(num_threads, len(items))) as pool:
    return list(pool.map(fn, items))
