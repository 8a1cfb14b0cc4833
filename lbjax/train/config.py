"""The run config: its fields and defaults, renamed fields, and what may change on resume.

Every experiment config (`lbjax/configs/*.py`) starts from `default_config()` and overrides fields. The
learning-rate recipe in `config.lr` is the *baseline* recipe, tuned at `config.scaling.base_batch_size`;
`config.scaling.rule` maps it to the batch size in force (none, linear, sqrt, LEGW, Goyal et al.), so a
batch-size sweep is one baseline config, one rule and a list of batch sizes.
"""

import json

import ml_collections

from lbjax.train.errors import CheckpointMismatchError

# Fields that may differ between a run and the checkpoint it resumes from: they change how the run is
# watched or where it runs, not what it computes (max_device_batch: unless micro-batches change the update,
# `check_resumable`).
OPERATIONAL_FIELDS = ("log_every", "eval_every_epochs", "checkpoint_every_steps", "keep_checkpoints", "tensorboard",
                      "mesh", "pipeline", "eval_batch_size", "max_device_batch", "data_dir", "num_epochs", "num_steps",
                      "progress", "resume_with_changed_optimizer", "resume_with_changed_data", "init_from",
                      "deterministic", "heartbeat_timeout_seconds", "steps_per_call",
                      "train_data_on_device", "profile")

# What `resume_with_changed_optimizer=True` lets differ from the checkpoint (e.g. a lower LR to get past
# a non-finite step): the optimizer's settings but not which optimizer (its state would not fit).
OPTIMIZER_FIELDS = ("optimizer", "lr", "scaling", "clip_global_norm")
OPTIMIZER_STATE_FIELDS = ("name", "layout")  # optimizer fields that decide the structure of its state

# Sections whose fields are the keyword arguments of the function the config names (lbjax.train.names):
# a command-line override may add a field to them; elsewhere only existing fields can be set.
ARGUMENT_SECTIONS = ("model_options", "data_options", "optimizer", "lr", "scaling", "compression")

# In an argument section, the fields the trainer reads itself rather than handing them to the section's function:
# the field that names the function, and the section's own (the recipe, lbjax.train.optimizer). model_options and
# data_options have neither: their function is config.model or config.dataset.
SECTION_NAME_FIELDS = {"optimizer": "name", "compression": "name", "scaling": "rule", "lr": "decay"}
SECTION_OWN_FIELDS = {"scaling": ("base_batch_size",), "lr": ("base", "warmup", "warmup_epochs")}


def trainer_fields(section: str) -> tuple[str, ...]:
  """The fields of argument `section` that the trainer reads itself (its name field and its own fields); the
  section's other fields are the keyword arguments of the function it names (`FieldReads.options`)."""
  name = SECTION_NAME_FIELDS.get(section)
  return (*((name,) if name else ()), *SECTION_OWN_FIELDS.get(section, ()))

# Names and values lbjax used before the names became imports: what they are called now.
RENAMED_FIELDS = {
    "optimizer.clip_global_norm": "clip_global_norm",
    "optimizer.adam_eps": "optimizer.eps (the argument of optax.adam/adamw and lbjax.optim.lamb)",
    "lr.factor": "lr.decay_factors (lbjax.schedules.multistep_decay)",
    "lr.decay_start_epoch": "lr.decay_begin_epoch (lbjax.schedules.exponential_decay)",
    "lr.decay_rate": "lr.decay_factor (lbjax.schedules.exponential_decay)",
    "compression.levels": "compression.num_levels (lbjax.optim.compression.qsgd)",
    "data_options.mnist_format": "data_options.source (lbjax.train.datasets.mnist)",
}
RENAMED_VALUES = {
    "model": {"mnist_lstm": "MnistLSTM", "ptb_lstm": "PtbLSTM", "resnet50": "ResNet50", "resnet18": "ResNet18",
              "resnet_tiny": "ResNetTiny"},
    "lr.warmup": {"linear": "linear_warmup", "constant": "constant_warmup"},
    "lr.decay": {"poly": "polynomial_decay", "multistep": "multistep_decay", "exponential": "exponential_decay",
                 "cosine": "cosine_decay"},
}


