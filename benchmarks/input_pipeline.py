"""Input pipelines: examples/s of each host pipeline vs the rate the train step consumes them.

Part `host` (README section input-pipeline):
  mnist        TrainStream over the MNIST idx files (shuffled gather of 28x28 float images)
  ptb          PtbStream over ptb.train.txt (consecutive 20-token windows)
  cifar10      the CIFAR-10 train transform (per-example RNGs, pad 4, crop, flip; uint8 out, the step
               normalises) on synthetic uint8 32x32 images, plus pad-crop-flip and the host
               normalisation of before alone
The consumer rate is the trainer's compiled step on one CPU device for the matching model (measured
in the same process).

Part `imagenet` (README section input-pipeline-imagenet): ImageNet-like JPEGs generated at run time
(`lbjax.data.synthetic_jpeg`: 1/f-noise content, quality 90, sizes ~N(350, 70) x N(400, 80) with 4%
two to three times larger), through train and eval transforms on one core (images per CPU second,
variants interleaved in each round, medians and spread over the rounds, ratios to the baseline of
the same round):
  full-decode baseline   the path before reduced decoding: Pillow decodes in full to a numpy array
                         (as TFDS does), Pillow's antialiased bilinear resizes the window
  PIL draft              an earlier reduced path: Pillow's draft mode at the DCT scale covering
                         the crop, Pillow resize
  simplejpeg whole       lbjax's path without a TurboJPEG 3 library: simplejpeg decodes the whole
                         image at the DCT scale covering the crop, OpenCV resizes (`lbjax.data.jpeg`)
  libturbojpeg region    lbjax's path (`decode="reduced"`) with one: only the crop's region is
                         decoded (`lbjax.data.libturbojpeg`); its rows are left out when no
                         TurboJPEG 3 library is found
and lbjax's train path on 1 and 2 grain worker processes (`lbjax.data.workers`). ResNet-50 at
224x224 is not run on this CPU; the table gives the cores needed for --imagenet-target images/s
(default 3,000, about one H100 on ResNet-50 in bfloat16; an assumption, not a measurement).

Part `decoders` (README section input-pipeline-decoders): each JPEG decoder (Pillow, simplejpeg, OpenCV,
libturbojpeg's region decode) alone and inside lbjax's train and eval transforms, ratios to simplejpeg: whether
each decode path earns its place. Short: run it under `nice` with `--rounds 5 --seconds 0.3 --imagenet-images 32`.

    python -m benchmarks.input_pipeline [--part all|host|imagenet|decoders] [--rounds 5] [--no-readme]
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
from lbjax.data import crops
from lbjax.data import imagenet
from lbjax.data import jpeg
from lbjax.data import libturbojpeg
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
    add("  of which: pad_crop_flip (uint8 out; normalised in the step)", batch_size,
        rate(lambda e=examples, o=offsets, f=flips: cifar.pad_crop_flip(e["image"], o, f),
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
  """uint8 RGB array of a whole JPEG, decoded by Pillow as TFDS's image feature does."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))


def objects(values) -> np.ndarray:
  """1-D object array of `values` (how a source hands out images of different sizes or bytes)."""
  values = list(values)
  array = np.empty(len(values), dtype=object)
  array[:] = values
  return array


