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

Modules: `host`, `imagenet_decode` and `decoders` (the parts), `reference_decoders` (the decode paths
lbjax's are compared with), `timing` (rates, interleaved rounds, medians and ranges).
"""
