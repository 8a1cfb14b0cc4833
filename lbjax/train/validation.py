"""Validation of a run config before any compute: every problem found, in one message.

`validate` checks values (sizes, ranges, what divides what) and resolves every name the config uses
(`lbjax.train.names`), binding each section's fields to its function's signature, so that a typo, a
renamed field or an argument a function does not take is refused here, not dropped or found mid-run.
"""

import math

import ml_collections

from lbjax.train import batch_policy
from lbjax.train import config as config_lib
from lbjax.train import mesh
from lbjax.train import names
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import tasks
from lbjax.train.errors import ConfigError


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _name_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Resolves every name and binds every argument section; one message per section that fails."""
  problems = []
  checks = [(optimizer_lib.resolve_optimizer, "config.optimizer"), (optimizer_lib.learning_rate_schedule, "config.lr"),
            (optimizer_lib.build_compressor, "config.compression"), (tasks.resolve_dataset, "config.data_options"),
            (_check_model_options, "config.model_options")]
  for check, section in checks:
    try:
      check(config)
    except ConfigError as e:
      problems.append(str(e))
    except (ValueError, TypeError) as e:  # a function of the section refuses its arguments
      problems.append(f"{section}: {e}")
  return problems


def _check_model_options(config: ml_collections.ConfigDict) -> None:
  """The model's name and options (the arguments that follow from the data are known only later)."""
  resolved = tasks.resolve_model_name(config)
  names.bind("model_options", resolved, tasks.model_options(config),
             supplied={name: None for name in names.parameters(resolved.function)}, required=("rngs",))


def _model_class(config: ml_collections.ConfigDict):
  """The class (or function) `config.model` names, or None when it does not resolve (`_name_problems` says why)."""
  try:
    return tasks.resolve_model_name(config).function
  except ConfigError:
    return None


def _batch_problems(config: ml_collections.ConfigDict, data_parallel_size: int) -> list[str]:
  problems = []
  if config.batch_sizes and len(config.batch_sizes) != len(config.batch_size_boundaries) + 1:
    problems.append(f"config.batch_sizes has {len(config.batch_sizes)} sizes but "
                    f"config.batch_size_boundaries has {len(config.batch_size_boundaries)} epochs; "
                    "give one more size than boundaries.")
  if config.max_device_batch < 0:
    problems.append(f"config.max_device_batch must be >= 0 (0 = no accumulation), got {config.max_device_batch}.")
  field = "config.batch_sizes" if config.batch_sizes else "config.batch_size"
  for size in config_lib.batch_sizes(config):
    if not isinstance(size, int) or size <= 0:
      problems.append(f"{field}: batch size {size!r} must be a positive integer.")
    elif size % data_parallel_size:
      problems.append(f"global batch size {size} is not divisible by the data-parallel size "
                      f"{data_parallel_size} (devices on the data x fsdp mesh axes); use a multiple of "
                      f"{data_parallel_size} or change config.mesh.")
    elif config.max_device_batch > 0:
      share = size // data_parallel_size
      if share > config.max_device_batch and share % config.max_device_batch:
        problems.append(f"gradient accumulation cannot split a device share of {share} examples (global "
                        f"batch {size} over {data_parallel_size} devices) into micro-batches of "
                        f"config.max_device_batch={config.max_device_batch}; choose a divisor of {share}.")
  if config.eval_batch_size <= 0 or config.eval_batch_size % data_parallel_size:
    problems.append(f"config.eval_batch_size={config.eval_batch_size} must be a positive multiple of the "
                    f"data-parallel size {data_parallel_size}.")
  lipschitz = config.diagnostics
  if lipschitz.lipschitz_every < 0:
    problems.append(f"config.diagnostics.lipschitz_every must be >= 0 (0 = off), got {lipschitz.lipschitz_every}.")
  if lipschitz.lipschitz_every and (lipschitz.lipschitz_batch_size <= 0
                                    or lipschitz.lipschitz_batch_size % data_parallel_size):
    problems.append(f"config.diagnostics.lipschitz_batch_size={lipschitz.lipschitz_batch_size} must "
                    f"be a positive multiple of the data-parallel size {data_parallel_size}.")
  return problems


def _flat_numbers(section: ml_collections.ConfigDict, prefix: str):
  for key, value in section.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _flat_numbers(value, f"{prefix}{key}.")
    elif _is_number(value):
      yield f"{prefix}{key}", value
    elif isinstance(value, (tuple, list)):
      for i, item in enumerate(value):
        if _is_number(item):
          yield f"{prefix}{key}[{i}]", item


# Optimizer arguments by meaning: a decay rate of a moving average in [0, 1), a non-negative
# coefficient. Names are those of lbjax.optim and optax.
_RATE_ARGUMENTS = ("momentum", "b1", "b2", "beta", "decay", "beta1", "beta2")
_NON_NEGATIVE_ARGUMENTS = ("weight_decay", "eps", "eps_root", "trust_coefficient", "eta")


