"""The batch-size plan: every batch-size field of a config, its rules and their validation, in one place.

The batch size of a run lives in `config.batch_size`, `config.batch_sizes` at
`config.batch_size_boundaries` (a schedule, papers/002), `config.max_device_batch` (accumulation inside
the compiled step of each size) and `config.batch` (who chooses: "fixed", "schedule" or "adaptive",
and `micro_batch_size`, the any-batch step). `problems` checks them together before any compute;
`BatchPlan` is what a resolved run holds; `check_fits_data` refuses, once the data is open, a batch
the training set cannot fill.
"""

import dataclasses

import ml_collections

from lbjax import schedules
from lbjax.train import config as config_lib
from lbjax.train import protocols
from lbjax.train.errors import ConfigError

POLICIES = ("fixed", "schedule", "adaptive")
LEARNING_RATE_MODES = ("scaling_rule", "adascale")
# Fields only the adaptive policy reads, with their defaults (set away from them elsewhere: refused).
ADAPTIVE_FIELDS = {"min_batch_size": 0, "max_batch_size": 0, "noise_multiple": 1.0, "never_shrink": True,
                   "learning_rate": "scaling_rule"}
# Fields of the gradient noise-scale measurement (its averaging and `batch` records), with their defaults: they
# act only where a step measures it from micro-batches (the adaptive policy, config.batch.micro_batch_size, or
# accumulation under config.max_device_batch); set away from their defaults elsewhere: refused.
NOISE_SCALE_FIELDS = {field: value for field, value in config_lib.default_config().batch.items()
                      if field in ("adapt_every", "ema_decay")}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """The run's batch sizes and who chooses them (`lbjax.train.batch_policy.BatchPolicy` follows it).

  Attributes:
    policy: "fixed", "schedule" or "adaptive".
    sizes, boundaries: the schedule: `sizes[i]` from epoch `boundaries[i-1]` on (one size: constant).
      Under the adaptive policy `sizes[0]` is the first batch.
    max_device_batch: > 0: a step whose device share exceeds it accumulates micro-batches in the step.
    micro_batch_size: > 0: every batch is a whole number of micro-batches of this global size and
      runs on the any-batch step (`lbjax.train.any_batch`).
    min_batch_size, max_batch_size, noise_multiple, never_shrink: the adaptive controller's bounds
      and target (`lbjax.schedules.adaptive_batch.noise_proportional_batch_size`).
    learning_rate: adaptive: "scaling_rule" (the scaled recipe at the batch in force) or "adascale".
    adapt_every, ema_decay: steps between decisions (and `batch` records); the estimates' decay.
    eval_batch_size: the global batch of the evaluation.
  """
  policy: str
  sizes: tuple[int, ...]
  boundaries: tuple[float, ...]
  max_device_batch: int
  micro_batch_size: int
  min_batch_size: int
  max_batch_size: int
  noise_multiple: float
  never_shrink: bool
  learning_rate: str
  adapt_every: int
  ema_decay: float
  eval_batch_size: int

  @property
  def first(self) -> int:
    return self.sizes[0]

  @property
  def adaptive(self) -> bool:
    return self.policy == "adaptive"

  @property
  def adascale(self) -> bool:
    return self.adaptive and self.learning_rate == "adascale"

  @property
  def smallest_adaptive(self) -> int:
    """The adaptive policy's smallest batch (`min_batch_size`, 0 meaning the first batch)."""
    return self.min_batch_size or self.first

  def schedule(self) -> schedules.BatchSizeSchedule:
    """The global batch size as a function of epochs (the schedule policies')."""
    if len(self.sizes) > 1:
      return schedules.BatchSizeSchedule(self.sizes, self.boundaries)
    return schedules.constant_batch_size(self.first)

  def num_microbatches(self, global_batch_size: int, data_parallel_size: int) -> int:
    """Micro-batches the per-size step accumulates (`max_device_batch`; 1 when the share fits)."""
    return microbatch_count(global_batch_size, data_parallel_size, self.max_device_batch)

  def describe(self) -> str:
    """The policy's fields as `policy='schedule', micro_batch_size=0, ...` (the console's `batch by`)."""
    fields = ("policy", "micro_batch_size", "min_batch_size", "max_batch_size", "noise_multiple", "never_shrink",
              "learning_rate", "adapt_every", "ema_decay")
    return ", ".join(f"{k}={getattr(self, k)!r}" for k in fields)


def microbatch_count(global_batch_size: int, data_parallel_size: int, max_device_batch: int) -> int:
  """Micro-batches a step accumulates when a device's share of the batch exceeds `max_device_batch`
  (> 0); 1 when the share fits."""
  share = global_batch_size // data_parallel_size
  return share // max_device_batch if 0 < max_device_batch < share else 1


