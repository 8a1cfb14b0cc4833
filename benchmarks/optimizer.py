"""Speed of one optimizer update (update + apply_updates, jitted, donated buffers).

Compares lbjax's layer-wise optimizers with optax's and with plain momentum SGD on the real ResNet-50
parameter tree (25.6M parameters, 161 leaves) and the PTB LSTM tree, checks that lbjax LARS with the
optax denominator gives optax.lars's numbers, and writes the table into benchmarks/README.md.

    .venv/bin/python benchmarks/optimizer.py [--repeats 30] [--rounds 3] [--no-readme]

Each optimizer is timed in `rounds` interleaved rounds of `repeats` steps; the table gives the median
and the minimum (the machine is shared, so the minimum is the less noisy figure).
"""

import argparse
import datetime
import os
import pathlib
import platform
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lbjax import optim

README = pathlib.Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- optimizer-benchmark:begin -->", "<!-- optimizer-benchmark:end -->"


def resnet50_shapes() -> dict[str, tuple[int, ...]]:
  """The parameter shapes of ResNet-50 v1 (flax layout: HWIO kernels, BN scale/bias, no conv bias)."""
  shapes = {"stem/conv/kernel": (7, 7, 3, 64), "stem/bn/scale": (64,), "stem/bn/bias": (64,)}
  in_features = 64
  for stage, (blocks, features) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
    for block in range(blocks):
      name = f"stage{stage + 1}/block{block + 1}"
      convs = [(1, 1, in_features, features), (3, 3, features, features),
               (1, 1, features, 4 * features)]
      if block == 0:
        convs.append((1, 1, in_features, 4 * features))
      for i, kernel in enumerate(convs):
        label = "proj" if i == 3 else f"conv{i + 1}"
        shapes[f"{name}/{label}/kernel"] = kernel
        shapes[f"{name}/{label}_bn/scale"] = (kernel[-1],)
        shapes[f"{name}/{label}_bn/bias"] = (kernel[-1],)
      in_features = 4 * features
  shapes["head/kernel"] = (2048, 1000)
  shapes["head/bias"] = (1000,)
  return shapes


def ptb_lstm_shapes() -> dict[str, tuple[int, ...]]:
  """The parameter shapes of the 2x200 PTB LSTM (papers/001): embedding, 2 cells, softmax."""
  return {
      "embedding": (10000, 200),
      "lstm1/kernel": (400, 800), "lstm1/bias": (800,),
      "lstm2/kernel": (400, 800), "lstm2/bias": (800,),
      "softmax/kernel": (200, 10000), "softmax/bias": (10000,),
  }


def random_tree(shapes, seed, scale):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray((scale * rng.standard_normal(s)).astype(np.float32))
          for k, s in shapes.items()}


