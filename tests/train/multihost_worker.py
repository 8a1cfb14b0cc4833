"""One process of the multi-host tests: `python -m tests.train.multihost_worker ID COUNT PORT WORKDIR OUT [MODE]`.

Runs the tiny classifier on this process's 2 CPU devices as part of a `jax.distributed` job on
127.0.0.1 (or alone, COUNT=1, on all its devices) and saves the final parameters and eval metrics
to OUT (process 0). MODE `ptb` runs the tiny PTB LSTM (dropout 0.1) instead: 4 updates of 16
rows by the any-batch step in 2 micro-batches of 8, which each process cuts from its own rows on the
host (`lbjax.train.any_batch`), evaluated as one stream (`data_options.eval_protocol`), which lies in row 0,
process 0's. MODE `until_sigterm` trains the classifier for 500 epochs instead, to
be stopped by a SIGTERM, and prints `preempted=<bool> step=<int>`; `until_sigterm_in_calls` the same
with 4 steps per device call (`config.steps_per_call`). MODE `calls` trains the classifier with 4 steps per
call, each call's batches stacked and placed in one transfer from every process's rows; `on_device` with the
training set held on every device (`config.train_data_on_device`), 3 steps per call, each process placing its rows'
indices; `profile` with steps 3-4 traced (`config.profile`), each process into its own folder.
"""

import sys

import jax
import numpy as np


def main(process_id: int, num_processes: int, port: int, workdir: str, out: str, mode: str = "") -> None:
  if num_processes > 1:
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=num_processes, process_id=process_id,
                               initialization_timeout=120)
  from lbjax.train import train_and_evaluate  # pylint: disable=g-import-not-at-top
  from tests.train import helpers  # pylint: disable=g-import-not-at-top
  if mode.startswith("until_sigterm"):
    config = helpers.tiny_classifier_config(num_epochs=500.0, eval_every_epochs=1000.0, checkpoint_every_steps=0,
                                            steps_per_call=4 if mode == "until_sigterm_in_calls" else 1)
    result = train_and_evaluate(config, workdir)
    print(f"preempted={result.preempted} step={result.step}", flush=True)
    return
  if mode == "ptb":
    config = helpers.tiny_language_model_config(num_steps=4, eval_batch_size=4,
                                                **{"batch.micro_batch_size": 8, "data_options.eval_protocol": "stream",
                                                   "data_options.stream_window": 100})
  elif mode == "calls":
    config = helpers.tiny_classifier_config(steps_per_call=4)
  elif mode == "on_device":
    config = helpers.tiny_classifier_config(steps_per_call=3, train_data_on_device=True)
  elif mode == "profile":
    config = helpers.tiny_classifier_config(**{"profile.num_steps": 2, "profile.skip_steps": 2})
  else:
    config = helpers.tiny_classifier_config()
  result = train_and_evaluate(config, workdir)
  if jax.process_index() == 0:
    leaves = jax.tree_util.tree_leaves_with_path(result.state.params)
    np.savez(out, **{jax.tree_util.keystr(path): np.asarray(leaf.addressable_data(0)) for path, leaf in leaves},
             **result.eval_metrics, step=result.step, devices=jax.device_count())


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], *sys.argv[6:7])