def plan(read) -> BatchPlan:
  """The plan of a validated config; `read(path)` reads (and records) one field."""
  sizes = tuple(read("batch_sizes"))
  return BatchPlan(
      policy=read("batch.policy"), sizes=sizes or (read("batch_size"),),
      boundaries=tuple(read("batch_size_boundaries")),
      max_device_batch=read("max_device_batch"), micro_batch_size=read("batch.micro_batch_size"),
      min_batch_size=read("batch.min_batch_size"), max_batch_size=read("batch.max_batch_size"),
      noise_multiple=read("batch.noise_multiple"), never_shrink=read("batch.never_shrink"),
      learning_rate=read("batch.learning_rate"), adapt_every=read("batch.adapt_every"),
      ema_decay=read("batch.ema_decay"), eval_batch_size=read("eval_batch_size"))


def problems(config: ml_collections.ConfigDict, data_parallel_size: int) -> list[str]:
  """Every problem of the batch fields, alone and together, on `data_parallel_size` batch shards."""
  return _size_problems(config, data_parallel_size) + _policy_problems(config, data_parallel_size)


def _size_problems(config: ml_collections.ConfigDict, data_parallel_size: int) -> list[str]:
  found = []
  if config.batch_sizes and len(config.batch_sizes) != len(config.batch_size_boundaries) + 1:
    found.append(f"config.batch_sizes has {len(config.batch_sizes)} sizes but "
                 f"config.batch_size_boundaries has {len(config.batch_size_boundaries)} epochs; "
                 "give one more size than boundaries.")
  if not config.batch_sizes and config.batch_size_boundaries:
    found.append(f"config.batch_size_boundaries={tuple(config.batch_size_boundaries)} without config.batch_sizes: "
                 "the boundaries are where config.batch_sizes changes; give the sizes too (one more than the "
                 "boundaries), or drop the boundaries for the constant config.batch_size.")
  if config.max_device_batch < 0:
    found.append(f"config.max_device_batch must be >= 0 (0 = no accumulation), got {config.max_device_batch}.")
  field = "config.batch_sizes" if config.batch_sizes else "config.batch_size"
  sizes_are_counts = True
  for size in config_lib.batch_sizes(config):
    if not isinstance(size, int) or size <= 0:
      sizes_are_counts = False
      found.append(f"{field}: batch size {size!r} must be a positive integer.")
    elif size % data_parallel_size:
      found.append(f"global batch size {size} is not divisible by the data-parallel size "
                   f"{data_parallel_size} (devices on the data x fsdp mesh axes); use a multiple of "
                   f"{data_parallel_size} or change config.mesh.")
    elif config.max_device_batch > 0:
      share = size // data_parallel_size
      if share > config.max_device_batch and share % config.max_device_batch:
        found.append(f"gradient accumulation cannot split a device share of {share} examples (global "
                     f"batch {size} over {data_parallel_size} devices) into micro-batches of "
                     f"config.max_device_batch={config.max_device_batch}; choose a divisor of {share}.")
  if config.eval_batch_size <= 0 or config.eval_batch_size % data_parallel_size:
    found.append(f"config.eval_batch_size={config.eval_batch_size} must be a positive multiple of the "
                 f"data-parallel size {data_parallel_size}.")
  if config.batch_sizes and sizes_are_counts and len(config.batch_sizes) == len(config.batch_size_boundaries) + 1:
    found += _schedule_problems(config)
  return found


def _schedule_problems(config: ml_collections.ConfigDict) -> list[str]:
  """The batch-size schedule's own rules (`schedules.BatchSizeSchedule`: boundaries increasing and > 0,
  consecutive sizes distinct), and boundaries inside training."""
  try:
    schedule = schedules.BatchSizeSchedule(tuple(config.batch_sizes), tuple(config.batch_size_boundaries))
  except (TypeError, ValueError) as e:
    return [f"config.batch_sizes={tuple(config.batch_sizes)} with config.batch_size_boundaries="
            f"{tuple(config.batch_size_boundaries)}: {e}"]
  late = [b for b in schedule.boundaries if b >= config.num_epochs]
  if late:
    return [f"config.batch_size_boundaries {list(late)} lie at or past the end of training (config.num_epochs="
            f"{config.num_epochs:g}); the batch would never change there. Move them inside or train longer."]
  return []


