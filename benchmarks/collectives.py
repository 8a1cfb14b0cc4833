"""Cross-device bytes per train step, read from the compiled HLO on 8 simulated CPU devices.

The trainer's step (`lbjax.train.compile_only.abstract_run`: its own step and shardings) is lowered from abstract
shapes (`jax.ShapeDtypeStruct` with shardings; nothing is allocated or run) and compiled for a mesh
of 8 CPU devices with fsdp = 1 (pure data parallelism) and fsdp = 8 (parameters and optimizer state
split). Every collective of the compiled module (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-permute) is summed with its payload, the size of the full array it reduces or
gathers, times the trip count of the loops it sits in, and converted to the bytes one device
sends with ring algorithms. The minimum is the same for both meshes: one all-reduce of the
gradients, 2(n-1)/n x the parameter bytes per device (FSDP's reduce-scatter of the gradients
plus all-gather of the parameters sends the same).

    python -m benchmarks.collectives [--no-readme]
"""

import os

os.environ["JAX_NUM_CPU_DEVICES"] = "8"  # before jax is imported (by the imports below)

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import collections
import math
import re

import jax

from benchmarks import report
from benchmarks import workloads
from lbjax.train import compile_only

# (fsdp, config.mesh.per_device_gradients) of each measured mesh of 8 devices.
MESHES = ((1, False), (8, False), (1, True))
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(r"=\s*(?P<result>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) +
                 r")(?P<start>-start)?\(")
_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4,
          "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_TRIP = re.compile(r"\"known_trip_count\":\{\"n\":\"(\d+)\"")
_CALLS = re.compile(r"(?:to_apply|calls|true_computation|false_computation|branch_computations)="
                    r"\{?%?([\w.\-]+)")

CASES = (("resnet50", 16, 224), ("mnist_lstm", 64, 28), ("ptb_lstm", 64, 0))


def _shape_bytes(text: str) -> int:
  return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
             for dtype, dims in _SHAPE.findall(text))


def _group_size(line: str) -> int:
  """Number of devices in each replica group of a collective's HLO line."""
  mesh_form = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
  if mesh_form:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh_form.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", mesh_form.group(2)))
  iota_form = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
  if iota_form:
    return int(iota_form.group(2))
  explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
  return len(explicit.group(1).split(",")) if explicit else 1


def _ring_factor(op: str, group_size: int) -> float:
  """Bytes each device sends per payload byte with ring algorithms (all-reduce = RS + AG)."""
  if op == "collective-permute":
    return 1.0
  share = (group_size - 1) / group_size
  return 2 * share if op == "all-reduce" else share


def collective_bytes(hlo: str) -> dict[str, tuple[int, int, float]]:
  """op name -> (count, payload bytes, ring bytes sent per device) per execution of the module.

  Collectives inside `while` bodies are multiplied by the loop's known trip count.
  """
  computations, current, entry = collections.defaultdict(list), None, None
  for line in hlo.splitlines():
    match = _COMPUTATION.match(line)
    if match and not line[:1].isspace():
      current = match.group("name")
      if match.group(1):
        entry = current
      continue
    if current is not None:
      computations[current].append(line)

  totals = collections.defaultdict(lambda: [0, 0, 0.0])

  def visit(name: str, multiplier: int, depth: int = 0) -> None:
    if depth > 50:
      return
    for line in computations.get(name, ()):
      op = _OP.search(line)
      if op:
        name, size, payload = op.group("op"), _group_size(line), _shape_bytes(op.group("result"))
        if name == "reduce-scatter":  # the result is one shard of the reduced array
          payload *= size
        totals[name][0] += multiplier
        totals[name][1] += multiplier * payload
        totals[name][2] += multiplier * payload * _ring_factor(name, size)
      if " while(" in line:
        body = re.search(r"body=%?([\w.\-]+)", line).group(1)
        trip = _TRIP.search(line)
        visit(body, multiplier * (int(trip.group(1)) if trip else 1), depth + 1)
      elif " fusion(" not in line:
        for callee in _CALLS.findall(line):
          visit(callee, multiplier, depth + 1)

  visit(entry, 1)
  return {op: tuple(values) for op, values in totals.items()}


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
      per_op = collective_bytes(hlo)
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
