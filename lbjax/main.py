"""`lbjax-train` (also `python -m lbjax.main`): train and evaluate a config from the command line.

  lbjax-train --list
  lbjax-train --config mnist_lstm --workdir runs/mnist_lstm
  lbjax-train --config mnist_lstm:batch=8192,rule=legw --config.num_epochs=5 --workdir runs/m8k --dry-run
  lbjax-train --config path/to/my_config.py --workdir runs/mine

Settings: a packaged config (`--list` shows them with their variant keys) or a config file, with an
optional `:key=value,...` variant, then any number of `--config.<field>=<value>` overrides; a variant
key and the override of its field are the same setting. A mistake in any of them, a missing data set,
a workdir holding another run's checkpoint or in use by a running one, or a flag that the chosen mode would
not use (--topology without --compile-only, --process_id without --distributed) prints what to change and
exits with status 2. Training stopped by a non-finite step prints why and what is kept and exits with
status 1; by a failed save (e.g. a full disk), likewise with status 3. LBJAX_TRACEBACK=1 shows the
traceback. SIGTERM and Ctrl-C (SIGINT) save a checkpoint at the next step and exit 0; rerunning the
same command resumes. `--config.deterministic=True` asks XLA for deterministic GPU kernels.

Look at the first step without training: `--layer-table` prints papers/000 Table 2 for the run (per layer
||w||, ||grad||, their ratio and mean |grad| at the initial parameters on the first batch;
lbjax.train.layer_table), and with --workdir writes it to <workdir>/layer_table.csv.

Compile without training: `--compile-only` builds and compiles the run's steps from abstract arrays (no
data read, nothing initialised) for the local devices, or with `--topology v3:32x32` (any TPU topology
name; needs `pip install 'lbjax[tpu]'`) for a TPU pod, or `--topology h100:8` (NVIDIA H100 or H200 GPUs:
`h200`, `h100:8` in one host, `h100:2x8` in two; needs JAX's CUDA plugin, lbjax.train.gpu_targets) for GPUs,
prints memory per device against the HBM, FLOPs, collective bytes and XLA's estimated step, epoch and
recipe times (TPU), writes <workdir>/compile.json, and exits 0 when every step fits, 4 when one does not
(with what to change).

Multi-host: `--distributed` calls `jax.distributed.initialize()` with what the platform provides
(Cloud TPU, SLURM, or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment
variables), or give `--coordinator_address`, `--num_processes` and `--process_id`. When a process of
the job is lost (silent for --config.heartbeat_timeout_seconds), every other one prints which, the
newest complete checkpoint and how to resume, and exits with status 5 (lbjax.train.distributed).
"""

import argparse
import os
import pathlib
import sys
import traceback
from typing import NamedTuple

from lbjax import dependencies

try:  # before lbjax.train imports flax: a short message, not an import traceback
  dependencies.check_flax_works_with_jax()
except ImportError as error:
  sys.exit(f"lbjax-train: {error}")

from lbjax import config_files
from lbjax.data import UndecodableRecordError
from lbjax.train import determinism
from lbjax.train import distributed
from lbjax.train import gpu_targets
from lbjax.train import orbax_log
from lbjax.train import summary
from lbjax.train import validation
from lbjax.train import workdir_lock
from lbjax.train.errors import TRACEBACK_ENV, USER_ERRORS, CheckpointSaveError, ConfigError, print_error

