"""How the input-pipeline parts time: examples/s by wall clock (`rate`) or per CPU second
(`cpu_rates`), interleaved rounds, medians with their range."""

import os
import statistics
import time

from benchmarks import report


def rate(function, batch_size: int, rounds: int, seconds: float) -> float:
  """Median examples/s of `function()` (one batch per call) over `rounds` timed rounds."""
  function()
  rates = []
  for _ in range(rounds):
    count, start = 0, time.perf_counter()
    while True:
      function()
      count += 1
      elapsed = time.perf_counter() - start
      if elapsed >= seconds:
        break
    rates.append(count * batch_size / elapsed)
  return statistics.median(rates)


def load_average() -> str:
  """The 1-minute load average, e.g. "3.1" (the machine is shared with other work)."""
  return f"{os.getloadavg()[0]:.1f}"


def cpu_rates(functions, count: int, rounds: int, seconds: float) -> dict[str, list[float]]:
  """`count` / CPU seconds of this process per call, for each function in each interleaved round.

  CPU time (`time.process_time`), not wall time: on this shared machine (load average above 10 on
  2 cores) wall time measures the scheduler; CPU time measures the work, i.e. images/s per core.
  Each round runs every function `repeats` times in a row, `repeats` chosen so that the first
  takes about `seconds` of CPU time; one untimed warm-up call each before the first round.
  """
  for function in functions.values():
    function()
  start = time.process_time()
  next(iter(functions.values()))()
  repeats = max(1, round(seconds / max(time.process_time() - start, 1e-6)))
  rates = {name: [] for name in functions}
  for round_index in range(rounds):
    for name in report.round_order(list(functions), round_index):
      start = time.process_time()
      for _ in range(repeats):
        functions[name]()
      rates[name].append(count * repeats / (time.process_time() - start))
  return rates


def cpu_seconds_with_children() -> float:
  """User + system CPU seconds of this process and its live child processes (the workers)."""
  import psutil  # pylint: disable=g-import-not-at-top
  total = 0.0
  me = psutil.Process()
  for process in [me, *me.children(recursive=True)]:
    try:
      times = process.cpu_times()
    except psutil.NoSuchProcess:
      continue
    total += times.user + times.system
  return total


def spread(values: list[float]) -> str:
  return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def ratio_text(values: list[float]) -> str:
  return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"
