"""One PTB LSTM run under the trainer's layouts of 8 simulated devices: same loss, ms per step, bytes per step.

  JAX_NUM_CPU_DEVICES=8 python -m experiments.model_parallel_layouts --steps 5 --repeats 3 \\
      --out docs/results/model_parallel_ptb

Each layout is the same trainer config (`lbjax.train.Run`) with other `mesh.*` / `pipeline.*` fields: the
PTB LSTM of papers/001 §5.1.2 (vocabulary 10,000, embedding and 2 layers of 200, no dropout; `--vocab`
and `--width` change them) on synthetic PTB tokens, global batch 64 x 20, momentum SGD. Layouts: one
device; data parallelism on 8; GPipe over 2 stages (`mesh.stage=2`, the two LSTM layers one per
stage) with 4 data shards and M = 1, 2, 4 micro-batches (and M = 4 with re-materialization); the
vocabulary-sharded embedding and softmax over `mesh.model` = 2, 4, 8 with 4, 2, 1 data shards.

Columns: the training loss of the last step; the difference of the parameters from the one-device
run's, max |w - w_1| / max |w_1| per parameter array, the largest over the arrays (float rounding
only: model parallelism changes where the arithmetic runs, not what it computes); the median wall
time per step after the compiling step, over `repeats` rounds of `steps` steps that interleave the
layouts (min-max across rounds); the bytes one device sends per step with ring algorithms, from the
compiled step's collectives (`benchmarks.collectives`); the parameter floats each device holds.
Simulated devices share the host's cores, so times show the work and copies added, not a speed-up.
"""

import argparse
import pathlib
import statistics
import time
from typing import Sequence

import jax
import numpy as np

from benchmarks import report
from experiments import runner
from experiments import simulated_devices
from lbjax.train import default_config
from lbjax.train import hlo_analysis
from lbjax.train.errors import exit_on_user_errors
from lbjax.train.run import Run

LAYOUTS = {
    "1 device": {"mesh.num_devices": 1},
    "data 8": {},
    "data 4 x stage 2, M=1": {"mesh.stage": 2},
    "data 4 x stage 2, M=2": {"mesh.stage": 2, "pipeline.num_microbatches": 2},
    "data 4 x stage 2, M=4": {"mesh.stage": 2, "pipeline.num_microbatches": 4},
    "data 4 x stage 2, M=4, remat": {"mesh.stage": 2, "pipeline.num_microbatches": 4, "pipeline.remat": True},
    "data 4 x model 2": {"mesh.model": 2},
    "data 2 x model 4": {"mesh.model": 4},
    "data 1 x model 8": {"mesh.model": 8},
}


def layout_config(overrides: dict, batch_size: int, seq_len: int, vocab: int = 10000, width: int = 200):
  config = default_config()
  config.model = "PtbLSTM"
  config.model_options = {"embed_size": width, "hidden_size": width}
  config.dataset = "synthetic_ptb"
  config.data_options = {"vocab_size": vocab, "num_train_tokens": 200_000, "num_eval_tokens": 2000, "seq_len": seq_len}
  config.batch_size = batch_size
  config.eval_batch_size = 64
  config.lr.base = 1.0
  config.progress = False
  for path, value in overrides.items():
    section, field = path.split(".")
    config[section][field] = value
  return config


def _timed_steps(run: Run, steps: int) -> tuple[float, float]:
  """Seconds per step over `steps` steps, and the last step's loss."""
  start = time.perf_counter()
  for _ in range(steps):
    metrics = run.step(run.next_batch())
  loss = float(jax.device_get(metrics["loss"]))
  return (time.perf_counter() - start) / steps, loss


def measure(steps: int, repeats: int, batch_size: int, seq_len: int, vocab: int = 10000,
            width: int = 200) -> list[dict]:
  runs = {name: Run(layout_config(o, batch_size, seq_len, vocab, width)) for name, o in LAYOUTS.items()}
  sent = {}
  for name, run in runs.items():
    run.step(run.next_batch())  # compiles
    sent[name] = sum(hlo_analysis.analyze(next(iter(run.compiled.values())).as_text()).collective_ring_bytes.values())
  times, losses = {name: [] for name in runs}, {}
  for _ in range(repeats):
    for name, run in runs.items():
      seconds, losses[name] = _timed_steps(run, steps)
      times[name].append(seconds)
  reference = jax.device_get(runs["1 device"].state.params)
  rows = []
  for name, run in runs.items():
    params = jax.device_get(run.state.params)
    difference = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
                     for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference)))
    rows.append({"layout": name, "loss": losses[name], "max_rel_diff": difference,
                 "ms": 1e3 * statistics.median(times[name]),
                 "ms_min": 1e3 * min(times[name]), "ms_max": 1e3 * max(times[name]), "sent_mb": sent[name] / 1e6,
                 "parameters_per_device": _parameters_per_device(run)})
  return rows


def _parameters_per_device(run: Run) -> int:
  return sum(int(np.prod(x.addressable_shards[0].data.shape)) for x in jax.tree.leaves(run.state.params))


def main(argv: Sequence[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=report.positive_int, default=10)
  parser.add_argument("--repeats", type=report.positive_int, default=3)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--seq_len", type=report.positive_int, default=20)
  parser.add_argument("--vocab", type=int, default=10000, help="vocabulary size V")
  parser.add_argument("--width", type=int, default=200, help="embedding and LSTM size D = H")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out)
  simulated_devices.require(parser, 8, exact=True)
  rows = measure(args.steps, args.repeats, args.batch_size, args.seq_len, args.vocab, args.width)
  command = simulated_devices.command("experiments.model_parallel_layouts", argv)
  total = 1 + args.steps * args.repeats
  lines = ["# PTB LSTM under model-parallel layouts of the trainer", "",
           f"PtbLSTM (V = {args.vocab:,}, D = H = {args.width}, 2 layers), synthetic PTB, global batch "
           f"{args.batch_size} x {args.seq_len}, momentum SGD at LR 1, {total} steps; jax {jax.__version__}, 8 "
           "simulated CPU devices on one host (they share its cores: times show the work and copies a layout adds, "
           "not a speed-up).", "",
           "```", command, "```", "",
           "| layout | loss of the last step | parameter difference vs 1 device | ms per step, median "
           "(min-max) | MB sent per device per step (ring) | parameters per device |",
           "|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['layout']} | {r['loss']:.6f} | {r['max_rel_diff']:.1e} | {r['ms']:.0f} ({r['ms_min']:.0f}-"
                 f"{r['ms_max']:.0f}) | {r['sent_mb']:.2f} | {r['parameters_per_device']:,} |")
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
  return rows


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.model_parallel_layouts"):
    main()
