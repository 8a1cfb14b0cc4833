"""`lbjax.data` imports only numpy: no jax, no TFDS/grain until a TFDS loader runs, no models/train."""

import subprocess
import sys


def test_importing_lbjax_data_pulls_in_no_heavy_or_upstream_modules():
  code = ("import sys, lbjax.data; "
          "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', "
          "'tensorflow', 'tensorflow_datasets', 'grain'}) + sorted(m for m in sys.modules if "
          "m.startswith(('lbjax.models', 'lbjax.train', 'lbjax.optim', 'lbjax.schedules')))))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
  assert result.stdout.strip() == "[]"
