"""Part `imagenet`: ImageNet-like JPEGs through each train and eval transform on one core, and lbjax's
train path on grain worker processes."""

import os
import statistics
import time

import numpy as np

from benchmarks import report
from benchmarks.input_pipeline.reference_decoders import (DECODE_BASELINE, DECODE_ENTROPY, DECODE_REGIONS,
                                                          DECODE_REGIONS_EIGHTHS, DECODE_SIMPLEJPEG, EVAL_BASELINE,
                                                          EVAL_BASELINE_UINT8, EVAL_REGION, EVAL_WHOLE, TRAIN_BASELINE,
                                                          TRAIN_BASELINE_UINT8, TRAIN_REGION, TRAIN_WHOLE,
                                                          decode_in_full, objects, reference_transforms, train_regions,
                                                          without_region_decoding)
from benchmarks.input_pipeline.timing import cpu_rates, cpu_seconds_with_children, load_average, ratio_text, spread
from lbjax.data import crops
from lbjax.data import imagenet
from lbjax.data import jpeg
from lbjax.data import libturbojpeg
from lbjax.data import stream as stream_lib
from lbjax.data import synthetic_jpeg
from lbjax.data import workers


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
