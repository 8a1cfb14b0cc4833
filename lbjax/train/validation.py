"""Validation of a run config before any compute: every problem found, in one message.

`validate` checks values (sizes, ranges, what divides what; the batch fields in `batch_plan`) and
resolves every name the config uses, once (`lbjax.train.resolved`), binding each section's fields to
its function's signature, so that a typo, a renamed field or an argument a function does not take is
refused here, not dropped or found mid-run. It returns the `ResolvedRun` a run is built from;
`check_devices` checks it again on the run's mesh (what divides the data-parallel size).
"""

import math
import re
from typing import Any, Callable

import ml_collections

from lbjax.train import batch_plan
from lbjax.train import checkpointing
from lbjax.train import config as config_lib
from lbjax.train import distributed
from lbjax.train import mesh
from lbjax.train import profiling
from lbjax.train import resolved
from lbjax.train.errors import ConfigError


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_problems(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """(field, problem) where a field the trainer reads lacks the kind of value its default has (a Python config
  may set any): an integer (not a bool) where the default is one, a number where it is a float, a bool, a
  string, a sequence."""
  problems = []
  for path, default in _trainer_fields(config_lib.default_config(), ""):
    node = config
    for part in path.split("."):
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if node is None and path.split(".")[0] in config_lib.ARGUMENT_SECTIONS:
      continue  # a section of arguments need not hold it (its function's default applies)
    kind, fits = _kind_of(default)
    if not fits(node):
      problems.append((path, f"config.{path} must be {kind}, got {node!r} ({type(node).__name__})."))
  return problems


def _trainer_fields(section: ml_collections.ConfigDict, prefix: str):
  for key, value in section.items():
    path = f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      yield from _trainer_fields(value, f"{path}.")
    elif not prefix or prefix[:-1] not in config_lib.ARGUMENT_SECTIONS or key in config_lib.trainer_fields(prefix[:-1]):
      yield path, value


def _kind_of(default) -> tuple[str, Callable[[Any], bool]]:
  if isinstance(default, bool):
    return "True or False", lambda value: isinstance(value, bool)
  if isinstance(default, int):
    return "an integer", lambda value: isinstance(value, int) and not isinstance(value, bool)
  if isinstance(default, float):
    return "a number", _is_number
  if isinstance(default, str):
    return "a string", lambda value: isinstance(value, str)
  return "a tuple", lambda value: isinstance(value, (tuple, list))


def _diagnostics_problems(config: ml_collections.ConfigDict, data_parallel_size: int) -> list[str]:
  problems = []
  lipschitz = config.diagnostics
  if lipschitz.lipschitz_every < 0:
    problems.append(f"config.diagnostics.lipschitz_every must be >= 0 (0 = off), got {lipschitz.lipschitz_every}.")
  if lipschitz.lipschitz_every and (lipschitz.lipschitz_batch_size <= 0
                                    or lipschitz.lipschitz_batch_size % data_parallel_size):
    problems.append(f"config.diagnostics.lipschitz_batch_size={lipschitz.lipschitz_batch_size} must "
                    f"be a positive multiple of the data-parallel size {data_parallel_size}.")
  return problems


def _device_problems(config: ml_collections.ConfigDict, data_parallel_size: int, model) -> list[str]:
  """The problems that depend on the data-parallel size (and the rest of the batch and mesh rules);
  `model` the `tasks.ModelChoice`, or None when its name does not resolve (reported elsewhere)."""
  batch_problems = batch_plan.problems(config, data_parallel_size)
  problems = (batch_problems + _diagnostics_problems(config, data_parallel_size)
              + mesh.model_parallel_problems(config, data_parallel_size, model.resolved.function if model else None))
  if model is not None and not batch_problems:
    problems += batch_plan.model_call_problems(config, data_parallel_size, repr(config.model),
                                               model.training_batch_multiple())
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
  for name in ("decay_begin_epoch", "begin_epoch"):
    begin = config.lr.get(name)
    if _is_number(begin) and not 0 <= begin < config.num_epochs:
      problems.append(f"config.lr.{name}={begin:g} lies outside training (0 to config.num_epochs="
                      f"{config.num_epochs:g}); the decay would never begin. Move it inside or train longer.")
  if not config.eval_every_epochs > 0:
    problems.append(f"config.eval_every_epochs must be > 0 (epochs between evaluations), got "
                    f"{config.eval_every_epochs!r}.")
  if isinstance(config.seed, bool) or not isinstance(config.seed, int) or not 0 <= config.seed < 2**63:
    problems.append(f"config.seed must be an integer from 0 to 2**63 - 1 (it seeds jax.random.key), got "
                    f"{config.seed!r}.")
  if config.mesh.num_devices < 0:
    problems.append(f"config.mesh.num_devices must be >= 0 (0 = all devices), got {config.mesh.num_devices}.")
  problems += mesh.size_problems(config.mesh.data, config.mesh.fsdp, config.mesh.stage, config.mesh.model)
  try:  # read by multi-host runs only, but a wrong value is wrong in any run (--dry-run included)
    distributed.check_heartbeat_timeout(config.heartbeat_timeout_seconds)
  except ConfigError as e:
    problems.append(str(e))
  if config.init_from and isinstance(config.init_from, str):
    try:
      checkpointing.init_source(config.init_from)
    except ConfigError as e:
      problems.append(str(e))
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
  base_batch = config.scaling.base_batch_size
  if isinstance(base_batch, bool) or not isinstance(base_batch, int) or base_batch < 1:
    problems.append(f"config.scaling.base_batch_size must be a positive integer (the batch of the baseline recipe "
                    f"the rule scales from), got {base_batch!r}.")
  if not 0.0 <= config.loss.discard_fraction < 1.0:
    problems.append(f"config.loss.discard_fraction must be in [0, 1), got {config.loss.discard_fraction}.")
  if config.loss.discard_fraction > 0 and not config.loss.discard_until_epoch > 0:
    problems.append(f"config.loss.discard_fraction={config.loss.discard_fraction} discards nothing while "
                    "config.loss.discard_until_epoch is 0: set the epoch until which it applies.")
  if config.loss.discard_fraction > 0 and (config.compression.name != "none" or config.mesh.per_device_gradients):
    problems.append(f"config.loss.discard_fraction={config.loss.discard_fraction} drops the smallest losses of the "
                    "batch (papers/003 §3.1), but under config.compression or config.mesh.per_device_gradients each "
                    "device computes its gradient alone and would rank only its own rows, an update that depends on "
                    "the device count. Set compression.name='none' and mesh.per_device_gradients=False, or "
                    "discard_fraction=0.")
  if config.log_every < 1:
    problems.append(f"config.log_every must be >= 1, got {config.log_every}.")
  problems += _steps_per_call_problems(config)
  if not isinstance(config.train_data_on_device, bool):
    problems.append(f"config.train_data_on_device must be True or False, got {config.train_data_on_device!r}.")
  problems += profiling.problems(config.profile)
  if config.checkpoint_every_steps < 0:
    problems.append(f"config.checkpoint_every_steps must be >= 0 (0 = only at the end), got "
                    f"{config.checkpoint_every_steps}.")
  if not isinstance(config.keep_checkpoints, int) or config.keep_checkpoints < 1:
    problems.append(f"config.keep_checkpoints must be an integer >= 1 (the newest checkpoints kept; a run "
                    f"always keeps at least one to resume from), got {config.keep_checkpoints!r}.")
  return problems


def _steps_per_call_problems(config: ml_collections.ConfigDict) -> list[str]:
  """`config.steps_per_call`: an integer >= 1; several steps per call need batch sizes and learning
  rates the host knows before the call, which the adaptive policy (its decisions read the steps'
  results) and the any-batch step (two programs per update) do not give."""
  count = config.steps_per_call
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    return [f"config.steps_per_call must be an integer >= 1 (1 = one step per device call), got {count!r}."]
  if count == 1:
    return []
  problems = []
  if config.batch.policy == "adaptive":
    problems.append(f"config.steps_per_call={count} needs each step's batch size before the call, but "
                    "config.batch.policy='adaptive' decides it from the steps' results; set "
                    "config.steps_per_call=1 or use the 'schedule' or 'fixed' policy.")
  if config.batch.micro_batch_size:
    problems.append(f"config.steps_per_call={count} does not combine with config.batch.micro_batch_size="
                    f"{config.batch.micro_batch_size} (the any-batch step runs two programs per update); set "
                    "one of them back (steps_per_call=1 or micro_batch_size=0).")
  return problems


def _raise(problems: list[str]) -> None:
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(p.replace("\n", "\n    ") for p in problems))


