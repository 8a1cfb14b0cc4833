"""Known-broken pairs of installed packages, found before they fail deep inside an import.

pip checks each package's own bounds but not whether two releases work together: flax 0.12.8 and
0.12.9 build `flax.nnx` on `jax.experimental.hijax.HiPrimitive`, which jax 0.10 has and jax 0.11.2
and 0.12.0.1 do not, so `from flax import nnx` fails with an AttributeError under them (seen on a GPU
image with jax 0.11.2 and flax 0.12.8; flax 0.12.10 and later choose the class by jax version).
`lbjax.models` and `lbjax.train` call `check_flax_works_with_jax` before they import flax.
"""

from importlib import metadata

FIRST_FLAX_FOR_JAX_0_11 = (0, 12, 10)


def _release(version: str) -> tuple[int, ...]:
  parts = []
  for part in version.split("."):
    digits = "".join(c for c in part if c.isdigit())
    if not digits:
      break
    parts.append(int(digits))
  return tuple(parts)


def check_flax_works_with_jax() -> None:
  """Raises ImportError, saying what to install, when the installed flax cannot import under the
  installed jax."""
  try:
    flax_version = metadata.version("flax")
  except metadata.PackageNotFoundError:
    return  # the import of flax itself then says so
  if _release(flax_version) >= FIRST_FLAX_FOR_JAX_0_11:
    return
  try:
    from jax.experimental import hijax  # pylint: disable=import-outside-toplevel
  except ImportError:
    hijax = None
  if not hasattr(hijax, "HiPrimitive"):
    import jax  # pylint: disable=import-outside-toplevel

    raise ImportError(
        f"flax {flax_version} does not work with jax {jax.__version__}: flax.nnx needs "
        "jax.experimental.hijax.HiPrimitive, which this jax lacks. Install a flax that supports it, "
        "`pip install -U \"flax>=0.12.10\"` (or use jax 0.10.x).")
