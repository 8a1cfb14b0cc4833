"""A parameter's name: its path in the tree, `'blocks/0/conv1/kernel'` for `params['blocks'][0]['conv1']['kernel']`.

The one spelling lbjax gives a leaf: a string mask of the layer-wise optimizers matches it
(`layerwise.resolve_mask`), the trainer's per-layer metrics (trust ratios) and the checkpoint
checksums are keyed by it, and sharding specs end with it (`lbjax.train.mesh`).
"""

from typing import Any


def leaf_name(path: tuple[Any, ...]) -> str:
  """`'embed/embedding'` for the key path (`jax.tree_util.tree_flatten_with_path`) of
  `params['embed']['embedding']`: dict keys, sequence indices and attribute names joined by '/'."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
