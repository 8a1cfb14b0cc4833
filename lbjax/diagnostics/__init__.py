"""Measurements about training, on any params/grads pytrees and any `loss_fn(params, batch)`.

* Per-layer ||w||, ||grad||, ||w||/||grad|| (papers/000 Table 2): `per_layer_norms` (jittable),
  `layer_norms` rows, `format_table`, `write_csv`.
* Local Lipschitz estimate L(x, g) = |g^T H g|/||g||^2 (papers/001 §4): `lipschitz_along_gradient`.
* Gradient noise scale B_simple (McCandlish et al. 2018): `noise_scale_estimates`,
  `simple_noise_scale`, `noise_scale_ema`.
* Per-layer curvature radius R_i ~ |w_i/g_i| (papers/003 eq. 17-22): `per_layer_curvature_radius`,
  `curvature_radius_rows`.
* Discarding small-loss samples (papers/003 §3.1): `small_loss_discard_weights`.

Imports nothing from lbjax.models, lbjax.data or lbjax.train.
"""

from lbjax.diagnostics.curvature import CurvatureRadiusRow
from lbjax.diagnostics.curvature import CurvatureRadiusStats
from lbjax.diagnostics.curvature import curvature_radius
from lbjax.diagnostics.curvature import curvature_radius_rows
from lbjax.diagnostics.curvature import per_layer_curvature_radius
from lbjax.diagnostics.layer_norms import LayerNormRow
from lbjax.diagnostics.layer_norms import PerLayerNorms
from lbjax.diagnostics.layer_norms import format_table
from lbjax.diagnostics.layer_norms import layer_norms
from lbjax.diagnostics.layer_norms import per_layer_norms
from lbjax.diagnostics.layer_norms import write_csv
from lbjax.diagnostics.layers import layer_name
from lbjax.diagnostics.lipschitz import hessian_vector_product
from lbjax.diagnostics.lipschitz import lipschitz_along_gradient
from lbjax.diagnostics.noise_scale import NoiseScaleEMA
from lbjax.diagnostics.noise_scale import NoiseScaleEMAState
from lbjax.diagnostics.noise_scale import NoiseScaleEstimate
from lbjax.diagnostics.noise_scale import noise_scale_ema
from lbjax.diagnostics.noise_scale import noise_scale_estimates
from lbjax.diagnostics.noise_scale import simple_noise_scale
from lbjax.diagnostics.sample_selection import kept_examples
from lbjax.diagnostics.sample_selection import small_loss_discard_weights