def _range_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Finite numbers everywhere; optimizer rates in [0, 1); coefficients >= 0; schedule epochs in range."""
  problems = [f"config.{path} must be a finite number, got {value!r}."
              for path, value in _flat_numbers(config, "") if isinstance(value, float) and not math.isfinite(value)]
  if problems:
    return problems
  for name, value in config.optimizer.items():
    if not _is_number(value):
      continue
    if name in _RATE_ARGUMENTS and not 0 <= value < 1:
      problems.append(f"config.optimizer.{name} must be in [0, 1) (a moving average's decay rate), got {value!r}.")
    if name in _NON_NEGATIVE_ARGUMENTS and value < 0:
      problems.append(f"config.optimizer.{name} must be >= 0, got {value!r}.")
  if config.lr.warmup_epochs < 0:
    problems.append(f"config.lr.warmup_epochs must be >= 0, got {config.lr.warmup_epochs!r}.")
  boundaries = config.lr.get("boundaries")
  if isinstance(boundaries, (tuple, list)):
    late = [b for b in boundaries if _is_number(b) and not 0 <= b < config.num_epochs]
    if late:
      problems.append(f"config.lr.boundaries {list(late)} lie outside training (0 to config.num_epochs="
                      f"{config.num_epochs:g}); the decay would never happen. Move them inside or train longer.")
  if not config.eval_every_epochs > 0:
    problems.append(f"config.eval_every_epochs must be > 0 (epochs between evaluations), got "
                    f"{config.eval_every_epochs!r}.")
  if not isinstance(config.seed, int) or config.seed < 0:
    problems.append(f"config.seed must be an integer >= 0, got {config.seed!r}.")
  if config.mesh.num_devices < 0:
    problems.append(f"config.mesh.num_devices must be >= 0 (0 = all devices), got {config.mesh.num_devices}.")
  if config.init_from and config.resume_with_changed_optimizer:
    problems.append("config.init_from starts a new run from a checkpoint's parameters with a fresh optimizer; "
                    "config.resume_with_changed_optimizer resumes this workdir's own checkpoint. Set one.")
  return problems


def _value_problems(config: ml_collections.ConfigDict) -> list[str]:
  problems = _range_problems(config)
  clip = config.clip_global_norm
  if not _is_number(clip) or not clip >= 0:
    problems.append(f"config.clip_global_norm must be a number >= 0 (0 turns clipping off), got {clip!r}.")
  if config.compression.name != "none" or config.mesh.per_device_gradients:
    what = (f"config.compression.name={config.compression.name!r}" if config.compression.name != "none"
            else "config.mesh.per_device_gradients=True")
    if config.mesh.fsdp != 1:
      problems.append(f"{what} reduces whole per-device gradients and needs replicated parameters: set "
                      f"config.mesh.fsdp=1 (got {config.mesh.fsdp}).")
  if config.compression.name == "none" and len(config.compression) > 1:
    extra = sorted(k for k in config.compression if k != "name")
    problems.append(f"config.compression sets {', '.join(extra)} but compression.name='none'; name a "
                    "compressor (one_bit, qsgd, powersgd) or remove them.")
  if config.lr.warmup == "none" and config.lr.warmup_epochs and config.scaling.rule != "goyal":
    problems.append(f"config.lr.warmup_epochs={config.lr.warmup_epochs} but config.lr.warmup='none': set "
                    "config.lr.warmup='linear_warmup' (or 'constant_warmup') for a warm-up, or the epochs to 0.")
  if config.lr.warmup != "none" and config.lr.warmup_epochs > config.num_epochs:
    problems.append(f"config.lr.warmup_epochs={config.lr.warmup_epochs} is longer than training "
                    f"(config.num_epochs={config.num_epochs}); shorten the warm-up or train longer. "
                    "(With scaling.rule='legw' the warm-up grows with the batch size: this is checked "
                    "again after scaling.)")
  if config.num_steps < 0:
    problems.append(f"config.num_steps must be >= 0 (0 = stop by epochs only), got {config.num_steps}.")
  if not config.num_epochs > 0:
    problems.append(f"config.num_epochs must be > 0, got {config.num_epochs}.")
  if not config.lr.base > 0:
    problems.append(f"config.lr.base must be > 0, got {config.lr.base}.")
  if not 0.0 <= config.loss.discard_fraction < 1.0:
    problems.append(f"config.loss.discard_fraction must be in [0, 1), got {config.loss.discard_fraction}.")
  if config.loss.discard_fraction > 0 and not config.loss.discard_until_epoch > 0:
    problems.append(f"config.loss.discard_fraction={config.loss.discard_fraction} discards nothing while "
                    "config.loss.discard_until_epoch is 0: set the epoch until which it applies.")
  if config.log_every < 1:
    problems.append(f"config.log_every must be >= 1, got {config.log_every}.")
  if config.checkpoint_every_steps < 0:
    problems.append(f"config.checkpoint_every_steps must be >= 0 (0 = only at the end), got "
                    f"{config.checkpoint_every_steps}.")
  if not isinstance(config.keep_checkpoints, int) or config.keep_checkpoints < 1:
    problems.append(f"config.keep_checkpoints must be an integer >= 1 (the newest checkpoints kept; a run "
                    f"always keeps at least one to resume from), got {config.keep_checkpoints!r}.")
  return problems


def validate(config: ml_collections.ConfigDict, *, data_parallel_size: int) -> None:
  """Checks the config before any compute; raises `ConfigError` listing every problem found.

  Args:
    config: the run config.
    data_parallel_size: number of batch shards of the mesh (devices of the `data` x `fsdp` axes).
  """
  problems = config_lib.renamed_problems(config)
  if not problems:  # names and values are read only once the fields mean what they say
    problems += _value_problems(config) + _batch_problems(config, data_parallel_size)
    problems += batch_policy.problems(config, data_parallel_size)
    problems += mesh.model_parallel_problems(config, data_parallel_size, _model_class(config))
    problems += _name_problems(config)
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(p.replace("\n", "\n    ") for p in problems))
