"""The baseline warm-up a config's finalize supplies (shared by the packaged configs)."""


def complete_baseline_warmup(config, legw_base_warmup_epochs: float) -> None:
  """LEGW scales the baseline's warm-up, so a LEGW run whose config gives none gets a linear one of
  `legw_base_warmup_epochs`; warm-up epochs given without a shape get the linear shape."""
  if config.lr.warmup != "none":
    return
  if config.scaling.rule == "legw":
    config.lr.warmup = "linear_warmup"
    config.lr.warmup_epochs = config.lr.warmup_epochs or legw_base_warmup_epochs
  elif config.lr.warmup_epochs:
    config.lr.warmup = "linear_warmup"
