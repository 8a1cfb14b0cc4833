"""lbjax.optim: layer-wise adaptive-rate optimizers as Optax transforms (no flax, no data).

One transform, `scale_by_layerwise_rate`, with a pluggable layer statistic; LARS (papers/000,
Algorithm 1), LAMB's trust ratio, PercentDelta and the median-curvature LR (papers/003, eq. 20-24) are
statistics of it. `trust_ratios(opt_state)` reads the last step's per-layer rates for logging.
"""

from lbjax.optim.lars import lars
from lbjax.optim.lars import lars_rate
from lbjax.optim.lars import scale_by_lars
from lbjax.optim.layerwise import LayerRate
from lbjax.optim.layerwise import LayerReducer
from lbjax.optim.layerwise import LayerwiseRateState
from lbjax.optim.layerwise import default_mask
from lbjax.optim.layerwise import safe_quotient
from lbjax.optim.layerwise import scale_by_layerwise_rate
from lbjax.optim.layerwise import trust_ratios
