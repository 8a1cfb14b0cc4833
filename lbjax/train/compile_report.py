"""The figures of `--compile-only`: per compiled step and for the run; printed and written to `compile.json`.

Per device, from `compiled.memory_analysis()`: arguments (parameters, optimizer state, batch, ...),
outputs, the part of the outputs aliased to donated arguments, temporaries (activations kept for the
backward pass and XLA's scratch) and the generated code; the step needs

  memory = arguments + outputs - aliased + temporaries + generated code

(MaxText's `train_compile.py` total, plus the code), against the device's HBM (`lbjax.train.topology`):
it **fits** when memory <= HBM. The eval step (and the Lipschitz probe) takes the parameters and model
state but not the rest of the train state, which is not donated to it: the optimizer and compression
state stay resident beside it, and it fits when memory + resident <= HBM.

From `compiled.cost_analysis()`: XLA's FLOPs and its estimated step time (`optimal_seconds`), both per
device. XLA's cost analysis counts a loop body once (an LSTM's
time steps, an accumulation loop), so where the program has loops both are scaled by the matmul
FLOPs counted per iteration over those counted once (`hlo_analysis.HloFigures.loop_flop_ratio`).
Every time figure is XLA's cost-model estimate, not a measurement. A deviceless GPU has no cost
analysis: its FLOPs are those of the dots and convolutions (cuDNN and cuBLAS calls) in the compiled
HLO (`flops_counted`), and it has no time estimate. From the HLO too, on every platform: the kernels
a step launches (`hlo_analysis.HloFigures.kernels`) and the bytes they read and write (`kernel_bytes`),
printed for GPUs, where a step of many short kernels takes about as long as launching them and its
elementwise and reduction kernels as long as their memory traffic.

The one clock: a recipe of E_i epochs at each batch size B_i of the schedule takes
sum_i E_i * steps_per_epoch(B_i) * estimated_step_seconds(B_i) (evaluation not included), its stages
walked in order and cut at `config.num_steps` steps when that is > 0 (`recipe_stages`).
"""

from collections.abc import Callable
import dataclasses
import json
import math
import pathlib
import re
from typing import Any

import jax

from lbjax.train.hlo_analysis import COLLECTIVES, HloFigures
from lbjax.train.resolved import ResolvedRun

COMPILE_FILE = "compile.json"
# Who counted a program's FLOPs: XLA's cost analysis (every operation), or, where it gives none (a deviceless
# GPU), the dots and convolutions of the compiled HLO (`hlo_analysis`).
FLOPS_FROM_COST_ANALYSIS, FLOPS_FROM_MATMULS = "xla_cost_analysis", "matmuls_in_hlo"
# The programs that run beside training, not in a step (`compile_only.Program.per_step` 0), by name: what the report
# calls them, and the config field of their batch size.
MEASUREMENTS = {"eval": "eval step", "lipschitz": "Lipschitz probe"}
MEASUREMENT_BATCH_FIELDS = {"eval": "config.eval_batch_size", "lipschitz": "config.diagnostics.lipschitz_batch_size"}


