"""XLA flag sets against XLA's defaults on the trainer's step: each set in its own processes, alternated.

XLA reads its flags (`XLA_FLAGS`) once, when the backend starts, so a flag set cannot be compared with the
defaults inside one process. Each round starts one process per flag set, in an order that rotates from
round to round; a process builds the trainer's step for every case (`benchmarks.workloads.TrainerStep`,
synthetic data on the device, momentum SGD), times it in a few interleaved inner rounds and prints the
median. The table gives each set's time per step (median over rounds [quartiles]) and its per-round ratio
to the defaults' process of the same round.

Every set given as NAME=FLAGS is first tried in a process that only starts the backend: XLA reads its flags
then and aborts on one it does not know or a value it cannot read, so such a set is refused (exit 2) before
anything is timed. This module's own sets are not tried first (an unattended GPU session spends no process
on them): one that a newer XLA refuses, like a set XLA accepts but whose step then fails, is a row with its
error, the other sets measured.

The default sets are about command buffers (CUDA graphs), which XLA:GPU records for fusions and library
calls but, by default, not for `while` loops and conditionals: a step of a few hundred short kernels (the
LSTMs: two scans of 28 time steps) spends its time launching them. On a CPU the GPU flags change
nothing (the ratios then say how much two processes differ).

    python -m benchmarks.xla_flags [--cases mnist_lstm:128,ptb_lstm:20] [--rounds 3] [--no-readme]
"""

import argparse
import json
import os
import re
import subprocess
import sys

from benchmarks import report

# name -> XLA_FLAGS added to the process's own; "default" is the baseline of every ratio.
FLAG_SETS = {
    "default": "",
    "command buffers with loops": "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL",
    "no command buffers": "--xla_gpu_enable_command_buffer=",
}
BASELINE = "default"
CASES = "mnist_lstm:128,ptb_lstm:20"
RESULT = "XLA_FLAGS_RESULT "  # the line a child prints its times on


def parse_cases(text: str) -> list[tuple[str, int]]:
  """`model:batch,...` -> [(model, batch)], the models those of `benchmarks.workloads.MODELS`."""
  from benchmarks import workloads  # pylint: disable=import-outside-toplevel
  cases = [workloads.parse_case(item) for item in filter(None, text.split(","))]
  if not cases:
    raise argparse.ArgumentTypeError("--cases names no case")
  return cases


def parse_flag_sets(text: str) -> dict[str, str]:
  """`name=flags;...` -> {name: flags}; a name of `FLAG_SETS` alone stands for its flags. The baseline
  (`default`, no flags) comes first whether named or not."""
  sets = {BASELINE: ""}
  for item in filter(None, text.split(";")):
    name, given, flags = item.partition("=")
    name = name.strip()
    if not given and name not in FLAG_SETS:
      raise argparse.ArgumentTypeError(f"{item!r}: a flag set is NAME=FLAGS, or one of {', '.join(FLAG_SETS)}")
    sets[name] = flags.strip() if given else FLAG_SETS[name]
  if len(sets) < 2:
    raise argparse.ArgumentTypeError("--flag-sets names no set beside the defaults")
  return sets


def time_cases(cases: list[tuple[str, int]], inner_rounds: int, seconds_per_round: float) -> dict[str, float]:
  """In this process: seconds per trainer step of each case, median over `inner_rounds` interleaved rounds."""
  from benchmarks import workloads  # pylint: disable=import-outside-toplevel
  steps = {f"{model}:{batch}": workloads.TrainerStep(workloads.trainer_config(model, batch)) for model, batch in cases}
  repeats = {name: report.repeats_for(step, seconds_per_round) for name, step in steps.items()}
  return {name: report.median_seconds({name: step}, rounds=inner_rounds, repeats=repeats[name])[name]
          for name, step in steps.items()}


def _environment(flags: str) -> dict[str, str]:
  """This process's environment with `flags` added to its XLA_FLAGS."""
  return dict(os.environ, XLA_FLAGS=" ".join(filter(None, (os.environ.get("XLA_FLAGS", ""), flags))))


def _last_lines(done: subprocess.CompletedProcess) -> str:
  return " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[:400] or f"exit status {done.returncode}"


def xla_refusal(flags: str, timeout: float) -> str | None:
  """Why XLA refuses `flags` when its backend starts, or None: a process that only starts the backend under them
  (XLA parses XLA_FLAGS then, aborting on an unknown flag or a value it cannot read); its XLA error lines."""
  env = _environment(flags)
  if not env["XLA_FLAGS"]:
    return None
  try:
    done = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return f"the backend did not start within --process-timeout {timeout:g} s"
  if not done.returncode:
    return None
  logged = re.findall(r"^[EF]\d{4} [^\]]*\] (.*)$", done.stderr, re.MULTILINE)  # XLA's `F1201 ... file.cc:234] ...`
  return " ".join(logged)[:400] or _last_lines(done)


