"""lbjax models (Flax NNX): ResNet, the MNIST and PTB LSTMs of papers/001, losses and metrics.

Every model keeps its weights in `nnx.Param` and (ResNet only) its BatchNorm running averages in
`nnx.BatchStat`, and nothing else, so the trainer can `nnx.split(model, nnx.Param, ...)` and
`nnx.merge` inside a jitted step. Dropout keys and LSTM carries are explicit call arguments.
"""

from lbjax import dependencies

dependencies.check_flax_works_with_jax()  # before anything below imports flax

from lbjax.models.batch_norm import GhostBatchNorm
from lbjax.models.losses import accuracy
from lbjax.models.losses import per_example_cross_entropy
from lbjax.models.losses import perplexity
from lbjax.models.losses import softmax_cross_entropy
from lbjax.models.lstm_cell import LSTMCarry
from lbjax.models.lstm_cell import LSTMCell
from lbjax.models.lstm_cell import lstm_step
from lbjax.models.mnist_lstm import MnistLSTM
from lbjax.models.ptb_lstm import PtbCarry
from lbjax.models.ptb_lstm import PtbLSTM
from lbjax.models.resnet import BasicBlock
from lbjax.models.resnet import BottleneckBlock
from lbjax.models.resnet import ResNet
from lbjax.models.resnet import ResNet18
from lbjax.models.resnet import ResNet50
from lbjax.models.resnet import ResNetTiny

__all__ = [
    "BasicBlock",
    "BottleneckBlock",
    "GhostBatchNorm",
    "LSTMCarry",
    "LSTMCell",
    "MnistLSTM",
    "PtbCarry",
    "PtbLSTM",
    "ResNet",
    "ResNet18",
    "ResNet50",
    "ResNetTiny",
    "accuracy",
    "lstm_step",
    "per_example_cross_entropy",
    "perplexity",
    "softmax_cross_entropy",
]
