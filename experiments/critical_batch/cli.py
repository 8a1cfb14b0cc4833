"""The command line of `python -m experiments.critical_batch` (`measure` and `warmup`)."""

import argparse
import pathlib
import shlex
import sys
from typing import Sequence

from experiments import adaptive_batch
from experiments import config_spec
from experiments import critical_batch
from experiments import fields_the_experiment_sets
from experiments import runner
from experiments import variant_fields
from experiments.critical_batch import measure as measure_lib
from experiments.critical_batch.branches import KEEP_ALL_CHECKPOINTS
from experiments.critical_batch import warmup as warmup_lib
from experiments.critical_batch.grid import load_config, make_grid, train_examples
from lbjax import train
from lbjax.train.errors import WorkdirInUseError


def _overrides(text: str) -> list[str]:
  """argparse type of --overrides: "a=1 b='x y'" -> ['a=1', 'b=x y'], split as a shell splits words."""
  try:
    return shlex.split(text)
  except ValueError as e:  # an unclosed quote
    raise argparse.ArgumentTypeError(f"{e} in {text!r}: quote as a shell does, e.g. "
                                     "\"data_options.eval_split=validation lr.base=0.1\"") from None


def main(argv: Sequence[str] | None = None) -> None:
  """Command-line entry; see the package docstring."""
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(prog="python -m experiments.critical_batch",
                                   description=critical_batch.__doc__.split("\n\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  for name in ("measure", "warmup"):
    sub = commands.add_parser(name)
    sub.add_argument("--config", required=True)
    sub.add_argument("--overrides", type=_overrides, default="", help="field=value settings, space-separated, e.g. "
                     "'data_options.eval_split=validation batch.micro_batch_size=64'")
    sub.add_argument("--out", required=True, help="output prefix, e.g. docs/results/critical_batch_mnist")
    sub.add_argument("--workdir", required=True)
    sub.add_argument("--title", default="")
    sub.add_argument("--allow_test_split", action="store_true",
                     help="evaluate on the test split where the config does (refused without it: the choices "
                     "would be made on the test split; pass --overrides data_options.eval_split=validation)")
  measure_parser, warmup_parser = commands.choices["measure"], commands.choices["warmup"]
  measure_parser.add_argument("--checkpoints", type=runner.floats, default="0,0.25,0.5,1,2,4",
                              help="epochs of the reference run")
  measure_parser.add_argument("--batch_sizes", type=runner.ints, default="128,256,512,1024,2048,4096,8192",
                              help="the grid; the first is the reference batch")
  measure_parser.add_argument("--budget_epochs", type=float, default=0.5,
                              help="examples per branch, in epochs (rounded to a whole number of every batch size)")
  measure_parser.add_argument("--tolerance", type=float, default=0.02,
                              help="relative: B is within the CBS while loss(B) <= (1 + tolerance) loss(B0)")
  measure_parser.add_argument("--lr_multipliers", type=runner.floats, default="1",
                              help="e.g. 0.5,1,2: the best LR per branch")
  warmup_parser.add_argument("--cbs", required=True,
                             help="a `measure` table, e.g. docs/results/critical_batch_mnist.csv")
  warmup_parser.add_argument("--seeds", type=runner.ints, default="0,1,2")
  warmup_parser.add_argument("--max_batch", type=int, default=0, help="cap of the warm-up's batch (0: none)")
  warmup_parser.add_argument("--targets", type=runner.floats, default="",
                             help="more targets besides the baseline's final metric: "
                             "accuracy as a fraction (0.97), perplexity as it is")
  runner.add_dry_run(warmup_parser)
  warmup_parser.add_argument("--tolerance", type=float, default=None,
                             help="the CBS at this tolerance from the table's loss ratios (default: the table's CBS)")
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  command = "python -m experiments.critical_batch " + shlex.join(argv)
  try:  # a bad grid, config or table: the message and exit status 2, as lbjax-train does
    if args.command == "measure":
      _measure_command(args, command)
    else:
      _warmup_command(args, parser, command)
  except ValueError as e:
    parser.exit(2, f"{e}\n")


def _test_split_refusal(args: argparse.Namespace, split: str, choices: str) -> str:
  """Why the command refuses to evaluate on `split`, or "" if it does not: the test split, unless
  --allow_test_split, since the command `choices` on the split it evaluates."""
  if split != "test" or args.allow_test_split:
    return ""
  return (f"{args.command} {choices} on the evaluation split, which is the test split here (data_options.eval_split "
          f"of --config {args.config}): pass --overrides data_options.eval_split=validation (valid for PTB) to "
          "choose on data held out of training, or --allow_test_split to use the test split all the same.")


def _measure_command(args: argparse.Namespace, command: str) -> None:
  config = load_config(args.config,
                       args.overrides + [f"keep_checkpoints={KEEP_ALL_CHECKPOINTS}"])
  train.validate(config)
  grid = make_grid(config, args.checkpoints, args.batch_sizes, args.budget_epochs, args.tolerance,
                   args.lr_multipliers, train_examples(config))
  if refusal := _test_split_refusal(args, grid.split, "chooses each branch's LR and the critical batch size"):
    raise ValueError(refusal)
  measure_lib.measure(config, grid, pathlib.Path(args.workdir), pathlib.Path(args.out), command,
          args.title or "Critical batch size vs the gradient noise scale")


def _warmup_command(args: argparse.Namespace, parser: argparse.ArgumentParser, command: str) -> None:
  overrides = args.overrides
  given = variant_fields(args.config) | {o.partition("=")[0].strip() for o in overrides}
  set_by = {"run": "each run", "seed": "--seeds", "large_batch": "each run", "batch.max_batch_size": "each run"}
  if refusal := fields_the_experiment_sets(given, set_by, f"--config {args.config!r} or --overrides"):
    parser.error(refusal)
  out, workdir = pathlib.Path(args.out), pathlib.Path(args.workdir)
  if not pathlib.Path(args.cbs).is_file():
    raise ValueError(f"--cbs {args.cbs} not found: give the table `measure` wrote (<out>.csv).")
  seeds, extra_targets = args.seeds, args.targets
  if problem := runner.seeds_problem(seeds):
    parser.error(f"--{problem}")
  if args.tolerance is not None and not args.tolerance >= 0:
    parser.error(f"--tolerance must be >= 0, got {args.tolerance}")
  if args.max_batch < 0:
    parser.error(f"--max_batch must be >= 0 (the largest batch of the warm-up; 0: no cap), got {args.max_batch}")
  curve = measure_lib.read_cbs_curve(args.cbs, args.tolerance)
  source = f"the CBS of {args.cbs}" + ("" if args.tolerance is None else f" at tolerance {args.tolerance:g}")
  if not curve:
    parser.exit(2, f"{args.cbs} holds no measured CBS yet; run `measure` first.\n")
  probe = load_config(config_spec(args.config, "run=baseline"), overrides)
  if problem := adaptive_batch.target_problem(extra_targets, warmup_lib.METRIC_KEYS[probe.dataset]):
    parser.error(problem)
  if 0 < args.max_batch <= probe.batch_size:
    parser.error(f"--max_batch {args.max_batch} caps the warm-up at or below the baseline batch {probe.batch_size}, "
                 "which it grows from: give a larger one, or 0 for no cap")
  if refusal := _test_split_refusal(args, runner.evaluated_split(probe),
                                    "takes its target, the baseline's final quality, and the updates to it"):
    raise ValueError(refusal)
  sizes, boundaries = warmup_lib.warmup_schedule(curve, probe.batch_size, args.max_batch or max(c for _, c in curve),
                                      probe.num_epochs)
  if len(sizes) < 2:
    parser.exit(2, f"the CBS curve of {args.cbs} never exceeds the baseline batch {probe.batch_size} before "
                   f"epoch {probe.num_epochs}: there is no warm-up to compare.\n")
  configs = warmup_lib.warmup_configs(args.config, overrides, seeds, sizes, boundaries)
  if args.dry_run:
    print(f"[critical_batch] the warm-up's batch sizes {list(sizes)} at epochs {list(boundaries)}, from {source}",
          flush=True)
    runner.print_dry_run("[critical_batch]", ((f"{run} seed={seed}", run_config, runner.run_dir(workdir, run, seed))
                                              for (run, seed), run_config in configs.items()))
    return
  out.parent.mkdir(parents=True, exist_ok=True)
  title = args.title or "Batch warm-up from the measured CBS"
  for key, run_config in configs.items():  # the outputs after each run, from every run finished so far
    try:
      adaptive_batch.train_runs({key: run_config}, str(workdir))
    except WorkdirInUseError:
      print(f"[critical_batch] {key[0]} seed {key[1]}: another process trains it", flush=True)
      continue
    warmup_lib.write_warmup(configs, workdir, seeds, out, command, title, sizes, boundaries, source, extra_targets)

