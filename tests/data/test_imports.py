"""`lbjax.data` imports only numpy: no jax, no TFDS/grain until a TFDS loader runs, no models/train."""

import pathlib
import subprocess
import sys

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_importing_lbjax_data_pulls_in_no_heavy_or_upstream_modules():
  code = ("import sys, lbjax.data; "
          "heavy = {'jax', 'flax', 'optax', 'tensorflow', 'tensorflow_datasets', 'grain'}; "
          "upstream = ('lbjax.models', 'lbjax.train', 'lbjax.optim', 'lbjax.schedules'); "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy "
          "or m.startswith(upstream)))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=_REPO_ROOT, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[]"
