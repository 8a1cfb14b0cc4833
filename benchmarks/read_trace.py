"""A `jax.profiler` trace's device time and its kernels by total time, per step: e.g. one that
`benchmarks/gpu_suite.sh` brought back (`traces/`), read here without a GPU (`lbjax.train.trace_analysis`).

    python -m benchmarks.read_trace TRACE.xplane.pb|FOLDER --platform gpu [--steps 50] [--top 20]

A FOLDER is one `jax.profiler.start_trace` wrote to (its newest `plugins/profile/*/*.xplane.pb`), e.g. a
run's `<workdir>/profile`.
"""

import argparse
import pathlib

from jax.profiler import ProfileData

from lbjax.train import trace_analysis


def main(argv: list[str] | None = None) -> None:
  """Prints the trace's file, its device time and its `--top` kernels per step (exit 2 on a path without one)."""
  parser = argparse.ArgumentParser(description="A jax.profiler trace's device time and its kernels by total time.")
  parser.add_argument("trace", type=pathlib.Path, help="an .xplane.pb file, or a folder holding plugins/profile/")
  parser.add_argument("--platform", choices=("cpu", "gpu", "tpu"), required=True, help="the traced devices'")
  parser.add_argument("--steps", type=int, default=1, help="steps the trace holds (figures per step)")
  parser.add_argument("--top", type=int, default=20, help="kernels to list")
  args = parser.parse_args(argv)
  path = args.trace if args.trace.is_file() else trace_analysis.latest_trace_file(args.trace)
  if path is None:
    parser.error(f"{args.trace} is neither a trace file nor a folder holding plugins/profile/*/*.xplane.pb")
  if args.steps < 1 or args.top < 0:
    parser.error("--steps must be >= 1 and --top >= 0")
  print(path)
  profile = ProfileData.from_file(str(path))
  print("\n".join(trace_analysis.summary_lines(profile, args.platform, steps=args.steps, top=args.top)))


if __name__ == "__main__":
  main()
