"""What every save and every start pays for integrity: checkpoint checksums and the data fingerprint.

Two comparisons, each timed in interleaved rounds in one process:

  checksums     `checkpointing.state_checksums` (numpy, for arrays in CPU memory) against the
                compiled sums it used before for every array (`jax.jit` of `checkpointing._sums`,
                what it still uses on accelerators), on a ResNet-50-sized state: the parameters and
                the momentum of the ResNet-50 tree (2 x 25.6M float32 values, 161 leaves each);
  fingerprint   `datasets.array_fingerprint` of a CIFAR-10-sized training array (50,000 x 32 x 32
                x 3 uint8, 147 MiB): the sampled fingerprint it takes of arrays over 16 MiB against
                the SHA-256 of every byte.

    python -m benchmarks.checkpoint_checksums [--rounds 15] [--max-spread 0.1] [--no-readme]

Exits with status 3 (README untouched) when the 95% confidence interval of a ratio's median is
wider than --max-spread of it.
"""

import argparse

import jax
import numpy as np

from benchmarks import optimizer as optimizer_benchmark
from benchmarks import report
from lbjax.train import checkpointing
from lbjax.train import datasets


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  report.add_spread_arguments(parser, rounds=15)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  if args.rounds < 2:
    parser.error("--rounds must be >= 2")
  shapes = optimizer_benchmark.resnet50_shapes()
  state = {"params": optimizer_benchmark.random_tree(shapes, seed=0, scale=0.05),
           "momentum": optimizer_benchmark.random_tree(shapes, seed=1, scale=1e-2)}
  replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)),
                                          jax.sharding.PartitionSpec())
  compiled_sums = jax.jit(checkpointing._sums, out_shardings=replicated)  # pylint: disable=protected-access
  assert checkpointing.state_checksums(state, replicated) == {
      name: [int(v) for v in value] for name, value in jax.device_get(compiled_sums(state)).items()}
  images = {"images": np.random.default_rng(0).integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8)}
  variants = {
      "checksums: numpy (arrays in CPU memory)": lambda: checkpointing.state_checksums(state, replicated),
      "checksums: compiled sums": lambda: jax.device_get(compiled_sums(state)),
      "fingerprint: sampled-sha256": lambda: datasets.array_fingerprint(images),
      "fingerprint: sha256 of every byte": lambda: datasets.array_fingerprint(images, sampled=False),
  }
  times = report.round_seconds(variants, rounds=args.rounds, repeats=1, sync=lambda result: result)
  check = report.SpreadCheck(args.max_spread)
  rows = []
  for name, baseline in (("checksums: numpy (arrays in CPU memory)", "checksums: compiled sums"),
                         ("fingerprint: sampled-sha256", "fingerprint: sha256 of every byte")):
    ratio = check.record(f"{name} / {baseline}", report.paired_ratios(times, name, baseline))
    rows.append([name, report.Spread.of(times[name]).format(1e3, digits=1),
                 report.Spread.of(times[baseline]).format(1e3, digits=1), ratio.format(digits=3)])
  table = report.markdown_table(["variant", "ms", "baseline ms", "variant / baseline"], rows)
  notes = (f"Times: median over {args.rounds} interleaved rounds [first and third quartiles], one call "
           "per round; ratios per round, median [quartiles]. Baselines: the compiled sums (`jax.jit` of "
           "`checkpointing._sums`, device_get included) and the SHA-256 of every byte. The two checksum "
           "paths give identical sums (checked at the start of the run), so checkpoints written before "
           "verify.")
  print(table)
  check.finish(args, "checkpoint-checksums", "Checkpoint checksums and data fingerprint", table + "\n\n" + notes)


if __name__ == "__main__":
  main()
