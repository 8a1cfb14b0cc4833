"""ResNet-50 training on one accelerator: images/s and the fraction of peak FLOP/s it reaches.

Compiles the trainer's step for ResNet-50 (bfloat16 compute, float32 parameters, momentum SGD,
synthetic 224x224 images already on the device), times it, takes the FLOPs of one step from XLA's
`compiled.cost_analysis()` (multiply-add = 2 FLOPs), and reports

  images/s = batch / step time
  achieved FLOP/s = step FLOPs / step time
  fraction of peak = achieved / (--peak-tflops x 1e12)

with the analytic count (3 x 4.09 GMACs x 2 = 24.5 GFLOPs per 224x224 image for forward + backward)
as a cross-check of XLA's number (at 224x224 only: images of 64 pixels or less get the CIFAR stem,
which keeps the full resolution in the first stage). Pass the peak of the chip in the compute dtype (dense, no
sparsity), e.g. 989 for an H100 SXM in bf16, 197 for a TPU v4 chip.

    python -m benchmarks.gpu_resnet50 --peak-tflops 989 [--batch 256] [--steps 50] [--no-readme]
    python -m benchmarks.gpu_resnet50 --pending   # (re)write the README section as not measured
"""

import argparse

import jax

from benchmarks import report
from benchmarks import workloads

ANALYTIC_FLOPS_PER_IMAGE = 3 * 2 * 4.089e9  # forward MACs of ResNet-50 at 224x224, x2, x3 for training
TITLE = "ResNet-50 bf16 on one accelerator: images/s and fraction of peak"
HOW_TO = """How to run (on a machine with one GPU or TPU chip; `pip install -U "jax[cuda12]"` for NVIDIA):

    python -m benchmarks.gpu_resnet50 --peak-tflops 989 --batch 256   # H100 SXM, bf16 dense peak

The script compiles the trainer's step (bfloat16 compute, float32 parameters, momentum SGD,
synthetic 224x224 images on the device, so no input pipeline), times `--steps` steps in
interleaved rounds, takes the step's FLOPs from `compiled.cost_analysis()`, and rewrites this
section with images/s, achieved TFLOP/s and the fraction of the peak given on the command line."""


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peak-tflops", type=float, help="the chip's dense peak in the compute dtype")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=20, help="steps per round")
  parser.add_argument("--pending", action="store_true",
                      help="only write the README section saying the figures are not yet measured")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  if args.pending:
    report.write_section("gpu-resnet50", TITLE, HOW_TO + "\n\n**Not yet measured**: no accelerator "
                         "was available where these benchmarks were last run.")
    return
  if args.peak_tflops is None or args.peak_tflops <= 0:
    parser.error("--peak-tflops must be given and > 0 (the chip's dense peak in the compute dtype, "
                 "e.g. 989 for an H100 SXM in bf16).")

  config = workloads.trainer_config("resnet50", args.batch, num_train_examples=args.batch,
                                    image_size=args.image_size)
  config.data_options.num_classes = 1000
  config.model_options.dtype = args.dtype
  trainer_step = workloads.TrainerStep(config)
  try:
    seconds = report.median_seconds({"step": trainer_step}, rounds=args.rounds,
                                    repeats=args.steps)["step"]
    flops = trainer_step.compiled.cost_analysis().get("flops", float("nan"))
  finally:
    trainer_step.close()
  analytic = ANALYTIC_FLOPS_PER_IMAGE * args.batch * (args.image_size / 224) ** 2
  achieved = flops / seconds
  device = jax.devices()[0]
  rows = [[device.device_kind, args.batch, args.image_size, args.dtype, f"{args.batch / seconds:,.0f}",
           f"{flops / 1e12:.3f}", f"{flops / analytic:.2f}", f"{achieved / 1e12:.1f}",
           f"{args.peak_tflops:g}", f"{achieved / (args.peak_tflops * 1e12):.3f}"]]
  table = report.markdown_table(
      ["device", "batch", "image", "compute dtype", "images/s", "TFLOPs / step (XLA)",
       "XLA / analytic FLOPs", "achieved TFLOP/s", "peak TFLOP/s (given)", "fraction of peak"], rows)
  print(table)
  if not args.no_readme:
    report.write_section("gpu-resnet50", TITLE,
                         report.header_lines() + "\n" + table + "\n\n" + HOW_TO)


if __name__ == "__main__":
  main()
