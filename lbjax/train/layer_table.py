"""Per-layer norms at the first iteration of a config's run: papers/000 Table 2 for your model.

  lbjax-train --config resnet50_imagenet:smoke=true --layer-table --workdir runs/layers
  lbjax-train --config mnist_lstm --config.batch_size=8192 --layer-table

print, for every parameter leaf, ||w||, ||grad||, ||w||/||grad|| and mean |grad| at the initial
parameters on the run's first training batch (with --workdir also as <workdir>/layer_table.csv).
LARS's local LR is eta times the ratio column (with weight decay 0); a ratio that varies by orders of
magnitude between layers is why one global LR fails at large batch (papers/000 §4).
"""

from flax import nnx
import jax
import ml_collections

from lbjax import diagnostics
from lbjax.train.any_batch import whole_batch
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

