"""`config.deterministic`: bit-for-bit repeatable runs on GPUs.

On GPUs, XLA may pick kernels whose floating-point sums depend on the order threads finish: atomics in
scatter-add (the embedding gradient of the PTB LSTM is one) and in some reductions, and GEMM and
convolution algorithms chosen by timing. Two runs of the same config then differ in the last bits from
the first step on, and the difference grows (issue 30: two PTB runs on one H200 ended 0.5% apart in
perplexity). `--xla_gpu_deterministic_ops` makes XLA use deterministic implementations of these, and
`--xla_gpu_exclude_nondeterministic_ops` makes it refuse to compile an operation that has none rather
than run it nondeterministically (select-and-scatter, the gradient of max pooling, gets a slower deterministic
form: 18.4 ms against 2.2 ms per gradient on an H200, benchmarks/README.md, section
max-pool-gradient-deterministic-gpu). Both are read when the backend
starts, so `request` puts them in `XLA_FLAGS` before the first JAX computation. CPU runs are already
deterministic; the flags change nothing there.
"""

import os

import ml_collections

from lbjax.train.errors import ConfigError

DETERMINISTIC_XLA_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_exclude_nondeterministic_ops=true")


def _flag_names(flags: str) -> dict[str, str]:
  """`--name=value` (or a bare `--name`) -> {name: value}; a repeated flag keeps its last value."""
  named = {}
  for flag in flags.split():
    name, _, value = flag.lstrip("-").partition("=")
    named[name] = value or "true"
  return named


def in_effect(flags: str | None = None) -> bool:
  """Whether `flags` (default: the environment's XLA_FLAGS) ask for every deterministic option."""
  named = _flag_names(os.environ.get("XLA_FLAGS", "") if flags is None else flags)
  return all(named.get(name) == value for name, value in _flag_names(" ".join(DETERMINISTIC_XLA_FLAGS)).items())


def request(config: ml_collections.ConfigDict) -> None:
  """With `config.deterministic`, adds `DETERMINISTIC_XLA_FLAGS` to XLA_FLAGS before the backend starts.

  Raises:
    ConfigError: `config.deterministic=True` but JAX's backend already started without the flags (a
      Python session that computed before calling the trainer): they can no longer take effect.
  """
  if not isinstance(config.deterministic, bool):
    raise ConfigError(f"config.deterministic must be True or False, got {config.deterministic!r}.")
  if not config.deterministic or in_effect():
    return
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if xla_bridge.backends_are_initialized():
    raise ConfigError("config.deterministic=True must be set before JAX starts its backend, which already ran "
                      "without it: start Python with XLA_FLAGS='" + " ".join(DETERMINISTIC_XLA_FLAGS) + "', or "
                      "train from the command line (lbjax-train sets them).")
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *DETERMINISTIC_XLA_FLAGS]).strip()
