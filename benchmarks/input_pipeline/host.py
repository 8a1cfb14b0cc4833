"""Part `host`: the MNIST, PTB and CIFAR-10 host pipelines against their models' train steps."""


import numpy as np

from benchmarks import report
from benchmarks import workloads
from benchmarks.input_pipeline.timing import load_average, rate
from lbjax import data as lbdata
from lbjax.data import cifar


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