# Training stopped with its checkpoints intact: the message, and exit status 1 (a non-finite step, a record
# that cannot be decoded) or SAVE_FAILED (a checkpoint could not be written, e.g. a full disk: free space and rerun).
STOPPED_ERRORS = (CheckpointSaveError, FloatingPointError, UndecodableRecordError)
SAVE_FAILED = 3
DOES_NOT_FIT = 4  # --compile-only: a compiled step needs more memory per device than the device has


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="lbjax-train", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
      epilog="Overrides: --config.<field>=<value>, e.g. --config.optimizer.name=lars --config.lr.base=0.5.\n"
             "A whole argument section swaps its function, dropping the arguments set for the one before:\n"
             "--config.optimizer=adamw, --config.lr=cosine_decay, --config.model_options={}.\n\n"
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
  parser.add_argument("--layer-table", action="store_true", help="print ||w||, ||grad||, their ratio and mean |grad| "
                      "per layer at the initial parameters on the first batch (papers/000 Table 2; "
                      "<workdir>/layer_table.csv with --workdir) and exit")
  parser.add_argument("--topology", help="with --compile-only: compile for this TPU topology (v3:32x32, "
                      "v4:8x8x16, v5p:8x16x16, ...; needs lbjax[tpu]) or these GPUs (h100, h100:8, h200:2x8; needs "
                      "jax[cuda12-local]) instead of the local devices")
  return parser


def list_configs() -> str:
  lines = []
  for name in config_files.packaged_names():
    module = config_files.config_module(name)
    lines.append(f"{name}: {config_files.describe_module(module)}")
    lines += [f"    {line}" for line in config_files.variant_help(module)]
  return "\n".join(lines)


class Processes(NamedTuple):
  """A multi-host job's process count and this process's index, from the flags or JAX_* variables (None:
  `jax.distributed` reads them from the cluster)."""

  num_processes: int | None
  process_id: int | None


def _train(args, loaded: config_files.LoadedConfig, resolved, argv: list[str], processes: Processes | None) -> int:
  """Trains; `processes`: the multi-host job's (`_multi_host`), or None for one process."""
  determinism.request(resolved)  # before the backend starts
  if processes is not None:
    if distributed.supervised_state() is None:  # a lost host ends every process with a message (exit 5)
      return distributed.supervise(argv, args.workdir, processes.process_id, resolved.heartbeat_timeout_seconds,
                                   processes.num_processes)
    distributed.initialize(args.coordinator_address, processes.num_processes, processes.process_id,
                           resolved.heartbeat_timeout_seconds)
  from lbjax.train import abstract_data  # pylint: disable=import-outside-toplevel
  abstract_data.check_without_data(resolved)  # as --dry-run does: the model against the data's shapes, in shapes
  if not os.environ.get(TRACEBACK_ENV):  # a failed save's Orbax tracebacks: in <workdir>/logs, not on the console
    state = distributed.supervised_state()
    orbax_log.keep_orbax_reports_in_log(args.workdir, f"{state.stem}.{orbax_log.LOG_NAME}" if state else None)
  from lbjax.train import loop  # pylint: disable=import-outside-toplevel  (not imported by --list/--dry-run/--help)
  try:
    loop.train_and_evaluate(resolved, args.workdir, origin=_origin(loaded))
  except Exception as e:  # pylint: disable=broad-except  (only waits; the error is raised again)
    distributed.wait_for_runtime_verdict(e)
    raise
  return 0


def _compile_only(args, loaded: config_files.LoadedConfig) -> int:
  """`--compile-only`: the report on the console and in <workdir>/compile.json; 0, or DOES_NOT_FIT."""
  from lbjax.train import compile_only  # pylint: disable=import-outside-toplevel
  if args.workdir:  # before compiling: compile.json is written there
    workdir_lock.check_workdir(args.workdir)
  report = compile_only.compile_run(loaded.config, args.topology, log=lambda line: print(line, flush=True))
  print("\n".join(report.lines()))
  if args.workdir:
    print(f"Written: {report.write(args.workdir)}")
  if not report.fits:
    print(f"lbjax-train: does not fit. {report.does_not_fit_message()}", file=sys.stderr)
    return DOES_NOT_FIT
  return 0


def _layer_table(args, loaded: config_files.LoadedConfig) -> int:
  """`--layer-table`: papers/000 Table 2 of the run on the console, and in <workdir>/layer_table.csv."""
  from lbjax import diagnostics  # pylint: disable=import-outside-toplevel
  from lbjax.train import layer_table  # pylint: disable=import-outside-toplevel
  if args.workdir:
    workdir_lock.check_workdir(args.workdir)
  rows = layer_table.first_step_layer_norms(loaded.config)
  print(diagnostics.format_table(rows))
  if args.workdir:
    path = pathlib.Path(args.workdir) / "layer_table.csv"
    diagnostics.write_csv(rows, path)
    print(f"Written: {path}")
  return 0


