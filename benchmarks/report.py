"""What every benchmark script shares: interleaved timing, medians with their spread, README sections.

The machine these run on is shared and noisy, so a figure is a ratio against a baseline measured in
the same process, in interleaved rounds (A, B, C, then B, C, A, ...), reported as the median over
rounds with its interquartile range. A ratio is taken round by round (both sides under the same
load) and `SpreadCheck` refuses to report one whose median is too uncertain (95% interval wider
than --max-spread of it): the script then exits with status 3 and leaves its README section as it
was.
"""

import argparse
from collections.abc import Callable, Sequence
import dataclasses
import datetime
import math
import os
import pathlib
import platform
import re
import shlex
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


def round_order(names: list[str], round_index: int) -> list[str]:
  """The order of `names` in interleaved round `round_index`: rotated by one each round, so that none always runs
  first (after a pause) or last."""
  shift = round_index % len(names)
  return names[shift:] + names[:shift]


def round_seconds(functions: dict[str, Callable[[], object]], *, rounds: int,
                  repeats: int | dict[str, int], sync: Callable[[object], object] = jax.block_until_ready
                  ) -> dict[str, list[float]]:
  """Seconds per call of each function in each of `rounds` interleaved rounds.

  Each round calls every function `repeats` times in a row (after one untimed warm-up call before
  the first round) and waits for the last result with `sync`. The order of the functions rotates
  by one every round, so that none always runs first (after a pause) or last.

  Args:
    functions: name -> zero-argument callable returning something `sync` can wait on.
    rounds: number of interleaved rounds.
    repeats: calls per function per round: one count for all, or name -> count (so that every
      function's turn lasts about as long, see `repeats_for`).
    sync: waits for a result (default `jax.block_until_ready`).

  Returns:
    name -> list of `rounds` per-call times in seconds, in round order.
  """
  if isinstance(repeats, int):
    repeats = {name: repeats for name in functions}
  if rounds < 1 or min(repeats.values(), default=1) < 1:
    raise ValueError(f"rounds and repeats must be >= 1, got {rounds} and {repeats}.")
  for function in functions.values():
    sync(function())
  names = list(functions)
  times = {name: [] for name in names}
  for round_index in range(rounds):
    for name in round_order(names, round_index):
      function = functions[name]
      start = time.perf_counter()
      for _ in range(repeats[name]):
        result = function()
      sync(result)
      times[name].append((time.perf_counter() - start) / repeats[name])
  return times


def median_seconds(functions: dict[str, Callable[[], object]], *, rounds: int, repeats: int,
                   sync: Callable[[object], object] = jax.block_until_ready) -> dict[str, float]:
  """Median over `round_seconds`'s interleaved rounds of the seconds per call of each function."""
  times = round_seconds(functions, rounds=rounds, repeats=repeats, sync=sync)
  return {name: statistics.median(values) for name, values in times.items()}


def repeats_for(function: Callable[[], object], seconds_per_round: float,
                sync: Callable[[object], object] = jax.block_until_ready) -> int:
  """Calls per round so that one round of `function` lasts about `seconds_per_round` (>= 1)."""
  sync(function())
  start = time.perf_counter()
  sync(function())
  return max(1, round(seconds_per_round / max(time.perf_counter() - start, 1e-6)))


