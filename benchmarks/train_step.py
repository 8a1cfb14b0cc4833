"""Train-step throughput: the trainer's compiled step vs a minimal hand-written `jax.jit` step.

For each model and batch size, both steps run on the same placed batch (no input pipeline) in
interleaved rounds on one device; the table gives examples/s (median over rounds) and the ratio
trainer / hand-written. The trainer's step adds, by design, the injected learning rate, the
non-finite guard (`jnp.where` over the state), grad/update norms and the dropout-key fold; its
overhead should stay within 5%.

    python -m benchmarks.train_step [--models mnist_lstm,ptb_lstm,resnet_tiny,resnet18]
        [--rounds 15] [--seconds-per-round 0.3] [--no-readme]

ResNet-50 (32x32, batch 8) is affordable on a CPU but slow to compile: add it with --models.
"""

import argparse
import statistics

from benchmarks import report
from benchmarks import workloads

BATCH_SIZES = {
    "mnist_lstm": (128, 512, 2048),
    "ptb_lstm": (16, 64),
    "resnet_tiny": (32, 128, 512),
    "resnet18": (32,),
    "resnet50": (8,),
}
DEFAULT_MODELS = "mnist_lstm,ptb_lstm,resnet_tiny,resnet18"


def cost(compiled) -> tuple[float, float]:
  """(FLOPs, bytes accessed) of a compiled step from XLA's cost analysis."""
  analysis = compiled.cost_analysis()
  return analysis.get("flops", float("nan")), analysis.get("bytes accessed", float("nan"))


def measure(model: str, batch_size: int, rounds: int, seconds_per_round: float) -> dict[str, float]:
  """Median step seconds and XLA costs of the trainer's and the hand-written step."""
  trainer_step = workloads.TrainerStep(workloads.trainer_config(model, batch_size))
  hand_step = workloads.HandStep(trainer_step)
  try:
    probe = report.median_seconds({"trainer": trainer_step}, rounds=1, repeats=1)["trainer"]
    repeats = max(1, round(seconds_per_round / max(probe, 1e-6)))
    times = report.round_seconds({"trainer": trainer_step, "hand": hand_step}, rounds=rounds,
                                 repeats=repeats)
    result = {name: statistics.median(values) for name, values in times.items()}
    result["trainer_best"], result["hand_best"] = min(times["trainer"]), min(times["hand"])
    result["trainer_flops"], result["trainer_bytes"] = cost(trainer_step.compiled)
    result["hand_flops"], result["hand_bytes"] = cost(hand_step.compiled())
    return result
  finally:
    trainer_step.close()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=DEFAULT_MODELS,
                      help=f"comma-separated, from {', '.join(workloads.MODELS)}")
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--seconds-per-round", type=float, default=0.3)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  models = [m.strip() for m in args.models.split(",") if m.strip()]
  unknown = [m for m in models if m not in workloads.MODELS]
  if unknown:
    parser.error(f"unknown models {unknown}; choose from {', '.join(workloads.MODELS)}.")

  rows = []
  for model in models:
    for batch_size in BATCH_SIZES[model]:
      seconds = measure(model, batch_size, args.rounds, args.seconds_per_round)
      row = [model, batch_size, f"{batch_size / seconds['trainer']:,.0f}",
             f"{batch_size / seconds['hand']:,.0f}", f"{seconds['hand'] / seconds['trainer']:.3f}",
             f"{seconds['hand_best'] / seconds['trainer_best']:.3f}",
             f"{seconds['trainer_flops'] / seconds['hand_flops']:.3f}",
             f"{seconds['trainer_bytes'] / seconds['hand_bytes']:.3f}"]
      print(" | ".join(str(c) for c in row), flush=True)
      rows.append(row)
  table = report.markdown_table(
      ["model", "global batch", "trainer step ex/s", "hand-written step ex/s",
       "trainer / hand (median)", "trainer / hand (best round)", "trainer / hand FLOPs", "trainer / hand bytes accessed"],
      rows)
  notes = (
      "One CPU device, synthetic data already on the device, momentum SGD. ptb_lstm examples are "
      "rows of 20 tokens (vocabulary 10,000, 2x200 LSTM); ResNets take 32x32 images (CIFAR stem). "
      f"Median of {args.rounds} interleaved rounds of ~{args.seconds_per_round:g} s each; a ratio "
      "below 1 means the trainer's step is slower; 'best round' compares the fastest round of each, "
      "the better estimate on a loaded machine. FLOPs and bytes accessed are XLA's "
      "`compiled.cost_analysis()` of the two executables: exact, where the timings on this shared "
      "2-core machine (load average ~10 while measured) scatter by +-20% between runs.")
  print(table)
  if not args.no_readme:
    report.write_section("train-step", "Train step: trainer vs hand-written jit step",
                         report.header_lines() + "\n" + table + "\n\n" + notes)


if __name__ == "__main__":
  main()
