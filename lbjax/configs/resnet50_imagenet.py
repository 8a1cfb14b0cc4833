"""ResNet-50 on ImageNet with LARS: papers/001 Table 1 (LEGW) and papers/000 Table 4.

Two recipes, both LARS (papers/000 Algorithm 1: trust coefficient eta=0.001, momentum 0.9, weight
decay 0.0005 as in papers/000 §5 for ResNet-50; 1-D parameters get neither decay nor trust ratio)
with polynomial (power 2) decay after a linear warm-up:

* `recipe=legw` (default), papers/001 Table 1: the B=1K row (LR 2^2.5, warm-up 0.3125 epochs, 90
  epochs) scaled by LEGW to `batch` in 1K..32K: LR x sqrt(k), warm-up x k (32K: LR 2^5, 10 epochs).
  The paper reports top-5 accuracy 0.9318..0.9355 (>= 93%) at every batch size.
* `recipe=table4`, papers/000 Table 4 (100 epochs, extended augmentation column):
  B=256 LR 4 no warm-up (75.8% top-1), 1K LR 9 / 5 epochs (75.4), 8K LR 30 / 5 (75.2),
  16K LR 33 / 12 (74.4), 32K LR 40 / 12 (72.5).

BatchNorm statistics are taken over groups of 32 examples (ghost BN, the per-GPU batch of Goyal et
al.), so results do not depend on the device count; compute is bfloat16 and each device computes at
most `max_device_batch`=128 examples at once (larger shares are accumulated, papers/000's iter_size).
Needs ImageNet prepared for TFDS (`imagenet2012`, see lbjax.data) and a GPU/TPU:

  lbjax-train --config resnet50_imagenet:batch=32768 --workdir runs/rn50_legw_32k
  lbjax-train --config resnet50_imagenet:recipe=table4,batch=8192 --workdir runs/rn50_t4_8k

`smoke=true` runs the same recipe machinery in seconds on CPU: ResNetTiny on synthetic 32x32 images, a
few steps (`lbjax-train --config resnet50_imagenet:smoke=1 --workdir /tmp/smoke`).
"""

from lbjax.configs import Variant
from lbjax.train import default_config
from lbjax.train.errors import ConfigError

LEGW_BASE_BATCH = 1024
LEGW_BASE_LEARNING_RATE = 2**2.5
LEGW_BASE_WARMUP_EPOCHS = 0.3125
LEGW_EPOCHS = 90
# papers/000 Table 4: batch -> (LR gamma, warm-up epochs); 100 epochs.
TABLE4 = {256: (4.0, 0.0), 1024: (9.0, 5.0), 8192: (30.0, 5.0), 16384: (33.0, 12.0), 32768: (40.0, 12.0)}
TABLE4_EPOCHS = 100

VARIANTS = {
    "batch": Variant("global batch size (legw: any power of two 1024..32768 is a row of Table 1; "
                     "table4: 256, 1024, 8192, 16384 or 32768)", field="batch_size"),
    "seed": Variant("initialisation and shuffling seed", field="seed"),
    "recipe": Variant("papers/001 Table 1 (legw) or papers/000 Table 4 (table4)", default="legw",
                      choices=("legw", "table4")),
    "smoke": Variant("the recipe on ResNetTiny and synthetic 32x32 images, a few steps on CPU", type=bool,
                     default=False),
}


def get_config():
  """The legw recipe at B=1K (the table4 recipe and the smoke run are presets: see finalize)."""
  config = default_config()
  config.model = "ResNet50"
  config.model_options.bn_group_size = 32
  config.model_options.dtype = "bfloat16"
  config.dataset = "imagenet"
  config.data_options.image_size = 224
  # A multiple of every power-of-two device count up to a full v3 pod's 2,048 cores (the eval batch is split
  # over the data-parallel devices); the 50,000 validation images are 25 batches, the last one padded.
  config.eval_batch_size = 2048
  config.max_device_batch = 128
  config.optimizer = {"name": "lars", "momentum": 0.9, "weight_decay": 0.0005, "trust_coefficient": 0.001}
  config.lr.warmup = "linear_warmup"
  config.lr.decay = "polynomial_decay"
  config.lr.power = 2.0
  config.lr.end_value = 0.0
  config.batch_size = LEGW_BASE_BATCH
  config.num_epochs = float(LEGW_EPOCHS)
  config.scaling.rule = "legw"
  config.scaling.base_batch_size = LEGW_BASE_BATCH
  config.lr.base = LEGW_BASE_LEARNING_RATE
  config.lr.warmup_epochs = LEGW_BASE_WARMUP_EPOCHS
  config.log_every = 100
  config.eval_every_epochs = 1.0
  config.checkpoint_every_steps = 1000
  return config


def finalize(config, presets):
  if presets["recipe"] == "table4":
    if config.batch_size not in TABLE4:
      raise ConfigError(f"resnet50_imagenet: recipe=table4 has rows for batch sizes {sorted(TABLE4)}, "
                       f"not {config.batch_size}.")
    config.num_epochs = float(TABLE4_EPOCHS)
    config.scaling.rule = "none"
    config.scaling.base_batch_size = config.batch_size
    config.lr.base, config.lr.warmup_epochs = TABLE4[config.batch_size]
    if config.lr.warmup_epochs == 0:
      config.lr.warmup = "none"
  if presets["smoke"]:
    _shrink_to_smoke(config)


def _shrink_to_smoke(config) -> None:
  """The recipe on ResNetTiny, 32x32 synthetic images, batch 32 (legw: scaled from 16), 8 steps."""
  config.model = "ResNetTiny"
  config.model_options.bn_group_size = 8
  config.model_options.dtype = "float32"
  config.dataset = "synthetic_images"
  config.data_options = {"image_size": 32, "num_train_examples": 128, "num_eval_examples": 64}
  config.eval_batch_size = 64
  config.max_device_batch = 0
  config.batch_size = 32
  config.num_epochs = 2.0
  if config.scaling.rule == "legw":
    config.scaling.base_batch_size = 16  # k = 2: LR 2^3, warm-up 0.625 epochs
  elif config.lr.warmup_epochs:
    config.lr.warmup_epochs = 0.5
  config.log_every = 2
  config.eval_every_epochs = 1.0
  config.checkpoint_every_steps = 0