@dataclasses.dataclass(frozen=True)
class Spread:
  """Median and spread of repeated measurements (per-round times or per-round ratios).

  Attributes:
    median: the median.
    q1, q3: first and third quartiles (inclusive method, as `numpy.percentile`'s default).
    low, high: smallest and largest value.
    count: number of values.
  """

  median: float
  q1: float
  q3: float
  low: float
  high: float
  count: int
  median_low: float
  median_high: float

  @classmethod
  def of(cls, values: Sequence[float]) -> "Spread":
    """The spread of `values` (at least one)."""
    values = sorted(values)
    if not values:
      raise ValueError("Spread.of needs at least one value.")
    q1, _, q3 = (statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1
                 else (values[0],) * 3)
    rank = _median_interval_rank(len(values))
    return cls(statistics.median(values), q1, q3, values[0], values[-1], len(values),
               values[rank], values[len(values) - 1 - rank])

  @property
  def relative_iqr(self) -> float:
    """(q3 - q1) / median: the spread as a fraction of the median."""
    return (self.q3 - self.q1) / self.median if self.median else math.inf

  @property
  def relative_median_interval(self) -> float:
    """Width of the 95% confidence interval of the median, as a fraction of the median."""
    return (self.median_high - self.median_low) / self.median if self.median else math.inf

  def format(self, scale: float = 1.0, digits: int = 1) -> str:
    """`median [q1, q3]` of the values times `scale`, e.g. `24.5 [23.9, 25.2]`."""
    return (f"{scale * self.median:.{digits}f} [{scale * self.q1:.{digits}f}, "
            f"{scale * self.q3:.{digits}f}]")


