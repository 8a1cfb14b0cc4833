"""The GPipe bubble measured on simulated devices vs (S-1)/(M+S-1) and papers/004's loss factor.

  JAX_NUM_CPU_DEVICES=8 python -m experiments.pipeline_bubble --stages 2,4 --microbatches 1,2,4,8,16 --repeats 7 \
      --out docs/results/pipeline_bubble

A stack of L residual MLP blocks (`lbjax.parallel.stacks.mlp_block`, width D) is split into S stages
over a `stage` mesh axis of S simulated CPU devices (`lbjax.parallel.pipeline`), the global batch B into
M micro-batches; one step is the jitted loss and gradient (forward and backward pipelined). Two
measurements per (S, M):

* schedule: 1 - (busy stage-ticks)/(S (M+S-1)), from the `active` flags that travel with the
  activations through the ppermutes of the executed forward pass (the backward pass is its transpose);
* time: 1 - T_seq / T_pipe, with T_pipe the step's wall time and T_seq that of the unpipelined stack
  (`pipeline.sequential`) on the same batch on one device. Stages run every tick, on garbage in the
  bubble, so on simulated devices (which share the host's cores) the bubble shows as extra compute:
  T_pipe ~ (M+S-1)/M T_seq when the per-micro-batch cost scales linearly. Smaller micro-batches
  run less efficiently and ppermute copies cost time, so this is an estimate, not an identity.

Formulas: GPipe (Huang et al. 2019, §2.3) (S-1)/(M+S-1); papers/004 ½(1 - m/(k-1+m)) with k = S,
m = M. Timings interleave the configurations, repeat, and report the median and the min-max spread.
"""

import argparse
import csv
import pathlib
import statistics
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

from benchmarks import report
from experiments import runner
from experiments import simulated_devices
from lbjax.parallel import pipeline, stacks
from lbjax.train.errors import exit_on_user_errors


def gpipe_bubble(stages: int, microbatches: int) -> float:
  return (stages - 1) / (microbatches + stages - 1)


def lecture_loss_factor(stages: int, microbatches: int) -> float:
  return 0.5 * (1 - microbatches / (stages - 1 + microbatches))


def _loss(forward, target):
  return lambda params: jnp.mean((forward(params) - target) ** 2)


def argument_problems(stages_list, microbatches_list, num_layers, batch_size) -> list[str]:
  """What is wrong with the command's stage and micro-batch counts (an empty list: nothing), said before
  any compute (the single counts are `report.positive_int`s)."""
  problems = [f"--{name} must be integers >= 1, got {','.join(map(str, values))}."
              for name, values in (("stages", stages_list), ("microbatches", microbatches_list)) if min(values) < 1]
  if not problems:
    problems += [f"--num_layers {num_layers} must be divisible by every stage count (--stages {s}): each stage "
                 "holds L/S layers." for s in stages_list if num_layers % s]
    problems += [f"--batch_size {batch_size} must be divisible by every micro-batch count (--microbatches {m})."
                 for m in microbatches_list if batch_size % m]
  return problems


def build_steps(stages_list, microbatches_list, num_layers, width, batch_size):
  params = stacks.init_mlp_stack(jax.random.key(0), num_layers, width)
  x = jax.random.normal(jax.random.key(1), (batch_size, width))
  target = jax.random.normal(jax.random.key(2), (batch_size, width))
  steps, schedules = {}, {}
  for s in stages_list:
    mesh = jax.make_mesh((s,), ("stage",), axis_types=(AxisType.Auto,), devices=jax.devices()[:s])
    for m in microbatches_list:
      apply = pipeline.pipeline(stacks.mlp_block, mesh, m)
      schedules[(s, m)] = np.asarray(jax.jit(apply)(params, x).active)
      steps[(s, m)] = jax.jit(jax.value_and_grad(_loss(lambda p, apply=apply: apply(p, x).outputs, target)))
  sequential = jax.jit(jax.value_and_grad(_loss(lambda p: pipeline.sequential(stacks.mlp_block, p, x), target)))
  steps["sequential"] = sequential
  return params, steps, schedules


def time_steps(params, steps, repeats: int) -> dict:
  for step in steps.values():  # compile and warm up
    jax.block_until_ready(step(params))
  times = {key: [] for key in steps}
  for _ in range(repeats):
    for key, step in steps.items():  # interleaved
      start = time.perf_counter()
      jax.block_until_ready(step(params))
      times[key].append(time.perf_counter() - start)
  return times