def kernels(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def everything(params):
  return jax.tree.map(lambda _: True, params)


def optimizers(lr=0.1, wd=1e-4):
  """name -> optax.GradientTransformation; LARS variants select the kernels (ndim >= 2)."""
  return {
      "momentum SGD (optax.sgd)": optax.sgd(lr, momentum=0.9),
      "optax.lars": optax.lars(lr, weight_decay=wd, weight_decay_mask=kernels,
                               trust_ratio_mask=kernels),
      "lbjax lars": optim.lars(lr, weight_decay=wd),
      "lbjax lars, optax denominator": optim.lars(lr, weight_decay=wd, denominator="optax"),
      "optax.lamb": optax.lamb(lr, weight_decay=wd),
      "lbjax lamb (all leaves)": optim.lamb(lr, weight_decay=wd, mask=everything),
      "lbjax percent_delta": optim.percent_delta(lr, weight_decay=wd),
      "lbjax mclr": optim.mclr(lr, weight_decay=wd),
  }


def make_step(opt):
  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def time_steps(step, params, state, grads, repeats):
  """Runs `repeats` steps, returns (per-step seconds, params, state)."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    params, state = step(params, state, grads)
    jax.block_until_ready(params)
    times.append(time.perf_counter() - start)
  return times, params, state


def benchmark(shapes, repeats, rounds):
  """(median, min) ms per step of every optimizer, timed in interleaved rounds."""
  grads = random_tree(shapes, seed=1, scale=1e-2)
  runs = {}
  for name, opt in optimizers().items():
    params = random_tree(shapes, seed=0, scale=0.05)
    state = opt.init(params)
    step = make_step(opt)
    _, params, state = time_steps(step, params, state, grads, 2)  # compile and warm up
    runs[name] = [step, params, state, []]
  for _ in range(rounds):
    for run in runs.values():
      times, run[1], run[2] = time_steps(run[0], run[1], run[2], grads, repeats)
      run[3].extend(times)
  return {name: (1e3 * statistics.median(run[3]), 1e3 * min(run[3])) for name, run in runs.items()}


def max_relative_difference(a_opt, b_opt, shapes, steps=3):
  """Largest |a - b| / max|b| over the parameters after `steps` identical updates."""
  grads = random_tree(shapes, seed=1, scale=1e-2)
  results = []
  for opt in (a_opt, b_opt):
    params = random_tree(shapes, seed=0, scale=0.05)
    state = opt.init(params)
    step = make_step(opt)
    for _ in range(steps):
      params, state = step(params, state, grads)
    results.append(params)
  return max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
             for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])))


def numerics(shapes):
  """Comparable pairs: lbjax vs optax with the same definition."""
  ops = optimizers()
  return {
      "lbjax lars (optax denominator) vs optax.lars": max_relative_difference(
          ops["lbjax lars, optax denominator"], ops["optax.lars"], shapes),
      "lbjax lamb (all leaves) vs optax.lamb": max_relative_difference(
          ops["lbjax lamb (all leaves)"], ops["optax.lamb"], shapes),
  }


def cpu_model() -> str:
  """The CPU's model name (from /proc/cpuinfo where there is one)."""
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  if cpuinfo.exists():
    for line in cpuinfo.read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  return platform.processor() or platform.machine()


def markdown(results, diffs, args):
  lines = [
      f"Command: `.venv/bin/python benchmarks/optimizer.py --repeats {args.repeats} "
      f"--rounds {args.rounds}`  ",
      f"Machine: {cpu_model()}, {os.cpu_count()} cores, "
      f"{jax.device_count()} x {jax.devices()[0].device_kind} device, jax {jax.__version__}, "
      f"optax {optax.__version__}  ",
      f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
      "",
      "Milliseconds per update (update + apply_updates, jitted, donated buffers): median and min",
      "over all timed steps; x SGD is the median's ratio to momentum SGD on the same tree.",
      "",
  ]
  names = list(next(iter(results.values())))
  header = "| optimizer | " + " | ".join(
      f"{tree} median | {tree} min | {tree} x SGD" for tree in results) + " |"
  lines += [header, "|---" * (1 + 3 * len(results)) + "|"]
  for name in names:
    cells = []
    for tree in results.values():
      sgd = tree["momentum SGD (optax.sgd)"][0]
      median, fastest = tree[name]
      cells += [f"{median:.1f}", f"{fastest:.1f}", f"{median / sgd:.2f}"]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += ["", "Numerics after 3 steps (max |a - b| / max |b| over leaves):", ""]
  for tree, pairs in diffs.items():
    for pair, diff in pairs.items():
      lines.append(f"- {tree}: {pair}: {diff:.1e}")
  return "\n".join(lines)


def write_readme(table):
  text = README.read_text() if README.exists() else ""
  block = f"{BEGIN}\n{table}\n{END}"
  if BEGIN in text:
    text = re.sub(re.escape(BEGIN) + ".*" + re.escape(END), lambda _: block, text, flags=re.S)
  else:
    text = text.rstrip() + "\n\n" + block + "\n"
  README.write_text(text)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=30, help="steps per round")
  parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  if args.repeats < 1 or args.rounds < 1:
    parser.error("--repeats and --rounds must be >= 1")
  trees = {"ResNet-50": resnet50_shapes(), "PTB LSTM": ptb_lstm_shapes()}
  for name, shapes in trees.items():
    count = sum(int(np.prod(s)) for s in shapes.values())
    print(f"{name}: {len(shapes)} leaves, {count / 1e6:.2f}M parameters")
  results = {name: benchmark(shapes, args.repeats, args.rounds) for name, shapes in trees.items()}
  diffs = {name: numerics(shapes) for name, shapes in trees.items()}
  table = markdown(results, diffs, args)
  print(table)
  if not args.no_readme:
    write_readme(table)


if __name__ == "__main__":
  main()
