"""lbjax.optim: layer-wise adaptive-rate optimizers as Optax transforms (no flax, no data).

One transform, `scale_by_layerwise_rate`, with a pluggable layer statistic; LARS (papers/000,
Algorithm 1), LAMB's trust ratio and PercentDelta (sums: every layer of the tree at once) and the
median-curvature LR (papers/003, eq. 20-24; leaf by leaf) are statistics of it.
`trust_ratios(opt_state)` reads the last step's per-layer rates for logging. `lars`, `lamb` and
`percent_delta` also run in the multi-tensor layout (`layout="flat"`, `lbjax.optim.multi_tensor`).
"""

from lbjax.optim import compression
from lbjax.optim.lamb import lamb
from lbjax.optim.lamb import lamb_rate
from lbjax.optim.lamb import scale_by_lamb_trust_ratio
from lbjax.optim.lars import lars
from lbjax.optim.lars import lars_rate
from lbjax.optim.lars import scale_by_lars
from lbjax.optim.layerwise import LayerRate
from lbjax.optim.layerwise import LayerRates
from lbjax.optim.layerwise import LayerReducer
from lbjax.optim.layerwise import LayerwiseRateState
from lbjax.optim.layerwise import RatesLayout
from lbjax.optim.layerwise import SummedRate
from lbjax.optim.layerwise import default_mask
from lbjax.optim.layerwise import layerwise_sgd
from lbjax.optim.layerwise import safe_quotient
from lbjax.optim.layerwise import scale_by_layerwise_rate
from lbjax.optim.layerwise import trust_ratios
from lbjax.optim.median_curvature import mclr
from lbjax.optim.momentum import momentum
from lbjax.optim.median_curvature import median_curvature_rate
from lbjax.optim.median_curvature import scale_by_median_curvature
from lbjax.optim.percent_delta import percent_delta
from lbjax.optim.percent_delta import percent_delta_rate
from lbjax.optim.percent_delta import scale_by_percent_delta
from lbjax.optim import flax_state
from lbjax.optim import multi_tensor

# Flax's serializer learns the state classes (`lbjax.optim.flax_state`)
flax_state.register_if_flax_is_loaded(LayerRates, "vectors")
flax_state.register_if_flax_is_loaded(multi_tensor.FlatTree, "buffers")

__all__ = [
    "compression",
    "lamb",
    "lamb_rate",
    "scale_by_lamb_trust_ratio",
    "lars",
    "lars_rate",
    "scale_by_lars",
    "LayerRate",
    "LayerRates",
    "LayerReducer",
    "LayerwiseRateState",
    "RatesLayout",
    "SummedRate",
    "default_mask",
    "layerwise_sgd",
    "safe_quotient",
    "scale_by_layerwise_rate",
    "trust_ratios",
    "mclr",
    "momentum",
    "median_curvature_rate",
    "scale_by_median_curvature",
    "percent_delta",
    "percent_delta_rate",
    "scale_by_percent_delta",
]
