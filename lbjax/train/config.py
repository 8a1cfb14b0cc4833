"""The run config: its fields, their defaults, and validation before any compute.

Every experiment config (`configs/*.py`) starts from `default_config()` and overrides fields. The
learning-rate recipe in `config.lr` is the *baseline* recipe, tuned at `config.scaling.base_batch_size`;
`config.scaling.rule` maps it to the batch size in force (none, linear, sqrt, LEGW, Goyal et al.), so a
batch-size sweep is one baseline config, one rule and a list of batch sizes.
"""

import json

import ml_collections

MODELS = ("mnist_lstm", "ptb_lstm", "resnet50", "resnet18", "resnet_tiny")
DATASETS = ("mnist", "ptb", "imagenet", "cifar10", "synthetic_mnist", "synthetic_images", "synthetic_ptb")
OPTIMIZERS = ("sgd", "momentum", "lars", "lamb", "adam", "percent_delta", "mclr")
WARMUPS = ("none", "linear", "constant")
DECAYS = ("constant", "poly", "multistep", "exponential", "cosine")
SCALING_RULES = ("none", "linear", "sqrt", "legw", "goyal")
COMPRESSIONS = ("none", "one_bit", "qsgd")
LANGUAGE_MODEL_DATASETS = ("ptb", "synthetic_ptb")

# Fields that may differ between a run and the checkpoint it resumes from: they change how the run is
# watched or where it runs, not what it computes.
OPERATIONAL_FIELDS = ("log_every", "eval_every_epochs", "checkpoint_every_steps", "keep_checkpoints", "tensorboard", "mesh",
                      "eval_batch_size", "max_device_batch", "data_dir", "num_epochs", "num_steps", "progress")


def default_config() -> ml_collections.ConfigDict:
  """All fields of a run with their defaults (a small MNIST LSTM run on the shared data)."""
  config = ml_collections.ConfigDict()
  config.model = "mnist_lstm"
  # Keyword arguments of the model constructor, e.g. bn_group_size, dropout_rate, dtype.
  config.model_options = ml_collections.ConfigDict()
  config.dataset = "mnist"
  config.data_dir = ""  # "" = LBJAX_DATA_DIR or ../shared/data (see lbjax.data.default_data_dir)
  config.data_options = ml_collections.ConfigDict()
  config.data_options.mnist_format = "idx"  # mnist: 'idx' (LeCun's files) or 'tfds'
  config.data_options.image_size = 0  # imagenet/cifar10/synthetic_images; 0 = the dataset's own
  config.data_options.seq_len = 20  # ptb: BPTT window
  config.data_options.eval_split = "valid"  # ptb: 'valid' or 'test'
  config.data_options.num_train_examples = 2048  # synthetic_mnist/synthetic_images
  config.data_options.num_eval_examples = 512
  config.data_options.num_classes = 10  # synthetic_images
  config.data_options.vocab_size = 50  # synthetic_ptb
  config.data_options.num_train_tokens = 20000
  config.data_options.num_eval_tokens = 4000
  config.seed = 0
  config.num_epochs = 1.0  # the run's length; LR schedules that decay to the end use it
  config.num_steps = 0  # > 0: also stop after this many updates (e.g. to study the first iterations)

  config.batch_size = 128  # global batch size (when batch_sizes is empty)
  config.batch_sizes = ()  # piecewise-constant batch-size schedule: sizes[i] from boundaries[i-1] on
  config.batch_size_boundaries = ()  # epochs where the batch size changes (len(batch_sizes) - 1)
  config.max_device_batch = 0  # >0: accumulate micro-batches when a device's share exceeds this
  config.eval_batch_size = 1000

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "momentum"
  config.optimizer.momentum = 0.9
  config.optimizer.nesterov = False
  config.optimizer.weight_decay = 0.0
  # > 0: the loss gradient is rescaled to this global L2 norm when larger, before weight decay and the
  # optimizer (optax.clip_by_global_norm; Zaremba et al.'s PTB LSTMs clip at 5 on the loss summed over time).
  config.optimizer.clip_global_norm = 0.0
  config.optimizer.trust_coefficient = 0.001  # LARS eta
  config.optimizer.eps = 0.0
  config.optimizer.b1 = 0.9  # Adam/LAMB
  config.optimizer.b2 = 0.999
  config.optimizer.adam_eps = 1e-8

  config.lr = ml_collections.ConfigDict()
  config.lr.base = 0.1  # peak LR of the baseline recipe
  config.lr.warmup = "none"
  config.lr.warmup_epochs = 0.0
  config.lr.decay = "constant"
  config.lr.power = 2.0  # poly
  config.lr.end_value = 0.0  # poly/cosine
  config.lr.boundaries = ()  # multistep: epochs
  config.lr.factor = 0.1  # multistep: LR multiplied by this at each boundary
  config.lr.decay_start_epoch = 0.0  # exponential: LR constant until this epoch ...
  config.lr.decay_rate = 0.5  # ... then multiplied by this per epoch

  config.scaling = ml_collections.ConfigDict()
  config.scaling.rule = "none"
  config.scaling.base_batch_size = 128

  # papers/003 §3.1: drop the smallest-loss fraction of each batch for the first epochs.
  config.loss = ml_collections.ConfigDict()
  config.loss.discard_fraction = 0.0
  config.loss.discard_until_epoch = 0.0

  # papers/004: compress each device's gradient before the data-parallel reduction (shard_map step).
  config.compression = ml_collections.ConfigDict()
  config.compression.name = "none"  # none | one_bit | qsgd
  config.compression.levels = 4  # QSGD s
  config.compression.error_feedback = True  # 1-bit SGD

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

  config.log_every = 50
  config.eval_every_epochs = 1.0
  config.checkpoint_every_steps = 1000  # also saved after every evaluation and at the end
  config.keep_checkpoints = 3
  config.tensorboard = False
  config.progress = True
  return config


