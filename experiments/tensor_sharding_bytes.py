"""Cross-device bytes per step of layers sharded over a `model` mesh axis: the PTB embedding and softmax, or
the ResNet-50 head.

  JAX_NUM_CPU_DEVICES=8 python -m experiments.tensor_sharding_bytes --out docs/results/tensor_sharded_ptb
  JAX_NUM_CPU_DEVICES=8 python -m experiments.tensor_sharding_bytes --model resnet50_head \
      --out docs/results/tensor_sharded_resnet50_head

Both on 8 simulated devices as data x model = 8x1, 4x2, 2x4, 1x8, the batch over `data`. One step is the
jitted loss and gradient; its collectives are read from the compiled HLO
(`lbjax.train.hlo_analysis`: payload, and bytes one device sends with ring algorithms).
Nothing runs: the step is lowered from abstract shapes.

* `ptb`: the PTB LSTM's embedding (V x D) and softmax (H x V, V) with V = 10,000, D = H = 200
  (papers/001 §5.1.2), split over `model` with `lbjax.parallel.tensor`; the step is mean
  cross-entropy(softmax(tanh(embed(tokens)))). The model-axis floats of `tensor.vocab_parallel_floats`
  are listed beside them.
* `resnet50_head`: ResNet-50's head (Dense 2048 -> 1000 on the globally average-pooled features),
  sharded as the trainer shards it: the trainer's mesh (`lbjax.train.mesh.build_mesh`), batch sharding,
  and `parameter_shardings` of `ResNet.TENSOR_PARALLEL_SPECS` (the classes over `model`), with XLA's
  partitioner choosing the collectives as in the trainer. The step is the value and gradient of mean
  softmax cross-entropy w.r.t. the head's parameters and the features [B, 2048], whose gradient is
  returned whole on every `model` device, as the body (replicated over `model`) needs it. The
  whole network is not compiled; its data-parallel gradient all-reduce is computed beside.
"""

import argparse
import pathlib
from typing import Sequence

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding

from experiments import runner
from experiments import simulated_devices
from lbjax import models
from lbjax.parallel import tensor
from lbjax.train import hlo_analysis
from lbjax.train import mesh as mesh_lib
from lbjax.train.errors import exit_on_user_errors

DEVICES = 8
MODELS = ("ptb", "resnet50_head")
DEFAULT_BATCH = {"ptb": 64, "resnet50_head": 256}  # resnet50_head: papers/000 Table 4's smallest batch
PTB_SIZES = {"vocab": 10000, "width": 200, "seq_len": 20}


def _ring(floats: int, group: int) -> float:
  """Bytes one device sends in a ring all-reduce of `floats` float32 values over `group` devices:
  2 (g - 1) / g x 4 floats."""
  return 2 * (group - 1) / group * 4 * floats


def _totals(hlo: str) -> dict:
  ops = hlo_analysis.analyze(hlo).collectives
  return {"payload": sum(v[1] for v in ops.values()), "ring": sum(v[2] for v in ops.values()), "ops": ops}


