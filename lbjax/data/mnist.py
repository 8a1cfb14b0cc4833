"""MNIST (LeCun et al.) from the original idx files or from TFDS, as an in-memory `ArraySource`.

Both loaders give the same format: `images` uint8 [N, 28, 28], the files' pixels (0-255), and
`labels` int32 [N] in 0..9, with N = 60,000 (train) and 10,000 (test), in the files' order. The
model reads `MNIST_NORMALIZATION(images)`, float32 pixel / 255 in [0, 1], computed by the training
step on the device (a quarter of the bytes to place per batch; the values the host division gives,
bit for bit). The LSTM of `papers/001` section 5.1.1 reads each image as 28 steps of 28 pixels.
"""

import gzip
import hashlib
import os
import pathlib
import zlib

import numpy as np

from lbjax.data.data_dir import how_to_set
from lbjax.data.data_dir import default_data_dir
from lbjax.data.data_dir import origin as data_dir_origin
from lbjax.data.normalization import PixelScale
from lbjax.data.stream import ArraySource

MNIST_SPLITS = ("train", "test")
IMAGE_SIZE = 28
NUM_CLASSES = 10
MNIST_NORMALIZATION = PixelScale(255.0)  # pixel / 255: what the model reads

_IMAGES_MAGIC = 0x00000803
_LABELS_MAGIC = 0x00000801

_FILE_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# sha256 of the published files (gzipped and decompressed), as listed in shared/data/README.md and
# in tensorflow_datasets/url_checksums/mnist.txt.
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz":
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz":
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz":
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz":
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "train-images-idx3-ubyte":
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte":
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte":
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte":
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}

_WHERE_TO_GET = (
    "Get LeCun's idx files from http://yann.lecun.com/exdb/mnist/ or a mirror "
    "(https://storage.googleapis.com/cvdf-datasets/mnist/, "
    "https://ossci-datasets.s3.amazonaws.com/mnist/), gzipped or not, or use "
    "lbjax.data.load_mnist_tfds (tfds.data_source('mnist')).")


def _check_split(split: str) -> None:
  if split not in MNIST_SPLITS:
    raise ValueError(f"MNIST split must be one of {MNIST_SPLITS}, got {split!r}.")


# The shared data folder's layout (lbjax.data.data_dir); the files directly in the data folder are read too.
_LAYOUT = ("MNIST is read from <data folder>/mnist/: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
           "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (gzipped or not)")


def _find_file(folders: list[pathlib.Path], name: str, data_dir) -> pathlib.Path:
  for folder in folders:
    for candidate in (folder / f"{name}.gz", folder / name):
      if candidate.is_file():
        return candidate
  tried = ", ".join(str(folder / f"{name}[.gz]") for folder in folders)
  raise FileNotFoundError(f"MNIST file {name}[.gz] not found in the data folder {folders[-1]} "
                          f"({data_dir_origin(data_dir)}); looked for {tried}. {_LAYOUT}. {how_to_set('mnist/')}. "
                          f"{_WHERE_TO_GET}")


def _read_bytes(path: pathlib.Path, verify: bool) -> bytes:
  raw = path.read_bytes()
  if verify:
    expected = MNIST_SHA256.get(path.name)
    if expected is None:
      raise ValueError(f"No known sha256 for {path}; verify=True needs LeCun's file names "
                       f"({sorted(MNIST_SHA256)}).")
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected:
      raise ValueError(
          f"MNIST file {path} is corrupt: sha256 {actual}, expected {expected}. Replace it. "
          f"{_WHERE_TO_GET}")
  if path.suffix == ".gz":
    try:
      return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as error:
      raise ValueError(
          f"MNIST file {path} is not a valid gzip file ({error}). Replace it. "
          f"{_WHERE_TO_GET}") from error
  return raw


def _header(data: bytes, path: pathlib.Path, num_fields: int) -> list[int]:
  size = 4 * num_fields
  if len(data) < size:
    raise ValueError(
        f"MNIST file {path} is corrupt: {len(data)} bytes, shorter than its {size}-byte idx "
        f"header. {_WHERE_TO_GET}")
  return [int.from_bytes(data[4 * i:4 * i + 4], "big") for i in range(num_fields)]


def _parse_images(data: bytes, path: pathlib.Path) -> np.ndarray:
  magic, count, rows, cols = _header(data, path, 4)
  if magic != _IMAGES_MAGIC:
    raise ValueError(
        f"MNIST file {path} is not an idx3 image file: magic number {magic:#x}, expected "
        f"{_IMAGES_MAGIC:#x}. {_WHERE_TO_GET}")
  if (rows, cols) != (IMAGE_SIZE, IMAGE_SIZE):
    raise ValueError(
        f"MNIST file {path} has {rows}x{cols} images, expected {IMAGE_SIZE}x{IMAGE_SIZE}.")
  expected_size = 16 + count * rows * cols
  if len(data) != expected_size:
    raise ValueError(
        f"MNIST file {path} is corrupt: {len(data)} bytes, expected {expected_size} for "
        f"{count} images of {rows}x{cols}. {_WHERE_TO_GET}")
  return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(count, rows, cols).copy()


