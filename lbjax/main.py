"""`lbjax-train` (also `python -m lbjax.main`): train and evaluate a config from the command line.

  lbjax-train --list
  lbjax-train --config mnist_lstm --workdir runs/mnist_lstm
  lbjax-train --config mnist_lstm:batch=8192,rule=legw --config.num_epochs=5 --workdir runs/m8k --dry-run
  lbjax-train --config path/to/my_config.py --workdir runs/mine

Settings: a packaged config (`--list` shows them with their variant keys) or a config file, with an
optional `:key=value,...` variant, then any number of `--config.<field>=<value>` overrides; a variant
key and the override of its field are the same setting. A mistake in any of them, a missing data set,
or a workdir holding another run's checkpoint or in use by a running one prints what to change and
exits with status 2. Training stopped by a non-finite step prints why and what is kept and exits with
status 1; by a failed save (e.g. a full disk), likewise with status 3. LBJAX_TRACEBACK=1 shows the
traceback. SIGTERM and Ctrl-C (SIGINT) save a checkpoint at the next step and exit 0; rerunning the
same command resumes.

Compile without training: `--compile-only` builds and compiles the run's steps from abstract arrays (no
data read, nothing initialised) for the local devices, or with `--topology v3:32x32` (any TPU topology
name; needs `pip install 'lbjax[tpu]'`) for a TPU pod, prints memory per device against the HBM, FLOPs,
collective bytes and XLA's estimated step, epoch and recipe times, writes <workdir>/compile.json, and
exits 0 when every step fits, 4 when one does not (with what to change).

Multi-host: `--distributed` calls `jax.distributed.initialize()` with what the platform provides
(Cloud TPU, SLURM, or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment
variables), or give `--coordinator_address`, `--num_processes` and `--process_id`.
"""

import argparse
import contextlib
import json
import logging
import os
import sys

from lbjax import dependencies

try:  # before lbjax.train imports flax: a short message, not an import traceback
  dependencies.check_flax_works_with_jax()
except ImportError as error:
  sys.exit(f"lbjax-train: {error}")

from lbjax.train import config_files
from lbjax.train import summary
from lbjax.train import validation
from lbjax.train.errors import (CheckpointCorruptError, CheckpointMismatchError, CheckpointSaveError, ConfigError,
                                DataMismatchError, WorkdirInUseError)

# Errors whose message says what to change: printed without a traceback, exit status 2.
USER_ERRORS = (ConfigError, CheckpointMismatchError, DataMismatchError, CheckpointCorruptError, WorkdirInUseError,
               FileNotFoundError)
# Training stopped with its checkpoints intact: the message, and exit status 1 (a non-finite step) or
# SAVE_FAILED (a checkpoint could not be written, e.g. a full disk: free space and rerun).
STOPPED_ERRORS = (CheckpointSaveError, FloatingPointError)
SAVE_FAILED = 3
DOES_NOT_FIT = 4  # --compile-only: a compiled step needs more memory per device than the device has
TRACEBACK_ENV = "LBJAX_TRACEBACK"


@contextlib.contextmanager
def exit_on_user_errors(prog: str):
  """Ends a command-line program (the experiment scripts) on an error of `USER_ERRORS`, such as a missing
  data folder, with its message and exit status 2 instead of a traceback (kept with LBJAX_TRACEBACK=1)."""
  try:
    yield
  except USER_ERRORS as e:
    if os.environ.get(TRACEBACK_ENV):
      raise
    _print_error(prog, e)
    sys.exit(2)


def _print_error(prog: str, error: BaseException) -> None:
  """The error's message, prefixed by the program, and how to see the traceback."""
  print(f"{prog}: {error}\n(Set {TRACEBACK_ENV}=1 for the traceback.)", file=sys.stderr)