def step_bytes(data: int, model: int, vocab: int, width: int, batch_size: int, seq_len: int) -> dict:
  """The PTB embedding and softmax step on a data x model mesh."""
  mesh = jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
  abstract = lambda shape, spec: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
  specs = tensor.softmax_specs()
  embedding = abstract((vocab, width), tensor.embedding_spec())
  softmax = {"kernel": abstract((width, vocab), specs["kernel"]), "bias": abstract((vocab,), specs["bias"])}
  tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
  embed, cross_entropy = tensor.sharded_embed(mesh), tensor.sharded_cross_entropy(mesh)
  loss = lambda e, s: jnp.mean(cross_entropy(jnp.tanh(embed(e, tokens)), s, tokens))
  hlo = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(embedding, softmax).compile().as_text()
  return {"data": data, "model": model, **_totals(hlo),
          "model_floats": (sum(tensor.vocab_parallel_floats(batch_size * seq_len // data, width, width).values())
                           * (model > 1)),
          "parameter_floats": (2 * vocab * width + vocab) // model}


def resnet50() -> nnx.Module:
  """ResNet-50 (1000 classes) from shapes only: its head, parameter count and `TENSOR_PARALLEL_SPECS`."""
  return nnx.eval_shape(lambda: models.ResNet50(rngs=nnx.Rngs(0)))


def head_step_bytes(data: int, model: int, network: nnx.Module, batch_size: int) -> dict:
  """The ResNet head step on the trainer's data x model mesh, with the trainer's shardings.

  Model-axis floats per device (n = batch_size / data examples per data shard, F features): the
  cross-entropy's three all-reduces of n (max logit, sum of exponentials, label logit; as
  `tensor.vocab_parallel_floats`' softmax) and the features' gradient, n F; over `data`, the head's
  gradient shard (F C + C) / model and the loss.
  """
  mesh = mesh_lib.build_mesh(data=data, model=model)
  graphdef, params = nnx.split(network.head, nnx.Param)
  params = {"head": nnx.to_pure_dict(params)}
  shardings = mesh_lib.parameter_shardings(mesh, params, mesh_lib.tensor_parallel_specs(mesh, network))
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, shardings)
  features_size, classes = params["head"]["kernel"].shape
  batch = mesh_lib.batch_sharding(mesh)
  features = jax.ShapeDtypeStruct((batch_size, features_size), jnp.float32, sharding=batch)
  labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=batch)
  loss = lambda p, x, y: models.softmax_cross_entropy(nnx.merge(graphdef, p["head"])(x), y)
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)),
                 out_shardings=(mesh_lib.replicated(mesh), (shardings, batch)))
  hlo = step.lower(abstract, features, labels).compile().as_text()
  softmax = tensor.vocab_parallel_floats(batch_size // data, 0, features_size)["softmax_forward"]
  features_gradient = batch_size // data * features_size
  head_floats = features_size * classes + classes
  total = sum(x.size for x in jax.tree.leaves(nnx.state(network, nnx.Param)))
  return {"data": data, "model": model, **_totals(hlo),
          "specs": {f"head/{k}": s.spec for k, s in shardings["head"].items()},
          "model_floats": (softmax + features_gradient) * (model > 1), "parameter_floats": head_floats // model,
          "features": features_size, "classes": classes, "network_floats": total, "head_floats": head_floats,
          "network_data_ring": _ring(total - head_floats + head_floats // model, data)}


def _ptb_markdown(args: argparse.Namespace, rows: list[dict], command: str) -> list[str]:
  lines = ["# Vocabulary-sharded PTB embedding and softmax: bytes per step", "",
           f"V = {args.vocab}, D = H = {args.width}, global batch {args.batch_size} x {args.seq_len} tokens, "
           f"float32, jax {jax.__version__}, 8 simulated CPU devices; from the compiled HLO of the loss-and-gradient "
           "step (nothing runs).", "", "```", command, "```", "",
           "| data x model | parameter floats per device (E, W, b) | model-axis floats (embedding fwd + 3 softmax "
           "all-reduces + hidden gradient) | collective payload MB | MB sent per device (ring) |",
           "|---|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['data']} x {r['model']} | {r['parameter_floats']:,} | {r['model_floats']:,} | "
                 f"{r['payload'] / 1e6:.3f} | {r['ring'] / 1e6:.3f} |")
  return lines + [
      "", "With model = 1 the step all-reduces the whole embedding and softmax gradient over `data`; "
      "sharding the vocabulary over `model` divides that all-reduce by the model size and adds all-reduces "
      "of activations (n D + 3n + n H floats for n tokens per data shard), so the bytes fall while the "
      "activations are smaller than the parameters. The payload column also counts the all-reduces XLA emits over "
      "groups of one device (the model axis at model = 1), which send nothing; the ring column does not."]


def _head_markdown(args: argparse.Namespace, rows: list[dict], command: str) -> list[str]:
  first = rows[0]
  sharded = ", ".join(f"{k} {v}" for k, v in next(r for r in rows if r["model"] > 1)["specs"].items())
  head_alone, network = _ring(first["head_floats"], DEVICES), _ring(first["network_floats"], DEVICES)
  lines = ["# ResNet-50 head sharded over `model`: bytes per step", "",
           f"The head (Dense {first['features']} -> {first['classes']}, {first['head_floats']:,} parameters) on the "
           f"globally average-pooled features, global batch {args.batch_size} ({args.batch_size // DEVICES} per "
           "device at data = 8; the default, 256, is papers/000 Table 4's smallest), float32, "
           f"jax {jax.__version__}, 8 simulated CPU devices; from the compiled HLO of the value and gradient of the "
           "mean cross-entropy w.r.t. the head's parameters and the features (nothing runs, the body is not "
           f"compiled). Shardings as in the trainer: `ResNet.TENSOR_PARALLEL_SPECS` ({sharded}) through "
           "`lbjax.train.mesh.parameter_shardings`, batch over `data`, XLA's partitioner.", "",
           "```", command, "```", "",
           "| data x model | head parameter floats per device (W, b) | model-axis floats (3 softmax all-reduces "
           "+ features gradient) | collective payload MB | MB sent per device (ring) | computed: ResNet-50 gradient "
           "all-reduce over `data`, MB sent per device (ring) |",
           "|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['data']} x {r['model']} | {r['parameter_floats']:,} | {r['model_floats']:,} | "
                 f"{r['payload'] / 1e6:.3f} | {r['ring'] / 1e6:.3f} | {r['network_data_ring'] / 1e6:.3f} |")
  return lines + [
      "", "Computed, for context (2 (g - 1) / g x 4 bytes per float, g devices): the head's gradient alone, "
      f"all-reduced over 8 data-parallel devices, sends {head_alone / 1e6:.3f} MB per device; the whole "
      f"ResNet-50's ({first['network_floats']:,} floats) {network / 1e6:.3f} MB. "
      "The last column is the whole network's gradient all-reduce over `data` with the head sharded: the body's "
      "gradient whole plus 1/model of the head's (none at data = 1, where every `model` device computes the body's "
      "whole gradient on the same batch). The measured columns are the head's step alone: its gradient shard and "
      f"the loss all-reduced over `data`, and over `model` n ({first['features']} + 3) floats for n = batch / data "
      "examples per data shard; the ring column is 2 (g - 1) / g of the payload for each all-reduce over g devices."]


def main(argv: Sequence[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=MODELS, default="ptb",
                      help="ptb: the PTB embedding and softmax; resnet50_head: the ResNet-50 head")
  parser.add_argument("--vocab", type=int, help=f"ptb only (default {PTB_SIZES['vocab']})")
  parser.add_argument("--width", type=int, help=f"ptb only (default {PTB_SIZES['width']})")
  parser.add_argument("--seq_len", type=int, help=f"ptb only (default {PTB_SIZES['seq_len']})")
  parser.add_argument("--batch_size", type=int, help="global batch (default "
                      f"{', '.join(f'{n} for {m}' for m, n in DEFAULT_BATCH.items())})")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out)
  given = [f"--{name}" for name in PTB_SIZES if getattr(args, name) is not None]
  if args.model != "ptb" and given:
    parser.error(f"{', '.join(given)} size the PTB layers; the ResNet-50 head's sizes are the model's "
                 "(2048 features, 1000 classes): leave them out with --model resnet50_head.")
  for name, default in PTB_SIZES.items():
    if getattr(args, name) is None:
      setattr(args, name, default)
  if args.batch_size is None:
    args.batch_size = DEFAULT_BATCH[args.model]
  if args.width < 1 or args.seq_len < 1 or args.vocab < 1 or args.vocab % DEVICES:
    parser.error(f"--width and --seq_len must be >= 1 and --vocab a positive multiple of {DEVICES} (split over up "
                 f"to {DEVICES} devices), got {args.width}, {args.seq_len} and {args.vocab}.")
  if args.batch_size < 1 or args.batch_size % DEVICES:
    parser.error(f"--batch_size must be a positive multiple of {DEVICES} (the data axis is up to {DEVICES} "
                 f"devices), got {args.batch_size}.")
  simulated_devices.require(parser, DEVICES, exact=True)
  command = simulated_devices.command("experiments.tensor_sharding_bytes", argv)
  meshes = [(DEVICES // m, m) for m in (1, 2, 4, 8)]
  if args.model == "ptb":
    rows = [step_bytes(d, m, args.vocab, args.width, args.batch_size, args.seq_len) for d, m in meshes]
    lines = _ptb_markdown(args, rows, command)
  else:
    network = resnet50()
    rows = [head_step_bytes(d, m, network, args.batch_size) for d, m in meshes]
    lines = _head_markdown(args, rows, command)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
  return rows


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.tensor_sharding_bytes"):
    main()
