"""The papers' largest runs compiled for TPU pod topologies, on a machine without a TPU: fits, memory,
collectives, and XLA's estimated step, epoch and recipe times, beside the published records.

  python -m experiments.tpu_pod_plan --out docs/results/tpu_pod_plan

Needs libtpu (`pip install 'lbjax[tpu]'`). Each entry of `ENTRIES` is a packaged config, its overrides
and a topology, compiled by `lbjax.train.compile_only.compile_run` (the run's train step; no data
read, nothing initialised) and stored in `<out>.json` as it finishes; a rerun skips the entries
already there (a ResNet-50 on 2,048 devices compiles in about 2 CPU-minutes), so the script resumes
after an interruption, and `--only KEY,...` compiles a subset. `<out>.md` is rendered from `<out>.json`
each time, the entries not yet compiled listed as such.

Calibration: XLA's `optimal_seconds` is its cost model's estimate of a step, not a measurement. The
`calibration` entry (ResNet-50, B=1,024, on a v3-8 = `v3:2x2`, 8 TensorCores) is compared with a
published time for that slice, and the ratio published / estimated scales the ResNet-50 estimates of
the table (`calibrated` column); the ratio is a property of one model on one chip generation, so it
is applied to ResNet-50 on v3 only.
"""

import argparse
import dataclasses
import json
import pathlib
import time

from experiments import runner
from lbjax.train.errors import exit_on_user_errors
from lbjax.train import compile_only
from lbjax import config_files

IMAGENET_TRAIN = 1_281_167


@dataclasses.dataclass(frozen=True)
class Entry:
  key: str
  config: str
  topology: str
  overrides: tuple[str, ...] = ()
  record: str = ""  # the published result it compares with


RN50_LEGW_RECORD = ("papers/001 Table 1 (LEGW, 90 epochs, top-5 93.2-93.6% at 1K-32K); hardware time not reported "
                    "for LEGW")
ENTRIES = (    Entry("calibration", "resnet50_imagenet:batch=1024", "v3:2x2", (),
          "one Cloud TPU v3-8: ResNet-50 in 302 min (Google, Cloud TPU Pods beta, May 2019); calibrated = published "
          "by construction"),
    Entry("mnist_lstm_8k", "mnist_lstm:batch=8192,rule=legw", "v5p:2x2x1", (),
          "papers/001 Fig. 5: MNIST LSTM at 8K with LEGW (accuracy; no hardware time)"),
    Entry("ptb_lstm_640", "ptb_lstm:batch=640,rule=legw", "v5p:2x2x1", (),
          "papers/001 Fig. 5: PTB LSTM at 640 with LEGW (perplexity; no hardware time)"),
    Entry("ptb_lstm_8k", "ptb_lstm:batch=8192,rule=legw", "v5p:2x2x1", (),
          "papers/001 Figs. 6-7 mention the PTB run at 8K"),
    Entry("ptb_lstm_640_pipeline", "ptb_lstm:batch=640,rule=legw", "v4:2x2x1",
          ("--config.mesh.stage=2", "--config.pipeline.num_microbatches=4", "--config.eval_batch_size=40"),
          "papers/004 GPipe layout: 2 stages x 2 data shards, 4 micro-batches "
          "(docs/results/model_parallel_ptb.md on CPU)"),
    Entry("ptb_lstm_640_tensor", "ptb_lstm:batch=640,rule=legw", "v4:2x2x1",
          ("--config.mesh.model=2", "--config.eval_batch_size=40"),
          "papers/004 tensor layout: vocabulary sharded over model=2 (docs/results/tensor_sharded_ptb.md)"),
    Entry("rn50_32k_v3_pod", "resnet50_imagenet:batch=32768", "v3:32x32", (),
          "Ying et al. 2018 (arXiv:1811.06992): ResNet-50 to 76.3% top-1 in 2.2 min on a full v3 pod (1,024 chips)"),
    Entry("rn50_8k_v3_pod", "resnet50_imagenet:batch=8192", "v3:32x32", (),
          "Goyal et al. 2017: B=8K in 1 hour on 256 P100 GPUs (76.3% top-1)"),
    Entry("rn50_64k_v3_pod", "resnet50_imagenet:batch=65536", "v3:32x32", (), RN50_LEGW_RECORD),
    Entry("rn50_32k_v4_pod", "resnet50_imagenet:batch=32768", "v4:8x8x16", (), "as rn50_32k_v3_pod, on v4"),
    Entry("rn50_32k_v5p_pod", "resnet50_imagenet:batch=32768", "v5p:8x16x16", (), "as rn50_32k_v3_pod, on v5p"),
    Entry("rn50_32k_tpu7x_pod", "resnet50_imagenet:batch=32768", "tpu7x:8x8x16", (),
          "as rn50_32k_v3_pod, on TPU7x (Ironwood: 1,024 chips, 2,048 TensorCores)"),
)

# Published times used for calibration and comparison (seconds).
PUBLISHED_V3_8_RN50_SECONDS = 302 * 60  # 90 epochs (the reference recipe) on one v3-8, Cloud TPU Pods beta (2019)
PUBLISHED_V3_POD_RN50_SECONDS = 2.2 * 60  # Ying et al. 2018, 1,024 v3 chips


