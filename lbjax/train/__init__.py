"""The sharded trainer: config -> mesh, task, compiled steps, checkpoints, metrics.

`train_and_evaluate(config, workdir)` is what the CLI (`lbjax-train`), notebooks, experiments and tests
call; `lbjax.config_files.load("mnist_lstm:batch=8192")` gives the config of a packaged experiment.
"""

from lbjax import dependencies

dependencies.check_flax_works_with_jax()  # before anything below imports flax

from lbjax.train.config import default_config
from lbjax.train.errors import CheckpointMismatchError
from lbjax.train.errors import ConfigError
from lbjax.train.loop import TrainResult
from lbjax.train.loop import train_and_evaluate
from lbjax.train.mesh import build_mesh
from lbjax.train.optimizer import batch_size_schedule
from lbjax.train.optimizer import build_optimizer
from lbjax.train.optimizer import learning_rate_schedule
from lbjax.train.resolved import ResolvedRun
from lbjax.train.run import NonFiniteError
from lbjax.train.run import Run
from lbjax.train.state import TrainState
from lbjax.train.tasks import build_task
from lbjax.train.validation import validate
