"""The five runs of the adaptive-batch experiment (issue 14), shared by adaptive_batch_mnist and _ptb.

One baseline config (batch B0, LR recipe with its warm-up in `config.lr.warmup_epochs`, micro-batch m),
five batch policies on the any-batch step (`lbjax.train.any_batch`):

  baseline:   B = B0 throughout
  legw:       B = `large_batch` throughout, LEGW (LR x sqrt(k), warm-up x k; papers/001 §3)
  grow_batch: B grows as the given schedule (papers/002: each LR decay becomes a batch increase), the
              LR held at the recipe's peak (its decay replaced by the growth)
  adaptive:   B = `noise_multiple` x B_noise in [B0, `batch.max_batch_size`], never shrinking, LR by
              LEGW at the batch in force (lbjax.train.batch_policy)
  adascale:   the same batch policy, LR = AdaScale gain x the recipe's LR at the scale-invariant epoch
"""

from lbjax import schedules
from lbjax.configs import Variant

RUNS = ("baseline", "legw", "grow_batch", "adaptive", "adascale")
ADAPTIVE_RUNS = ("adaptive", "adascale")


def variants(base_batch_size: int, large_batch_size: int) -> dict[str, Variant]:
  """The variant keys of an adaptive-batch config whose baseline batch is `base_batch_size`."""
  return {
      "run": Variant("which batch policy: " + ", ".join(RUNS), default="adaptive", choices=RUNS),
      "epochs": Variant("number of epochs", field="num_epochs"),
      "seed": Variant("initialisation and shuffling seed", field="seed"),
      "micro": Variant("micro-batch of the any-batch step", field="batch.micro_batch_size"),
      "large_batch": Variant("legw's fixed batch", type=int, default=large_batch_size,
                             only_with=("run", ("legw",))),
      "max_batch": Variant("adaptive/adascale's largest batch", field="batch.max_batch_size"),
      "multiple": Variant("adaptive: next batch = multiple x B_noise", field="batch.noise_multiple"),
      "warmup": Variant(f"LEGW's warm-up of the B={base_batch_size} baseline in epochs", field="lr.warmup_epochs"),
  }


def set_run(config, run: str, large_batch_size: int, grow: schedules.BatchSizeSchedule) -> None:
  """Sets the batch policy and LR recipe of `run` on the baseline `config`.

  The baseline's warm-up (`config.lr.warmup_epochs`) applies only where LEGW scales it (legw,
  adaptive); grow_batch trains at the constant peak LR on `grow`'s batches; the adaptive runs keep
  `config.batch.max_batch_size`, the others clear it and the noise multiple.
  """
  warmup = config.lr.warmup_epochs
  config.lr.warmup_epochs = 0.0
  if run in ("legw", "adaptive"):
    config.scaling.rule = "legw"
    config.lr.warmup, config.lr.warmup_epochs = "linear_warmup", warmup
  if run == "legw":
    config.batch.policy = "fixed"
    config.batch_size = large_batch_size
  elif run == "grow_batch":
    config.batch_sizes, config.batch_size_boundaries = grow.sizes, grow.boundaries
    config.lr = {name: config.lr[name] for name in ("base", "warmup", "warmup_epochs")} | {"decay": "constant"}
  elif run in ADAPTIVE_RUNS:
    config.batch.policy = "adaptive"
    if run == "adascale":
      config.batch.learning_rate = "adascale"
  else:
    config.batch.policy = "fixed"
  if run not in ADAPTIVE_RUNS:
    config.batch.max_batch_size = 0
    config.batch.noise_multiple = 1.0
