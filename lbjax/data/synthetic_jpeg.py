"""ImageNet-like JPEGs generated at run time (tests and benchmarks of the decoding path; no download).

Content: three colour channels of 1/f ("pink") noise, the power spectrum of natural photographs
(Field 1987), so a quality-90 file has about the entropy per pixel of an ImageNet photo (3 to 6
bits per pixel) and the Huffman decoding, which no DCT scaling saves, costs what it costs on real
data. Sizes: width ~ N(400, 80) and height ~ N(350, 70) pixels (clipped to [120, 800]), and a tail
of `large_fraction` images 2 to 3 times larger on each side, like the large photos of ImageNet's
training set.

References:
  D. J. Field, "Relations between the statistics of natural images and the response properties of
  cortical cells", JOSA A 4(12), 1987.
"""

import io

import numpy as np


def pink_noise_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """uint8 [height, width, 3]: a shared 1/f luminance field plus weaker per-channel 1/f colour."""
  frequency_y = np.fft.fftfreq(height)[:, None]
  frequency_x = np.fft.rfftfreq(width)[None, :]
  frequency = np.hypot(frequency_y, frequency_x)
  frequency[0, 0] = 1.0

  def field(exponent: float) -> np.ndarray:
    spectrum = rng.normal(size=frequency.shape) + 1j * rng.normal(size=frequency.shape)
    values = np.fft.irfft2(spectrum / frequency**exponent, s=(height, width))
    return (values - values.mean()) / values.std()

  luminance = field(1.0)
  channels = [45 * luminance + 15 * field(1.3) + 120 + rng.uniform(-20, 20) for _ in range(3)]
  return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def imagenet_like_sizes(rng: np.random.Generator, count: int, *,
                        large_fraction: float = 0.04) -> list[tuple[int, int]]:
  """(height, width) pairs spread like ImageNet's (see the module docstring)."""
  sizes = []
  for _ in range(count):
    height = int(np.clip(rng.normal(350, 70), 120, 800))
    width = int(np.clip(rng.normal(400, 80), 120, 800))
    if rng.random() < large_fraction:
      factor = rng.uniform(2, 3)
      height, width = int(height * factor), int(width * factor)
    sizes.append((height, width))
  return sizes


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
  """Baseline JPEG bytes of uint8 RGB `image` (PIL, 4:2:0 chroma subsampling)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
  return buffer.getvalue()


def imagenet_like_jpegs(count: int, *, seed: int = 0, quality: int = 90,
                        large_fraction: float = 0.04) -> list[bytes]:
  """`count` quality-`quality` JPEGs of 1/f-noise content with ImageNet-like sizes."""
  rng = np.random.default_rng(seed)
  return [encode_jpeg(pink_noise_image(rng, height, width), quality)
          for height, width in imagenet_like_sizes(rng, count, large_fraction=large_fraction)]
