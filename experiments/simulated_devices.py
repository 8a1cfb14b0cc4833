"""The devices of an experiment that runs on several (simulated CPU) devices: the check that jax sees
enough of them, and the command line, with the environment that gives them, that reproduces its table.

jax fixes its number of CPU devices when it starts (`JAX_NUM_CPU_DEVICES`, read once when the first
device is asked for), so an experiment cannot add devices after the fact: `require` stops it with
the setting to use instead.
"""

import argparse
import shlex
import sys
from typing import Sequence

import jax


def require(parser: argparse.ArgumentParser, needed: int, *, exact: bool = False, reason: str = "") -> None:
  """Stops with a usage error (`parser.error`, exit status 2) unless jax sees `needed` devices, or at
  least `needed` when not `exact`; `reason` (e.g. "--stages up to 4") says what needs them."""
  count = jax.device_count()
  if count == needed or (count > needed and not exact):
    return
  what = f"{reason} needs" if reason else "needs"
  parser.error(f"{what} {needed if exact else f'at least {needed}'} devices, jax sees {count}; run with "
               f"JAX_NUM_CPU_DEVICES={needed} in the environment (jax reads it when it starts).")


def command(module: str, argv: Sequence[str] | None = None) -> str:
  """`JAX_NUM_CPU_DEVICES=<n> python -m <module> <argv>`, the command that reproduces this run: n is the
  number of devices jax sees, and the setting is left out when they are not CPU devices. `argv` is
  the script's arguments (`sys.argv[1:]` when None), quoted for the shell."""
  arguments = sys.argv[1:] if argv is None else argv
  environment = f"JAX_NUM_CPU_DEVICES={jax.device_count()} " if jax.devices()[0].platform == "cpu" else ""
  return f"{environment}python -m {module} {shlex.join(arguments)}"