def _tree_bytes(tree: Any) -> int:
  """Bytes per device of a tree of sharded ShapeDtypeStructs (the largest shard)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * leaf.dtype.itemsize
  return total


@dataclasses.dataclass(frozen=True)
class ProgramFigures:
  """One compiled program's figures (`program_figures`); memory and time per device."""
  name: str
  batch_size: int
  num_microbatches: int
  per_step: float
  memory_per_device_bytes: int | None
  memory: dict[str, int]
  flops_per_device: float | None
  collective_bytes: dict[str, int]
  estimated_seconds: float | None
  compile_seconds: float | None
  compiler_message: str = ""  # the compiler's out-of-memory figures, where it refused the program
  flops_counted: str = FLOPS_FROM_COST_ANALYSIS  # who counted `flops_per_device`
  kernels: int | None = None  # the kernels one run of the program launches (`hlo_analysis.HloFigures.kernels`)
  kernel_bytes: float | None = None  # the bytes they read and write (`hlo_analysis.HloFigures.kernel_bytes`)
  steps_per_call: int = 1  # training steps one run of the program takes (`config.steps_per_call`)
  discard_fraction: float = 0.0  # the fraction of smallest losses the train step discards (papers/003 §3.1)
  all_reduce_16bit_bytes: int = 0  # the all-reduce bytes summed in bf16/f16 (`HloFigures`)
  resident_bytes: int = 0  # the train state that stays on the device beside it, not its argument (the eval step's)

  def fits(self, hbm_bytes: int | None) -> bool:
    if self.compiler_message:
      return False
    return hbm_bytes is None or self.memory_per_device_bytes + self.resident_bytes <= hbm_bytes


def program_figures(program, compiled, hlo: HloFigures, state, compile_seconds: float) -> ProgramFigures:
  """The figures of one compiled program (`compile_only.Program`) of the run whose abstract state is `state`."""
  stats = compiled.memory_analysis()
  memory = {**_state_memory(state),
            "arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
            "aliased": stats.alias_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
            "generated_code": stats.generated_code_size_in_bytes}
  total = (memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temporaries"]
           + memory["generated_code"])
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  ratio = hlo.loop_flop_ratio
  flops, counted = cost.get("flops"), FLOPS_FROM_COST_ANALYSIS
  if flops is not None:
    flops *= ratio
  elif hlo.matmul_flops:
    flops, counted = hlo.matmul_flops, FLOPS_FROM_MATMULS
  # Scaled as a whole by the matmul FLOP ratio: the work outside the loops too (docs/running.md, an overestimate
  # where the loops' matmuls are small).
  seconds = cost.get("optimal_seconds")
  return ProgramFigures(program.name, program.batch_size, program.num_microbatches, program.per_step, total, memory,
                        flops, hlo.collective_bytes, None if seconds is None or seconds < 0 else seconds * ratio,
                        compile_seconds, all_reduce_16bit_bytes=hlo.all_reduce_16bit_bytes,
                        steps_per_call=program.steps_per_call, flops_counted=counted, kernels=hlo.kernels,
                        kernel_bytes=hlo.kernel_bytes, resident_bytes=_tree_bytes(program.resident_state),
                        discard_fraction=program.discard_fraction)


