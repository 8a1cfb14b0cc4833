"""lbjax.diagnostics depends on jax, numpy and optax only (docs/design.md, "Layers": arrows point one way)."""

import subprocess
import sys
import textwrap


def test_importing_diagnostics_pulls_in_no_model_data_or_train_code_and_no_flax():
  probe = textwrap.dedent("""
      import sys
      import lbjax.diagnostics
      others = ("lbjax.models", "lbjax.data", "lbjax.train", "lbjax.optim")
      loaded = sorted(m for m in sys.modules if m.startswith(others + ("flax", "tensorflow")))
      print(loaded)
      """)
  result = subprocess.run(
      [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
  assert result.stdout.strip() == "[]", result.stdout