def run_process(flags: str, args: argparse.Namespace) -> dict[str, float] | str:
  """One child process under `flags`: its seconds per step by case, or its error's last lines (or that it ran past
  --process-timeout, a failure of that set like any other)."""
  env = _environment(flags)
  command = [sys.executable, "-m", "benchmarks.xla_flags", "--child", "--cases", args.cases,
             "--inner-rounds", str(args.inner_rounds), "--seconds-per-round", str(args.seconds_per_round)]
  try:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.process_timeout,
                          check=False)
  except subprocess.TimeoutExpired:
    return f"the process ran past --process-timeout {args.process_timeout:g} s (stopped)"
  for line in done.stdout.splitlines():
    if line.startswith(RESULT):
      return json.loads(line[len(RESULT):])
  return _last_lines(done)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default=CASES, help="MODEL:BATCH,... (models of benchmarks.workloads)")
  parser.add_argument("--flag-sets", default=";".join(FLAG_SETS),
                      help=f"NAME=FLAGS;... or names of {', '.join(FLAG_SETS)}; the defaults always run")
  parser.add_argument("--inner-rounds", type=report.positive_int, default=5, help="timed rounds in each process")
  parser.add_argument("--seconds-per-round", type=report.positive_float, default=0.2)
  parser.add_argument("--process-timeout", type=report.positive_float, default=300.0,
                      help="seconds a process may take before it counts as failed")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  report.add_spread_arguments(parser, rounds=3)
  args = parser.parse_args()
  try:
    cases, sets = parse_cases(args.cases), parse_flag_sets(args.flag_sets)
  except argparse.ArgumentTypeError as e:
    parser.error(str(e))
  if args.child:
    print(RESULT + json.dumps(time_cases(cases, args.inner_rounds, args.seconds_per_round)), flush=True)
    return
  typed = {name: flags for name, flags in sets.items() if flags != FLAG_SETS.get(name)}  # not this module's own
  refused = {name: why for name, flags in typed.items() if (why := xla_refusal(flags, args.process_timeout))}
  if refused:
    parser.error("XLA refuses these flag sets when its backend starts, so nothing was timed:\n" + "".join(
        f"  {name!r} (XLA_FLAGS={_environment(sets[name])['XLA_FLAGS']!r}): {why}\n" for name, why in refused.items())
                 + "Correct the flag's name or value (XLA's flags: xla/debug_options_flags.cc), or drop the set.")

  names = list(sets)
  case_names = [f"{model}:{batch}" for model, batch in cases]  # the keys a child reports its times under
  times = {(case, name): [] for case in case_names for name in names}
  failed: dict[str, str] = {}
  for round_index in range(args.rounds):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      result = run_process(sets[name], args) if name not in failed else None
      if isinstance(result, str):
        failed[name] = result
        print(f"[xla_flags] {name}: {result}", flush=True)
      elif result is not None:
        for case, seconds in result.items():
          times[(case, name)].append(seconds)
  if BASELINE in failed:
    sys.exit(f"the defaults' process failed: {failed[BASELINE]}")

  check = report.SpreadCheck(args.max_spread)
  rows = []
  for case in case_names:
    for name in names:
      if name in failed:
        rows.append([case, name, f"`{sets[name]}`", f"failed: {failed[name]}", ""])
        continue
      ratio = "" if name == BASELINE else check.record(f"{case}: {name} / {BASELINE}", report.paired_ratios(
          {name: times[(case, name)], BASELINE: times[(case, BASELINE)]}, name, BASELINE)).format(digits=3)
      flags = f"`{sets[name]}`" if sets[name] else ""
      rows.append([case, name, flags, report.Spread.of(times[(case, name)]).format(1e3, 2), ratio])
  table = report.markdown_table(["model:batch", "flag set", "XLA_FLAGS", "ms per step", f"x {BASELINE}"], rows)
  notes = (f"Each round starts one process per flag set (the order rotating from round to round); a process times "
           f"the trainer's step ({args.inner_rounds} inner rounds of ~{args.seconds_per_round:g} s, synthetic data "
           f"on the device, momentum SGD) and keeps the median. Times: median over {args.rounds} rounds [quartiles]; "
           f"x {BASELINE}: the per-round ratio to the defaults' process of the same round (median [quartiles]).")
  print(table + "\n\n" + notes)
  # Only now, in finish's header_lines, does this process start a backend: the children had the GPU.
  check.finish(args, "xla-flags", "XLA flags on the trainer's step: `benchmarks/xla_flags.py`",
               table + "\n\n" + notes)


if __name__ == "__main__":
  main()
