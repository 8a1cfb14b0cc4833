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


PLATFORMS = ("cpu", "gpu", "tpu")
WHERE = "a .xplane.pb file, or a folder holding plugins/profile/*/*.xplane.pb (what jax.profiler.start_trace writes)"


def platforms_held(profile: ProfileData) -> list[str]:
  """The platforms of `PLATFORMS` whose kernels `profile` holds (on a CPU, XLA's thunks on the host)."""
  found = (trace_analysis.kernels_by_device(profile, platform) for platform in PLATFORMS)
  return sorted({kind for kind, kernels in found if kernels}, key=PLATFORMS.index)


def main(argv: list[str] | None = None) -> None:
  """Prints the trace's file, its device time and its `--top` kernels per step (exit 2 on a path without a
  trace, a file that is not one, or a trace without kernels of `--platform`)."""
  parser = argparse.ArgumentParser(description="A jax.profiler trace's device time and its kernels by total time.")
  parser.add_argument("trace", type=pathlib.Path, help=WHERE)
  parser.add_argument("--platform", choices=PLATFORMS, required=True, help="the traced devices'")
  parser.add_argument("--steps", type=int, default=1, help="steps the trace holds (figures per step)")
  parser.add_argument("--top", type=int, default=20, help="kernels to list")
  args = parser.parse_args(argv)
  if args.steps < 1 or args.top < 0:
    parser.error("--steps must be >= 1 and --top >= 0")
  path = args.trace if args.trace.is_file() else trace_analysis.latest_trace_file(args.trace)
  if path is None:
    parser.error(f"{args.trace} is neither a trace file nor a folder holding plugins/profile/*/*.xplane.pb")
  try:
    profile = ProfileData.from_file(str(path))
  except (RuntimeError, OSError) as error:
    parser.error(f"{path} is not a jax.profiler trace ({error}); give {WHERE}.")
  kind, kernels = trace_analysis.kernels_by_device(profile, args.platform)
  if not (kind == args.platform and kernels):
    held = platforms_held(profile)  # read only to say which --platform to give
    parser.error(f"{path} holds no {args.platform} kernels; " +
                 (f"it holds {', '.join(held)} kernels: rerun with --platform {held[0]}." if held else
                  "it holds no kernels of any platform (on a GPU the profiler records kernels only where NVIDIA's "
                  "CUPTI library loads)."))
  print(path)
  print("\n".join(trace_analysis.summary_lines(profile, args.platform, steps=args.steps, top=args.top)))


if __name__ == "__main__":
  main()
