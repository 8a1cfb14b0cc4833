"""Gradient compression for data-parallel SGD (papers/004): 1-bit SGD, QSGD and PowerSGD.

Each compressor is an Optax transform (`GradientCompressor`) whose `update` returns what the
receiving side decodes from the messages; `compressed_pmean` is the compressed all-reduce inside
`shard_map` over the data axis, and `bits_per_step` counts the message size.

* `one_bit`, `qsgd` (quantized.py): per-leaf quantizers, decoded then averaged.
* `powersgd` (powersgd.py): rank-r factors P and Q all-reduced as steps of the algorithm.
"""

from lbjax.optim.compression.base import FLOAT_BITS
from lbjax.optim.compression.base import BitsPerStep
from lbjax.optim.compression.base import ErrorFeedbackState
from lbjax.optim.compression.base import GradientCompressor
from lbjax.optim.compression.base import bits_per_step
from lbjax.optim.compression.base import compressed_pmean
from lbjax.optim.compression.base import no_compression
from lbjax.optim.compression.powersgd import PowerSGDState
from lbjax.optim.compression.powersgd import compressed_rank
from lbjax.optim.compression.powersgd import matrix_shape
from lbjax.optim.compression.powersgd import powersgd
from lbjax.optim.compression.powersgd import powersgd_bits
from lbjax.optim.compression.quantized import QSGDState
from lbjax.optim.compression.quantized import one_bit
from lbjax.optim.compression.quantized import qsgd
from lbjax.optim.compression.quantized import qsgd_dense_bits
from lbjax.optim.compression.quantized import qsgd_elias_bits

__all__ = [
    "BitsPerStep",
    "ErrorFeedbackState",
    "FLOAT_BITS",
    "GradientCompressor",
    "PowerSGDState",
    "QSGDState",
    "bits_per_step",
    "compressed_pmean",
    "compressed_rank",
    "matrix_shape",
    "no_compression",
    "one_bit",
    "powersgd",
    "powersgd_bits",
    "qsgd",
    "qsgd_dense_bits",
    "qsgd_elias_bits",
]