class _OneLineOrbaxErrors(logging.Filter):
  """Orbax logs a failed background save with its whole traceback (hundreds of lines) before lbjax
  stops with a short message saying what failed and what is kept: keep Orbax's line, drop the
  traceback (shown with LBJAX_TRACEBACK=1)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if "orbax" in record.pathname and record.exc_info and not os.environ.get(TRACEBACK_ENV):
      record.exc_info, record.exc_text = None, None
    return True


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="lbjax-train", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
      epilog="Overrides: --config.<field>=<value>, e.g. --config.optimizer.name=lars --config.lr.base=0.5.\n\n"
             "Examples:\n" + __doc__.split("\n\n", 1)[1],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", help="a packaged config (see --list) or a .py file, with an optional "
                      ":key=value,... variant")
  parser.add_argument("--workdir", help="checkpoints, metrics and config.json go here; a workdir holding a "
                      "checkpoint of the same run resumes it")
  parser.add_argument("--list", action="store_true", help="list the packaged configs with their variant keys")
  parser.add_argument("--dry-run", action="store_true", help="print the resolved run and exit, touching "
                      "neither data nor devices")
  parser.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() with the "
                      "platform's settings (TPU pods, SLURM, JAX_* environment variables)")
  parser.add_argument("--coordinator_address", help="host:port of process 0 (multi-host)")
  parser.add_argument("--num_processes", type=int, help="number of processes (multi-host)")
  parser.add_argument("--process_id", type=int, help="this process's index (multi-host)")
  parser.add_argument("--compile-only", action="store_true", help="compile the run's steps from abstract arrays, "
                      "report memory, FLOPs, collectives and estimated times (compile.json in --workdir); exit 4 "
                      "when a step does not fit")
  parser.add_argument("--topology", help="with --compile-only: compile for this TPU topology (v3:32x32, "
                      "v4:8x8x16, v5p:8x16x16, ...) instead of the local devices; needs lbjax[tpu]")
  return parser


def list_configs() -> str:
  lines = []
  for name in config_files.packaged_names():
    module = config_files.config_module(name)
    lines.append(f"{name}: {config_files.describe_module(module)}")
    lines += [f"    {line}" for line in config_files.variant_help(module)]
  return "\n".join(lines)


def _train(args, loaded: config_files.LoadedConfig) -> None:
  logging.getLogger("absl").addFilter(_OneLineOrbaxErrors())
  import jax  # pylint: disable=import-outside-toplevel  (not imported by --list/--dry-run/--help)
  if args.coordinator_address is not None or args.distributed:
    jax.distributed.initialize(coordinator_address=args.coordinator_address,
                               num_processes=args.num_processes or _env_int("JAX_NUM_PROCESSES"),
                               process_id=args.process_id if args.process_id is not None else _env_int("JAX_PROCESS_ID"))
  from lbjax.train import loop  # pylint: disable=import-outside-toplevel
  loop.train_and_evaluate(loaded.config, args.workdir, origin=_origin(loaded))


def _compile_only(args, loaded: config_files.LoadedConfig) -> int:
  """`--compile-only`: the report on the console and in <workdir>/compile.json; 0, or DOES_NOT_FIT."""
  from lbjax.train import compile_only  # pylint: disable=import-outside-toplevel
  report = compile_only.compile_run(loaded.config, args.topology, log=lambda line: print(line, flush=True))
  print("\n".join(report.lines()))
  if args.workdir:
    print(f"Written: {report.write(args.workdir)}")
  if not report.fits:
    print(f"lbjax-train: does not fit. {report.does_not_fit_message()}", file=sys.stderr)
    return DOES_NOT_FIT
  return 0


def _env_int(name: str) -> int | None:
  """An integer from the environment (JAX reads JAX_COORDINATOR_ADDRESS itself, not these two)."""
  value = os.environ.get(name)
  if value is None:
    return None
  if not value.strip().isdigit():
    raise ConfigError(f"{name}={value!r} must be a non-negative integer.")
  return int(value)


def _origin(loaded: config_files.LoadedConfig) -> str:
  return " ".join([loaded.source + (f":{loaded.variant}" if loaded.variant else ""), *loaded.overrides])


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = _parser()
  args, rest = parser.parse_known_args(argv)
  overrides = [a for a in rest if a.startswith("--config.")]
  unexpected = [a for a in rest if not a.startswith("--config.")]
  if unexpected:
    parser.error(f"unexpected arguments {unexpected}; overrides are written --config.<field>=<value>.")
  if args.list:
    print(list_configs())
    return 0
  if not args.config:
    parser.error("--config is required (a packaged config such as mnist_lstm, see --list, or a .py file).")
  try:
    loaded = config_files.load(args.config, overrides)
    # Names, arguments and values now; what depends on the devices once they are known.
    validation.validate(loaded.config, data_parallel_size=1)
    if args.dry_run:
      print("\n".join(summary.format_run(summary.resolved_run(loaded.config), _origin(loaded))))
      return 0
    if args.topology and not args.compile_only:
      parser.error("--topology compiles for a TPU pod without training: add --compile-only.")
    if args.compile_only:
      return _compile_only(args, loaded)
    if not args.workdir:
      parser.error("--workdir is required to train (or pass --dry-run).")
    _train(args, loaded)
  except (USER_ERRORS + STOPPED_ERRORS) as e:
    if os.environ.get(TRACEBACK_ENV):
      raise
    _print_error("lbjax-train", e)
    if isinstance(e, CheckpointSaveError):
      return SAVE_FAILED
    return 2 if isinstance(e, USER_ERRORS) else 1
  except KeyboardInterrupt:  # before training started (during it, Ctrl-C saves and exits 0)
    print("lbjax-train: interrupted before training started; nothing was saved.", file=sys.stderr)
    return 130
  return 0


def run() -> None:
  """Console-script entry point (`lbjax-train`)."""
  status = main()
  if status == SAVE_FAILED:
    # Orbax's writer threads of the failed save are abandoned; at interpreter shutdown they would
    # print a traceback each ("Event loop is closed"), burying the message. Everything of lbjax is
    # closed by now (metrics, checkpointer, lock), so leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access
  sys.exit(status)


if __name__ == "__main__":
  run()