def _parse_labels(data: bytes, path: pathlib.Path) -> np.ndarray:
  magic, count = _header(data, path, 2)
  if magic != _LABELS_MAGIC:
    raise ValueError(
        f"MNIST file {path} is not an idx1 label file: magic number {magic:#x}, expected "
        f"{_LABELS_MAGIC:#x}. {_WHERE_TO_GET}")
  if len(data) != 8 + count:
    raise ValueError(
        f"MNIST file {path} is corrupt: {len(data)} bytes, expected {8 + count} for {count} "
        f"labels. {_WHERE_TO_GET}")
  labels = np.frombuffer(data, dtype=np.uint8, offset=8)
  if labels.size and labels.max() >= NUM_CLASSES:
    raise ValueError(
        f"MNIST file {path} is corrupt: label {labels.max()} outside 0..{NUM_CLASSES - 1}.")
  return labels.astype(np.int32)


def load_mnist_idx(data_dir: str | os.PathLike[str] | None, split: str, *,
                   verify: bool = False) -> ArraySource:
  """Loads an MNIST split from LeCun's idx files.

  Args:
    data_dir: folder holding `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`, or a folder
      with an `mnist/` subfolder holding them (like the shared data folder); None means
      `default_data_dir()`.
    split: 'train' (60,000 examples) or 'test' (10,000, the t10k files).
    verify: also check each file's sha256 against the published sums (`MNIST_SHA256`).

  Returns:
    `ArraySource(images=uint8 [N, 28, 28], labels=int32 [N])`; `MNIST_NORMALIZATION(images)` is the
    float32 [0, 1] input of the model.

  Raises:
    FileNotFoundError: a file is missing (the message says where to get it).
    ValueError: a file is corrupt (bad gzip, magic number, size, checksum, or the image and label
      counts differ).
  """
  _check_split(split)
  root = default_data_dir() if data_dir is None else pathlib.Path(data_dir)
  if not root.is_dir():
    raise FileNotFoundError(f"MNIST data_dir {root} ({data_dir_origin(data_dir)}) is not a directory. {_LAYOUT}. "
                            f"{how_to_set('mnist/')}. {_WHERE_TO_GET}")
  folders = [root / "mnist", root] if (root / "mnist").is_dir() else [root]
  images_name, labels_name = _FILE_NAMES[split]
  images_path = _find_file(folders, images_name, data_dir)
  labels_path = _find_file(folders, labels_name, data_dir)
  images = _parse_images(_read_bytes(images_path, verify), images_path)
  labels = _parse_labels(_read_bytes(labels_path, verify), labels_path)
  if len(images) != len(labels):
    raise ValueError(
        f"MNIST files disagree: {images_path} has {len(images)} images but {labels_path} has "
        f"{len(labels)} labels. {_WHERE_TO_GET}")
  return ArraySource(images=images, labels=labels)


def load_mnist_tfds(split: str, data_dir: str | os.PathLike[str] | None = None, *,
                    download: bool = False) -> ArraySource:
  """Loads an MNIST split from a TFDS `mnist` dataset in the format of the idx loader.

  Reads `tfds.data_source('mnist', split=split, data_dir=data_dir, download=download)` (random access,
  no TensorFlow needed).

  Args:
    split: a TFDS split of mnist: 'train', 'test', or a slice such as 'train[:1000]'.
    data_dir: TFDS data folder; None means TFDS's default (`$TFDS_DATA_DIR` or
      `~/tensorflow_datasets`).
    download: if True and the dataset is not prepared, TFDS downloads and prepares it first (needs
      network access, e.g. in Colab); if False (the default) nothing is downloaded.

  Returns:
    `ArraySource(images=uint8 [N, 28, 28], labels=int32 [N])`, as `load_mnist_idx`.

  Raises:
    ImportError: tensorflow-datasets is not installed (`pip install 'lbjax[tfds]'`).
    FileNotFoundError: the dataset is not prepared in array_record format in `data_dir`.
  """
  if not isinstance(split, str) or not split:
    raise ValueError(f"split must be a TFDS split string such as 'train', got {split!r}.")
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError(
        "load_mnist_tfds needs tensorflow-datasets: pip install 'lbjax[tfds]', or read the idx "
        "files with lbjax.data.load_mnist_idx.") from error
  try:
    source = tfds.data_source("mnist", split=split,
                              data_dir=None if data_dir is None else os.fspath(data_dir),
                              download=download)
  except Exception as error:
    raise FileNotFoundError(
        f"TFDS mnist (split {split!r}) is not available in data_dir={data_dir!r} as array_record "
        f"({type(error).__name__}: {error}). Prepare it once with network access: `tfds build "
        "mnist --file_format=array_record` (optionally --data_dir=...), or read the idx files "
        "with lbjax.data.load_mnist_idx.") from error
  records = [source[i] for i in range(len(source))]
  if not records:
    raise ValueError(f"TFDS mnist split {split!r} is empty.")
  images = np.stack([np.asarray(r["image"], dtype=np.uint8).reshape(IMAGE_SIZE, IMAGE_SIZE)
                     for r in records])
  labels = np.asarray([r["label"] for r in records], dtype=np.int32)
  return ArraySource(images=images, labels=labels)
