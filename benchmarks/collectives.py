"""Cross-device bytes per train step, read from the compiled HLO on 8 simulated CPU devices.

The trainer's step (`lbjax.train.compile_only.abstract_run`: its own step and shardings) is lowered from abstract
shapes (`jax.ShapeDtypeStruct` with shardings; nothing is allocated or run) and compiled for a mesh
of 8 CPU devices with fsdp = 1 (pure data parallelism) and fsdp = 8 (parameters and optimizer state
split). Every collective of the compiled module (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-permute) is summed with its payload, the size of the full array it reduces or
gathers, times the trip count of the loops it sits in, and converted to the bytes one device
sends with ring algorithms (`lbjax.train.hlo_analysis`). The minimum is the same for both meshes: one all-reduce of the
gradients, 2(n-1)/n x the parameter bytes per device (FSDP's reduce-scatter of the gradients
plus all-gather of the parameters sends the same).

    python -m benchmarks.collectives [--no-readme]
"""

import os

os.environ["JAX_NUM_CPU_DEVICES"] = "8"  # before jax is imported (by the imports below)

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position

import jax

from benchmarks import report
from benchmarks import workloads
from lbjax.train import compile_only
from lbjax.train import hlo_analysis

# (fsdp, config.mesh.per_device_gradients) of each measured mesh of 8 devices.
MESHES = ((1, False), (8, False), (1, True))
CASES = (("resnet50", 16, 224), ("mnist_lstm", 64, 28), ("ptb_lstm", 64, 0))


def compiled_hlo(model: str, batch_size: int, image_size: int, fsdp: int,
                 per_device_gradients: bool = False) -> tuple[str, int]:
  """The compiled train step's HLO text and the parameter bytes, for 8 devices and `fsdp`.

  The step is the trainer's own, lowered from abstract inputs (`compile_only.abstract_run`).
  `per_device_gradients`: the `config.mesh.per_device_gradients` step (gradients in `shard_map`, one
  all-reduce), with fsdp = 1.
  """
  config = workloads.trainer_config(model, batch_size, image_size=image_size or 32)
  config.mesh.fsdp = fsdp
  config.mesh.per_device_gradients = per_device_gradients
  if model == "resnet50":
    config.dataset = "synthetic_images"
    config.data_options.num_classes = 1000
    config.data_options.num_train_examples = 16
    config.data_options.num_eval_examples = 16
  run = compile_only.abstract_run(config, jax.devices())
  compiled, _ = compile_only.compile_program(run.programs[0])
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(run.state.params))
  return compiled.as_text(), param_bytes


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(c[0] for c in CASES))
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  wanted = args.models.split(",")
  unknown = sorted(set(wanted) - {c[0] for c in CASES})
  if unknown:
    parser.error(f"--models {','.join(unknown)}: not measured here; choose from {','.join(c[0] for c in CASES)}.")
  rows = []
  for model, batch_size, image_size in CASES:
    if model not in wanted:
      continue
    for fsdp, per_device in MESHES:
      hlo, param_bytes = compiled_hlo(model, batch_size, image_size, fsdp, per_device)
      per_op = hlo_analysis.analyze(hlo).collectives
      payload = sum(values[1] for values in per_op.values())
      wire = sum(values[2] for values in per_op.values())
      minimum = 2 * 7 / 8 * param_bytes
      ops = ", ".join(f"{op} x{count}: {size / 2**20:.2f} MiB"
                      for op, (count, size, _) in sorted(per_op.items()))
      mesh = f"{8 // fsdp} data x {fsdp} fsdp" + (", per-device gradients" if per_device else "")
      rows.append([model, mesh, f"{param_bytes / 2**20:.2f}",
                   f"{payload / 2**20:.2f}", f"{wire / 2**20:.2f}", f"{minimum / 2**20:.2f}",
                   f"{wire / minimum:.2f}", ops])
      print(rows[-1], flush=True)
  table = report.markdown_table(
      ["model", "mesh (8 devices)", "parameter MiB", "collective payload MiB / step",
       "ring MiB sent per device", "minimum MiB sent per device", "ratio to minimum",
       "by op (count: payload)"], rows)
  notes = ("Momentum SGD, float32. Payload = bytes of the full array a collective reduces or "
           "gathers (for reduce-scatter: result x group size), summed over loop trip counts. Ring "
           "bytes sent per device = payload x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, "
           "reduce-scatter and all-to-all, x 1 for collective-permute (n = group size). The minimum "
           "is the same for every mesh: 2(n-1)/n x parameter bytes (one all-reduce of the "
           "gradients; with fsdp a reduce-scatter of the gradients plus an all-gather of the "
           "parameters). `per-device gradients`: config.mesh.per_device_gradients=True (gradients "
           "in shard_map, one all-reduce of the gradient tree; BatchNorm statistics per device). "
           "Batch: ResNet-50 16 x 224x224 images, LSTMs 64 rows; the gradient traffic does not "
           "depend on it.")
  print(table)
  report.publish(args, "collectives", "Cross-device bytes per step (8 simulated devices)", table + "\n\n" + notes)


if __name__ == "__main__":
  main()
