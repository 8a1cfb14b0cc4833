"""Pipelined runs evaluate to the end (issue 30): the layouts a user would try, on 8 CPU devices that share
one CPU core, each trained and evaluated several times.

The evaluation loop used to queue its steps without bound. XLA:CPU launches each device's part of a
program on a worker thread, which waits there while the device has too many programs queued; with
every worker thread so held or waiting in a collective for a device whose part found no thread, the
run deadlocked (`all reduce RendezvousKey{... global_devices=[0, 2] ...}` stuck, then XLA's abort): in
2 of 3 runs of the README's pipeline command on 4 devices. `Run.evaluate` now keeps at most two steps
in flight, as training does. One core makes the host outrun the devices, as on a loaded machine; before
the change this test hung within the first layout.
"""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
# (mesh.stage, data-parallel devices, pipeline.num_microbatches)
LAYOUTS = [(2, 4, 2), (2, 2, 8), (2, 1, 4), (4, 2, 4), (4, 1, 8)]
EVALUATIONS = 3

SCRIPT = f"""
import os
os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})  # before JAX sizes its thread pools
from lbjax.train import Run
from tests.train import helpers
for stage, data, micro in {LAYOUTS!r}:
  # The PTB LSTM's shape at a smaller width: its stack of identical layers, a 1,000-word vocabulary.
  config = helpers.tiny_language_model_config(
      model_options={{"embed_size": 64, "hidden_size": 64, "num_layers": 4}}, batch_size=32, eval_batch_size=16,
      data_options={{"vocab_size": 1000, "num_train_tokens": 4000, "num_eval_tokens": 8000, "seq_len": 10}},
      **{{"mesh.stage": stage, "mesh.num_devices": stage * data, "pipeline.num_microbatches": micro}})
  run = Run(config)
  try:
    for _ in range(2):
      run.step(run.next_batch())
    losses = {{run.evaluate()["loss"] for _ in range({EVALUATIONS})}}
  finally:
    run.close()
  assert len(losses) == 1, losses  # the same parameters evaluate to the same loss
  print("evaluated", stage, data, micro, losses.pop(), flush=True)
"""


def test_pipelined_runs_of_every_layout_train_and_evaluate_repeatedly_to_the_end():
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  assert done.returncode == 0, done.stdout + done.stderr[-3000:]
  assert [line.split()[1:4] for line in done.stdout.splitlines() if line.startswith("evaluated")] == [
      [str(v) for v in layout] for layout in LAYOUTS]
