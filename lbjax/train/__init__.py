"""The sharded trainer: config -> mesh, task, compiled steps, checkpoints, metrics.

`train_and_evaluate(config, workdir)` is what the CLI (`python -m lbjax.main`), notebooks and tests call.
"""

from lbjax.train.config import check_variant_keys
from lbjax.train.config import default_config
from lbjax.train.config import parse_variant
from lbjax.train.config import validate
from lbjax.train.loop import NonFiniteError
from lbjax.train.loop import TrainResult
from lbjax.train.loop import train_and_evaluate
from lbjax.train.mesh import build_mesh
from lbjax.train.optimizer import batch_size_schedule
from lbjax.train.optimizer import build_optimizer
from lbjax.train.optimizer import learning_rate_schedule
from lbjax.train.state import TrainState
from lbjax.train.tasks import build_task