def _check_choice(field: str, value: str, choices: tuple[str, ...]) -> list[str]:
  if value not in choices:
    return [f"config.{field}={value!r} is not known; choose one of {', '.join(choices)}."]
  return []


def parse_variant(arg: str | None) -> dict[str, str]:
  """Parses a config variant string such as `"batch=8192,rule=legw"` into `{"batch": "8192", ...}`.

  Each `configs/*.py` interprets its own keys; an empty or None `arg` is the baseline.
  """
  if not arg:
    return {}
  variant = {}
  for item in arg.split(","):
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ValueError(f"Config variant {arg!r}: expected comma-separated key=value pairs such as "
                       f"'batch=8192,rule=legw', got {item!r}.")
    variant[key.strip()] = value.strip()
  return variant


def check_variant_keys(variant: dict[str, str], known: tuple[str, ...], config_name: str) -> None:
  """Raises if a variant string uses keys the config does not understand."""
  unknown = sorted(set(variant) - set(known))
  if unknown:
    raise ValueError(f"{config_name}: unknown variant key(s) {unknown}; this config understands "
                     f"{', '.join(known)}.")


def batch_sizes(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The distinct global batch sizes the run uses, in order."""
  return tuple(config.batch_sizes) if config.batch_sizes else (config.batch_size,)


def validate(config: ml_collections.ConfigDict, *, data_parallel_size: int) -> None:
  """Checks the config before any compute; raises ValueError listing every problem found.

  Args:
    config: the run config.
    data_parallel_size: number of batch shards of the mesh (devices of the `data` x `fsdp` axes).
  """
  errors = []
  errors += _check_choice("model", config.model, MODELS)
  errors += _check_choice("dataset", config.dataset, DATASETS)
  errors += _check_choice("optimizer.name", config.optimizer.name, OPTIMIZERS)
  errors += _check_choice("lr.warmup", config.lr.warmup, WARMUPS)
  errors += _check_choice("lr.decay", config.lr.decay, DECAYS)
  errors += _check_choice("scaling.rule", config.scaling.rule, SCALING_RULES)
  errors += _check_choice("compression.name", config.compression.name, COMPRESSIONS)
  clip = config.optimizer.clip_global_norm
  if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip >= 0:
    errors.append(f"config.optimizer.clip_global_norm must be a number >= 0 (0 turns clipping off), got {clip!r}.")
  if config.compression.name != "none" or config.mesh.per_device_gradients:
    what = (f"config.compression.name={config.compression.name!r}" if config.compression.name != "none"
            else "config.mesh.per_device_gradients=True")
    if config.mesh.fsdp != 1:
      errors.append(f"{what} reduces whole per-device gradients and needs replicated parameters: set "
                    f"config.mesh.fsdp=1 (got {config.mesh.fsdp}).")
    if config.compression.name == "qsgd" and (not isinstance(config.compression.levels, int)
                                               or config.compression.levels < 1):
      errors.append(f"config.compression.levels (QSGD s) must be an integer >= 1, got {config.compression.levels!r}.")
  errors += _check_choice("data_options.mnist_format", config.data_options.mnist_format, ("idx", "tfds"))
  errors += _check_choice("data_options.eval_split", config.data_options.eval_split, ("valid", "test"))
  language_model = config.model == "ptb_lstm"
  if (config.dataset in LANGUAGE_MODEL_DATASETS) != language_model and config.model in MODELS \
      and config.dataset in DATASETS:
    errors.append(f"config.model={config.model!r} cannot train on config.dataset={config.dataset!r}: "
                  "ptb_lstm goes with ptb/synthetic_ptb, the other models with image datasets.")
  if config.num_steps < 0:
    errors.append(f"config.num_steps must be >= 0 (0 = stop by epochs only), got {config.num_steps}.")
  if not config.num_epochs > 0:
    errors.append(f"config.num_epochs must be > 0, got {config.num_epochs}.")
  sizes = batch_sizes(config)
  if config.batch_sizes and len(config.batch_sizes) != len(config.batch_size_boundaries) + 1:
    errors.append(f"config.batch_sizes has {len(config.batch_sizes)} sizes but "
                  f"config.batch_size_boundaries has {len(config.batch_size_boundaries)} epochs; "
                  "give one more size than boundaries.")
  for size in sizes:
    if not isinstance(size, int) or size <= 0:
      errors.append(f"batch size {size!r} must be a positive integer.")
    elif size % data_parallel_size:
      errors.append(f"global batch size {size} is not divisible by the data-parallel size "
                    f"{data_parallel_size} (devices on the data x fsdp mesh axes); use a multiple of "
                    f"{data_parallel_size} or change config.mesh.")
    elif config.max_device_batch > 0:
      share = size // data_parallel_size
      if share > config.max_device_batch and share % config.max_device_batch:
        errors.append(f"gradient accumulation cannot split a device share of {share} examples (global "
                      f"batch {size} over {data_parallel_size} devices) into micro-batches of "
                      f"config.max_device_batch={config.max_device_batch}; choose a divisor of {share}.")
  if config.max_device_batch < 0:
    errors.append(f"config.max_device_batch must be >= 0 (0 = no accumulation), got {config.max_device_batch}.")
  if config.lr.warmup != "none" and config.lr.warmup_epochs > config.num_epochs:
    errors.append(f"config.lr.warmup_epochs={config.lr.warmup_epochs} is longer than training "
                  f"(config.num_epochs={config.num_epochs}); shorten the warm-up or train longer. "
                  "(With scaling.rule='legw' the warm-up grows with the batch size: this is checked "
                  "again after scaling.)")
  if not 0.0 <= config.loss.discard_fraction < 1.0:
    errors.append(f"config.loss.discard_fraction must be in [0, 1), got {config.loss.discard_fraction}.")
  if config.loss.discard_fraction > 0 and language_model:
    errors.append("config.loss.discard_fraction applies to classification; the PTB language model has no "
                  "per-example loss to rank. Set it to 0.")
  if config.diagnostics.lipschitz_every < 0:
    errors.append(f"config.diagnostics.lipschitz_every must be >= 0 (0 = off), got "
                  f"{config.diagnostics.lipschitz_every}.")
  if config.diagnostics.lipschitz_every and (config.diagnostics.lipschitz_batch_size <= 0 or
                                             config.diagnostics.lipschitz_batch_size % data_parallel_size):
    errors.append(f"config.diagnostics.lipschitz_batch_size={config.diagnostics.lipschitz_batch_size} must "
                  f"be a positive multiple of the data-parallel size {data_parallel_size}.")
  if not config.lr.base > 0:
    errors.append(f"config.lr.base must be > 0, got {config.lr.base}.")
  if config.log_every < 1:
    errors.append(f"config.log_every must be >= 1, got {config.log_every}.")
  if config.checkpoint_every_steps < 0:
    errors.append(f"config.checkpoint_every_steps must be >= 0 (0 = only at the end), got "
                  f"{config.checkpoint_every_steps}.")
  if config.eval_batch_size <= 0 or config.eval_batch_size % data_parallel_size:
    errors.append(f"config.eval_batch_size={config.eval_batch_size} must be a positive multiple of the "
                  f"data-parallel size {data_parallel_size}.")
  if errors:
    raise ValueError("Invalid config:\n  - " + "\n  - ".join(errors))


def _with_defaults(values: dict, defaults: dict) -> dict:
  """`values` with every field it lacks taken from `defaults` (recursively)."""
  merged = dict(defaults)
  for key, value in values.items():
    merged[key] = _with_defaults(value, defaults[key]) if isinstance(value, dict) and isinstance(
        defaults.get(key), dict) else value
  return merged


def check_resumable(saved_json: str, config: ml_collections.ConfigDict, workdir: str) -> None:
  """Raises if the workdir's checkpoint was written by a run with a different recipe.

  Operational fields (`OPERATIONAL_FIELDS`) may change between runs; everything else must match. A
  field the checkpoint's config lacks (written before lbjax added it) counts as its default value.
  """
  defaults = json.loads(default_config().to_json())
  saved = _with_defaults(json.loads(saved_json), defaults)
  current = _with_defaults(json.loads(config.to_json()), defaults)
  differing = sorted(k for k in set(saved) | set(current)
                     if k not in OPERATIONAL_FIELDS and saved.get(k) != current.get(k))
  if differing:
    details = "; ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in differing)
    raise ValueError(f"The workdir {workdir} holds a checkpoint of a different run ({details}). Use a new "
                     "--workdir, or restore the original config to resume.")
