"""PTB LSTM of papers/001 §5.1.2: 2 layers of 200, 20-step windows, 13 epochs, perplexity.

Two baseline recipes at B=20 (`recipe=`), scaled to larger batches by `rule=`:

  paper:   as papers/001 states it: momentum 0.9, LR constant for 7 epochs, then halved after each
           epoch (epochs 7..12). The paper gives no LR; 1.0 is Zaremba et al.'s, inside the 0.1..1.6
           range papers/001 §5.3 calls effective. No clipping. (The default; what docs/results ran.)
  zaremba: the recipe behind the paper's 115.91, which is the test perplexity of TensorFlow's
           ptb_word_lm "small" config (Zaremba et al. 2014): plain SGD, LR 1.0 on the loss summed over
           the 20 time steps, gradients clipped to global norm 5, LR halved after each epoch from
           epoch 4. lbjax's loss is the per-token mean (1/20 of that sum), so the same updates are
           LR 20 and clip 0.25 here. Its uniform(-0.1, 0.1) initialisation is `init_scale=0.1`
           (not part of the recipe, so that its recorded runs stay reproducible: lbjax's default is
           Glorot-uniform LSTM kernels, limit 0.071).

Evaluation is on the test split (`eval_split=valid` for validation, to choose hyper-parameters).
`rule=legw` gives the baseline a linear warm-up of `BASE_WARMUP_EPOCHS` when it has none.

  lbjax-train --config ptb_lstm --workdir runs/ptb_b20
  lbjax-train --config ptb_lstm:batch=640,rule=legw --workdir runs/ptb_b640_legw
  lbjax-train --config ptb_lstm:recipe=zaremba --workdir runs/ptb_b20_zaremba
"""

from lbjax.configs import Variant
from lbjax.configs._warmup import complete_baseline_warmup
from lbjax.train import default_config

BASE_BATCH_SIZE = 20
# LEGW warm-up of the baseline: 1/32 epoch at B=20 (~73 steps), i.e. one epoch at B=640. papers/001
# gives no PTB warm-up; this is the MNIST choice (73 baseline steps) carried over.
BASE_WARMUP_EPOCHS = 0.03125
DECAY_RATE = 0.5
# Adam, the adaptive baseline of papers/001 §5.2 ("does not require the users to input hyper-parameters"):
# its default LR with the recipe's decay and clipping.
ADAM_LEARNING_RATE = 0.001
SEQ_LEN = 20
# name: (optimizer section, learning rate, clip of the per-token mean loss's gradient, decay start epoch)
RECIPES = {
    "paper": ({"name": "momentum", "momentum": 0.9}, 1.0, 0.0, 7.0),
    "zaremba": ({"name": "sgd"}, 1.0 * SEQ_LEN, 5.0 / SEQ_LEN, 4.0),
}

VARIANTS = {
    "batch": Variant("global batch size", field="batch_size"),
    "rule": Variant("how the B=20 recipe is scaled to `batch`: none, linear, sqrt, goyal, legw",
                    field="scaling.rule"),
    "lr": Variant("baseline learning rate at B=20 (default: the recipe's)", field="lr.base"),
    "epochs": Variant("number of epochs; the decay still starts at the recipe's epoch", field="num_epochs"),
    "warmup": Variant("warm-up of the B=20 baseline in epochs (LEGW scales it by k)", field="lr.warmup_epochs"),
    "clip": Variant("global-norm clip of the per-token loss gradient (default: the recipe's; 0 = off)",
                    field="clip_global_norm"),
    "seed": Variant("initialisation seed", field="seed"),
    "init_scale": Variant("uniform(-s, s) initialisation of every weight, as ptb_word_lm (0.1); 0: lbjax's",
                          field="model_options.init_scale"),
    "eval_split": Variant("test, or valid", field="data_options.eval_split"),
    "carry_state": Variant("False: every 20-token window starts from a zero LSTM state (default: carried)",
                           field="data_options.carry_state"),
    "recipe": Variant("the B=20 baseline", default="paper", choices=tuple(RECIPES)),
    "optimizer": Variant("the recipe's optimizer, or adam (papers/001 §5.2's adaptive baseline, LR 0.001)",
                         default="recipe", choices=("recipe", "adam")),
}


def get_config():
  config = default_config()
  config.model = "PtbLSTM"
  config.model_options.embed_size = 200
  config.model_options.hidden_size = 200
  config.model_options.num_layers = 2
  config.dataset = "ptb"
  config.data_options.seq_len = SEQ_LEN
  config.data_options.eval_split = "test"
  config.num_epochs = 13.0
  config.batch_size = BASE_BATCH_SIZE
  config.eval_batch_size = 20
  config.scaling.base_batch_size = BASE_BATCH_SIZE
  config.lr.decay = "exponential_decay"
  config.lr.decay_factor = DECAY_RATE
  config.log_every = 100
  config.checkpoint_every_steps = 2000
  _apply_recipe(config, "paper")
  return config


def _apply_recipe(config, recipe: str) -> None:
  optimizer, learning_rate, clip, decay_start = RECIPES[recipe]
  config.optimizer = dict(optimizer)
  config.lr.base = learning_rate
  config.clip_global_norm = clip
  config.lr.decay_begin_epoch = decay_start


def finalize(config, presets):
  _apply_recipe(config, presets["recipe"])
  if presets["optimizer"] == "adam":
    config.optimizer = {"name": "adam"}
    config.lr.base = ADAM_LEARNING_RATE
  complete_baseline_warmup(config, BASE_WARMUP_EPOCHS)