def pil_resize(image, window, size: int) -> np.ndarray:
  """Pillow's antialiased bilinear resize of `window` (top, left, height, width) of a PIL image."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  top, left, height, width = window
  return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR,
                                 box=(left, top, left + width, top + height)))


def pil_draft_decode(encoded: bytes, window, size: int):
  """The previous reduced path (lbjax before simplejpeg): Pillow's draft mode at the DCT scale of
  `jpeg.dct_scale`, then Pillow's resize of the window mapped to the drafted image."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  image = Image.open(io.BytesIO(encoded))
  width, height = image.size
  scale = jpeg.dct_scale(window.height, window.width, size, size)
  drafted = image.draft("RGB", (width // scale, height // scale)) if scale > 1 else None
  step = width / drafted[1][2] if drafted else 1
  return pil_resize(image.convert("RGB"), [edge / step for edge in window], size)


def _row_normalizer(mean, stddev, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Mean and 1 / stddev tiled along one image row, so numpy's inner loop runs over a whole row
  ([W * C] values) instead of the C channels (about 5x faster): the host normalisation lbjax's
  transforms did before they handed over uint8 (the baselines' cost of it)."""
  inverse = np.float32(1) / np.asarray(stddev, np.float32)
  return np.tile(np.asarray(mean, np.float32), width), np.tile(inverse, width)


def _normalize_into(out: np.ndarray, image: np.ndarray, normalizer: tuple[np.ndarray, np.ndarray]) -> None:
  """`out[...] = (image - mean) / stddev` with `_row_normalizer`'s rows."""
  mean_row, inverse_stddev_row = normalizer
  rows = out.reshape(-1, mean_row.shape[0])
  np.subtract(np.asarray(image).reshape(rows.shape), mean_row, out=rows, dtype=np.float32)
  np.multiply(rows, inverse_stddev_row, out=rows)


def reference_transforms(image_size: int):
  """Train and eval transforms of JPEG bytes as the variants to compare compute them, one thread:
  the same windows (`crops.train_window`, `crops.eval_window`) and flips as `imagenet`'s
  transforms, only the decode and the resize differ, and these normalise on the host to float32
  as the ImageNet path did before its batches became uint8 (the `uint8 out` baselines do not).

  Returns {name: transform(examples, positions)}:
    full-decode baseline   the ImageNet path before reduced decoding (lbjax's `decode='full'` until
                           this decoder): Pillow decodes to a numpy array (as TFDS's image feature
                           does), the window is resized from it by Pillow's antialiased bilinear
                           (`Image.fromarray(array).resize(box=window)`)
    ..., uint8 out         the same, without the host normalisation
    PIL draft              the previous reduced path (`pil_draft_decode`)
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  normalizer = _row_normalizer(imagenet.IMAGENET_MEAN_RGB, imagenet.IMAGENET_STDDEV_RGB, image_size)

  def full_train(encoded, rng):
    array = decode_in_full(encoded)
    window, flip = crops.train_window(array.shape[0], array.shape[1], rng)
    crop = pil_resize(Image.fromarray(array), window, image_size)
    return crop[:, ::-1] if flip else crop

  def draft_train(encoded, rng):
    window, flip = crops.train_window(*jpeg.image_size(encoded), rng)
    crop = pil_draft_decode(encoded, window, image_size)
    return crop[:, ::-1] if flip else crop

  def full_eval(encoded, rng):
    del rng
    array = decode_in_full(encoded)
    return pil_resize(Image.fromarray(array), crops.eval_window(*array.shape[:2], image_size),
                      image_size)

  def draft_eval(encoded, rng):
    del rng
    return pil_draft_decode(encoded, crops.eval_window(*jpeg.image_size(encoded), image_size),
                            image_size)

  def transform_of(crop, normalise=True):
    def transform(examples, positions):
      images = np.empty((len(positions), image_size, image_size, 3),
                        np.float32 if normalise else np.uint8)
      for i, (encoded, rng) in enumerate(zip(examples["image"],
                                             stream_lib.example_rngs(0, positions))):
        if normalise:
          _normalize_into(images[i], crop(encoded, rng), normalizer)
        else:
          images[i] = crop(encoded, rng)
      return {"images": images, "labels": np.asarray(examples["label"]).astype(np.int32)}
    return transform

  return {TRAIN_BASELINE: transform_of(full_train),
          TRAIN_BASELINE_UINT8: transform_of(full_train, normalise=False),
          "train PIL draft": transform_of(draft_train),
          EVAL_BASELINE: transform_of(full_eval),
          EVAL_BASELINE_UINT8: transform_of(full_eval, normalise=False),
          "eval PIL draft": transform_of(draft_eval)}


TRAIN_BASELINE, EVAL_BASELINE = "train full-decode baseline", "eval full-decode baseline"
TRAIN_BASELINE_UINT8 = "train full-decode baseline, uint8 out (no host normalisation)"
EVAL_BASELINE_UINT8 = "eval full-decode baseline, uint8 out (no host normalisation)"
TRAIN_WHOLE = "train simplejpeg whole decode + OpenCV (lbjax without libturbojpeg 3)"
EVAL_WHOLE = "eval simplejpeg whole decode + OpenCV (lbjax without libturbojpeg 3)"
TRAIN_REGION = "train libturbojpeg region decode + OpenCV (lbjax)"
EVAL_REGION = "eval libturbojpeg region decode + OpenCV (lbjax)"
DECODE_BASELINE = "decode alone, Pillow, full size"
DECODE_SIMPLEJPEG = "decode alone, simplejpeg, full size"
DECODE_REGIONS = "decode alone, libturbojpeg, the train crops' regions"
DECODE_REGIONS_EIGHTHS = ("decode alone, libturbojpeg, the train crops' regions at the smallest "
                          "M/8 covering the output (M = 1..8; not used)")
DECODE_ENTROPY = "decode alone, libturbojpeg, last row only (entropy decoding of all rows)"


def without_region_decoding(function):
  """`function` run as lbjax runs where no TurboJPEG 3 library is found (simplejpeg decodes whole
  images): `libturbojpeg.decoder` answers None for the duration of the call."""
  def run():
    found = libturbojpeg.decoder
    libturbojpeg.decoder = lambda: None
    try:
      return function()
    finally:
      libturbojpeg.decoder = found
  return run


def train_regions(jpegs: list[bytes], image_size: int,
                  eighths: bool = False) -> list[tuple[int, tuple, tuple]]:
  """(DCT numerator, rows, columns) that the train transform decodes of each JPEG at position = its
  index (the windows of `crops.train_window`, as `jpeg.decode_resized_crop` maps them); with
  `eighths`, at the smallest M/8 (any M in 1..8, not only 8, 4, 2, 1) that leaves the crop at
  least `image_size` on both sides."""
  regions = []
  for position, encoded in enumerate(jpegs):
    height, width = jpeg.image_size(encoded)
    box, _ = crops.train_window(height, width, stream_lib.example_rngs(0, [position])[0])
    if eighths:
      numerator = next(m for m in range(1, 9)
                       if min(box.height, box.width) * m >= 8 * image_size or m == 8)
    else:
      numerator = jpeg.scaling_numerator(
          height, width, jpeg.dct_scale(box.height, box.width, image_size, image_size))
    window = crops.Box(*(edge / (8 / numerator) for edge in box))
    regions.append((numerator, *jpeg._support(  # pylint: disable=protected-access
        window, -(-height * numerator // 8), -(-width * numerator // 8))))
  return regions


def single_core_rates(jpegs: list[bytes], image_size: int, rounds: int,
                      seconds: float) -> dict[str, list[float]]:
  """images/s per round of each one-thread variant, rounds interleaved (region rows only where
  `libturbojpeg.decoder()` finds a library)."""
  import simplejpeg  # pylint: disable=g-import-not-at-top
  region_decoder = libturbojpeg.decoder()
  batch = {"label": np.zeros(len(jpegs), np.int64)}
  positions = np.arange(len(jpegs))
  train = imagenet.imagenet_train_transform(seed=0, image_size=image_size, num_threads=1)
  evaluation = imagenet.imagenet_eval_transform(image_size=image_size, num_threads=1)
  encoded = objects(jpegs)
  references = reference_transforms(image_size)
  functions = {
      TRAIN_BASELINE: lambda: references[TRAIN_BASELINE]({**batch, "image": encoded}, positions),
      TRAIN_BASELINE_UINT8: lambda: references[TRAIN_BASELINE_UINT8](
          {**batch, "image": encoded}, positions),
      "train PIL draft": lambda: references["train PIL draft"]({**batch, "image": encoded},
                                                                positions),
      "train Pillow full decode + OpenCV (lbjax decode='full')": lambda: train(
          {**batch, "image": objects(map(decode_in_full, jpegs))}, positions),
      TRAIN_WHOLE: without_region_decoding(lambda: train({**batch, "image": encoded}, positions)),
      TRAIN_REGION: lambda: train({**batch, "image": encoded}, positions),
      EVAL_BASELINE: lambda: references[EVAL_BASELINE]({**batch, "image": encoded}, positions),
      EVAL_BASELINE_UINT8: lambda: references[EVAL_BASELINE_UINT8](
          {**batch, "image": encoded}, positions),
      "eval PIL draft": lambda: references["eval PIL draft"]({**batch, "image": encoded},
                                                              positions),
      EVAL_WHOLE: without_region_decoding(
          lambda: evaluation({**batch, "image": encoded}, positions)),
      EVAL_REGION: lambda: evaluation({**batch, "image": encoded}, positions),
      DECODE_BASELINE: lambda: [decode_in_full(j) for j in jpegs],
      DECODE_SIMPLEJPEG: lambda: [simplejpeg.decode_jpeg(j, "RGB") for j in jpegs],
  }
  if region_decoder is None:
    del functions[TRAIN_REGION], functions[EVAL_REGION]
  else:
    regions = train_regions(jpegs, image_size)
    last_rows = [((h - 1, h), (0, 1)) for h, _ in map(jpeg.image_size, jpegs)]
    functions[DECODE_REGIONS] = lambda: [region_decoder.decode(j, *r)
                                         for j, r in zip(jpegs, regions)]
    eighths = train_regions(jpegs, image_size, eighths=True)
    functions[DECODE_REGIONS_EIGHTHS] = lambda: [region_decoder.decode(j, *r)
                                                 for j, r in zip(jpegs, eighths)]
    functions[DECODE_ENTROPY] = lambda: [region_decoder.decode(j, 8, *r)
                                         for j, r in zip(jpegs, last_rows)]
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
        cpu[n].append(images / max(cpu_seconds_with_children() - start_cpu, 1e-3))
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


def ratio_text(values: list[float]) -> str:
  return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def imagenet_part(args) -> None:
  """Full-decode baseline, PIL draft, simplejpeg whole and libturbojpeg region decode, train and
  eval; 1 and 2 workers."""
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
  versus = {}
  for image_size in args.imagenet_sizes:
    rates = single_core_rates(jpegs, image_size, args.rounds, args.seconds)
    for name, values in rates.items():
      per_core[(name, image_size)] = statistics.median(values)
      baseline = (TRAIN_BASELINE if name.startswith("train ") else
                  EVAL_BASELINE if name.startswith("eval ") else DECODE_BASELINE)
      ratios = [v / b for v, b in zip(values, rates[baseline])]
      rows.append([name, image_size, "1 process, 1 thread", spread(values), ratio_text(ratios),
                   f"{args.imagenet_target / statistics.median(values):.1f}"
                   if not name.startswith("decode") else "-"])
      print(rows[-1], flush=True)
    comparisons = [(TRAIN_WHOLE, TRAIN_BASELINE), (EVAL_WHOLE, EVAL_BASELINE),
                   (TRAIN_WHOLE, TRAIN_BASELINE_UINT8), (EVAL_WHOLE, EVAL_BASELINE_UINT8)]
    if TRAIN_REGION in rates:
      comparisons += [(TRAIN_REGION, TRAIN_BASELINE), (TRAIN_REGION, TRAIN_WHOLE),
                      (EVAL_REGION, EVAL_BASELINE), (EVAL_REGION, EVAL_WHOLE),
                      (TRAIN_REGION, TRAIN_BASELINE_UINT8), (EVAL_REGION, EVAL_BASELINE_UINT8)]
    for new, old in comparisons:
      versus[(new, old, image_size)] = ratio_text(
          [n / o for n, o in zip(rates[new], rates[old])])
  image_size = args.imagenet_sizes[0]
  region = (TRAIN_REGION, image_size) in per_core
  train_lbjax = TRAIN_REGION if region else TRAIN_WHOLE
  fractions = []
  for index, (height, width) in enumerate(sizes):
    for position in range(8):
      rng = stream_lib.example_rngs(0, [index * 8 + position])[0]
      box = crops.sample_crop_box(rng, height, width)
      fractions.append(jpeg.decoded_pixel_fraction(height, width, crops.Box(*box),
                                                   (image_size, image_size)))
  scaled = np.mean(np.array(fractions) < 1)
  load_between = load_average()
  worker, worker_cpu = worker_rates(jpegs, image_size, args.worker_batch, args.rounds,
                                    args.worker_batches)
  for label, measured in (("wall clock", worker), ("per CPU second of all processes", worker_cpu)):
    for n, values in measured.items():
      ratios = [v / one for v, one in zip(values, measured[1])]
      rows.append([f"{train_lbjax}, grain workers, {label}", image_size,
                   f"{n} worker process(es)", spread(values), f"{ratio_text(ratios)} vs 1 worker",
                   "-"])
      print(rows[-1], flush=True)
  table = report.markdown_table(
      ["variant", "output side", "parallelism", "images/s, median (min-max)",
       "ratio to baseline, median (min-max)", f"cores for {args.imagenet_target:,.0f} images/s"],
      rows)
  worker_overhead = per_core[(train_lbjax, image_size)] / statistics.median(worker_cpu[1]) - 1

  def at_sides(new, old):
    return ", ".join(f"{versus[(new, old, side)]} at side {side}" for side in args.imagenet_sizes)

  def bound(decode_row):
    return per_core[(decode_row, image_size)] / per_core[(TRAIN_BASELINE, image_size)]

  if region:
    verdict = (
        f"Train, libturbojpeg region decode vs the full-decode baseline: "
        f"{at_sides(TRAIN_REGION, TRAIN_BASELINE)}; vs the baseline without its host "
        f"normalisation: {at_sides(TRAIN_REGION, TRAIN_BASELINE_UINT8)}; vs simplejpeg whole "
        "decode: "
        f"{at_sides(TRAIN_REGION, TRAIN_WHOLE)} (simplejpeg whole vs the baseline: "
        f"{at_sides(TRAIN_WHOLE, TRAIN_BASELINE)}). Eval, region vs the baseline: "
        f"{at_sides(EVAL_REGION, EVAL_BASELINE)} (without its host normalisation: "
        f"{at_sides(EVAL_REGION, EVAL_BASELINE_UINT8)}); vs simplejpeg whole: "
        f"{at_sides(EVAL_REGION, EVAL_WHOLE)}. The region decoder "
        f"({os.path.basename(libturbojpeg.decoder().path)}, from the `turbojpeg` wheel or the system) "
        "entropy-decodes every row down to the crop's last one and inverse-transforms only the "
        "crop's pixels. At side "
        f"{image_size} decoding the regions is "
        f"{per_core[(TRAIN_REGION, image_size)] / per_core[(DECODE_REGIONS, image_size)]:.0%} "
        "of the train transform's CPU time, the rest is window sampling and the resize and flip "
        "(written into the batch). Bounds at side "
        f"{image_size}, in train-baseline units: were window sampling and resize "
        f"free, the train path would run at the rate of decoding the crops' regions alone, "
        f"{bound(DECODE_REGIONS):.2f}x the baseline (decoding them at the smallest M/8 that still "
        "covers the output, any M in 1..8, runs at "
        f"{bound(DECODE_REGIONS_EIGHTHS) / bound(DECODE_REGIONS):.2f}x "
        "the rate at M in 8, 4, 2, 1: libjpeg-turbo's inverse DCTs at 3/8 to 7/8 are plain C, its "
        "SIMD ones are 8/8, 4/8 and 2/8, so `jpeg.dct_scale` keeps those); were also the inverse "
        "DCT, upsampling and "
        "colour conversion free (decoding only the last row, which entropy-decodes all rows "
        f"above it), {bound(DECODE_ENTROPY):.2f}x: the Huffman decoding of the rows above the crop, "
        "which no libjpeg-turbo API skips in a JPEG without restart markers, bounds every CPU "
        "path that reads the stored JPEGs; beyond it: decoding on the GPU or files stored "
        "smaller. ")
  else:
    verdict = (
        f"No libturbojpeg with the TurboJPEG 3 API was found, so the region rows are missing "
        f"(pip install 'lbjax[turbojpeg]'). Train, simplejpeg whole decode vs the baseline: "
        f"{at_sides(TRAIN_WHOLE, TRAIN_BASELINE)}; eval: {at_sides(EVAL_WHOLE, EVAL_BASELINE)}. "
        f"Bound at side {image_size}: were window sampling and resize free, this "
        f"path would run at simplejpeg's full decode rate, {bound(DECODE_SIMPLEJPEG):.2f}x the "
        "baseline. ")
  notes = (
      f"Data: {described}, quality 90, generated at run time (`lbjax.data.synthetic_jpeg`). "
      "Single-process rows: images per CPU second of the process (`time.process_time`: time "
      "the scheduler gives to other jobs is not counted, though they share the caches and the "
      "memory bus), i.e. images/s per core, on one thread, in "
      f"{args.rounds} interleaved rounds of about {args.seconds:g} CPU s; the ratio column divides "
      "by the full-decode baseline of the same transform and output side in the same round (decode "
      "rows by the Pillow decode). All train variants draw the same windows and flips; they "
      "differ in decode and resize, and in where the normalisation runs: `full-decode baseline` "
      "= the ImageNet path before reduced decoding (Pillow decodes the whole JPEG to a numpy "
      "array, as TFDS does; Pillow's antialiased bilinear resizes the window from it; the crop is "
      "normalised to float32 on the host, as that path did), `uint8 out` = the same without "
      "the host normalisation; `PIL draft` (host normalisation too) = an earlier lbjax "
      "path (Pillow's draft mode at the DCT scale covering the crop, Pillow resize); `Pillow full "
      "decode + OpenCV` = lbjax's `decode='full'` path (TFDS decodes with Pillow, "
      "`jpeg.resize_window`); `simplejpeg whole decode + OpenCV` = lbjax's `decode='reduced'` path "
      "where no TurboJPEG 3 library is found (simplejpeg decodes the whole JPEG at the DCT scale "
      "covering the crop); `libturbojpeg region decode + OpenCV` = lbjax's `decode='reduced'` path "
      "with one (`lbjax.data.libturbojpeg`: the pixels the resize reads, the same pixels); lbjax's "
      "rows hand uint8 batches over and the compiled step normalises them on the device "
      "(`Normalization`, not timed here); its eval rows resample the eval window by "
      "`cv2.resize` of the decoded pixels from the origin (`jpeg.resize_window`). Cores "
      f"for {args.imagenet_target:,.0f} images/s = target / per-core rate (reading the "
      "array_record files is not included). " + verdict
      + f"At output side {image_size}, {scaled:.0%} of training crops decode at a DCT scale below "
      "1 (a crop must be at least twice the output on both sides). "
      f"Worker rows: lbjax's train transform ({train_lbjax.removeprefix('train ')}), batches of "
      f"{args.worker_batch} from `WorkerTrainStream` (grain `mp_prefetch`), a fresh pipeline per "
      f"round, {args.worker_batches} batches timed after the first 2 n (worker start-up excluded), "
      f"1 and 2 workers interleaved, on {os.cpu_count()} cores (1-min load average {load_before} at "
      f"the start, {load_between} before the worker rows, {load_average()} at the end; a load near "
      "or above the core count means other jobs shared the cores, and then the wall-clock rows "
      "measure the share of the cores the scheduler gave, not the scaling on free cores). The "
      "per-CPU-second rows divide by the CPU time of the main process and the workers together: "
      "equal rates for 1 and 2 workers mean a second worker adds no work per image. With one "
      f"worker an image costs {worker_overhead:.0%} "
      "more CPU than the same transform in the training process (the batch passes through shared "
      "memory to the main process, which receives and unpacks it).")
  print(table + "\n\n" + notes)
  if not args.no_readme:
    report.write_section("input-pipeline-imagenet",
                         "ImageNet input: full-decode baseline, PIL draft, simplejpeg whole decode, "
                         "libturbojpeg region decode; worker processes",
                         report.header_lines() + "\n" + table + "\n\n" + notes)


DECODER_ROWS = (
    ("decode, full size", "Pillow", "simplejpeg", "OpenCV imdecode", "libturbojpeg"),
    ("decode, the train crops' DCT scale (whole image; libturbojpeg: the crop's region)", "Pillow draft",
     "simplejpeg", "OpenCV IMREAD_REDUCED", "libturbojpeg"),
)


def opencv_decode(encoded: bytes, scale: int = 1) -> np.ndarray:
  """OpenCV's decoder (`cv2.imdecode`, libjpeg-turbo inside OpenCV's wheel) at DCT scale 1/`scale`, RGB."""
  cv2 = jpeg.codecs()[1]
  flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
           8: cv2.IMREAD_REDUCED_COLOR_8}[scale]
  return cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), flags), cv2.COLOR_BGR2RGB)


def pil_draft(encoded: bytes, scale: int) -> np.ndarray:
  """Pillow's decoder at DCT scale 1/`scale` (draft mode), RGB."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  image = Image.open(io.BytesIO(encoded))
  image.draft("RGB", (-(-image.width // scale), -(-image.height // scale)))
  return np.asarray(image.convert("RGB"))


def decoder_part(args) -> None:
  """Each decode path on one core, alone and inside the train and eval transforms (short: for the
  question whether a path earns its place)."""
  import simplejpeg  # pylint: disable=g-import-not-at-top
  load_before = load_average()
  image_size = args.imagenet_sizes[0]
  jpegs = synthetic_jpeg.imagenet_like_jpegs(args.imagenet_images, seed=0)
  scales = [jpeg.dct_scale(box.height, box.width, image_size, image_size)
            for box, _ in (crops.train_window(*jpeg.image_size(j), stream_lib.example_rngs(0, [i])[0])
                           for i, j in enumerate(jpegs))]
  region_decoder = libturbojpeg.decoder()
  if region_decoder is None:
    raise SystemExit("the decoders part compares libturbojpeg too: pip install 'lbjax[turbojpeg]'.")
  regions = train_regions(jpegs, image_size)
  whole = [(8, (0, h), (0, w)) for h, w in map(jpeg.image_size, jpegs)]
  pairs = list(zip(jpegs, scales))
  functions = {
      ("decode, full size", "Pillow"): lambda: [decode_in_full(j) for j in jpegs],
      ("decode, full size", "simplejpeg"): lambda: [simplejpeg.decode_jpeg(j, "RGB") for j in jpegs],
      ("decode, full size", "OpenCV imdecode"): lambda: [opencv_decode(j) for j in jpegs],
      ("decode, full size", "libturbojpeg"): lambda: [region_decoder.decode(j, *r) for j, r in zip(jpegs, whole)],
      (DECODER_ROWS[1][0], "Pillow draft"): lambda: [pil_draft(j, s) for j, s in pairs],
      (DECODER_ROWS[1][0], "simplejpeg"): lambda: [jpeg.decode(j, s) for j, s in pairs],
      (DECODER_ROWS[1][0], "OpenCV IMREAD_REDUCED"): lambda: [opencv_decode(j, s) for j, s in pairs],
      (DECODER_ROWS[1][0], "libturbojpeg"): lambda: [region_decoder.decode(j, *r) for j, r in zip(jpegs, regions)],
  }
  batch = {"label": np.zeros(len(jpegs), np.int64), "image": objects(jpegs)}
  positions = np.arange(len(jpegs))
  for mode, transform in (("train", imagenet.imagenet_train_transform(seed=0, image_size=image_size,
                                                                      num_threads=1)),
                          ("eval", imagenet.imagenet_eval_transform(image_size=image_size, num_threads=1))):
    row = f"{mode} transform (decode + crop + resize, uint8 out)"
    functions[(row, "simplejpeg")] = without_region_decoding(lambda t=transform: t(batch, positions))
    functions[(row, "libturbojpeg")] = lambda t=transform: t(batch, positions)
  rates = cpu_rates(functions, len(jpegs), args.rounds, args.seconds)
  decoders = ("Pillow", "Pillow draft", "simplejpeg", "OpenCV imdecode", "OpenCV IMREAD_REDUCED", "libturbojpeg")
  rows = []
  for row in dict.fromkeys(row for row, _ in rates):
    for decoder in decoders:
      if (row, decoder) in rates:
        values = rates[(row, decoder)]
        ratios = [v / s for v, s in zip(values, rates[(row, "simplejpeg")])]
        rows.append([row, decoder, spread(values), ratio_text(ratios)])
  table = report.markdown_table(["what is timed", "decoder", f"images/s at side {image_size}, median (min-max)",
                                 "ratio to simplejpeg, median (min-max)"], rows)
  notes = (f"{len(jpegs)} JPEGs of `lbjax.data.synthetic_jpeg` (as in section input-pipeline-imagenet), one "
           f"thread, images per CPU second of the process in {args.rounds} interleaved rounds of about "
           f"{args.seconds:g} CPU s, run under `nice`; ratios taken round by round. 1-min load average "
           f"{load_before} at the start and {load_average()} at the end on {os.cpu_count()} cores (other jobs "
           "shared them: CPU time, not wall time, is what is compared). Every decoder is libjpeg-turbo "
           "underneath (Pillow's, simplejpeg's, OpenCV's and the `turbojpeg` wheel's builds); they differ in the "
           "build, the colour conversion and what they can skip: OpenCV decodes to BGR (converted here), "
           "Pillow's draft mode and OpenCV's IMREAD_REDUCED reach the same DCT scales as simplejpeg, only "
           "libturbojpeg's TurboJPEG 3 API decodes a region.")

  def median_ratio(row: str, decoder: str) -> str:
    return ratio_text([v / b for v, b in zip(rates[(row, decoder)], rates[(row, "simplejpeg")])])

  train_row, eval_row = (f"{mode} transform (decode + crop + resize, uint8 out)" for mode in ("train", "eval"))
  verdict = (
      "Which paths stay: simplejpeg is the fastest whole-image decoder here, so it decodes (`decode='reduced'`); "
      f"libturbojpeg's region decode makes the train transform {median_ratio(train_row, 'libturbojpeg')} as fast "
      f"(the eval transform {median_ratio(eval_row, 'libturbojpeg')}: its window is most of the image), so it stays "
      "where its library is found; OpenCV's decoder is slower than simplejpeg at both scales "
      f"({median_ratio('decode, full size', 'OpenCV imdecode')} full size), so OpenCV only resizes; Pillow "
      f"({median_ratio('decode, full size', 'Pillow')}) decodes only what TFDS decodes (`decode='full'`) and the "
      "images libjpeg-turbo does not (CMYK, PNG). The DALI (GPU) path was removed: it had never been measured.")
  notes += " " + verdict
  print(table + "\n\n" + notes)
  if not args.no_readme:
    report.write_section("input-pipeline-decoders", "JPEG decode paths: does each earn its place?",
                         report.header_lines() + "\n" + table + "\n\n" + notes)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=("all", "host", "imagenet", "decoders"), default="all")
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
  if args.part in ("all", "decoders"):
    decoder_part(args)


if __name__ == "__main__":
  main()