def default_config() -> ml_collections.ConfigDict:
  """All fields of a run with their defaults (a small MNIST LSTM run on the shared data).

  Names are imports (`lbjax.train.names`): `model` is a constructor in `lbjax.models`, `dataset` a
  function in `lbjax.train.datasets`, `optimizer.name` a function in `lbjax.optim` or `optax`, and so
  on; `model_options`, `data_options`, and the other fields of `optimizer`, `lr` (after the recipe's
  base/warmup/warmup_epochs/decay), `scaling` (after rule/base_batch_size) and `compression` are
  their keyword arguments.
  """
  config = ml_collections.ConfigDict()
  config.model = "MnistLSTM"
  config.model_options = ml_collections.ConfigDict()  # e.g. bn_group_size, dropout_rate, dtype
  config.dataset = "mnist"
  config.data_dir = ""  # "" = LBJAX_DATA_DIR or ../shared/data (see lbjax.data.default_data_dir)
  config.data_options = ml_collections.ConfigDict()  # e.g. eval_split, seq_len, image_size
  config.seed = 0
  config.num_epochs = 1.0  # the run's length; LR schedules that decay to the end use it
  config.num_steps = 0  # > 0: also stop after this many updates (e.g. to study the first iterations)

  config.batch_size = 128  # global batch size (when batch_sizes is empty)
  config.batch_sizes = ()  # piecewise-constant batch-size schedule: sizes[i] from boundaries[i-1] on
  config.batch_size_boundaries = ()  # epochs where the batch size changes (len(batch_sizes) - 1)
  config.max_device_batch = 0  # >0: accumulate micro-batches when a device's share exceeds this
  config.eval_batch_size = 1000

  # Who chooses the batch (lbjax.train.batch_policy): "schedule" = batch_sizes at batch_size_boundaries,
  # or batch_size when they are empty; "fixed" = batch_size; "adaptive" = from the gradient noise scale.
  config.batch = ml_collections.ConfigDict()
  config.batch.policy = "schedule"
  # > 0: every update is a whole number of micro-batches of this global size, and any such batch runs on
  # the same two compiled programs (lbjax.train.any_batch); the adaptive policy needs it.
  config.batch.micro_batch_size = 0
  config.batch.min_batch_size = 0  # adaptive: the smallest batch; 0 = config.batch_size (the first batch)
  config.batch.max_batch_size = 0  # adaptive: the largest batch (required)
  config.batch.noise_multiple = 1.0  # adaptive: next batch = noise_multiple * B_noise
  config.batch.never_shrink = True  # adaptive: the batch only grows
  config.batch.learning_rate = "scaling_rule"  # adaptive: "scaling_rule" (config.scaling.rule) or "adascale"
  config.batch.adapt_every = 10  # steps between decisions and `batch` records (noise scale, goodput)
  config.batch.ema_decay = 0.9  # per step, of the |G|^2 and tr(Sigma) estimates

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "momentum"  # lbjax.optim.momentum: SGD + momentum, L2 decay on kernels
  config.optimizer.momentum = 0.9
  # > 0: the loss gradient is rescaled to this global L2 norm when larger, before weight decay and the
  # optimizer (optax.clip_by_global_norm; Zaremba et al.'s PTB LSTMs clip at 5 on the loss summed over time).
  config.clip_global_norm = 0.0

  config.lr = ml_collections.ConfigDict()
  config.lr.base = 0.1  # peak LR of the baseline recipe
  config.lr.warmup = "none"  # or a function of lbjax.schedules.warmup: linear_warmup, constant_warmup
  config.lr.warmup_epochs = 0.0
  config.lr.decay = "constant"  # a function of lbjax.schedules.decay; its arguments are further lr fields

  config.scaling = ml_collections.ConfigDict()
  config.scaling.rule = "none"  # a function of lbjax.schedules.rules: none, linear, sqrt, goyal, legw
  config.scaling.base_batch_size = 128

  # papers/003 §3.1: drop the smallest-loss fraction of each batch for the first epochs.
  config.loss = ml_collections.ConfigDict()
  config.loss.discard_fraction = 0.0
  config.loss.discard_until_epoch = 0.0

  # papers/004: compress each device's gradient before the data-parallel reduction (shard_map step).
  config.compression = ml_collections.ConfigDict()
  config.compression.name = "none"  # or a function of lbjax.optim.compression: one_bit, qsgd, powersgd

  config.diagnostics = ml_collections.ConfigDict()
  # papers/001 §4: L(x, g) = |g^T H g| / ||g||^2 on the first `lipschitz_batch_size` eval examples.
  config.diagnostics.lipschitz_every = 0  # steps; 0 = off
  config.diagnostics.lipschitz_batch_size = 128

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1
  config.mesh.fsdp = 1
  config.mesh.num_devices = 0  # 0 = all devices; n = the first n (e.g. to compare with a 1-device run)
  # True: each device computes its gradient in shard_map and one all-reduce averages them. For LSTMs
  # XLA's partitioner otherwise all-reduces the kernel gradient once per time step (benchmarks/README.md,
  # "collectives": 27x the bytes for the MNIST LSTM). BatchNorm statistics are then per device.
  # With max_device_batch each device accumulates its own micro-batches before the one all-reduce.
  config.mesh.per_device_gradients = False
  # Model parallelism beside `data` (lbjax.train.mesh): GPipe stages of the model's stack of layers, or the
  # model's declared parameters (e.g. PTB's vocabulary) sharded over a `model` axis. Either, not both.
  config.mesh.stage = 1
  config.mesh.model = 1

  # GPipe (lbjax.parallel.pipeline), with mesh.stage > 1: each data shard's batch runs through the stages in
  # num_microbatches micro-batches (bubble (S-1)/(M+S-1)); remat recomputes a stage's activations backward.
  config.pipeline = ml_collections.ConfigDict()
  config.pipeline.num_microbatches = 1
  config.pipeline.remat = False

  config.log_every = 50
  # Training steps per device call (Keras' steps_per_execution): k > 1 runs k steps in one compiled
  # `lax.scan`, the host dispatching once per k steps; the same steps, batches and records (lbjax.train.step_calls).
  config.steps_per_call = 1
  # True: the training set (in-memory arrays: MNIST, the synthetic datasets) is placed once on every device and each
  # step's batch gathered there from its indices: the same batches, B int32 sent per step (lbjax.train.device_data).
  config.train_data_on_device = False
  config.eval_every_epochs = 1.0
  config.checkpoint_every_steps = 1000  # also saved after every evaluation and at the end
  config.keep_checkpoints = 3
  # Resuming a workdir's checkpoint needs the same recipe and data; these allow, explicitly, a changed
  # optimizer setting (LR, warm-up, momentum, ...; recorded in <workdir>/history.jsonl) or changed data.
  config.resume_with_changed_optimizer = False
  config.resume_with_changed_data = False
  # A checkpoint (a workdir, its checkpoints/ folder or one step folder) whose parameters and BatchNorm
  # statistics start this run; the optimizer, step and data start afresh. Of a workdir, the newest checkpoint
  # that reads back with the checksums saved with it. Ignored once the workdir holds a checkpoint of its own
  # (the run then resumes that).
  config.init_from = ""
  config.tensorboard = False
  config.progress = True
  # jax.profiler: num_steps > 0 traces that many steps, after the first skip_steps of each session (a start or
  # a resume), into <workdir>/profile; the `profile` record says how busy the device was (lbjax.train.profiling).
  config.profile = ml_collections.ConfigDict()
  config.profile.num_steps = 0
  config.profile.skip_steps = 10
  config.profile.python_calls = False  # True: jax's Python tracer records every call too (slows the host)
  config.profile.perfetto_trace = False  # also perfetto_trace.json.gz, for ui.perfetto.dev
  # True: XLA's deterministic GPU kernels, set before the backend starts (lbjax.train.determinism).
  config.deterministic = False
  # Multi-host: a process silent this long counts as lost and the others stop, exit 5 (lbjax.train.distributed).
  config.heartbeat_timeout_seconds = 60
  return config