def write_outputs(rows, out: str, command: str, header: str) -> None:
  pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
  with open(f"{out}.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("stages", "microbatches", "schedule_bubble", "gpipe_formula", "lecture_formula",
                     "time_bubble", "step_ms_median", "step_ms_min", "step_ms_max"))
    for r in rows:
      writer.writerow((r["S"], r["M"], f"{r['schedule']:.4f}", f"{r['gpipe']:.4f}", f"{r['lecture']:.4f}",
                       f"{r['time']:.4f}", f"{r['ms']:.2f}", f"{r['ms_min']:.2f}", f"{r['ms_max']:.2f}"))
  lines = ["# GPipe bubble: measured vs (S-1)/(M+S-1) and papers/004's loss factor", "", header, "",
           "```", command, "```", "",
           "| S | M | bubble from the executed schedule | GPipe (S-1)/(M+S-1) | papers/004 ½(1-m/(k-1+m)) | "
           "bubble from time 1-T_seq/T_pipe | step ms, median (min-max) |",
           "|---:|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    lines.append(f"| {r['S']} | {r['M']} | {r['schedule']:.4f} | {r['gpipe']:.4f} | {r['lecture']:.4f} | "
                 f"{r['time']:.3f} | {r['ms']:.1f} ({r['ms_min']:.1f}-{r['ms_max']:.1f}) |")
  lines += ["", "The schedule column is the executed program's occupancy and equals GPipe's formula; papers/004's "
            "loss factor is half of it because it counts one triangle of idle slots per pass, while each stage "
            "idles S-1 ticks in both the fill and the drain (`lbjax.parallel.pipeline` docstring). The time column "
            "follows the trend for small M, but per-tick costs (ppermute copies, the loop, smaller matmuls) and "
            "the shared, loaded cores make it noisy, and simulated devices may run concurrently on the host's 2 "
            "cores, which can take it below the formula: compare the min-max spreads before reading differences."]
  pathlib.Path(f"{out}.md").write_text("\n".join(lines) + "\n")
  plot(rows, f"{out}.png")


def plot(rows, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for s, color in zip(sorted({r["S"] for r in rows}), ("C0", "C1", "C2", "C3")):
    mine = [r for r in rows if r["S"] == s]
    ms = [r["M"] for r in mine]
    ax.plot(ms, [r["gpipe"] for r in mine], "-", color=color, label=f"S={s}: GPipe (S-1)/(M+S-1)")
    ax.plot(ms, [r["lecture"] for r in mine], ":", color=color, label=f"S={s}: papers/004 ½(1-m/(k-1+m))")
    ax.plot(ms, [r["schedule"] for r in mine], "o", color=color, label=f"S={s}: executed schedule")
    ax.plot(ms, [r["time"] for r in mine], "x", color=color, markersize=8, label=f"S={s}: 1 - T_seq/T_pipe")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("micro-batches M")
  ax.set_ylabel("idle fraction (bubble)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--stages", type=runner.ints, default=(2, 4))
  parser.add_argument("--microbatches", type=runner.ints, default=(1, 2, 4, 8, 16))
  parser.add_argument("--num_layers", type=report.positive_int, default=8)
  parser.add_argument("--width", type=report.positive_int, default=256)
  parser.add_argument("--batch_size", type=report.positive_int, default=512)
  parser.add_argument("--repeats", type=report.positive_int, default=7)
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out)
  simulated_devices.require(parser, max(args.stages), reason=f"--stages up to {max(args.stages)}")
  problems = argument_problems(args.stages, args.microbatches, args.num_layers, args.batch_size)
  if problems:
    parser.error(" ".join(problems))
  params, steps, schedules = build_steps(args.stages, args.microbatches, args.num_layers, args.width,
                                         args.batch_size)
  times = time_steps(params, steps, args.repeats)
  sequential = statistics.median(times["sequential"])
  rows = []
  for (s, m), active in schedules.items():
    median = statistics.median(times[(s, m)])
    rows.append({"S": s, "M": m, "schedule": 1 - float(active.mean()), "gpipe": gpipe_bubble(s, m),
                 "lecture": lecture_loss_factor(s, m), "time": 1 - sequential / median, "ms": 1e3 * median,
                 "ms_min": 1e3 * min(times[(s, m)]), "ms_max": 1e3 * max(times[(s, m)])})
  header = (f"{args.num_layers} residual MLP blocks of width {args.width}, global batch {args.batch_size}, S stages "
            f"on S of {jax.device_count()} simulated {jax.devices()[0].platform} devices, jax {jax.__version__}; "
            f"unpipelined step {1e3 * sequential:.1f} ms (median of {args.repeats}). The host has 2 cores shared "
            "with other jobs: the time column is an estimate (module docstring of experiments/pipeline_bubble.py).")
  command = simulated_devices.command("experiments.pipeline_bubble", argv)
  write_outputs(rows, args.out, command, header)
  return rows


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.pipeline_bubble"):
    main()