def model_call_problems(config: ml_collections.ConfigDict, data_parallel_size: int, model: str,
                        multiple: int) -> list[str]:
  """Each training batch one call of the model sees, against the `multiple` the model declares
  (`training_batch_multiple`: the ResNets' ghost BN groups): a call's batch is the global batch, a
  micro-batch of it (`max_device_batch`, `batch.micro_batch_size`), and under `mesh.per_device_gradients`
  or compression (a `shard_map` step) one device's share of that."""
  if multiple == 1 or config.mesh.stage > 1:
    return []
  per_device = config.compression.name != "none" or config.mesh.per_device_gradients
  calls = {}
  if config.batch.micro_batch_size:
    calls[config.batch.micro_batch_size] = f"config.batch.micro_batch_size={config.batch.micro_batch_size}"
  else:
    for size in config_lib.batch_sizes(config):
      if not isinstance(size, int) or size <= 0 or size % data_parallel_size:
        continue  # reported by `problems`
      count = microbatch_count(size, data_parallel_size, config.max_device_batch)
      calls[size // count] = f"the global batch {size}" + (
          f" in {count} micro-batches (config.max_device_batch={config.max_device_batch})" if count > 1 else "")
  found = []
  for call, source in calls.items():
    seen = call // data_parallel_size if per_device else call
    if seen % multiple:
      device = (f", {seen} per device ({data_parallel_size} data-parallel devices; mesh.per_device_gradients "
                "or compression compute each device's gradient alone)") if per_device else ""
      found.append(f"config.model={model} splits each training batch into groups of {multiple} (for the "
                   f"ResNets config.model_options.bn_group_size), but one call of it sees {source}{device}: "
                   f"{seen} examples. Use a batch giving a multiple of {multiple} per call, or a group size "
                   f"that divides {seen}.")
  return found


def _policy_problems(config: ml_collections.ConfigDict, data_parallel_size: int) -> list[str]:
  batch, found = config.batch, []
  if batch.policy not in POLICIES:
    return [f"config.batch.policy={batch.policy!r} is not one of {', '.join(POLICIES)}."]
  micro = batch.micro_batch_size
  if not _is_int(micro) or micro < 0:
    return [f"config.batch.micro_batch_size must be an integer >= 0 (0 = one compiled step per batch size), "
            f"got {micro!r}."]
  if not _is_int(batch.adapt_every) or batch.adapt_every < 1:
    found.append(f"config.batch.adapt_every must be an integer >= 1 (steps), got {batch.adapt_every!r}.")
  if not 0.0 <= batch.ema_decay < 1.0:
    found.append(f"config.batch.ema_decay must be in [0, 1), got {batch.ema_decay!r}.")
  if micro:
    if micro % data_parallel_size:
      found.append(f"config.batch.micro_batch_size={micro} is split over the data-parallel size "
                   f"{data_parallel_size}; use a multiple of {data_parallel_size}.")
    if config.max_device_batch:
      found.append("config.batch.micro_batch_size and config.max_device_batch both split the batch; set "
                   "config.max_device_batch=0 (the micro-batch already bounds the memory).")
    if config.compression.name != "none" or config.mesh.per_device_gradients:
      found.append("config.batch.micro_batch_size reduces GSPMD gradients; it does not combine with "
                   "config.compression or config.mesh.per_device_gradients. Set it to 0.")
  if batch.policy != "adaptive":
    changed = [f"batch.{k}" for k, default in ADAPTIVE_FIELDS.items() if batch[k] != default]
    if changed:
      found.append(f"config.{', config.'.join(changed)} only apply with config.batch.policy='adaptive' "
                   f"(it is {batch.policy!r}); remove them or set the policy.")
  if batch.policy != "adaptive" and not micro and not _accumulates(config, data_parallel_size):
    changed = [f"batch.{k}={batch[k]!r}" for k, default in NOISE_SCALE_FIELDS.items() if batch[k] != default]
    if changed:
      found.append(f"config.{', config.'.join(changed)} set how the gradient noise scale is averaged and recorded "
                   f"(`batch` records), but no step of this run measures it: it is measured from micro-batches, "
                   f"under config.batch.policy='adaptive' (it is {batch.policy!r}), with "
                   "config.batch.micro_batch_size > 0, or with gradient accumulation (config.max_device_batch below "
                   "a device's share of the batch). Remove them or set one of those.")
  if batch.policy == "fixed" and config.batch_sizes:
    found.append("config.batch.policy='fixed' uses config.batch_size only, but config.batch_sizes is set; "
                 "set config.batch.policy='schedule' for a batch-size schedule.")
  if batch.policy == "adaptive":
    found += _adaptive_problems(config)
  elif micro:
    for size in config_lib.batch_sizes(config):
      if _is_int(size) and size % micro:
        found.append(f"batch size {size} is not a whole number of micro-batches of "
                     f"config.batch.micro_batch_size={micro}; use a multiple of {micro}.")
  return found


