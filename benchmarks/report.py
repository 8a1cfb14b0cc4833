"""What every benchmark script shares: interleaved median timing and its README section.

The machine these run on is shared and noisy, so a figure is a ratio against a baseline measured in
the same process, in interleaved rounds (A, B, A, B, ...), and each rate is the median over rounds.
"""

from collections.abc import Callable, Sequence
import datetime
import os
import pathlib
import platform
import re
import statistics
import sys
import time

import jax

README = pathlib.Path(__file__).resolve().parent / "README.md"
README_INTRO = """# lbjax benchmarks

Speed and memory of lbjax's trainer, input pipelines and optimizers. Each section is written by the
script it names (`python -m benchmarks.<name>` from the repository root) and rewritten in place when
the script runs again. Figures are ratios against a baseline measured in the same process, in
interleaved rounds, medians taken, because the machine is shared and noisy.
"""


def round_seconds(functions: dict[str, Callable[[], object]], *, rounds: int, repeats: int,
                  sync: Callable[[object], object] = jax.block_until_ready
                  ) -> dict[str, list[float]]:
  """Seconds per call of each function in each of `rounds` interleaved rounds.

  Each round calls every function `repeats` times in a row (after one untimed warm-up call before
  the first round) and waits for the last result with `sync`.

  Args:
    functions: name -> zero-argument callable returning something `sync` can wait on.
    rounds: number of interleaved rounds.
    repeats: calls per function per round.
    sync: waits for a result (default `jax.block_until_ready`).

  Returns:
    name -> list of `rounds` per-call times in seconds.
  """
  if rounds < 1 or repeats < 1:
    raise ValueError(f"rounds and repeats must be >= 1, got {rounds} and {repeats}.")
  for function in functions.values():
    sync(function())
  times = {name: [] for name in functions}
  for _ in range(rounds):
    for name, function in functions.items():
      start = time.perf_counter()
      for _ in range(repeats):
        result = function()
      sync(result)
      times[name].append((time.perf_counter() - start) / repeats)
  return times


def median_seconds(functions: dict[str, Callable[[], object]], *, rounds: int, repeats: int,
                   sync: Callable[[object], object] = jax.block_until_ready) -> dict[str, float]:
  """Median over `round_seconds`'s interleaved rounds of the seconds per call of each function."""
  times = round_seconds(functions, rounds=rounds, repeats=repeats, sync=sync)
  return {name: statistics.median(values) for name, values in times.items()}


def cpu_model() -> str:
  """The CPU model name from /proc/cpuinfo (or `platform.processor()` elsewhere)."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def machine_line() -> str:
  """One line naming the machine: CPU model, cores, JAX version and devices, date (UTC)."""
  devices = jax.devices()
  now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  return (f"{cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}, "
          f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform}), {now}")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  """A GitHub markdown table; floats are printed as given (format them before)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def command_line() -> str:
  """The command that ran this script, as a reader would retype it."""
  module = pathlib.Path(sys.argv[0]).stem
  return " ".join(["python -m benchmarks." + module, *sys.argv[1:]])


def write_section(name: str, title: str, body: str, *, readme: pathlib.Path = README) -> None:
  """Rewrites the `<!-- BEGIN name -->` ... `<!-- END name -->` section of the README in place.

  The file is re-read right before the edit (others write their own sections concurrently) and only
  this section changes; a missing file is created with a short intro, a missing section appended.

  Args:
    name: the section's marker name.
    title: its markdown heading (without '#').
    body: markdown below the heading (command, machine, tables, notes).
    readme: the README path.
  """
  begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
  section = f"{begin}\n## {title}\n\n{body.strip()}\n{end}"
  text = readme.read_text() if readme.exists() else README_INTRO
  pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
  if pattern.search(text):
    text = pattern.sub(lambda _: section, text, count=1)
  else:
    text = text.rstrip("\n") + "\n\n" + section + "\n"
  readme.write_text(text)


def header_lines() -> str:
  """The command and machine lines every section starts with."""
  return f"Command: `{command_line()}`\n\nMachine: {machine_line()}\n"