def _median_interval_rank(count: int, confidence: float = 0.95) -> int:
  """0-based rank `j` such that [x_(j), x_(n-1-j)] of `count` sorted values holds the median with
  at least `confidence` (distribution-free: the median lies below x_(j) only if at most j values
  are below it, and that count is Binomial(n, 1/2)); 0 (the whole range) when `count` is too small
  for that confidence."""
  tail, rank = 0.0, 0
  for j in range((count + 1) // 2):
    tail += math.comb(count, j) / 2**count  # P(at most j values below the median)
    if 2 * tail > 1 - confidence:
      break
    rank = j
  return rank


def paired_ratios(times: dict[str, list[float]], numerator: str, denominator: str) -> Spread:
  """Spread of the per-round ratios `times[numerator][i] / times[denominator][i]`.

  Rounds are interleaved, so a ratio within one round compares the two under the same load; the
  spread of these ratios says how far the load drift of the machine moves the comparison.
  """
  return Spread.of([a / b for a, b in zip(times[numerator], times[denominator])])


class SpreadCheck:
  """Collects ratios and says which are too noisy to mean anything.

  A ratio is meaningless when the 95% confidence interval of the median of its per-round values
  (distribution-free, from their order statistics) is wider than `max_width` of the median: the
  load of the machine moved it more than the comparison can bear. More rounds narrow the interval.
  A benchmark records every ratio it reports, prints the verdict and exits with `EXIT_TOO_NOISY`
  (without rewriting its README section) if any failed.
  """

  EXIT_TOO_NOISY = 3

  def __init__(self, max_width: float):
    if not max_width > 0:
      raise ValueError(f"max_width must be > 0, got {max_width}.")
    self.max_width = max_width
    self.failures: list[str] = []

  def record(self, label: str, spread: Spread) -> Spread:
    """Records one reported ratio; returns it."""
    if spread.relative_median_interval > self.max_width:
      self.failures.append(
          f"{label}: median {spread.median:.3f}, 95% interval [{spread.median_low:.3f}, "
          f"{spread.median_high:.3f}] over {spread.count} rounds, "
          f"{100 * spread.relative_median_interval:.0f}% of the median > "
          f"{100 * self.max_width:.0f}%")
    return spread

  def warning(self) -> str:
    """Markdown naming the too-noisy ratios (empty when there are none), to head a section."""
    if not self.failures:
      return ""
    return ("**Too noisy** (written with `--write-noisy`; the run exited with status "
            f"{self.EXIT_TOO_NOISY}): the 95% interval of these medians is wider than "
            f"{100 * self.max_width:.0f}% of them, so read these ratios as rough:\n\n" +
            "\n".join(f"- {failure}" for failure in self.failures) + "\n\n")

  def exit_if_noisy(self) -> None:
    """Prints the failed ratios and exits with `EXIT_TOO_NOISY` if there are any."""
    if self.failures:
      print("Too noisy to report (rerun on a quieter machine, with more --rounds, or raise "
            "--max-spread):", *self.failures, sep="\n  ", file=sys.stderr)
      sys.exit(self.EXIT_TOO_NOISY)

  def finish(self, args: argparse.Namespace, name: str, title: str, body: str) -> None:
    """Ends a timing benchmark: `publish`es `body` under the `warning` if the ratios are sound or
    `--write-noisy` was given, then `exit_if_noisy`. `args` holds `add_spread_arguments`' options."""
    if not self.failures or args.write_noisy:
      publish(args, name, title, self.warning() + body)
    self.exit_if_noisy()


def flags_given(parser: argparse.ArgumentParser, args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
  """The `--flag` names of `dests` whose value differs from the parser's default (a flag given at its
  default value is not told apart), in the order of `dests`; for refusing what a mode would not use."""
  return [f"--{dest.replace('_', '-')}" for dest in dests if getattr(args, dest) != parser.get_default(dest)]


def positive_int(text: str) -> int:
  """An argparse type: an integer >= 1 (a count of rounds, repeats, steps)."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
  return value


def positive_float(text: str) -> float:
  """An argparse type: a number > 0 (a spread, a number of seconds)."""
  value = float(text)
  if not value > 0:
    raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
  return value


def add_spread_arguments(parser, *, rounds: int, max_spread: float = 0.1) -> None:
  """The `--rounds`, `--max-spread` and `--write-noisy` options every timing benchmark shares."""
  parser.add_argument("--rounds", type=positive_int, default=rounds, help="interleaved rounds")
  parser.add_argument(
      "--max-spread", type=positive_float, default=max_spread,
      help="widest 95%% confidence interval of a reported ratio's median, as a fraction of the "
           f"median, before the run is declared too noisy (exit {SpreadCheck.EXIT_TOO_NOISY}, "
           "README untouched unless --write-noisy)")
  parser.add_argument(
      "--write-noisy", action="store_true",
      help="write the README section even when too noisy, headed by the list of noisy ratios "
           f"(the exit status is still {SpreadCheck.EXIT_TOO_NOISY})")


def load_average() -> str:
  """The 1-minute load average and the core count, e.g. `load 3.2 on 2 cores`."""
  try:
    load = os.getloadavg()[0]
  except OSError:
    return f"{os.cpu_count()} cores"
  return f"load average {load:.1f} on {os.cpu_count()} cores"


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
          f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform}), {now}, "
          f"{load_average()} at the end of the run")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  """A GitHub markdown table; floats are printed as given (format them before)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
  return "\n".join(lines)


def command_line() -> str:
  """The command that ran this script, as a reader would retype it (a package run as `python -m
  benchmarks.input_pipeline` is named so, not by its `__main__`)."""
  path = pathlib.Path(sys.argv[0])
  module = path.parent.name if path.stem == "__main__" else path.stem
  return shlex.join(["python", "-m", "benchmarks." + module, *sys.argv[1:]])


def publish(args: argparse.Namespace, name: str, title: str, body: str, *, per_platform: bool = True) -> None:
  """Unless `--no-readme` was given (`args.no_readme`), `write_section` with the machine's `header_lines`
  above `body`."""
  if not args.no_readme:
    write_section(name, title, header_lines() + "\n" + body, per_platform=per_platform)


def write_section(name: str, title: str, body: str, *, readme: pathlib.Path = README,
                  per_platform: bool = True) -> None:
  """Rewrites the `<!-- BEGIN name -->` ... `<!-- END name -->` section of the README in place.

  The file is re-read right before the edit (others write their own sections concurrently) and only
  this section changes; a missing file is created with a short intro, a missing section appended.
  Measured on an accelerator, a table goes to its own section beside the CPU one: `<name>-gpu`
  (`-tpu`), its title naming the device.

  Args:
    name: the section's marker name.
    title: its markdown heading (without '#').
    body: markdown below the heading (command, machine, tables, notes).
    readme: the README path.
    per_platform: False for a section that is only ever measured on an accelerator.
  """
  backend = jax.default_backend()
  if per_platform and backend != "cpu":
    name, title = f"{name}-{backend}", f"{title}, on {jax.devices()[0].device_kind}"
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
