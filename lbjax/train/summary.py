"""The resolved run in a few lines: what `--dry-run` prints, the console shows at start, and
`<workdir>/config.json` records.

`resolved_run(run)` needs neither data nor devices: it shows the typed parts of a `ResolvedRun`,
every name as the function it imports with its bound arguments, and the learning-rate recipe after
the scaling rule.
"""

from typing import Any

from lbjax.train import names
from lbjax.train.resolved import ResolvedRun


def _fields(**values: Any) -> str:
  return ", ".join(f"{k}={v!r}" for k, v in values.items())


def resolved_run(run: ResolvedRun) -> dict[str, Any]:
  """The run's settings after resolution, as strings and numbers (JSON-ready)."""
  learning_rate, batch, mesh = run.learning_rate, run.batch, run.mesh
  peak, warmup_epochs = learning_rate.recipe(batch.first)
  dataset_arguments = {k: v for k, v in run.dataset.arguments.items() if v is not None}
  return {
      "model": names.describe(run.model.resolved, run.model.options),
      "dataset": names.describe(run.dataset.resolved, dataset_arguments),
      "optimizer": run.optimizer.describe()
                   + (f", gradients clipped to global norm {run.clip_global_norm:g}" if run.clip_global_norm else ""),
      "batch_size": list(batch.sizes) if len(batch.sizes) > 1 else batch.first,
      "batch_size_boundaries": list(batch.boundaries),
      "scaling_rule": f"{learning_rate.rule.resolved.name} from batch {learning_rate.base_batch_size} "
                      f"(LR {learning_rate.base:g}, warm-up {learning_rate.base_warmup_epochs:g} epochs)",
      "learning_rate": peak,
      "warmup_epochs": warmup_epochs,
      "lr_decay": learning_rate.decay.describe(),
      "num_epochs": run.num_epochs,
      "num_steps": run.num_steps or None,
      "steps_per_call": run.steps_per_call,
      "train_data_on_device": run.train_data_on_device,
      "max_device_batch": batch.max_device_batch or None,
      "batch_policy": batch.describe(),
      "mesh": _fields(data=mesh.data, fsdp=mesh.fsdp, num_devices=mesh.num_devices,
                      per_device_gradients=mesh.per_device_gradients, stage=mesh.stage, model=mesh.model),
      "pipeline": _fields(num_microbatches=mesh.pipeline_microbatches, remat=mesh.pipeline_remat),
      "compression": run.compressor.describe() if run.compressor else "none",
      "loss": _fields(discard_fraction=run.discard_fraction, discard_until_epoch=run.discard_until_epoch),
      "diagnostics": _fields(lipschitz_every=run.watch.lipschitz_every,
                             lipschitz_batch_size=run.watch.lipschitz_batch_size),
      "profile": run.watch.profile.describe(),
      "eval_batch_size": batch.eval_batch_size,
      "seed": run.seed,
      "initial_parameters": f"from the checkpoint {run.init_from}" if run.init_from else f"drawn with seed {run.seed}",
  }


def format_run(resolved: dict[str, Any], origin: str = "") -> list[str]:
  """The console lines of a resolved run."""
  sizes = resolved["batch_size"]
  batch = (f"{sizes} at epochs {resolved['batch_size_boundaries']}" if isinstance(sizes, list) else str(sizes))
  length = f"{resolved['num_epochs']:g} epochs" + (f", at most {resolved['num_steps']} steps"
                                                   if resolved["num_steps"] else "")
  if resolved["steps_per_call"] > 1:
    length += f"; {resolved['steps_per_call']} steps per device call"
  if resolved.get("train_data_on_device"):
    length += "; training set held on the devices"
  lines = [f"run       {origin}"] if origin else []
  lines += [
      f"model     {resolved['model']}",
      f"data      {resolved['dataset']}",
      f"optimizer {resolved['optimizer']}",
      f"batch     {batch} (global){_accumulation(resolved)}; {length}",
      f"LR        peak {resolved['learning_rate']:.6g}, warm-up {resolved['warmup_epochs']:.6g} epochs; "
      f"scaling {resolved['scaling_rule']}; decay {resolved['lr_decay']}",
      f"mesh      {resolved['mesh']}; seed {resolved['seed']}; eval batch {resolved['eval_batch_size']}"
      + (f"; compression {resolved['compression']}" if resolved["compression"] != "none" else ""),
  ]
  if "policy='schedule'" not in resolved["batch_policy"] or "micro_batch_size=0" not in resolved["batch_policy"]:
    lines.append(f"batch by  {resolved['batch_policy']}")
  if resolved.get("pipeline", "num_microbatches=1, remat=False") != "num_microbatches=1, remat=False":
    lines.append(f"pipeline  {resolved['pipeline']}")
  if "discard_fraction=0.0" not in resolved["loss"].split(", "):
    lines.append(f"loss      {resolved['loss']}")
  if "lipschitz_every=0" not in resolved["diagnostics"].split(", "):
    lines.append(f"diagnose  {resolved['diagnostics']}")
  if resolved.get("profile", "off") != "off":
    lines.append(f"profile   {resolved['profile']}")
  for key in ("devices", "steps_per_epoch", "parameters"):
    if key in resolved:
      lines.append(f"{key.replace('_', ' '):<9} {resolved[key]}")
  return lines


def _accumulation(resolved: dict[str, Any]) -> str:
  return f", at most {resolved['max_device_batch']} examples per device at once" if resolved["max_device_batch"] else ""
