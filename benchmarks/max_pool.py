"""The ResNet stem's max-pool gradient: JAX's select-and-scatter vs `lbjax.models.pooling`'s placements.

Both forms take the cotangent of the 3x3, stride-2 pooling of a bfloat16 [batch, 112, 112, 64] input
(ResNet-50's stem at 224x224) back to the input, jitted on their own, in interleaved rounds on one
device. The trainer uses the placements everywhere but on TPUs (`lbjax.models.pooling`); this says what
that saves, and with `--deterministic` (XLA's deterministic-ops flags, `config.deterministic`), where the
scatter's atomics are not allowed, what it saves then. The table gives the time per gradient (median
over rounds [quartiles]) and the per-round ratio placements / select-and-scatter.

    python -m benchmarks.max_pool [--batch 256] [--deterministic] [--rounds 21] [--no-readme]
"""

import argparse
import functools
import os

from benchmarks import report

POOL = ((3, 3), (2, 2), ((1, 1), (1, 1)))  # window, strides, padding: the ResNet stem's


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=report.positive_int, default=8, help="images (256: ResNet-50's batch per GPU)")
  parser.add_argument("--deterministic", action="store_true",
                      help="XLA's deterministic-ops flags (config.deterministic) for this process")
  parser.add_argument("--seconds-per-round", type=report.positive_float, default=0.2)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  report.add_spread_arguments(parser, rounds=21)
  args = parser.parse_args()
  if args.batch < 1:
    parser.error(f"--batch must be >= 1, got {args.batch}")
  if args.deterministic:  # read when the backend starts, which nothing has started yet
    from lbjax.train import determinism  # pylint: disable=import-outside-toplevel
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *determinism.DETERMINISTIC_XLA_FLAGS])

  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from lbjax.models import pooling  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(0)
  x = jax.device_put(jnp.asarray(np.maximum(rng.normal(size=(args.batch, 112, 112, 64)), 0), jnp.bfloat16))
  # Positive cotangents: no sum of them cancels, so both forms give a gradient to exactly the inputs they choose.
  cotangent = jax.device_put(jnp.asarray(np.abs(rng.normal(size=(args.batch, 56, 56, 64))) + 0.1, jnp.bfloat16))
  # Each gradient is the transpose of a tangent form of `pooling` (linear in the tangent).
  tangents = {"select-and-scatter": pooling._jax_tangent,  # pylint: disable=protected-access
              "placements": pooling._first_maximum_tangent}  # pylint: disable=protected-access

  def gradient(tangent, x, cotangent):
    return jax.linear_transpose(functools.partial(tangent, POOL, x), x)(cotangent)[0]

  compiled = {name: jax.jit(functools.partial(gradient, tangent)).lower(x, cotangent).compile()
              for name, tangent in tangents.items()}
  gradients = {name: (lambda c=c: c(x, cotangent)) for name, c in compiled.items()}
  agree = np.array_equal(np.asarray(gradients["placements"]()) != 0,
                         np.asarray(gradients["select-and-scatter"]()) != 0)
  repeats = report.repeats_for(gradients["select-and-scatter"], args.seconds_per_round)
  times = report.round_seconds(gradients, rounds=args.rounds, repeats=repeats)
  check = report.SpreadCheck(args.max_spread)
  ratio = check.record("placements / select-and-scatter", report.paired_ratios(times, "placements",
                                                                                "select-and-scatter"))
  table = report.markdown_table(
      ["gradient", "ms per gradient", "placements / select-and-scatter"],
      [[name, report.Spread.of(times[name]).format(1e3), ratio.format(digits=3) if name == "placements" else ""]
       for name in tangents])
  mode = "with XLA's deterministic-ops flags" if args.deterministic else "XLA's defaults"
  notes = (f"Batch {args.batch} of bfloat16 [112, 112, 64] inputs, 3x3 pooling of stride 2, {mode}; "
           f"the two gradients give a cotangent to the same inputs: {agree}. Times: median over {args.rounds} "
           f"interleaved rounds of {repeats} calls [first and third quartiles]; the ratio is taken round by "
           "round (median [quartiles]), below 1 the placements are faster.")
  print(table + "\n\n" + notes)
  name = "max-pool-gradient" + ("-deterministic" if args.deterministic else "")
  check.finish(args, name, f"Max-pool gradient, {mode}: `benchmarks/max_pool.py`", table + "\n\n" + notes)


if __name__ == "__main__":
  main()
