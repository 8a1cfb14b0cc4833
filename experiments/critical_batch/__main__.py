"""`python -m experiments.critical_batch measure|warmup ...`: see the package docstring."""

import sys

from experiments.critical_batch import cli
from lbjax.train.errors import exit_on_user_errors

with exit_on_user_errors("python -m experiments.critical_batch"):
  cli.main(sys.argv[1:])
