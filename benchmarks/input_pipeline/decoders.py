"""Part `decoders`: each JPEG decoder alone and inside lbjax's transforms, ratios to simplejpeg."""

import os

import numpy as np

from benchmarks import report
from benchmarks.input_pipeline.reference_decoders import (decode_in_full, objects, opencv_decode, pil_draft,
                                                          train_regions, without_region_decoding)
from benchmarks.input_pipeline.timing import cpu_rates, load_average, ratio_text, spread
from lbjax.data import crops
from lbjax.data import imagenet
from lbjax.data import jpeg
from lbjax.data import libturbojpeg
from lbjax.data import stream as stream_lib
from lbjax.data import synthetic_jpeg


DECODER_ROWS = (
    ("decode, full size", "Pillow", "simplejpeg", "OpenCV imdecode", "libturbojpeg"),
    ("decode, the train crops' DCT scale (whole image; libturbojpeg: the crop's region)", "Pillow draft",
     "simplejpeg", "OpenCV IMREAD_REDUCED", "libturbojpeg"),
)


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
