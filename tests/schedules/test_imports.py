"""lbjax.schedules depends on jax, numpy and optax only (docs/design.md, "Layers": arrows point one way)."""

import subprocess
import sys
import textwrap


def test_importing_schedules_pulls_in_no_other_part_of_lbjax_and_no_flax():
  probe = textwrap.dedent("""
      import sys
      import lbjax.schedules
      others = ("lbjax.optim", "lbjax.models", "lbjax.data", "lbjax.train", "lbjax.diagnostics")
      loaded = sorted(m for m in sys.modules if m.startswith(others + ("flax", "tensorflow")))
      print(loaded)
      """)
  result = subprocess.run(
      [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
  )
  assert result.stdout.strip() == "[]", result.stdout