def compile_entry(entry: Entry) -> dict:
  loaded = config_files.load(entry.config, list(entry.overrides))
  start = time.perf_counter()
  report = compile_only.compile_run(loaded.config, entry.topology, evaluation=False)
  figures = report.to_json()
  figures.update(key=entry.key, config=" ".join([entry.config, *entry.overrides]),
                 wall_seconds=round(time.perf_counter() - start, 1), lines=report.lines())
  return figures


def _gib(n):
  return "?" if n is None else f"{n / 2**30:.2f}"


def _memory(result: dict) -> str:
  """An entry's memory per device: at least the compiler's figure where it refused a step ("?" without one)."""
  memory = result["memory_per_device_bytes"]
  return "?" if memory is None else ("≥ " if result.get("memory_per_device_is_lower_bound") else "") + _gib(memory)


def _duration(seconds):
  if seconds is None:
    return "n/a"
  if seconds < 1:
    return f"{seconds * 1e3:.1f} ms"
  return f"{seconds:.1f} s" if seconds < 10 else (f"{seconds:.0f} s" if seconds < 300 else f"{seconds / 60:.1f} min")


def calibration_factor(results: dict) -> float | None:
  """Published v3-8 step time / XLA's estimate for the same step (ResNet-50, B=1,024)."""
  entry = results.get("calibration")
  if not entry or not entry.get("estimated_step_seconds"):
    return None
  steps = 90 * (IMAGENET_TRAIN // 1024)
  return PUBLISHED_V3_8_RN50_SECONDS / steps / entry["estimated_step_seconds"]


def render(results: dict, command: str) -> str:
  factor = calibration_factor(results)
  lines = [
      "# The papers at pod scale, on paper: compiled for TPU topologies without a TPU",
      "",
      f"Command: `{command}` (needs `pip install 'lbjax[tpu]'`; resumes, skipping entries already in "
      "`tpu_pod_plan.json`). Each row is the config's train step built as `lbjax-train --compile-only --topology "
      "NAME` builds it (no data read, nothing initialised) and compiled by libtpu for that topology on a CPU "
      "machine: `lbjax/train/compile_only.py`.",
      "",
      "**Every time in this table is an estimate**: XLA's TPU cost model (`cost_analysis()['optimal_seconds']`, "
      "scaled for loop trip counts, `lbjax/train/compile_report.py`), not a measurement on a TPU. Memory "
      "(`memory_analysis()`), FLOPs and the collective bytes (read from the compiled HLO) are the compiler's "
      "figures for the compiled program. HBM per device: 16 GiB for a v3 TensorCore (a v3 device is a "
      "core), 32 GiB for a v4 chip and 95 GB for a v5p chip (megacore: a device is a chip), 96 GiB for a TPU7x "
      "TensorCore (a TPU7x device is a core again, half of a 192 GiB chip), "
      "`lbjax/train/topology.py` after the Cloud TPU docs. "
      "Topology names count chips: `v3:32x32` is 1,024 chips = 2,048 TensorCores, the full v3 pod (Cloud's "
      "`v3-2048`).",
      "",
      "| entry | config | topology | devices | mesh | fits | memory / device (GiB) | all-reduce / device (MiB) | "
      "all-reduce / f32 gradient | other collectives (MiB) | FLOPs / step | est. step | est. epoch | est. recipe | "
      "calibrated recipe | published record |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for entry in ENTRIES:
    r = results.get(entry.key)
    if r is None:
      lines.append(f"| {entry.key} | `{' '.join([entry.config, *entry.overrides])}` | {entry.topology} | "
                   f"not compiled yet | | | | | | | | | | | | {entry.record} |")
      continue
    step = next(s for s in r["steps"] if s["step"] != "eval")
    collectives = r["collective_bytes"]
    others = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in collectives.items() if v and k != "all-reduce") or "-"
    flops = r["flops_per_step"]
    mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1) or "1"
    calibrated = "-"
    if factor and entry.config.startswith("resnet50") and entry.topology.startswith("v3") and \
        step.get("estimated_recipe_seconds"):
      calibrated = _duration(factor * step["estimated_recipe_seconds"])
    lines.append(
        f"| {entry.key} | `{r['config']}` | {entry.topology} | {r['devices']} {r['device_kind']} | {mesh} | "
        f"{'yes' if r['fits'] else '**no**'} | {_memory(r)} of {_gib(r['hbm_bytes'])} | "
        f"{collectives['all-reduce'] / 2**20:.1f} | {collectives['all-reduce'] / step['memory']['parameters']:.2f} | "
        f"{others} | "
        f"{'?' if flops is None else f'{flops:.3g}'} | "
        f"{_duration(r['estimated_step_seconds'])} | {_duration(step.get('estimated_epoch_seconds'))} | "
        f"{_duration(r['estimated_recipe_seconds'])} ({r['epochs']:g} ep.) | {calibrated} | {entry.record} |")
  lines += [
      "",
      "`all-reduce / f32 gradient`: the all-reduce bytes per device over the bytes of the float32 parameters "
      "(the gradient a data-parallel step sums). `n/a`: XLA's cost model gave no estimate for the program "
      "(`optimal_seconds` < 0). `≥`: the compiler refused the step for lack of memory, and its figure for what the "
      "step needed is a lower bound (`?`: it gave none). The LSTM rows are uncalibrated: an LSTM step is a chain "
      "of small sequential matmuls, latency-bound on a TPU in a way the cost model does not see, so their times are "
      "lower bounds only.",
      "", "## Calibration", ""]
  if factor is None:
    lines.append("The calibration entry is not compiled yet.")
  else:
    estimate = results["calibration"]["estimated_step_seconds"]
    published_step = PUBLISHED_V3_8_RN50_SECONDS / (90 * (IMAGENET_TRAIN // 1024))
    lines += [
        f"ResNet-50 at B=1,024 on a v3-8 (`v3:2x2`, 128 images per TensorCore): XLA estimates "
        f"{estimate * 1e3:.1f} ms per step ({1024 / estimate:,.0f} images/s). Google's published time for "
        "ResNet-50 on one Cloud TPU v3-8, 302 minutes (Cloud TPU Pods beta announcement, May 2019, as reported "
        "by TechCrunch; taken here as the reference recipe's 90 epochs at B=1,024, i.e. 112,590 steps, evaluation "
        f"and input pipeline included), is {published_step * 1e3:.1f} ms per step ({1024 / published_step:,.0f} "
        f"images/s). Ratio published / estimated = **{factor:.2f}**: XLA's cost model is a lower bound of the "
        "step (perfect overlap, no input pipeline, no host), and the ResNet-50 rows on v3 are multiplied by it "
        "(`calibrated recipe`).",
    ]
    pod = results.get("rn50_32k_v3_pod")
    if pod and pod.get("estimated_recipe_seconds"):
      lines += ["", f"Check at pod scale: the calibrated B=32K recipe on the full v3 pod is "
                f"{_duration(factor * pod['estimated_recipe_seconds'])} of training steps for 90 epochs (evaluation "
                f"not included), against Ying et al.'s 2.2 min for their own implementation on the same pod; the "
                f"uncalibrated XLA figure is {_duration(pod['estimated_recipe_seconds'])}."]
  compiled = [results[e.key] for e in ENTRIES if e.key in results]
  lines += ["", "## Findings", "",
            f"- {sum(r['fits'] for r in compiled)} of the {len(compiled)} compiled entries fit their devices' HBM."]
  half = [r["key"] for r in compiled
          if r["collective_bytes"]["all-reduce"] < 0.6 * r["steps"][0]["memory"]["parameters"]]
  if half:
    lines.append(f"- All-reduce bytes about half the float32 gradient ({', '.join(half)}): these models compute in "
                 "bfloat16 (`model_options.dtype`), and XLA all-reduces the kernels' partial gradients in bfloat16 "
                 "(the all-reduce operands in the compiled HLO are `bf16` arrays) before the cast to the float32 "
                 "parameters: the gradient is summed across the devices in bfloat16.")
  lines += ["", "## Compile output", ""]
  for entry in ENTRIES:
    if entry.key in results:
      r = results[entry.key]
      lines += [f"### {entry.key} (compiled in {r['wall_seconds']:.0f} s wall)", "", "```", *r["lines"], "```", ""]
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m experiments.tpu_pod_plan", description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="docs/results/tpu_pod_plan", help="writes <out>.json and <out>.md")
  parser.add_argument("--only", default="", help="comma-separated entry keys to compile (default: all)")
  parser.add_argument("--render-only", action="store_true", help="render <out>.md from <out>.json, compile nothing")
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out)
  if args.render_only and args.only:
    parser.error("--render-only renders <out>.md from <out>.json and compiles nothing: drop --only, or drop "
                 "--render-only to compile those entries.")
  out = pathlib.Path(args.out)
  store = out.with_suffix(".json")
  if args.render_only and not store.is_file():
    parser.error(f"--render-only renders {out.with_suffix('.md')} from {store}, which does not exist: compile the "
                 f"entries into it first with `python -m experiments.tpu_pod_plan --out {args.out}` (needs libtpu).")
  results = json.loads(store.read_text()) if store.exists() else {}
  wanted = {k for k in args.only.split(",") if k}
  unknown = wanted - {e.key for e in ENTRIES}
  if unknown:
    parser.error(f"--only: unknown entries {sorted(unknown)}; they are {', '.join(e.key for e in ENTRIES)}.")
  command = f"python -m experiments.tpu_pod_plan --out {args.out}"
  for entry in ENTRIES:
    if args.render_only or entry.key in results or (wanted and entry.key not in wanted):
      continue
    print(f"{entry.key}: {entry.config} {' '.join(entry.overrides)} on {entry.topology}", flush=True)
    results[entry.key] = compile_entry(entry)
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(results, command))
  out.with_suffix(".md").write_text(render(results, command))
  print(f"Written: {out.with_suffix('.md')}")


if __name__ == "__main__":
  with exit_on_user_errors("tpu_pod_plan"):
    main()
