"""`python -m benchmarks.input_pipeline [--part all|host|imagenet|decoders] ...`: see the package docstring."""

import argparse

from benchmarks import input_pipeline
from benchmarks import report
from benchmarks.input_pipeline.decoders import decoder_part
from benchmarks.input_pipeline.host import host_part
from benchmarks.input_pipeline.imagenet_decode import imagenet_part


def main() -> None:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.input_pipeline",
                                   description=input_pipeline.__doc__.splitlines()[0])
  parser.add_argument("--part", choices=("all", "host", "imagenet", "decoders"), default="all")
  parser.add_argument("--rounds", type=report.positive_int, default=5)
  parser.add_argument("--seconds", type=report.positive_float, default=0.5, help="per timed round")
  parser.add_argument("--imagenet-target", type=report.positive_float, default=3000.0)
  parser.add_argument("--imagenet-images", type=report.positive_int, default=64)
  parser.add_argument("--imagenet-sizes", type=report.positive_int, nargs="+", default=[224, 128],
                      help="output sides; the first is used for the worker rows")
  parser.add_argument("--worker-batch", type=report.positive_int, default=32)
  parser.add_argument("--worker-batches", type=report.positive_int, default=8)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  used_by = {"imagenet_target": ("imagenet",), "worker_batch": ("imagenet",), "worker_batches": ("imagenet",),
             "imagenet_images": ("imagenet", "decoders"), "imagenet_sizes": ("imagenet", "decoders")}
  unused = [name for name, parts in used_by.items()
            if args.part not in ("all", *parts) and report.flags_given(parser, args, [name])]
  if unused:
    flags = ", ".join(report.flags_given(parser, args, unused))
    parts = sorted(set.intersection(*(set(used_by[name]) for name in unused)))
    parser.error(f"--part {args.part} does not use {flags}: drop {'it' if len(unused) == 1 else 'them'}, or run "
                 f"--part {' or '.join(parts)}.")
  if args.part in ("all", "host"):
    host_part(args)
  if args.part in ("all", "imagenet"):
    imagenet_part(args)
  if args.part in ("all", "decoders"):
    decoder_part(args)


main()
