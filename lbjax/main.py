"""Command-line entry: `python -m lbjax.main --config configs/mnist_lstm.py --workdir runs/mnist`.

Every config field can be overridden, e.g. `--config.batch_size=512 --config.optimizer.name=lars`, and a
variant selected with `--config=configs/mnist_lstm.py:batch=8192,rule=legw`. Multi-host runs call
`jax.distributed.initialize` first: with `--coordinator_address`, `--num_processes` and `--process_id`,
or with no flags on a platform that provides them (Cloud TPU, SLURM).
"""

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics; resumes if it "
                               "holds a checkpoint of the same run.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with the "
                                 "platform's auto-detected settings (TPU pods, SLURM).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO; --verbosity=0 shows it
  if _COORDINATOR.value is not None or _DISTRIBUTED.value:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                               process_id=_PROCESS_ID.value)
  from lbjax.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    print(f"JAX: {jax.device_count()} {jax.devices()[0].platform} devices ({jax.local_device_count()} local) "
          f"on {jax.process_count()} process(es).", flush=True)
  result = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  if jax.process_index() == 0:
    status = "preempted (checkpoint saved)" if result.preempted else "done"
    print(f"{status}: step {result.step}, epoch {result.epoch:.3f}, eval {result.eval_metrics}", flush=True)


def run():
  """Console-script entry point (`lbjax-train`)."""
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)


if __name__ == "__main__":
  run()