def _env_int(name: str) -> int | None:
  """An integer from the environment (JAX reads JAX_COORDINATOR_ADDRESS itself, not these two)."""
  value = os.environ.get(name)
  if value is None:
    return None
  if not value.strip().isdigit():
    raise ConfigError(f"{name}={value!r} must be a non-negative integer.")
  return int(value)


def _multi_host(args) -> Processes:
  """The multi-host settings, flags or JAX_* environment variables, checked before anything starts: the
  coordinator's address is host:port with a numeric port, there is at least one process and this process's index
  is one of them. (JAX itself would raise a ValueError or IndexError once the run started, or wait for a peer
  forever.)"""
  address_from = "--coordinator_address" if args.coordinator_address is not None else "JAX_COORDINATOR_ADDRESS"
  address = args.coordinator_address if args.coordinator_address is not None else os.environ.get(address_from)
  if address is not None:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ConfigError(f"{address_from} {address!r} is not host:port: give the host of process 0 and a free "
                        "port number (1-65535) on it, e.g. --coordinator_address 10.0.0.1:1234 (localhost:1234 for "
                        "processes on one machine).")
  num_from = "--num_processes" if args.num_processes is not None else "JAX_NUM_PROCESSES"
  num_processes = args.num_processes if args.num_processes is not None else _env_int(num_from)
  id_from = "--process_id" if args.process_id is not None else "JAX_PROCESS_ID"
  process_id = args.process_id if args.process_id is not None else _env_int(id_from)
  if num_processes is not None and num_processes < 1:
    raise ConfigError(f"{num_from} {num_processes} must be >= 1: the number of processes of the job.")
  if process_id is not None and process_id < 0:
    raise ConfigError(f"{id_from} {process_id} must be >= 0: this process's index, 0 for the coordinator.")
  if not args.distributed and (num_processes is None or process_id is None):
    missing = [flag for flag, value in (("--num_processes", num_processes), ("--process_id", process_id))
               if value is None]
    raise ConfigError(f"{address_from} without --distributed sets the job up by hand: give {' and '.join(missing)} "
                      "too (or JAX_NUM_PROCESSES, JAX_PROCESS_ID), or add --distributed to let JAX read them from "
                      "the cluster (SLURM, Open MPI, a TPU pod, Kubernetes).")
  if process_id is not None and num_processes is not None and process_id >= num_processes:
    raise ConfigError(f"{id_from} {process_id} is not a process of {num_from} {num_processes}: processes are "
                      f"numbered 0 to {num_processes - 1}, 0 being the coordinator.")
  return Processes(num_processes, process_id)


def _origin(loaded: config_files.LoadedConfig) -> str:
  return " ".join([loaded.source + (f":{loaded.variant}" if loaded.variant else ""), *loaded.overrides])


