"""Input pipelines: examples/s of each host pipeline vs the rate the train step consumes them.

  mnist        TrainStream over the MNIST idx files (shuffled gather of 28x28 float images)
  ptb          PtbStream over ptb.train.txt (consecutive 20-token windows)
  cifar10      the CIFAR-10 train transform (per-example RNGs, pad 4, crop, flip, normalise) on
               synthetic uint8 32x32 images, plus its two parts alone
  imagenet     the ImageNet train transform (Inception crop, bilinear resize to 224, flip,
               normalise) on synthetic decoded images of ImageNet's typical size (~400x500), and
               the JPEG decode (PIL) that precedes it, alone

The consumer rate is the trainer's compiled step on one CPU device for the matching model (measured
in the same process). ResNet-50 at 224x224 is not run on this CPU; for ImageNet the table gives the
cores one would need per accelerator at a target rate passed with --imagenet-target (default 3,000
images/s, the order of one current GPU on ResNet-50 in bf16; an assumption, not a measurement).

    python -m benchmarks.input_pipeline [--rounds 5] [--imagenet-target 3000] [--no-readme]
"""

import argparse
import io
import statistics
import time

import numpy as np

from benchmarks import report
from benchmarks import workloads
from lbjax import data as lbdata
from lbjax.data import cifar
from lbjax.data import imagenet


def rate(function, batch_size: int, rounds: int, seconds: float) -> float:
  """Median examples/s of `function()` (one batch per call) over `rounds` timed rounds."""
  function()
  rates = []
  for _ in range(rounds):
    count, start = 0, time.perf_counter()
    while True:
      function()
      count += 1
      elapsed = time.perf_counter() - start
      if elapsed >= seconds:
        break
    rates.append(count * batch_size / elapsed)
  return statistics.median(rates)


def step_rate(model: str, batch_size: int, rounds: int) -> float:
  """Examples/s of the trainer's compiled step for `model` at `batch_size` on one device."""
  trainer_step = workloads.TrainerStep(workloads.trainer_config(model, batch_size))
  try:
    probe = report.median_seconds({"s": trainer_step}, rounds=1, repeats=1)["s"]
    seconds = report.median_seconds({"s": trainer_step}, rounds=rounds,
                                    repeats=max(1, round(0.5 / max(probe, 1e-6))))["s"]
    return batch_size / seconds
  finally:
    trainer_step.close()


