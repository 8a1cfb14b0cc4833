"""Per-layer norms at the first iteration of a config's run: papers/000 Table 2 for your model.

  python -m lbjax.train.layer_table --config resnet50_imagenet:smoke=true --out layers.csv
  python -m lbjax.train.layer_table --config mnist_lstm --config.batch_size=8192

prints, for every parameter leaf, ||w||, ||grad||, ||w||/||grad|| and mean |grad| at the initial
parameters on the run's first training batch, and writes them as CSV. LARS's local LR is
eta times the ratio column (with weight decay 0); a ratio that varies by orders of magnitude between
layers is why one global LR fails at large batch (papers/000 §4). The config is named as for
`lbjax-train`: a packaged config or a file, an optional `:key=value,...` variant, then any number of
`--config.<field>=<value>` overrides; a mistake in them or missing data prints what to change and exits
with status 2.
"""

import argparse
import sys

from flax import nnx
import jax
import ml_collections

from lbjax import config_files
from lbjax import diagnostics
from lbjax.train.any_batch import whole_batch
from lbjax.train.errors import exit_on_user_errors
from lbjax.train.run import Run


def first_step_layer_norms(config: ml_collections.ConfigDict) -> list[diagnostics.LayerNormRow]:
  """The per-layer norms table at the initial parameters, on the run's first training batch."""
  run = Run(config)
  batch = run.next_batch()
  arrays, _ = whole_batch(batch.arrays)
  carry = run.parts.zero_carry(batch.size)
  key = jax.random.key(run.resolved.seed)

  def loss(params, arrays, carry):  # the batch an argument, so the model sees it traced as in the step
    model = nnx.merge(run.parts.graphdef, params, run.state.model_state)
    return run.task.train_loss(model, arrays, carry, key)[0]

  grads = jax.jit(jax.grad(loss))(run.state.params, arrays, carry)
  return diagnostics.layer_norms(run.state.params, grads)


def main(argv: list[str] | None = None) -> list[diagnostics.LayerNormRow]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m lbjax.train.layer_table", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="a packaged config (see lbjax-train --list) or a .py file, "
                      "with an optional :key=value,... variant; then --config.<field>=<value> overrides")
  parser.add_argument("--out", help="CSV file to write (optional)")
  args, rest = parser.parse_known_args(argv)
  overrides, unexpected = config_files.split_overrides(rest)
  if unexpected:
    parser.error(f"unexpected arguments {unexpected}; overrides are written --config.<field>=<value>.")
  rows = first_step_layer_norms(config_files.load(args.config, overrides).config)
  print(diagnostics.format_table(rows))
  if args.out:
    diagnostics.write_csv(rows, args.out)
  return rows


if __name__ == "__main__":
  with exit_on_user_errors("python -m lbjax.train.layer_table"):
    main(sys.argv[1:])