def _refuse_conflicting_modes(parser: argparse.ArgumentParser, args) -> None:
  """A flag that the chosen mode would not use is refused (exit 2, before the config is read), never ignored.

  --dry-run may be added to any training command line, multi-host flags included, to see the run it resolves.
  """
  multi_host = [flag for flag, given in (("--distributed", args.distributed),
                                         ("--coordinator_address", args.coordinator_address is not None),
                                         ("--num_processes", args.num_processes is not None),
                                         ("--process_id", args.process_id is not None)) if given]
  if args.topology and not args.compile_only:
    parser.error("--topology compiles for a TPU pod or GPUs without training: add --compile-only.")
  if args.layer_table and (args.dry_run or args.compile_only):
    parser.error("--layer-table computes the first step's gradients on this machine's devices; drop --dry-run, "
                 "--compile-only and --topology, or run them as a command of their own.")
  if args.dry_run and args.compile_only:
    parser.error("--dry-run prints the resolved run and compiles nothing; --compile-only compiles its steps: "
                 "keep one, or run them as two commands.")
  if multi_host and (args.compile_only or args.layer_table):
    mode = "--compile-only" if args.compile_only else "--layer-table"
    pod = " (for a pod, name it: --topology v5p:8x16x16)" if args.compile_only else ""
    parser.error(f"{mode} runs in this one process{pod}; drop {', '.join(multi_host)}.")
  if multi_host and not (args.distributed or args.coordinator_address is not None):
    parser.error(f"{', '.join(multi_host)} set up jax.distributed for a multi-host run: add --distributed "
                 "(or --coordinator_address host:port).")


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = _parser()
  args, rest = parser.parse_known_args(argv)
  overrides = [a for a in rest if a.startswith("--config.")]
  unexpected = [a for a in rest if not a.startswith("--config.")]
  if args.list:
    others = [a for a in argv if not (a.startswith("--li") and "--list".startswith(a))]  # argparse's --lis too
    if others:
      parser.error(f"--list takes no other options; drop {' '.join(others)} (or run them without --list).")
    try:
      print(list_configs(), flush=True)
    except BrokenPipeError:  # the reader stopped early (`lbjax-train --list | head`): not an error
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    return 0
  if unexpected:
    parser.error(f"unexpected arguments {unexpected}; overrides are written --config.<field>=<value>.")
  _refuse_conflicting_modes(parser, args)
  if args.topology:
    # Before JAX starts its backends. Compiling for named devices uses no local accelerator: without
    # JAX_PLATFORMS=cpu, JAX would try libtpu's and the CUDA plugin's on a machine without them (dozens of lines of
    # start-up errors); the plugin itself stays registered for a GPU target.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    gpu_targets.allow_plugin_without_cuda()
  if not args.config:
    parser.error("--config is required (a packaged config such as mnist_lstm, see --list, or a .py file).")
  try:
    processes = _multi_host(args) if args.distributed or args.coordinator_address is not None else None
    loaded = config_files.load(args.config, overrides)
    # Names, arguments and values now; what depends on the devices once they are known.
    resolved = validation.validate(loaded.config)
    if args.dry_run:
      # What the start of a run checks that needs no device and no data beyond its known shapes.
      from lbjax.train import abstract_data  # pylint: disable=import-outside-toplevel
      abstract_data.check_without_data(resolved)
      print("\n".join(summary.format_run(summary.resolved_run(resolved), _origin(loaded))))
      return 0
    if args.layer_table:
      return _layer_table(args, loaded)
    if args.compile_only:
      return _compile_only(args, loaded)
    if not args.workdir:
      parser.error("--workdir is required to train (or pass --dry-run).")
    workdir_lock.check_workdir(args.workdir)
    return _train(args, loaded, resolved, argv, processes)
  except (USER_ERRORS + STOPPED_ERRORS) as e:
    if os.environ.get(TRACEBACK_ENV):
      raise
    print_error("lbjax-train", e)
    status = SAVE_FAILED if isinstance(e, CheckpointSaveError) else 2 if isinstance(e, USER_ERRORS) else 1
    if distributed.in_job():  # the other processes wait for this one in a collective: tell them, end at once
      distributed.stop_on_error(str(e), status)
    return status
  except KeyboardInterrupt:  # before training started (during it, Ctrl-C saves and exits 0)
    print("lbjax-train: interrupted before training started; nothing was saved.", file=sys.stderr)
    if distributed.in_job():
      distributed.stop_on_error("interrupted before training started", 130)
    return 130
  return 0


def run() -> None:
  """Console-script entry point (`lbjax-train`)."""
  try:
    status = main()
  except Exception as e:  # a bug, or LBJAX_TRACEBACK=1: the traceback, then end as on any error of a job
    if not distributed.in_job():
      raise
    traceback.print_exc()
    distributed.stop_on_error(f"{type(e).__name__}: {e}", 1)
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