class FieldReads:
  """A config read one field at a time, recording the path of each field read.

  The resolved run (`lbjax.train.resolved`) reads every field it holds through one of these, so its
  `consumed_fields` are the fields the run reads, and a field nobody reads shows
  (tests/train/test_every_field_is_consumed.py).
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self._config = config
    self.paths: set[str] = set()

  def __call__(self, path: str):
    value = self._config
    for key in path.split("."):
      value = value[key]
    self.paths.add(path)
    return value

  def options(self, section: str) -> dict[str, object]:
    """The fields of argument `section` other than `trainer_fields(section)`: the keyword arguments of the
    function it names."""
    values = {k: v for k, v in self._config[section].to_dict().items() if k not in trainer_fields(section)}
    self.paths.update(f"{section}.{k}" for k in values)
    return values


def field_paths(config: ml_collections.ConfigDict) -> set[str]:
  """The dotted path of every field of `config` (sections' fields, not the sections)."""
  return set(_flat(config))


def _flat(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, object]:
  flat = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def renamed_problems(config: ml_collections.ConfigDict) -> list[str]:
  """Messages for fields and values that lbjax has renamed, naming the new ones."""
  flat = _flat(config)
  problems = [f"config.{old} is now config.{new}." for old, new in RENAMED_FIELDS.items() if old in flat]
  for field, values in RENAMED_VALUES.items():
    value = flat.get(field)
    if isinstance(value, str) and value in values:
      problems.append(f"config.{field}={value!r} is now {values[value]!r}.")
  return problems


def batch_sizes(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The global batch sizes of the run's schedule, in order (a size may come back: (32, 64, 32))."""
  return tuple(config.batch_sizes) if config.batch_sizes else (config.batch_size,)


def _with_defaults(values: dict, defaults: dict) -> dict:
  """`values` with every field it lacks taken from `defaults` (recursively)."""
  merged = dict(defaults)
  for key, value in values.items():
    merged[key] = _with_defaults(value, defaults[key]) if isinstance(value, dict) and isinstance(
        defaults.get(key), dict) else value
  return merged


def recipe_differences(saved_json: str, config: ml_collections.ConfigDict,
                       operational: tuple[str, ...] = OPERATIONAL_FIELDS) -> dict[str, list]:
  """The top-level fields in which `config` differs from the config `saved_json` records (a checkpoint's, a
  workdir's `config.json`), `{field: [saved value, value now]}`, apart from the `operational` ones. A field the
  saved config lacks (written before lbjax added it) counts as its default value."""
  defaults = json.loads(default_config().to_json())
  saved = _with_defaults(json.loads(saved_json), defaults)
  current = _with_defaults(json.loads(config.to_json()), defaults)
  for fields in (saved, current):  # a run stopped by a record that cannot be decoded resumes skipping such records
    (fields.get("data_options") or {}).pop("skip_undecodable", None)
  return {k: [saved.get(k), current.get(k)] for k in sorted(set(saved) | set(current))
          if k not in operational and saved.get(k) != current.get(k)}


def check_resumable(saved_json: str, config: ml_collections.ConfigDict, workdir: str,
                    lr_reads_num_epochs: bool = False,
                    micro_batches_change_the_update: bool = False) -> dict[str, list]:
  """Raises if the workdir's checkpoint was written by a run with a different recipe.

  Operational fields (`OPERATIONAL_FIELDS`) may change between runs; with
  `config.resume_with_changed_optimizer` so may `OPTIMIZER_FIELDS` (not `OPTIMIZER_STATE_FIELDS`); everything
  else must match. With `lr_reads_num_epochs` (a decay that runs to the end of training,
  `LearningRate.reads_num_epochs`) `num_epochs` is an optimizer field: another one would move the LR mid-run.
  With `micro_batches_change_the_update` (`ResolvedRun.micro_batches_change_the_update`) `max_device_batch` is part
  of the recipe. A field the checkpoint's config lacks (written before lbjax added it) counts as its default value.

  Returns:
    The allowed changes, `{field: [checkpoint value, value now]}` (empty when nothing changed).
  """
  operational = tuple(f for f in OPERATIONAL_FIELDS if not (lr_reads_num_epochs and f == "num_epochs")
                      and not (micro_batches_change_the_update and f == "max_device_batch"))
  optimizer_fields = OPTIMIZER_FIELDS + (("num_epochs",) if lr_reads_num_epochs else ())
  differences = recipe_differences(saved_json, config, operational)
  allowed = {}
  if config.resume_with_changed_optimizer:
    allowed = {k: values for k, values in differences.items() if k in optimizer_fields}
    saved_optimizer, optimizer_now = allowed.get("optimizer", [{}, {}])
    structural = [f for f in OPTIMIZER_STATE_FIELDS if saved_optimizer.get(f) != optimizer_now.get(f)]
    if structural:
      field = structural[0]
      raise CheckpointMismatchError(
          f"The workdir {workdir} holds a checkpoint of optimizer.{field}={saved_optimizer.get(field)!r}, now "
          f"{optimizer_now.get(field)!r}: its optimizer state cannot continue in another optimizer or "
          f"layout. Start a new run from its parameters instead: --config.init_from={workdir} "
          "--workdir=<a new workdir>.")
  differing = [k for k in differences if k not in allowed]
  if differing:
    details = "; ".join(f"{k}: checkpoint {differences[k][0]!r} vs now {differences[k][1]!r}" for k in differing)
    optimizer_hint = (" To change optimizer settings on purpose (e.g. a lower LR after a non-finite step), add "
                      "--config.resume_with_changed_optimizer=True." if set(differing) <= set(optimizer_fields) else "")
    if "max_device_batch" in differing:
      optimizer_hint += (" The smallest losses are discarded per micro-batch (config.loss.discard_fraction) or "
                         "BatchNorm normalises over it (no bn_group_size), so config.max_device_batch changes the "
                         "update.")
    if "num_epochs" in differing:
      optimizer_hint = (" The LR decay runs to config.num_epochs, so another num_epochs moves the LR from this "
                        "step on." + optimizer_hint)
    raise CheckpointMismatchError(
        f"The workdir {workdir} holds a checkpoint of a different run ({details}). Use a new --workdir, restore "
        f"the original config to resume, or start a new run from its parameters with "
        f"--config.init_from={workdir}.{optimizer_hint}")
  return allowed