# XLA:TPU's out-of-memory message, needed then available HBM: libtpu 0.0.50.1 (with jax 0.12) says "the total memory
# required for HLO temporaries (43.56G) exceeds available HBM (15.48G)", libtpu 0.0.40 (jax 0.10) "Used 43.02G of
# 15.48G hbm".
COMPILER_HBM_FIGURES = (r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", r"Used ([\d.]+)G of ([\d.]+)G hbm")


def compiler_hbm_figures(message: str) -> tuple[int, int] | None:
  """The bytes the compiler needed and the HBM it had, from its out-of-memory `message` (its G read as 2**30 bytes),
  or None where it gives no figures."""
  found = next(filter(None, (re.search(pattern, message) for pattern in COMPILER_HBM_FIGURES)), None)
  return None if found is None else (round(float(found.group(1)) * 2**30), round(float(found.group(2)) * 2**30))


def _state_memory(state) -> dict[str, int]:
  """Per device: the run's parameters, optimizer state and compression state (held by the train step as its
  arguments, and beside the eval step as resident state)."""
  return {"parameters": _tree_bytes(state.params), "optimizer_state": _tree_bytes(state.opt_state),
          "compression_state": _tree_bytes(state.compression_state)}


def out_of_memory_figures(program, message: str, state) -> ProgramFigures:
  """A program the compiler refused for lack of memory, with the compiler's own figures and what the state of the
  run (`state`, abstract) holds: the parameters and the optimizer state, which decide whether fsdp is the remedy.
  Its memory is the compiler's "needed" figure (a lower bound: libtpu counts its temporaries), None without one."""
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  figures = [line for line in lines if any(w in line for w in ("Used", "Exceeded", "memory", "hbm", "HBM"))]
  needed = compiler_hbm_figures(message)
  return ProgramFigures(program.name, program.batch_size, program.num_microbatches, program.per_step,
                        None if needed is None else needed[0],
                        _state_memory(state),
                        None, dict.fromkeys(COLLECTIVES, 0), None, None, " ".join((figures or lines)[:3])[:600],
                        steps_per_call=program.steps_per_call, resident_bytes=_tree_bytes(program.resident_state),
                        discard_fraction=program.discard_fraction)


def _resident_state_words(memory: dict[str, int]) -> str:
  """What stays resident beside the eval step or the probe: "the optimizer state", or with a compressor's state too."""
  return "the optimizer and compression state" if memory["compression_state"] else "the optimizer state"


def _gib(n: float | None) -> str:
  if n is None:
    return "?"
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _duration(seconds: float | None) -> str:
  if seconds is None:
    return "?"
  if seconds < 1:
    return f"{seconds * 1e3:.2f} ms"
  if seconds < 120:
    return f"{seconds:.1f} s"
  return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclasses.dataclass(frozen=True)
class Stage:
  """A stretch of the recipe trained by one step: its batch size and loss variant (the fraction of smallest losses
  it discards, papers/003 §3.1), its epochs and training steps."""
  batch_size: int
  discard_fraction: float
  epochs: float
  steps: float


def recipe_stages(resolved: ResolvedRun, steps_per_epoch: Callable[[int], int]) -> list[Stage]:
  """The recipe of `resolved` as the run trains it: each batch size of the schedule for its
  epochs (one clock: boundaries in epochs, up to `num_epochs`), split where the discarding of small losses ends
  (`discard_until_epoch`; a stage's loss variant is `ResolvedRun.discard_fraction_at` its start, as the run
  chooses it), in order, and no more than `num_steps` steps in all when that is > 0; `steps_per_epoch(batch_size)`
  the data's."""
  edges = [0.0, *resolved.batch.boundaries, resolved.num_epochs]
  steps_left = resolved.num_steps or math.inf
  stages = []
  for i, size in enumerate(resolved.batch.sizes):
    start, end = min(edges[i], edges[-1]), max(min(edges[i + 1], edges[-1]), min(edges[i], edges[-1]))
    ends_inside = resolved.discard_fraction > 0 and start < resolved.discard_until_epoch < end
    cuts = [start, resolved.discard_until_epoch, end] if ends_inside else [start, end]
    per_epoch = steps_per_epoch(size)
    for first, last in zip(cuts, cuts[1:]):
      steps = min((last - first) * per_epoch, steps_left)
      steps_left -= steps
      epochs = steps / per_epoch if steps < (last - first) * per_epoch else last - first
      stages.append(Stage(size, resolved.discard_fraction_at(first), epochs, steps))
  return stages


def step_record(parts: list[ProgramFigures], size: int, steps_per_epoch: int | None, epochs: float,
                hbm: int | None) -> dict[str, Any]:
  """One step (a train step, the any-batch pair at one batch size, the eval step or the Lipschitz probe) as a report
  record.

  `hbm` is the device memory the step must fit in (None: unknown); `steps_per_epoch` None for the `MEASUREMENTS`.
  """
  first = parts[0]
  if first.name in MEASUREMENTS:
    seconds = first.estimated_seconds
  elif all(p.estimated_seconds is not None for p in parts):
    seconds = sum(p.per_step * p.estimated_seconds for p in parts)
  else:
    seconds = None
  flops = (sum((p.per_step or 1.0) * p.flops_per_device for p in parts)
           if all(p.flops_per_device is not None for p in parts) else None)
  kernels = (round(sum((p.per_step or 1.0) * p.kernels for p in parts))
             if all(p.kernels is not None for p in parts) else None)
  kernel_bytes = (sum((p.per_step or 1.0) * p.kernel_bytes for p in parts)
                  if all(p.kernel_bytes is not None for p in parts) else None)
  record = {
      "step": first.name if first.name in MEASUREMENTS else ("any_batch" if len(parts) > 1 else "train"),
      "batch_size": size, "discard_fraction": first.discard_fraction, "num_microbatches": first.num_microbatches,
      "steps_per_call": first.steps_per_call,
      "programs": [p.name for p in parts],
      "memory_per_device_bytes": max(p.memory_per_device_bytes for p in parts) if all(
          p.memory_per_device_bytes is not None for p in parts) else None,
      "resident_bytes": max(p.resident_bytes for p in parts),
      "memory": parts[0].memory if len(parts) == 1 else {p.name: p.memory for p in parts},
      "fits": all(p.fits(hbm) for p in parts),
      "flops_per_device": flops,
      "flops_counted": FLOPS_FROM_MATMULS if any(p.flops_counted == FLOPS_FROM_MATMULS for p in parts)
                       else FLOPS_FROM_COST_ANALYSIS,
      "kernels_per_step": kernels,
      "kernel_bytes_per_step": kernel_bytes,
      "collective_bytes": {k: sum(int((p.per_step or 1.0) * p.collective_bytes[k]) for p in parts)
                           for k in COLLECTIVES},
      "all_reduce_16bit_bytes": sum(int((p.per_step or 1.0) * p.all_reduce_16bit_bytes) for p in parts),
      "estimated_step_seconds": seconds,
      "compile_seconds": sum(p.compile_seconds or 0.0 for p in parts),
      "compiler_message": " ".join(p.compiler_message for p in parts if p.compiler_message),
  }
  if steps_per_epoch is not None:
    epoch = None if seconds is None else seconds * steps_per_epoch
    record.update(steps_per_epoch=steps_per_epoch, estimated_epoch_seconds=epoch, epochs=epochs,
                  estimated_recipe_seconds=None if epoch is None else epoch * epochs)
  return record


@dataclasses.dataclass
class CompileReport:
  """The run's compiled steps and their figures (`compile_only.compile_run`)."""
  topology: str | None
  platform: str
  devices: int
  device_kind: str
  mesh: dict[str, int]
  hbm_bytes: int | None
  hbm_source: str
  data_from_files: bool
  steps: list[dict[str, Any]]
  epochs: float
  estimated_recipe_seconds: float | None
  notes: list[str] = dataclasses.field(default_factory=list)  # settings of the run the compile leaves out
  held_bytes: int = 0  # per device, the training set it holds (config.train_data_on_device) beside the programs
  num_steps: int = 0  # > 0: the run stops after this many steps (config.num_steps), and so does the recipe

  @property
  def available_bytes(self) -> int | None:
    """The device memory the programs must fit in: its HBM less the training set it holds."""
    return None if self.hbm_bytes is None else self.hbm_bytes - self.held_bytes

  @classmethod
  def build(cls, config, topology, run, device, memory, figures: list[ProgramFigures],
            notes: list[str] = ()) -> "CompileReport":
    epochs: dict[tuple[int, float], float] = {}
    for stage in run.stages:  # a schedule may come back to a size: its step's epochs are those of every stage
      key = (stage.batch_size, stage.discard_fraction)
      epochs[key] = epochs.get(key, 0.0) + stage.epochs
    # What the programs must fit in: the device's memory, less the training set it holds (config.train_data_on_device).
    available = None if memory.bytes is None else memory.bytes - run.held_bytes
    steps, recipe = [], 0.0
    trained = [f for f in figures if f.name not in MEASUREMENTS]
    for size, discard in dict.fromkeys((f.batch_size, f.discard_fraction) for f in trained):  # in the run's order
      parts = [f for f in trained if (f.batch_size, f.discard_fraction) == (size, discard)]
      steps.append(step_record(parts, size, run.data.steps_per_epoch(size), epochs.get((size, discard), 0.0),
                               available))
      if recipe is not None and steps[-1]["estimated_recipe_seconds"] is not None:
        recipe += steps[-1]["estimated_recipe_seconds"]
      else:
        recipe = None
    steps += [step_record([f], f.batch_size, None, 0.0, available) for f in figures if f.name in MEASUREMENTS]
    return cls(topology, device.platform, run.mesh.size, device.device_kind, dict(run.mesh.shape), memory.bytes,
               memory.source, run.data.read_from_data, steps, float(config.num_epochs), recipe, list(notes),
               run.held_bytes, config.num_steps)

  @property
  def fits(self) -> bool:
    return all(step["fits"] for step in self.steps)

  def headline(self) -> dict[str, Any]:
    """The train step with the largest memory (the one that decides whether the run fits)."""
    train = [s for s in self.steps if s["step"] not in MEASUREMENTS]
    return max(train, key=lambda s: (not s["fits"], s["memory_per_device_bytes"] or 0, s["batch_size"]))

  @property
  def memory_per_device_bytes(self) -> int | None:
    """The most memory a device needs for any step (the eval step's with the state resident beside it); None where
    the compiler refused a step without saying how much it needed (the figure would read as small)."""
    if any(s["memory_per_device_bytes"] is None for s in self.steps):
      return None
    return max(s["memory_per_device_bytes"] + s["resident_bytes"] for s in self.steps)

  def to_json(self) -> dict[str, Any]:
    head = self.headline()
    return {
        "topology": self.topology, "platform": self.platform, "devices": self.devices,
        "device_kind": self.device_kind, "mesh": self.mesh, "hbm_bytes": self.hbm_bytes, "hbm_source": self.hbm_source,
        "fits": self.fits,
        "memory_per_device_bytes": self.memory_per_device_bytes,
        # A refused step's memory is the compiler's figure for what it needed: the step needs at least that.
        "memory_per_device_is_lower_bound": any(s["compiler_message"] for s in self.steps),
        "batch_size": head["batch_size"],
        "flops_per_step": None if head["flops_per_device"] is None else head["flops_per_device"] * self.devices,
        "flops_counted": head["flops_counted"], "kernels_per_step": head["kernels_per_step"],
        "kernel_bytes_per_step": head["kernel_bytes_per_step"],
        "collective_bytes": head["collective_bytes"],
        "estimated_step_seconds": head["estimated_step_seconds"],
        "estimated_recipe_seconds": self.estimated_recipe_seconds, "epochs": self.epochs, "num_steps": self.num_steps,
        "estimates": "time figures are XLA's cost-model estimates (cost_analysis optimal_seconds), not measurements",
        "data_shapes_read_from_files": self.data_from_files,
        "notes": self.notes,
        "steps": self.steps,
    }

  def write(self, workdir) -> pathlib.Path:
    path = pathlib.Path(workdir) / COMPILE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
    return path

  def lines(self) -> list[str]:
    where = f"topology {self.topology}" if self.topology else f"the local {self.platform} devices"
    mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
    out = [f"Compiled for {where}: {self.devices} {self.device_kind} device(s), mesh {mesh}; "
           f"HBM per device {_gib(self.hbm_bytes)} ({self.hbm_source})."]
    for step in self.steps:
      name = {"train": "train step", "any_batch": "any-batch step (accumulate + apply)",
              **MEASUREMENTS}[step["step"]]
      micro = f", {step['num_microbatches']} micro-batches" if step["num_microbatches"] > 1 else ""
      if step["discard_fraction"]:
        micro += f", discarding the smallest losses (loss.discard_fraction={step['discard_fraction']:g})"
      if step["steps_per_call"] > 1:
        micro += f" ({step['steps_per_call']} steps per call; figures per step, memory per call)"
      out.append(f"  {name} at batch {step['batch_size']}{micro}: "
                 f"{'fits' if step['fits'] else 'DOES NOT FIT'}")
      if step["compiler_message"]:
        out.append(f"    the compiler ran out of memory: {step['compiler_message']}")
        continue
      memory = step["memory"] if step["step"] != "any_batch" else max(step["memory"].values(),
                                                                      key=lambda m: m["temporaries"])
      if step["resident_bytes"]:
        out.append(f"    memory per device {_gib(step['memory_per_device_bytes'])} of {_gib(self.hbm_bytes)}, beside "
                   f"{_resident_state_words(memory)} {_gib(step['resident_bytes'])} resident "
                   f"({_gib(step['memory_per_device_bytes'] + step['resident_bytes'])} in all): parameters "
                   f"{_gib(memory['parameters'])}, activations and temporaries {_gib(memory['temporaries'])}")
      else:
        out.append(f"    memory per device {_gib(step['memory_per_device_bytes'])} of {_gib(self.hbm_bytes)}: "
                   f"parameters {_gib(memory['parameters'])}, optimizer state {_gib(memory['optimizer_state'])}, "
                   f"activations and temporaries {_gib(memory['temporaries'])}")
      flops = step["flops_per_device"]
      collectives = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in step["collective_bytes"].items() if v) or "none"
      counted = "; its dots and convolutions, counted in the compiled HLO" if (
          step["flops_counted"] == FLOPS_FROM_MATMULS) else ""
      out.append(f"    FLOPs per step {'?' if flops is None else f'{flops * self.devices:.3g}'} "
                 f"({'?' if flops is None else f'{flops:.3g}'} per device{counted}); collectives per device: "
                 f"{collectives}")
      if self.platform == "gpu" and step["kernels_per_step"] is not None:
        traffic = ("" if step["kernel_bytes_per_step"] is None
                   else f", reading and writing {_gib(step['kernel_bytes_per_step'])}")
        out.append(f"    kernels launched per step {step['kernels_per_step']:,} (fusions, cuDNN/cuBLAS calls and "
                   f"copies; a loop's per iteration){traffic}")
      summed_in_16_bits = step["all_reduce_16bit_bytes"] > 0.01 * step["collective_bytes"]["all-reduce"]
      if step["step"] not in MEASUREMENTS and summed_in_16_bits:
        low = step["all_reduce_16bit_bytes"] / 2**20
        out.append(f"    of the all-reduce, {low:.1f} MiB is summed in 16-bit floats: the gradients are added across "
                   "the devices in bfloat16 (a ResNet's model_options.param_dtype_gradients=True makes its kernel "
                   "gradients in float32 first; mesh.per_device_gradients=True sums each device's float32 gradient "
                   "where each device holds whole BatchNorm groups; docs/running.md)")
      if step["step"] not in MEASUREMENTS and step["estimated_step_seconds"] is None:
        out.append(f"    estimated step: none (XLA's cost model gave no estimate for this program); epoch "
                   f"{step['steps_per_epoch']} steps, {step['epochs']:g} epochs")
      elif step["step"] not in MEASUREMENTS:
        out.append(f"    estimated step {_duration(step['estimated_step_seconds'])}, epoch "
                   f"({step['steps_per_epoch']} steps) {_duration(step['estimated_epoch_seconds'])}, "
                   f"{step['epochs']:g} epochs {_duration(step['estimated_recipe_seconds'])}")
    length = f"{self.epochs:g} epochs" + (f", at most {self.num_steps} steps" if self.num_steps else "")
    out.append(f"Recipe ({length}): estimated {_duration(self.estimated_recipe_seconds)} of training "
               "steps (XLA's cost-model estimate; evaluation not included).")
    if self.data_from_files:
      out.append("(The batch shapes were read from one batch of the data: the dataset is not in "
                 "lbjax.train.abstract_data.SHAPES.)")
    return out + [f"Note: {note}" for note in self.notes]

  def _examples_that_fit(self, step: dict[str, Any], at_once: int) -> int:
    """A guess at the examples per device that fit: `at_once` scaled by HBM / memory needed (the compiler's
    figures where it refused the step), since activations grow with the examples; the largest divisor of
    `at_once` below that, so that the share splits into whole micro-batches."""
    need, available = compiler_hbm_figures(step["compiler_message"]) or (step["memory_per_device_bytes"] or 0,
                                                                          self.available_bytes or 0)
    scaled = at_once * available / need if need and available else at_once / 2
    return next(d for d in range(max(int(min(scaled, at_once / 2)), 1), 0, -1) if at_once % d == 0)

  def does_not_fit_message(self) -> str:
    """What does not fit, by how much, and what to change."""
    step = next(s for s in self.steps if not s["fits"])
    name = MEASUREMENTS.get(step["step"], "train step")
    held = (f", {_gib(self.available_bytes)} of it beside the training set it holds ({_gib(self.held_bytes)})"
            if self.held_bytes else "")
    memory = step["memory"] if step["step"] != "any_batch" else next(iter(step["memory"].values()))
    resident = (f" beside {_resident_state_words(memory)} that stays resident while it runs "
                f"({_gib(step['resident_bytes'])}), {_gib(step['memory_per_device_bytes'] + step['resident_bytes'])} "
                "in all" if step["resident_bytes"] and step["memory_per_device_bytes"] is not None else "")
    need = (f"the compiler ran out of memory ({step['compiler_message']})" if step["compiler_message"] else
            f"it needs {_gib(step['memory_per_device_bytes'])} per device{resident}; a {self.device_kind} device has "
            f"{_gib(self.hbm_bytes)}{held}")
    available = self.available_bytes
    data_parallel = self.mesh.get("data", 1) * self.mesh.get("fsdp", 1)
    share = step["batch_size"] // max(data_parallel, 1)
    lines = [f"The {name} at batch {step['batch_size']} does not fit: {need}. What to change:"]
    state_bytes = memory["parameters"] + memory["optimizer_state"] if memory else 0
    fsdp = (f"  - parameters and optimizer state ({_gib(state_bytes)} per device) split over devices: "
            f"--config.mesh.fsdp=N (now {self.mesh.get('fsdp', 1)})")
    if self.held_bytes:
      lines.append(f"  - the training set on the host: --config.train_data_on_device=False (it takes "
                   f"{_gib(self.held_bytes)} of each device)")
    if available and state_bytes >= available:
      lines.append(fsdp + "; they alone exceed the device's memory")
    at_once = share // max(step["num_microbatches"], 1)
    if step["step"] in MEASUREMENTS:
      lines.append(f"  - a smaller {MEASUREMENT_BATCH_FIELDS[step['step']]} (now {step['batch_size']}, {share} per "
                   "device)")
    elif at_once > 1:
      fitting = self._examples_that_fit(step, at_once)
      lines.append(f"  - fewer examples per device at once: --config.max_device_batch={fitting} "
                   f"(now {at_once} of the {share} per device; the step then accumulates micro-batches)")
    if memory and not (available and state_bytes >= available):
      lines.append(fsdp)
    lines.append("  - rematerialisation: pipeline the model (--config.mesh.stage=S) with --config.pipeline.remat=True "
                 "to recompute activations in the backward pass")
    if step["memory_per_device_bytes"] and available:
      device_bytes = step["memory_per_device_bytes"] + step["resident_bytes"]
      lines.append(f"  - a larger slice: about {math.ceil(device_bytes / available)}x the "
                   f"{self.devices} devices, or a chip with more HBM")
    else:
      lines.append(f"  - a larger slice than {self.devices} devices, or a chip with more HBM")
    return "\n".join(lines)

