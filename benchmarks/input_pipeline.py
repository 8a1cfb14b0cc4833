"""Input pipelines: examples/s of each host pipeline vs the rate the train step consumes them.

Part `host` (README section input-pipeline):
  mnist        TrainStream over the MNIST idx files (shuffled gather of 28x28 float images)
  ptb          PtbStream over ptb.train.txt (consecutive 20-token windows)
  cifar10      the CIFAR-10 train transform (per-example RNGs, pad 4, crop, flip, normalise) on
               synthetic uint8 32x32 images, plus its two parts alone
The consumer rate is the trainer's compiled step on one CPU device for the matching model (measured
in the same process).

Part `imagenet` (README section input-pipeline-imagenet): ImageNet-like JPEGs generated at run time
(`lbjax.data.synthetic_jpeg`: 1/f-noise content, quality 90, sizes ~N(350, 70) x N(400, 80) with 4%
two to three times larger), through the ImageNet train and eval transforms on one core:
  full      the full-decode path (`decode="full"`): PIL decodes each JPEG in full (as TFDS does),
            then the transform crops and resizes the array
  reduced   the new path (`decode="reduced"`): the transform reads the JPEG header, draws the crop,
            decodes at the smallest DCT scale covering it (`lbjax.data.jpeg`)
and the reduced train path on 1 and 2 grain worker processes (`lbjax.data.workers`). ResNet-50 at
224x224 is not run on this CPU; the table gives the cores needed for --imagenet-target images/s
(default 3,000, about one H100 on ResNet-50 in bfloat16; an assumption, not a measurement).

    python -m benchmarks.input_pipeline [--part all|host|imagenet] [--rounds 5] [--no-readme]
"""

import argparse
import io
import os
import statistics
import time

import numpy as np

from benchmarks import report
from benchmarks import workloads
from lbjax import data as lbdata
from lbjax.data import cifar
from lbjax.data import imagenet
from lbjax.data import jpeg
from lbjax.data import stream as stream_lib
from lbjax.data import synthetic_jpeg
from lbjax.data import workers


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


def host_part(args) -> None:
  """MNIST, PTB and CIFAR-10 pipelines vs their models' train steps (section input-pipeline)."""
  load_before = load_average()
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

  table = report.markdown_table(
      ["pipeline", "batch", "pipeline ex/s", "consumer", "consumer ex/s", "pipeline / consumer",
       "bottleneck"], rows)
  notes = (
      f"Medians of {args.rounds} rounds of {args.seconds:g} s; the consumer is the trainer's "
      "compiled step on one CPU device (synthetic data), which shares the same 2 cores with the "
      f"pipeline in a real run. ImageNet: see the next section. Load average (1 min) before and "
      f"after: {load_before}, {load_average()}.")
  print(table + "\n\n" + notes)
  if not args.no_readme:
    report.write_section("input-pipeline", "Input pipelines vs the train step",
                         report.header_lines() + "\n" + table + "\n\n" + notes)


def load_average() -> str:
  """The 1-minute load average, e.g. "3.1" (the machine is shared with other work)."""
  return f"{os.getloadavg()[0]:.1f}"


