"""Scripts that reproduce the papers' tables and figures from the configs of `lbjax.configs` (or a config
file) with the public lbjax API.

* `sweep`: a baseline config x scaling rules x batch sizes -> CSV, markdown table and plot
  (final test metric vs batch size, like Figure 1 of papers/001).
* `batch_schedule`: decaying LR vs increasing batch vs hybrid (papers/002) -> table and plots of
  test accuracy vs epochs and vs parameter updates.
* `variant_table`: named variants of a config (hypotheses, LR grids at a fixed batch, ablations), each
  with seeds -> table and plot; the tables live in `experiments/tables/*.json`.
* `lr_grid`, `mclr_vs_lars`, `lipschitz`, `noise_scale`, `by_epoch`: see their docstrings.

Every script that trains runs does so through `runner.run_once` (a run is trained once: a finished or
diverged run is read back, an interrupted one resumes), whose outcome is a `runner.RunRow`; list
arguments are read with `runner.ints` and `runner.floats`.

Every script takes `--config` as `lbjax-train` does: a packaged config (`mnist_lstm`) or a config file
(`path/to/my_config.py`), either optionally with `:variant` keys; configs are loaded with
`lbjax.config_files.load`.
"""

from collections.abc import Hashable, Mapping

from lbjax import config_files
from lbjax import train


def config_spec(config: str, *variants: str) -> str:
  """`config` (`name[:variant]` or `path.py[:variant]`) with more variant keys appended.

  `config_spec("mnist_lstm:epochs=5", "batch=512")` is `"mnist_lstm:epochs=5,batch=512"`; a key given
  twice takes its last value.
  """
  source, _, variant = config.partition(":")
  keys = ",".join(v for v in (variant, *variants) if v)
  return f"{source}:{keys}" if keys else source


def run_specs(config: str, variant: str, own_keys: Mapping[Hashable, str]) -> dict[Hashable, str]:
  """The spec of each run of an experiment: `config` with the run's own keys (`own_keys[run]`, e.g.
  "run=legw,seed=0") and the keys every run shares (`variant`), less the shared keys the run's own presets make
  moot (`lbjax.configs.Variant.only_with`: `large_batch` is the LEGW run's, not the baseline's).

  Raises:
    lbjax.train.ConfigError: a shared key that applies to none of the runs.
  """
  specs = {run: config_spec(config, own, variant) for run, own in own_keys.items()}
  moot = {run: config_files.moot_keys(spec) for run, spec in specs.items()}
  unused = set.intersection(*(set(keys) for keys in moot.values()))
  if unused:
    raise train.ConfigError(f"variant {'keys' if len(unused) > 1 else 'key'} {', '.join(sorted(unused))} "
                            f"{'apply' if len(unused) > 1 else 'applies'} to none of the experiment's runs: "
                     + " ".join(next(iter(moot.values()))[key] for key in sorted(unused)))
  return {run: config_files.without_keys(spec, moot[run]) for run, spec in specs.items()}


def variant_fields(spec: str) -> set[str]:
  """The config fields that the variant of `spec` sets (`mnist_lstm:epochs=2` -> {"num_epochs"});
  a preset key (one without a field, e.g. `recipe`) counts as its own name.

  Raises:
    lbjax.train.ConfigError: an unknown config or variant key.
  """
  source, _, variant = spec.partition(":")
  declared = getattr(config_files.config_module(source), "VARIANTS", {})
  return {declared[key].field or key for key in config_files.parse_variant(variant, declared, source)}


def fields_the_experiment_sets(given: set[str], set_by: dict[str, str], where: str) -> str:
  """The refusal of settings an experiment would overwrite run by run, or "" when `given` has none.

  `given`: the fields a user set (`variant_fields(spec)`, override keys); `set_by`: each field (or section, such as
  "optimizer", which covers "optimizer.momentum") that the experiment sets itself -> what sets it ("--lrs", "each
  run"); `where`: where the user set them, for the message.
  """
  def owner(field: str) -> str | None:
    return next((key for key in set_by if field == key or field.startswith(f"{key}.")), None)

  fixed = sorted(f for f in given if owner(f))
  if not fixed:
    return ""
  sources = ", ".join(dict.fromkeys(set_by[owner(f)] for f in fixed))
  return (f"{where} sets {', '.join(fixed)}, which the experiment sets itself ({sources}): drop "
          f"{'it' if len(fixed) == 1 else 'them'} there.")
