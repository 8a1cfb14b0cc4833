"""Cross-device bytes per step of the PTB embedding and softmax, vocabulary-sharded over `model`.

  JAX_NUM_CPU_DEVICES=8 python -m experiments.tensor_sharding_bytes --out docs/results/tensor_sharded_ptb

The PTB LSTM's embedding (V x D) and softmax (H x V, V) with V = 10,000, D = H = 200 (papers/001 §5.1.2),
split over a `model` mesh axis with `lbjax.parallel.tensor` and the batch over `data`, on 8 simulated
devices as data x model = 8x1, 4x2, 2x4, 1x8. One step is the jitted loss and gradient of
mean cross-entropy(softmax(tanh(embed(tokens)))); its collectives are read from the compiled HLO
(`benchmarks.collectives.collective_bytes`: payload, and bytes one device sends with ring algorithms).
Nothing runs: the step is lowered from abstract shapes. The model-axis floats of
`tensor.vocab_parallel_floats` are listed beside them.
"""

import argparse
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding

from benchmarks.collectives import collective_bytes
from experiments import simulated_devices
from lbjax.parallel import tensor


def step_bytes(data: int, model: int, vocab: int, width: int, batch_size: int, seq_len: int) -> dict:
  mesh = jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
  abstract = lambda shape, spec: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
  specs = tensor.softmax_specs()
  embedding = abstract((vocab, width), tensor.embedding_spec())
  softmax = {"kernel": abstract((width, vocab), specs["kernel"]), "bias": abstract((vocab,), specs["bias"])}
  tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
  embed, cross_entropy = tensor.sharded_embed(mesh), tensor.sharded_cross_entropy(mesh)
  loss = lambda e, s: jnp.mean(cross_entropy(jnp.tanh(embed(e, tokens)), s, tokens))
  hlo = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(embedding, softmax).compile().as_text()
  ops = collective_bytes(hlo)
  return {"data": data, "model": model, "payload": sum(v[1] for v in ops.values()),
          "ring": sum(v[2] for v in ops.values()), "ops": ops,
          "model_floats": sum(tensor.vocab_parallel_floats(batch_size * seq_len // data, width, width).values()) * (model > 1),
          "parameter_floats": (2 * vocab * width + vocab) // model}


def main(argv: Sequence[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", type=int, default=10000)
  parser.add_argument("--width", type=int, default=200)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--seq_len", type=int, default=20)
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  simulated_devices.require(parser, 8, exact=True)
  rows = [step_bytes(8 // m, m, args.vocab, args.width, args.batch_size, args.seq_len) for m in (1, 2, 4, 8)]
  command = simulated_devices.command("experiments.tensor_sharding_bytes", argv)
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
  lines += ["", "With model = 1 the step all-reduces the whole embedding and softmax gradient over `data`; "
            "sharding the vocabulary over `model` divides that all-reduce by the model size and adds all-reduces "
            "of activations (n D + 3n + n H floats for n tokens per data shard), so the bytes fall while the "
            "activations are smaller than the parameters. The payload column also counts the all-reduces XLA emits over "
            "groups of one device (the model axis at model = 1), which send nothing; the ring column does not."]
  pathlib.Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
  return rows


if __name__ == "__main__":
  main()