def decode_in_full(encoded: bytes) -> np.ndarray:
  """uint8 RGB array of a whole JPEG, decoded by PIL as TFDS's image feature does."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))


def objects(values) -> np.ndarray:
  """1-D object array of `values` (how a source hands out images of different sizes or bytes)."""
  values = list(values)
  array = np.empty(len(values), dtype=object)
  array[:] = values
  return array


def previous_train_transform(image_size: int):
  """The train transform as of commit 131342b (before reduced decoding): crops of decoded arrays
  stacked, then normalised with per-channel broadcasting (`random_resized_crop` and
  `random_flip_left_right` are still those functions)."""
  mean = np.asarray(imagenet.IMAGENET_MEAN_RGB, np.float32)
  stddev = np.asarray(imagenet.IMAGENET_STDDEV_RGB, np.float32)

  def transform(examples, positions):
    crops = [imagenet.random_flip_left_right(imagenet.random_resized_crop(image, rng, image_size),
                                             rng)
             for image, rng in zip(examples["image"], stream_lib.example_rngs(0, positions))]
    return {"images": (np.stack(crops).astype(np.float32) - mean) / stddev,
            "labels": np.asarray(examples["label"]).astype(np.int32)}

  return transform


def simplejpeg_train_transform(image_size: int):
  """The reduced train transform with simplejpeg (libjpeg-turbo) decoding instead of PIL's: same
  window, flip and DCT scale; the decoded window is copied into a PIL image for the same resize.
  Measured to choose the decoder (lbjax uses PIL: see the notes)."""
  import simplejpeg  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  def crop(encoded, rng):
    height, width, _, _ = simplejpeg.decode_jpeg_header(encoded)
    box, flip = imagenet.train_window(height, width, rng)
    scale = jpeg.dct_scale(box.height, box.width, image_size, image_size)
    pixels = simplejpeg.decode_jpeg(encoded, "RGB", min_height=-(-height // scale),
                                    min_width=-(-width // scale))
    top, left = box.top // scale, box.left // scale
    bottom = -(-(box.top + box.height) // scale) + 1
    right = -(-(box.left + box.width) // scale) + 1
    window = Image.fromarray(np.ascontiguousarray(pixels[top:bottom, left:right]))
    resized = window.resize((image_size, image_size), Image.Resampling.BILINEAR, box=(
        box.left / scale - left, box.top / scale - top, (box.left + box.width) / scale - left,
        (box.top + box.height) / scale - top))
    return np.asarray(resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else resized)

  def transform(examples, positions):
    rngs = stream_lib.example_rngs(0, positions)
    images = np.stack([crop(encoded, rng) for encoded, rng in zip(examples["image"], rngs)])
    return {"images": imagenet.normalize_images(images),
            "labels": np.asarray(examples["label"]).astype(np.int32)}

  return transform


def single_core_rates(jpegs: list[bytes], image_size: int, rounds: int,
                      seconds: float) -> dict[str, list[float]]:
  """images/s per round of each one-thread variant, rounds interleaved."""
  batch = {"label": np.zeros(len(jpegs), np.int64)}
  positions = np.arange(len(jpegs))
  train = imagenet.imagenet_train_transform(seed=0, image_size=image_size, num_threads=1)
  evaluation = imagenet.imagenet_eval_transform(image_size=image_size, num_threads=1)
  encoded = objects(jpegs)
  previous = previous_train_transform(image_size)
  functions = {
      "train previous code (131342b)": lambda: previous(
          {**batch, "image": objects(map(decode_in_full, jpegs))}, positions),
      "train full": lambda: train({**batch, "image": objects(map(decode_in_full, jpegs))},
                                  positions),
      "train reduced": lambda: train({**batch, "image": encoded}, positions),
      "eval full": lambda: evaluation({**batch, "image": objects(map(decode_in_full, jpegs))},
                                      positions),
      "eval reduced": lambda: evaluation({**batch, "image": encoded}, positions),
      "decode alone (PIL, full size)": lambda: [decode_in_full(j) for j in jpegs],
  }
  try:
    import simplejpeg  # pylint: disable=g-import-not-at-top
    functions["decode alone (simplejpeg, full size)"] = lambda: [
        simplejpeg.decode_jpeg(j, "RGB") for j in jpegs]
    with_simplejpeg = simplejpeg_train_transform(image_size)
    functions["train reduced, simplejpeg decoder"] = lambda: with_simplejpeg(
        {**batch, "image": encoded}, positions)
  except ImportError:
    pass
  return cpu_rates(functions, len(jpegs), rounds, seconds)


def cpu_rates(functions, count: int, rounds: int, seconds: float) -> dict[str, list[float]]:
  """`count` / CPU seconds of this process per call, for each function in each interleaved round.

  CPU time (`time.process_time`), not wall time: on this shared machine (load average above 10 on
  2 cores) wall time measures the scheduler; CPU time measures the work, i.e. images/s per core.
  Each round runs every function `repeats` times in a row, `repeats` chosen so that the first
  takes about `seconds` of CPU time; one untimed warm-up call each before the first round.
  """
  for function in functions.values():
    function()
  start = time.process_time()
  next(iter(functions.values()))()
  repeats = max(1, round(seconds / max(time.process_time() - start, 1e-6)))
  rates = {name: [] for name in functions}
  for _ in range(rounds):
    for name, function in functions.items():
      start = time.process_time()
      for _ in range(repeats):
        function()
      rates[name].append(count * repeats / (time.process_time() - start))
  return rates


def worker_rates(jpegs: list[bytes], image_size: int, batch_size: int, rounds: int,
                 batches_per_round: int, worker_counts=(1, 2)
                 ) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
  """Wall-clock images/s and images per CPU second (main process and workers together) per round
  of the reduced train path on `n` grain worker processes, counts interleaved. Each round starts a
  fresh pipeline, takes `2 n` batches untimed (start-up and the batches computed meanwhile), then
  times `batches_per_round` batches (steady state)."""
  source = stream_lib.ArraySource(image=objects(jpegs), label=np.arange(len(jpegs)))
  transform = imagenet.imagenet_train_transform(seed=0, image_size=image_size, num_threads=1)
  rates = {n: [] for n in worker_counts}
  cpu = {n: [] for n in worker_counts}
  for _ in range(rounds):
    for n in worker_counts:
      worker_stream = workers.WorkerTrainStream(
          stream_lib.TrainStream(source, seed=0, transform=transform), num_workers=n,
          buffer_size=1)
      try:
        for _ in range(2 * n):
          worker_stream.next_batch(batch_size)
        start, start_cpu = time.perf_counter(), cpu_seconds_with_children()
        for _ in range(batches_per_round):
          worker_stream.next_batch(batch_size)
        images = batches_per_round * batch_size
        rates[n].append(images / (time.perf_counter() - start))
        cpu[n].append(images / (cpu_seconds_with_children() - start_cpu))
      finally:
        worker_stream.close()
  return rates, cpu


def cpu_seconds_with_children() -> float:
  """User + system CPU seconds of this process and its live child processes (the workers)."""
  import psutil  # pylint: disable=g-import-not-at-top
  total = 0.0
  me = psutil.Process()
  for process in [me, *me.children(recursive=True)]:
    try:
      times = process.cpu_times()
    except psutil.NoSuchProcess:
      continue
    total += times.user + times.system
  return total


def spread(values: list[float]) -> str:
  return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def imagenet_part(args) -> None:
  """Full-decode vs reduced-size decoding, train and eval, 1 and 2 worker processes."""
  load_before = load_average()
  jpegs = synthetic_jpeg.imagenet_like_jpegs(args.imagenet_images, seed=0)
  sizes = [jpeg.image_size(j) for j in jpegs]
  pixels = np.mean([h * w for h, w in sizes])
  kilobytes = [len(j) / 1000 for j in jpegs]
  described = (f"{len(jpegs)} JPEGs, mean {np.mean([h for h, _ in sizes]):.0f}x"
               f"{np.mean([w for _, w in sizes]):.0f} (height x width, {pixels / 1000:.0f}k pixels), "
               f"{min(kilobytes):.0f}-{max(kilobytes):.0f} KB (median {np.median(kilobytes):.0f})")
  print(described, flush=True)
  rows = []
  per_core = {}
  ratio_medians = {}
  versus_previous = {}
  for image_size in args.imagenet_sizes:
    rates = single_core_rates(jpegs, image_size, args.rounds, args.seconds)
    ratios = [r / p for r, p in zip(rates["train reduced"], rates["train previous code (131342b)"])]
    versus_previous[image_size] = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-"
                                   f"{max(ratios):.2f})")
    for name, values in rates.items():
      per_core[(name, image_size)] = statistics.median(values)
      baseline = ("train full" if name.startswith("train ") else
                  "eval full" if name.startswith("eval") else "decode alone (PIL, full size)")
      ratios = [v / b for v, b in zip(values, rates[baseline])]
      ratio_medians[(name, image_size)] = statistics.median(ratios)
      rows.append([name, image_size, "1 process, 1 thread", spread(values),
                   f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                   f"{args.imagenet_target / statistics.median(values):.1f}"
                   if not name.startswith("decode") else "-"])
      print(rows[-1], flush=True)
  image_size = args.imagenet_sizes[0]
  fractions = []
  for index, (height, width) in enumerate(sizes):
    for position in range(8):
      rng = stream_lib.example_rngs(0, [index * 8 + position])[0]
      box = imagenet.sample_crop_box(rng, height, width)
      fractions.append(jpeg.decoded_pixel_fraction(height, width, jpeg.Box(*box),
                                                   (image_size, image_size)))
  scaled = np.mean(np.array(fractions) < 1)
  worker, worker_cpu = worker_rates(jpegs, image_size, args.worker_batch, args.rounds,
                                    args.worker_batches)
  for label, measured in (("wall clock", worker), ("per CPU second of all processes", worker_cpu)):
    for n, values in measured.items():
      ratios = [v / one for v, one in zip(values, measured[1])]
      rows.append([f"train reduced, grain workers, {label}", image_size,
                   f"{n} worker process(es)", spread(values),
                   f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) vs 1 "
                   "worker", "-"])
      print(rows[-1], flush=True)
  table = report.markdown_table(
      ["variant", "output side", "parallelism", "images/s, median (min-max)",
       "ratio to baseline, median (min-max)", f"cores for {args.imagenet_target:,.0f} images/s"],
      rows)
  train_ratio = ratio_medians[("train reduced", image_size)]
  full_rate = per_core[("train full", image_size)]
  simplejpeg_decode, simplejpeg_train = ("decode alone (simplejpeg, full size)",
                                         "train reduced, simplejpeg decoder")
  in_process = per_core[("train reduced", image_size)]
  one_worker_cpu = statistics.median(worker_cpu[1])
  notes = (
      f"Data: {described}, quality 90, generated at run time (`lbjax.data.synthetic_jpeg`). "
      f"Single-process rows: images per CPU second of the process (`time.process_time`, so the "
      "machine's load does not enter), i.e. images/s per core, on one thread, in "
      f"{args.rounds} interleaved rounds of about {args.seconds:g} CPU s; the ratio column divides "
      "by the `full` row of the same transform (and output side) in the same round, decode rows by "
      "the PIL decode. Cores for "
      f"{args.imagenet_target:,.0f} images/s = target / per-core rate (reading the array_record "
      "files is not included). "
      f"At output side {image_size}, {scaled:.0%} of training crops are decoded at a DCT scale "
      "below 1 (a crop must be at least twice the output on both sides); the rest decode in full, "
      "so the per-core gain of the reduced train path over the full-decode path of the same code "
      f"({train_ratio:.2f}x here) comes mostly from decoding straight into the resize (no "
      "full-size array and its copy back into PIL); the entropy decoding of every JPEG remains. "
      "Against the train transform as of commit 131342b (`previous code`: the same full decode, "
      "then stack-and-broadcast normalisation, since replaced by a row-tiled in-place one used by "
      "both paths) the reduced path is "
      + ", ".join(f"{ratio} at side {size}" for size, ratio in versus_previous.items()) + ". "
      f"Bound at side {image_size}, where {1 - scaled:.0%} of crops decode in full: were crop, "
      "resize and normalisation free, the train path would run at the full decode "
      f"rate, {per_core[('decode alone (PIL, full size)', image_size)] / full_rate:.2f}x the full "
      "path with PIL's decoder" + (
          f" and {per_core[(simplejpeg_decode, image_size)] / full_rate:.2f}x with simplejpeg's"
          if (simplejpeg_decode, image_size) in per_core else "") + "; 3x per core needs a "
      "decoder that skips entropy decoding (region decoding) or the GPU (`decoder='dali'`). "
      "Decoder choice: simplejpeg decodes a whole JPEG faster than PIL (decode rows), and the train "
      "transform with it (`train reduced, simplejpeg decoder`: same windows and scales, the window "
      "copied into PIL for the same resize) is " + (
          f"{per_core[(simplejpeg_train, image_size)] / per_core[('train reduced', image_size)]:.2f}x"
          if (simplejpeg_train, image_size) in per_core else "(not installed: not measured)") +
      " the PIL one; lbjax keeps PIL (no new dependency for that). "
      f"Worker rows: wall-clock images/s, batches of {args.worker_batch} from `WorkerTrainStream` "
      f"(grain `mp_prefetch`), a fresh pipeline per round, {args.worker_batches} batches timed "
      "after the first 2 n (worker start-up excluded). This machine has 2 cores shared with other "
      "engineers' jobs and a background training run (1-min load average "
      f"{load_before} before, {load_average()} after): a process gets a small, varying share of a "
      "core, so the wall-clock rows measure the scheduler as much as the pipeline, and their 1-to-2 "
      "worker ratio says little about scaling on an idle host. The per-CPU-second rows divide by "
      "the CPU time of the main process and the workers together: equal rates for 1 and 2 workers "
      "mean a second worker adds no work per image, so on free cores the throughput grows with "
      "the workers until the main process (which only receives batches) or the memory bus "
      f"limits it. One worker costs {1 - one_worker_cpu / in_process:.0%} more CPU per image than "
      "the same transform in the training process (batches pass through shared memory).")
  print(table + "\n\n" + notes)
  if not args.no_readme:
    report.write_section("input-pipeline-imagenet",
                         "ImageNet input: full-size vs reduced-size JPEG decoding, worker processes",
                         report.header_lines() + "\n" + table + "\n\n" + notes)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=("all", "host", "imagenet"), default="all")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--seconds", type=float, default=0.5, help="per timed round")
  parser.add_argument("--imagenet-target", type=float, default=3000.0)
  parser.add_argument("--imagenet-images", type=int, default=64)
  parser.add_argument("--imagenet-sizes", type=int, nargs="+", default=[224, 128],
                      help="output sides; the first is used for the worker rows")
  parser.add_argument("--worker-batch", type=int, default=32)
  parser.add_argument("--worker-batches", type=int, default=8)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  if args.part in ("all", "host"):
    host_part(args)
  if args.part in ("all", "imagenet"):
    imagenet_part(args)


if __name__ == "__main__":
  main()
