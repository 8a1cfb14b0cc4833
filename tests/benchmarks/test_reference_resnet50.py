"""The benchmark's from-scratch flax ResNet-50 is the same network as lbjax's."""

from flax import nnx
import jax

from benchmarks import reference_resnet50
from lbjax import models


def _parameter_shapes(model) -> list[tuple[int, ...]]:
  return sorted(x.shape for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_the_reference_has_the_parameters_of_lbjax_resnet50():
  reference = nnx.eval_shape(lambda: reference_resnet50.ResNet50(rngs=nnx.Rngs(0)))
  lbjax_model = nnx.eval_shape(lambda: models.ResNet50(1000, rngs=nnx.Rngs(0)))
  assert _parameter_shapes(reference) == _parameter_shapes(lbjax_model)
  assert sum(x.size for x in jax.tree.leaves(nnx.state(reference, nnx.Param))) == 25_557_032
