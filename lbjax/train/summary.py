"""The resolved run in a few lines: what `--dry-run` prints, the console shows at start, and
`<workdir>/config.json` records.

`resolved_run(config)` needs neither data nor devices: every name resolved to the function it
imports, with its bound arguments, and the learning-rate recipe after the scaling rule.
"""

from typing import Any

import ml_collections

from lbjax.train import config as config_lib
from lbjax.train import names
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import tasks


def _options(section: ml_collections.ConfigDict) -> str:
  return ", ".join(f"{k}={v!r}" for k, v in section.to_dict().items())


def resolved_run(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The run's settings after resolution, as strings and numbers (JSON-ready)."""
  dataset, dataset_arguments = tasks.resolve_dataset(config)
  model = tasks.resolve_model_name(config)
  peak, warmup_epochs = optimizer_lib.scaled_recipe(config)
  sizes = config_lib.batch_sizes(config)
  compressor = optimizer_lib.resolve_compressor(config)
  return {
      "model": f"{model.qualified_name}({_options(config.model_options)})",
      "dataset": names.describe(dataset, {k: v for k, v in dataset_arguments.items() if v is not None}),
      "optimizer": optimizer_lib.resolve_optimizer(config).describe()
                   + (f", gradients clipped to global norm {config.clip_global_norm:g}"
                      if config.clip_global_norm else ""),
      "batch_size": list(sizes) if len(sizes) > 1 else sizes[0],
      "batch_size_boundaries": list(config.batch_size_boundaries),
      "scaling_rule": f"{config.scaling.rule} from batch {config.scaling.base_batch_size} "
                      f"(LR {config.lr.base:g}, warm-up {optimizer_lib.base_warmup_epochs(config):g} epochs)",
      "learning_rate": peak,
      "warmup_epochs": warmup_epochs,
      "lr_decay": names.describe(*optimizer_lib.resolve_decay(config)),
      "num_epochs": config.num_epochs,
      "num_steps": config.num_steps or None,
      "max_device_batch": config.max_device_batch or None,
      "batch_policy": _options(config.batch),
      "mesh": _options(config.mesh),
      "pipeline": _options(config.pipeline),
      "compression": names.describe(*compressor) if compressor else "none",
      "loss": _options(config.loss),
      "diagnostics": _options(config.diagnostics),
      "eval_batch_size": config.eval_batch_size,
      "seed": config.seed,
      "initial_parameters": (f"from the checkpoint {config.init_from}" if config.init_from
                             else f"drawn with seed {config.seed}"),
  }


def format_run(resolved: dict[str, Any], origin: str = "") -> list[str]:
  """The console lines of a resolved run."""
  sizes = resolved["batch_size"]
  batch = (f"{sizes} at epochs {resolved['batch_size_boundaries']}" if isinstance(sizes, list) else str(sizes))
  length = f"{resolved['num_epochs']:g} epochs" + (f", at most {resolved['num_steps']} steps"
                                                   if resolved["num_steps"] else "")
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
  for key in ("devices", "steps_per_epoch", "parameters"):
    if key in resolved:
      lines.append(f"{key.replace('_', ' '):<9} {resolved[key]}")
  return lines


def _accumulation(resolved: dict[str, Any]) -> str:
  return f", at most {resolved['max_device_batch']} examples per device at once" if resolved["max_device_batch"] else ""
