"""Model parallelism beside data parallelism (papers/004, "Model parallel computation").

* `pipeline` (pipeline.py): GPipe over a `stage` mesh axis with `shard_map` and `ppermute`.
* `stacks` (stacks.py): stacks of identical layers (LSTM layers, residual MLP blocks) as pure functions.
* `tensor` (tensor.py): the vocabulary-sharded embedding and softmax over a `model` mesh axis.
"""

from lbjax.parallel import pipeline
from lbjax.parallel import stacks
from lbjax.parallel import tensor

__all__ = ["pipeline", "stacks", "tensor"]