def configured_data_parallel_size(config: ml_collections.ConfigDict) -> int:
  """The data-parallel size the config fixes without the devices: `mesh.data * mesh.fsdp` when `mesh.data`
  is a size (the mesh is built with exactly that many batch shards, or not at all); 1 for `mesh.data=-1`
  (all devices: known once they are)."""
  data, fsdp = config.mesh.data, config.mesh.fsdp
  if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (data, fsdp)):
    return data * fsdp
  return 1


def validate(config: ml_collections.ConfigDict, *, data_parallel_size: int | None = None) -> resolved.ResolvedRun:
  """Checks the config before any compute and resolves it, once.

  Args:
    config: the run config.
    data_parallel_size: number of batch shards of the mesh (devices of the `data` x `fsdp` axes); None
      before the devices are known: what the config fixes (`configured_data_parallel_size`; `check_devices`
      checks the run's mesh once it is built).

  Returns:
    The `ResolvedRun`.

  Raises:
    ConfigError: listing every problem found.
  """
  _raise(config_lib.renamed_problems(config))  # names and values are read only once the fields mean what they say
  if data_parallel_size is None:
    data_parallel_size = configured_data_parallel_size(config)
  kinds = _type_problems(config)
  try:
    read = config_lib.FieldReads(config)
    parts, name_problems = resolved.resolve_parts(read)
    model = parts.get("model")
    batch_problems = batch_plan.problems(config, data_parallel_size)
    problems = _value_problems(config) + _device_problems(config, data_parallel_size, model) + name_problems
    if not batch_problems and "learning_rate" in parts:
      problems += batch_plan.learning_rate_problems(parts["batch"], parts["learning_rate"])
  except TypeError:  # a value of the wrong kind that a check compared (a string for a number)
    _raise([problem for _, problem in kinds])
    raise
  # A field's own check, where it has one, says more than its kind ("an integer >= 1").
  _raise(problems + [problem for path, problem in kinds
                     if not any(re.search(rf"config\.{re.escape(path)}\b", p) for p in problems)])
  return resolved.assemble(config, read, parts)


def check_devices(run: resolved.ResolvedRun, data_parallel_size: int) -> None:
  """Checks a resolved run against the data-parallel size of its mesh (batches it must divide).

  Raises:
    ConfigError: listing every problem found.
  """
  _raise(_device_problems(run.source_config, data_parallel_size, run.model))