def _accumulates(config: ml_collections.ConfigDict, data_parallel_size: int) -> bool:
  """Whether a step of the run accumulates micro-batches under `config.max_device_batch` (and so measures the
  gradient noise scale); batch sizes that are not valid are reported by `_size_problems`."""
  return any(_is_int(size) and size > 0 and microbatch_count(size, data_parallel_size, config.max_device_batch) > 1
             for size in config_lib.batch_sizes(config))


def _adaptive_problems(config: ml_collections.ConfigDict) -> list[str]:
  batch, found = config.batch, []
  micro = batch.micro_batch_size
  if config.batch_sizes:
    found.append("config.batch.policy='adaptive' chooses the batch itself: remove config.batch_sizes and "
                 "config.batch_size_boundaries (config.batch_size is the first batch).")
  if not micro:
    return found + ["config.batch.policy='adaptive' measures the noise from micro-batch gradients: set "
                    "config.batch.micro_batch_size > 0 (e.g. the smallest batch you would use)."]
  low = batch.min_batch_size or config.batch_size
  high = batch.max_batch_size
  if batch.learning_rate not in LEARNING_RATE_MODES:
    found.append(f"config.batch.learning_rate={batch.learning_rate!r} is not one of "
                 f"{', '.join(LEARNING_RATE_MODES)}.")
  if batch.learning_rate == "adascale" and config.scaling.rule != "none":
    found.append(f"config.batch.learning_rate='adascale' scales the LR by its own gain; set "
                 f"config.scaling.rule='none' (got {config.scaling.rule!r}).")
  if not (isinstance(batch.noise_multiple, (int, float)) and batch.noise_multiple > 0):
    found.append(f"config.batch.noise_multiple must be > 0, got {batch.noise_multiple!r}.")
  if not _is_int(high) or high <= 0:
    return found + [f"config.batch.max_batch_size must be set (a positive multiple of the micro-batch "
                    f"{micro}) with the adaptive policy, got {high!r}."]
  for name, value in (("config.batch.min_batch_size", low), ("config.batch.max_batch_size", high),
                      ("config.batch_size", config.batch_size)):
    if not _is_int(value) or value % micro:
      found.append(f"{name}={value!r} is not a whole number of micro-batches of "
                   f"config.batch.micro_batch_size={micro}; use a multiple of {micro}.")
  if _is_int(low) and low < 2 * micro:
    found.append(f"the smallest adaptive batch ({low}) must hold at least 2 micro-batches of {micro}: the "
                 "noise scale needs two batch sizes. Raise config.batch.min_batch_size or lower the micro-batch.")
  if not low <= config.batch_size <= high:
    found.append(f"config.batch_size={config.batch_size} (the first batch) must lie in "
                 f"[config.batch.min_batch_size, config.batch.max_batch_size] = [{low}, {high}].")
  return found


def learning_rate_problems(batch: BatchPlan, learning_rate) -> list[str]:
  """The adaptive scaling-rule LR must be a valid schedule at the largest batch too (LEGW's warm-up)."""
  if not batch.adaptive or batch.learning_rate != "scaling_rule":
    return []
  try:
    learning_rate.schedule(batch.max_batch_size)
  except ConfigError as e:
    return [f"at config.batch.max_batch_size={batch.max_batch_size}: {e}"]
  return []


def sizes_to_fit_data(batch: BatchPlan) -> list[tuple[str, int]]:
  """(field, size) of each batch size the training set must fill: the schedule's, and the adaptive policy's
  largest."""
  field = "config.batch_sizes" if len(batch.sizes) > 1 else "config.batch_size"
  fields = [(field, size) for size in batch.sizes]
  if batch.adaptive:
    fields.append(("config.batch.max_batch_size (the adaptive policy's largest batch)", batch.max_batch_size))
  return fields


def check_fits_data(batch: BatchPlan, stream: protocols.TrainStream, dataset: str) -> None:
  """Refuses, before any compute, a batch of `sizes_to_fit_data` larger than the training set (or, for a stream
  of windows, one that leaves a row too short for one window)."""
  name = f"config.dataset={dataset!r}"
  for field, size in sizes_to_fit_data(batch):
    try:
      steps = protocols.steps_per_epoch(stream, size)
    except ValueError:
      steps = 0
    if steps >= 1:
      continue
    if isinstance(stream, protocols.WindowStream):
      raise ConfigError(f"{field}: a batch of {size} rows leaves the training tokens of {name} too short for "
                        "one window per row; use a smaller batch size or seq_len.")
    raise ConfigError(f"{field}: a batch of {size} is larger than the training set of {name} "
                      f"({stream.num_examples} examples); use at most {stream.num_examples}.")
