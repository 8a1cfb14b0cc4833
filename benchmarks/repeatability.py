"""Two runs of one config, bit for bit: what `config.deterministic` buys on the device at hand.

Each case is trained twice from scratch, each run in a process of its own, once with XLA's defaults
and once with `config.deterministic=True` (XLA's deterministic-ops flags, `lbjax.train.determinism`),
and the two runs' final train states (parameters, optimizer state, BatchNorm statistics) are compared
leaf by leaf. A process of its own, because a GPU chooses some kernels by timing them when a process
compiles its program, and two runs in one process would share that choice. The cases run on the
synthetic twins of their data, so nothing needs a dataset, each on one device (the first):

- `ptb_lstm`: the 2x200 PTB LSTM at B=20 on PTB-shaped tokens (vocabulary 10,000). Its embedding
  gradient is a scatter-add, which a GPU sums with atomics in whatever order its threads finish (issue
  30: two PTB runs on one H200 ended 0.5% apart in perplexity).
- `resnet_tiny`: ResNet-tiny at B=128 on 32x32 class-prototype images (convolutions, BatchNorm, the
  stem's max-pool gradient).

The table says, per case and mode, whether the two final states are bit-identical, the largest
difference between them (max |a - b| over a leaf relative to that leaf's max |b|, the largest over
leaves) and each run's final evaluation loss. CPU runs are deterministic either way; the question is a
GPU's (a `-gpu` section).

    python -m benchmarks.repeatability [--cases ptb_lstm,resnet_tiny] [--steps 50] [--no-readme]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from benchmarks import report
from lbjax import config_files
from lbjax.train import determinism
from lbjax.train import train_and_evaluate

REPO = pathlib.Path(__file__).resolve().parents[1]

# Each case: the packaged config and the overrides that put it on its synthetic twin.
CASES = {
    "ptb_lstm": ("ptb_lstm", ["--config.dataset=synthetic_ptb", "--config.data_options.vocab_size=10000",
                              "--config.data_options.num_train_tokens=200000",
                              "--config.data_options.num_eval_tokens=20000"]),
    "resnet_tiny": ("resnet_tiny_synthetic_cifar", []),
}
MODES = {"XLA's defaults": False, "config.deterministic=True": True}


def train_once(case: str, deterministic: bool, steps: int, out: pathlib.Path) -> None:
  """In a fresh process: trains `case` for `steps` steps on one device (the first) and writes its final
  state's leaves and final evaluation loss to `out` (an .npz). Importing JAX starts no backend:
  `train_and_evaluate` starts it, with XLA's deterministic flags when `deterministic`."""
  spec, overrides = CASES[case]
  config = config_files.load(spec, [*overrides, f"--config.num_steps={steps}", "--config.progress=False",
                                    "--config.mesh.num_devices=1", f"--config.deterministic={deterministic}"]).config
  with tempfile.TemporaryDirectory() as workdir:
    result = train_and_evaluate(config, workdir)
  leaves = {f"leaf{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(jax.device_get(result.state)))}
  np.savez(out, eval_loss=np.float64(result.eval_metrics["loss"]), **leaves)


def compare(first: pathlib.Path, second: pathlib.Path) -> dict:
  """Whether two runs' final states are bit-identical, their largest relative difference, their losses."""
  with np.load(first) as a, np.load(second) as b:
    names = [name for name in a.files if name.startswith("leaf")]
    identical = all(np.array_equal(a[name], b[name]) for name in names)
    largest = 0.0
    for name in names:
      x, y = a[name].astype(np.float64), b[name].astype(np.float64)
      scale = float(np.max(np.abs(y))) if y.size else 0.0
      if scale > 0:
        largest = max(largest, float(np.max(np.abs(x - y))) / scale)
    return {"identical": identical, "largest_difference": largest, "leaves": len(names),
            "eval_losses": [float(a["eval_loss"]), float(b["eval_loss"])]}


def run_twice(case: str, deterministic: bool, steps: int, folder: pathlib.Path) -> dict:
  """Trains `case` twice, each in a process of its own; their comparison and the seconds each took."""
  mode = "deterministic" if deterministic else "defaults"
  outputs, seconds = [], []
  for index in (1, 2):
    out = folder / f"{case}_{mode}_{index}.npz"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.repeatability", "--train-once",
                           json.dumps([case, deterministic, steps, str(out)])],
                          cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
      sys.exit(f"{case} ({mode}), run {index} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    seconds.append(time.perf_counter() - start)
    outputs.append(out)
  return {**compare(*outputs), "seconds": seconds}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
  parser.add_argument("--steps", type=report.positive_int, default=50, help="training steps per run")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  parser.add_argument("--train-once", help=argparse.SUPPRESS)  # the child process: one run, JSON arguments
  args = parser.parse_args()
  if args.train_once:
    case, deterministic, steps, out = json.loads(args.train_once)
    train_once(case, deterministic, steps, pathlib.Path(out))
    return
  cases = [case for case in args.cases.split(",") if case]
  unknown = [case for case in cases if case not in CASES]
  if unknown or not cases:
    parser.error(f"--cases takes some of {', '.join(CASES)}, comma-separated; got {args.cases!r}.")
  given = os.environ.get("XLA_FLAGS", "")
  if any(flag.split("=")[0] in given for flag in determinism.DETERMINISTIC_XLA_FLAGS):
    parser.error("XLA_FLAGS already asks for deterministic ops, so the 'XLA's defaults' runs would not be: unset "
                 "it (each run sets the flags itself when config.deterministic is True).")

  rows = []
  with tempfile.TemporaryDirectory() as folder:
    for case in cases:
      for mode, deterministic in MODES.items():
        result = run_twice(case, deterministic, args.steps, pathlib.Path(folder))
        rows.append([case, mode, "yes" if result["identical"] else "no", f"{result['largest_difference']:.2e}",
                     ", ".join(f"{loss:.6f}" for loss in result["eval_losses"]),
                     ", ".join(f"{s:.0f}" for s in result["seconds"])])
        print(" | ".join(rows[-1]), flush=True)

  table = report.markdown_table(["case", "mode", "bit-identical", "largest difference", "final eval losses",
                                 "seconds per run"], rows)
  notes = (f"Each case trained twice for {args.steps} steps from the same seed, each run in a process of its "
           "own; the final train states compared leaf by leaf. Largest difference: max |a - b| over a leaf "
           "relative to that leaf's max |b|, the largest over the leaves. Seconds per run: the whole process "
           "(start, compile, steps, final evaluation).")
  print("\n" + table + "\n\n" + notes)
  report.publish(args, "repeatability", "Two runs bit for bit: `benchmarks/repeatability.py`", table + "\n\n" + notes)


if __name__ == "__main__":
  main()
