"""Datasets and input pipelines: resumable sharded streams, MNIST, PTB, CIFAR-10, ImageNet, synthetic twins.

  stream          deterministic, resumable, process-sharded streams; undecodable records
  workers         the same batches computed on grain worker processes
  tfds_source     TFDS datasets read without TensorFlow, and how to prepare them
  crops           crop geometry (one `Box`) of the ImageNet transforms, for every decoder
  jpeg            JPEG decoding at the DCT scale a crop needs, and the resampler
  libturbojpeg    decoding only a crop's region (libjpeg-turbo's TurboJPEG 3 API, ctypes)
  normalization   uint8 images to the model's float32 inputs, applied by the training step on the device
  imagenet, cifar the two image datasets' transforms and streams
  mnist, ptb      MNIST idx files / TFDS, Penn Treebank text
  synthetic, synthetic_jpeg   data shaped like the real sets, for tests and benchmarks

`lbjax.data` depends only on numpy (TFDS and grain are imported lazily by the functions that
read TFDS, as they are the optional `[tfds]` extra; simplejpeg and OpenCV by the ImageNet
transforms, the `[imagenet]` extra). It imports neither `lbjax.models` nor
`lbjax.train`.
"""

from lbjax.data.cifar import CIFAR10_NORMALIZATION
from lbjax.data.cifar import cifar10_eval_batches
from lbjax.data.cifar import cifar10_train_stream
from lbjax.data.cifar import pad_crop_flip
from lbjax.data.data_dir import DATA_DIR_ENV
from lbjax.data.data_dir import default_data_dir
from lbjax.data.crops import Box
from lbjax.data.crops import sample_crop_box
from lbjax.data.imagenet import center_crop_eval
from lbjax.data.imagenet import IMAGENET_NORMALIZATION
from lbjax.data.crops import check_image_size
from lbjax.data.imagenet import imagenet_eval_batches
from lbjax.data.imagenet import imagenet_train_stream
from lbjax.data.imagenet import random_resized_crop
from lbjax.data.mnist import load_mnist_idx
from lbjax.data.mnist import MNIST_NORMALIZATION
from lbjax.data.mnist import load_mnist_tfds
from lbjax.data.normalization import Normalization
from lbjax.data.normalization import PixelScale
from lbjax.data.ptb import PtbCorpus
from lbjax.data.ptb import PtbStream
from lbjax.data.ptb import check_carry_state
from lbjax.data.ptb import check_seq_len
from lbjax.data.ptb import check_stream_window
from lbjax.data.ptb import ptb_eval_batches
from lbjax.data.ptb import ptb_stream_eval_batches
from lbjax.data.sharding import process_slice
from lbjax.data.stream import ArraySource
from lbjax.data.stream import check_skip_undecodable
from lbjax.data.stream import Batch
from lbjax.data.stream import epoch_permutation
from lbjax.data.stream import eval_batches
from lbjax.data.stream import example_rngs
from lbjax.data.stream import INDEX
from lbjax.data.stream import IndexSource
from lbjax.data.stream import RandomAccessSource
from lbjax.data.stream import TrainStream
from lbjax.data.stream import Transform
from lbjax.data.stream import UndecodableRecordError
from lbjax.data.synthetic import synthetic_images
from lbjax.data.synthetic import synthetic_mnist
from lbjax.data.synthetic import synthetic_ptb_tokens
from lbjax.data.tfds_source import prepared_builder
from lbjax.data.workers import check_num_workers
from lbjax.data.tfds_source import TfdsSource
from lbjax.data.workers import WorkerTrainStream
