"""lbjax: large-batch training in JAX/Flax.

Subpackages are imported explicitly so that a user who only wants the optimizers pays for
nothing else: `from lbjax import optim` pulls in no flax, no TFDS.
"""

__version__ = "0.1.0"
