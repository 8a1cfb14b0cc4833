"""ResNet-50 training on one accelerator: images/s and the fraction of peak FLOP/s it reaches.

Three ResNet-50 train steps (bfloat16 compute, float32 parameters, momentum SGD, synthetic images
already on the device) run in interleaved rounds: the trainer's compiled step, a hand-written
`jax.jit` step on lbjax's model (`workloads.HandStep`), and a from-scratch flax ResNet-50 step
(`reference_resnet50.py`, no lbjax code) as the reference. For each: images/s, the time per step
relative to the reference (per round), and

  achieved FLOP/s = analytic step FLOPs / step time
  fraction of peak = achieved / (--peak-tflops x 1e12)

with the analytic count (3 x 4.09 GMACs x 2 = 24.5 GFLOPs per 224x224 image for forward + backward,
scaled by the image area). XLA's `compiled.cost_analysis()` is shown beside it as a ratio: it leaves
out convolutions that run as library calls (cuDNN on an H200 gave 0.02 of the analytic count), so it
cannot serve as the count. Images must be larger than 64 pixels (lbjax's model gives smaller ones a
CIFAR stem, which the reference does not have). Pass the peak of the chip in the compute dtype
(dense, no sparsity), e.g. 989 for an H100 or H200 SXM in bf16, 197 for a TPU v4 chip.

    python -m benchmarks.gpu_resnet50 --peak-tflops 989 [--batch 256] [--steps 50] [--no-readme]
    python -m benchmarks.gpu_resnet50 --pending   # (re)write the README section as not measured
"""

import argparse

import jax
import jax.numpy as jnp

from benchmarks import reference_resnet50
from benchmarks import report
from benchmarks import workloads

ANALYTIC_FLOPS_PER_IMAGE = 3 * 2 * 4.089e9  # forward MACs of ResNet-50 at 224x224, x2, x3 for training
TITLE = "ResNet-50 bf16 on one accelerator: images/s and fraction of peak"
HOW_TO = """How to run (on a machine with one GPU or TPU chip; `pip install -U "jax[cuda12]"` for NVIDIA):

    python -m benchmarks.gpu_resnet50 --peak-tflops 989 --batch 256   # H100 SXM, bf16 dense peak

The script compiles three steps (the trainer's, a hand-written step on lbjax's model, and a
from-scratch flax ResNet-50 step as the reference; bfloat16 compute, float32 parameters, momentum
SGD, synthetic 224x224 images on the device, so no input pipeline), times `--steps` steps of each
in interleaved rounds, and rewrites this section with images/s, the time relative to the
reference, the achieved TFLOP/s (analytic FLOPs) and the fraction of the peak given on the command
line."""


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peak-tflops", type=float, help="the chip's dense peak in the compute dtype")
  parser.add_argument("--batch", type=report.positive_int, default=256)
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--rounds", type=report.positive_int, default=7)
  parser.add_argument("--steps", type=report.positive_int, default=20, help="steps per round")
  parser.add_argument("--pending", action="store_true",
                      help="only write the README section saying the figures are not yet measured")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  if args.pending:
    unused = report.flags_given(parser, args, [name for name in vars(args) if name != "pending"])
    if unused:
      parser.error(f"--pending only writes the README section saying the figures are not yet measured: drop "
                   f"{', '.join(unused)}.")
    report.write_section("gpu-resnet50", TITLE, HOW_TO + "\n\n**Not yet measured**: no accelerator "
                         "was available where these benchmarks were last run.", per_platform=False)
    return
  if args.peak_tflops is None or args.peak_tflops <= 0:
    parser.error("--peak-tflops must be given and > 0 (the chip's dense peak in the compute dtype, "
                 "e.g. 989 for an H100 SXM in bf16).")

  if args.image_size <= 64:
    parser.error(f"--image-size must be > 64 (lbjax's ResNet-50 gives images of 64 pixels or less a CIFAR "
                 f"stem, unlike the reference), got {args.image_size}.")
  config = workloads.trainer_config("resnet50", args.batch, num_train_examples=args.batch,
                                    image_size=args.image_size)
  config.data_options.num_classes = 1000
  config.model_options.dtype = args.dtype
  trainer_step = workloads.TrainerStep(config)
  steps = {"lbjax trainer step": trainer_step,
           "lbjax model, hand-written step": workloads.HandStep(trainer_step),
           "flax reference (benchmarks/reference_resnet50.py)": reference_resnet50.ReferenceStep(
               args.batch, args.image_size, dtype=jnp.dtype(args.dtype))}
  compiled = {"lbjax trainer step": trainer_step.compiled,
              "lbjax model, hand-written step": steps["lbjax model, hand-written step"].compiled(),
              "flax reference (benchmarks/reference_resnet50.py)": steps[
                  "flax reference (benchmarks/reference_resnet50.py)"].compiled}
  try:
    times = report.round_seconds(steps, rounds=args.rounds, repeats=args.steps)
  finally:
    trainer_step.close()
  reference = "flax reference (benchmarks/reference_resnet50.py)"
  analytic = ANALYTIC_FLOPS_PER_IMAGE * args.batch * (args.image_size / 224) ** 2
  device = jax.devices()[0]
  rows = []
  for name, step_times in times.items():
    seconds = report.Spread.of(step_times)
    xla_flops = compiled[name].cost_analysis().get("flops", float("nan"))
    achieved = analytic / seconds.median
    ratio = report.paired_ratios(times, name, reference)
    rows.append([name, f"{args.batch / seconds.median:,.0f}", seconds.format(1e3), ratio.format(digits=3),
                 f"{xla_flops / analytic:.2f}", f"{achieved / 1e12:.1f}",
                 f"{achieved / (args.peak_tflops * 1e12):.3f}"])
  table = report.markdown_table(
      ["step", "images/s", "ms / step", "time / reference", "XLA / analytic FLOPs",
       "achieved TFLOP/s (analytic)", f"fraction of {args.peak_tflops:g} TFLOP/s peak"], rows)
  setting = (f"{device.device_kind}, batch {args.batch}, {args.image_size}x{args.image_size}, "
             f"{args.dtype} compute, float32 parameters; {args.rounds} interleaved rounds of {args.steps} steps, "
             "time per step as median [quartiles] over rounds, ratio to the reference per round. "
             f"Achieved FLOP/s count the analytic {analytic / 1e12:.2f} TFLOPs per step: XLA's cost analysis "
             "leaves out convolutions run as library calls (cuDNN on GPUs), hence its column.")
  print(setting + "\n\n" + table)
  report.publish(args, "gpu-resnet50", TITLE, setting + "\n\n" + table + "\n\n" + HOW_TO, per_platform=False)


if __name__ == "__main__":
  main()
