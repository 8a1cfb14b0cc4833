"""lbjax.schedules: everything that is a function of training progress, measured in epochs.

* Epoch schedules (`Schedule`: epoch -> value; floats on the host, jax arrays under `jax.jit`):
  `constant`, `polynomial_decay`, `multistep_decay`, `exponential_decay`, `cosine_decay`,
  `join_schedules`, `linear_warmup`, `constant_warmup`, `warmup_polynomial_decay`.
* Scaling rules from a baseline recipe to a batch size: `linear_scaling`, `sqrt_scaling`,
  `goyal_scaling`, `legw` (papers/001), all returning `ScaledRecipe(learning_rate, warmup_epochs)`.
* Batch-size schedules (papers/002): `BatchSizeSchedule`, `constant_batch_size`,
  `batch_schedule_from_lr_decay`, `hybrid_schedule`; the noise scale `noise_scale`,
  `exact_noise_scale`, `effective_learning_rate`, `noise_preserving_batch_size`.
* The bridge to Optax: `to_optax` (fixed or scheduled batch size).

Imports nothing else of lbjax (only jax, numpy, optax).
"""

from lbjax.schedules.base import Epoch
from lbjax.schedules.base import Schedule
from lbjax.schedules.batch_size import batch_schedule_from_lr_decay
from lbjax.schedules.batch_size import BatchSegment
from lbjax.schedules.batch_size import BatchSizeSchedule
from lbjax.schedules.batch_size import constant_batch_size
from lbjax.schedules.batch_size import hybrid_schedule
from lbjax.schedules.batch_size import HybridSchedule
from lbjax.schedules.composition import join_schedules
from lbjax.schedules.decay import constant
from lbjax.schedules.decay import cosine_decay
from lbjax.schedules.decay import exponential_decay
from lbjax.schedules.decay import multistep_decay
from lbjax.schedules.decay import polynomial_decay
from lbjax.schedules.noise_scale import effective_learning_rate
from lbjax.schedules.noise_scale import exact_noise_scale
from lbjax.schedules.noise_scale import noise_preserving_batch_size
from lbjax.schedules.noise_scale import noise_scale
from lbjax.schedules.optax_bridge import to_optax
from lbjax.schedules import rules
from lbjax.schedules.scaling import GOYAL_WARMUP_EPOCHS
from lbjax.schedules.scaling import goyal_scaling
from lbjax.schedules.scaling import legw
from lbjax.schedules.scaling import linear_scaling
from lbjax.schedules.scaling import ScaledRecipe
from lbjax.schedules.scaling import sqrt_scaling
from lbjax.schedules.warmup import constant_warmup
from lbjax.schedules.warmup import linear_warmup
from lbjax.schedules.warmup import warmup_polynomial_decay
