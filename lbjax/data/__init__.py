"""Datasets and input pipelines: resumable sharded streams, MNIST, PTB, synthetic twins.

`lbjax.data` depends only on numpy (TFDS and grain are imported lazily by the functions that
read TFDS, as they are the optional `[tfds]` extra). It imports neither `lbjax.models` nor
`lbjax.train`.
"""

from lbjax.data.stream import ArraySource
from lbjax.data.stream import Batch
from lbjax.data.stream import epoch_permutation
from lbjax.data.stream import eval_batches
from lbjax.data.stream import example_rngs
from lbjax.data.stream import RandomAccessSource
from lbjax.data.stream import TrainStream
from lbjax.data.stream import Transform