def synthetic_decoded_images(count: int, seed: int = 0) -> list[np.ndarray]:
  """uint8 RGB images of ImageNet-like sizes (height 333-500, width 375-500), smooth content."""
  rng = np.random.default_rng(seed)
  images = []
  for _ in range(count):
    height, width = int(rng.integers(333, 501)), int(rng.integers(375, 501))
    y, x = np.mgrid[0:height, 0:width]
    base = (np.sin(x / rng.uniform(5, 40)) + np.cos(y / rng.uniform(5, 40)) + 2) * 60
    noise = rng.normal(0, 12, (height, width, 3))
    images.append(np.clip(base[..., None] + noise, 0, 255).astype(np.uint8))
  return images


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--seconds", type=float, default=0.5, help="per timed round")
  parser.add_argument("--imagenet-target", type=float, default=3000.0)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  from PIL import Image  # pylint: disable=g-import-not-at-top

  rows = []

  def add(pipeline, batch_size, pipeline_rate, consumer, consumer_rate):
    ratio = pipeline_rate / consumer_rate if consumer_rate else float("nan")
    bottleneck = "input pipeline" if ratio < 1 else "train step"
    rows.append([pipeline, batch_size, f"{pipeline_rate:,.0f}", consumer,
                 f"{consumer_rate:,.0f}" if consumer_rate else "n/a",
                 f"{ratio:.1f}" if consumer_rate else "n/a", bottleneck if consumer_rate else "-"])
    print(rows[-1], flush=True)

  mnist = lbdata.TrainStream(lbdata.load_mnist_idx(None, "train"), seed=0)
  for batch_size in (128, 2048):
    add("MNIST TrainStream (idx)", batch_size,
        rate(lambda b=batch_size: mnist.next_batch(b), batch_size, args.rounds, args.seconds),
        "mnist_lstm step", step_rate("mnist_lstm", batch_size, args.rounds))

  corpus = lbdata.PtbCorpus.from_dir(None)
  for batch_size in (16, 64):
    stream = lbdata.PtbStream(corpus.train, seq_len=20)

    add("PTB PtbStream (20-token rows)", batch_size,
        rate(lambda s=stream, b=batch_size: s.next_batch(b), batch_size, args.rounds, args.seconds),
        "ptb_lstm step", step_rate("ptb_lstm", batch_size, args.rounds))

  cifar_transform = cifar.cifar10_train_transform(seed=0)
  rng = np.random.default_rng(0)
  for batch_size in (128, 512):
    examples = {"image": rng.integers(0, 256, (batch_size, 32, 32, 3), dtype=np.uint8),
                "label": rng.integers(0, 10, batch_size)}
    positions = np.arange(batch_size)
    consumer = step_rate("resnet_tiny", batch_size, args.rounds)
    add("CIFAR-10 train transform", batch_size,
        rate(lambda e=examples, p=positions: cifar_transform(e, p), batch_size, args.rounds,
             args.seconds), "resnet_tiny step (32x32)", consumer)
    add("  of which: example_rngs (per-example Generators)", batch_size,
        rate(lambda p=positions: lbdata.example_rngs(0, p), batch_size, args.rounds, args.seconds),
        "resnet_tiny step (32x32)", consumer)
    offsets, flips = cifar.sample_crop_offsets_and_flips(lbdata.example_rngs(0, positions))
    add("  of which: pad_crop_flip + normalise", batch_size,
        rate(lambda e=examples, o=offsets, f=flips: imagenet.normalize_images(
            cifar.pad_crop_flip(e["image"], o, f), cifar.CIFAR10_MEAN_RGB, cifar.CIFAR10_STDDEV_RGB),
             batch_size, args.rounds, args.seconds), "resnet_tiny step (32x32)", consumer)

  batch_size = 32
  images = synthetic_decoded_images(batch_size)
  decoded = np.empty(batch_size, dtype=object)
  decoded[:] = images
  examples = {"image": decoded, "label": np.arange(batch_size) % 1000}
  positions = np.arange(batch_size)
  for threads in (1, imagenet.default_num_threads()):
    transform = imagenet.imagenet_train_transform(seed=0, image_size=224, num_threads=threads)
    add(f"ImageNet train transform, {threads} thread(s)", batch_size,
        rate(lambda t=transform: t(examples, positions), batch_size, args.rounds, args.seconds),
        "", 0.0)
  jpegs = []
  for image in images:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90)
    jpegs.append(buffer.getvalue())
  decode_rate = rate(lambda: [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs],
                     batch_size, args.rounds, args.seconds)
  add("ImageNet JPEG decode (PIL, 1 thread)", batch_size, decode_rate, "", 0.0)
  one_thread = float(rows[-3][2].replace(",", ""))
  per_core = 1.0 / (1.0 / one_thread + 1.0 / decode_rate)
  cores = args.imagenet_target / per_core

  table = report.markdown_table(
      ["pipeline", "batch", "pipeline ex/s", "consumer", "consumer ex/s", "pipeline / consumer",
       "bottleneck"], rows)
  notes = (
      f"Medians of {args.rounds} rounds of {args.seconds:g} s; the consumer is the trainer's "
      "compiled step on one CPU device (synthetic data), which shares the same 2 cores with the "
      "pipeline in a real run. ImageNet: decode + augment on one core gives "
      f"{per_core:,.0f} images/s, so feeding {args.imagenet_target:,.0f} images/s (the assumed rate "
      f"of one GPU on ResNet-50 bf16, not measured here) needs about {cores:.0f} host cores per "
      f"accelerator; decode takes {per_core / decode_rate:.0%} of that time, the crop-resize-flip "
      f"{per_core / one_thread:.0%}. The per-core rates are those of this loaded machine (load "
      "average ~10 on 2 cores while measured); an idle modern core is several times faster.")
  print(table + "\n\n" + notes)
  if not args.no_readme:
    report.write_section("input-pipeline", "Input pipelines vs the train step",
                         report.header_lines() + "\n" + table + "\n\n" + notes)


if __name__ == "__main__":
  main()
