"""experiments/simulated_devices.py: the device check of the multi-device experiments (a usage error
that names the setting, before anything runs) and the command line written into their tables, on the
8 simulated CPU devices of tests/conftest.py."""

import argparse

import jax
import pytest

from experiments import simulated_devices


def test_enough_devices_pass():
  parser = argparse.ArgumentParser()
  simulated_devices.require(parser, 8, exact=True)
  simulated_devices.require(parser, 2)  # 8 >= 2


@pytest.mark.parametrize("needed, exact, reason, message", [
    (4, True, "", "error: needs 4 devices, jax sees 8; run with JAX_NUM_CPU_DEVICES=4 in the environment"),
    (16, False, "--stages up to 16", "error: --stages up to 16 needs at least 16 devices, jax sees 8; run with "
                                     "JAX_NUM_CPU_DEVICES=16 in the environment")])
def test_other_device_counts_are_a_usage_error(capsys, needed, exact, reason, message):
  with pytest.raises(SystemExit) as stop:
    simulated_devices.require(argparse.ArgumentParser(prog="script"), needed, exact=exact, reason=reason)
  assert stop.value.code == 2
  assert message in capsys.readouterr().err


def test_the_command_names_the_devices_and_quotes_the_arguments():
  assert jax.device_count() == 8 and jax.devices()[0].platform == "cpu"  # tests/conftest.py
  command = simulated_devices.command("experiments.pipeline_bubble", ["--stages", "2,4", "--out", "docs/a b"])
  assert command == "JAX_NUM_CPU_DEVICES=8 python -m experiments.pipeline_bubble --stages 2,4 --out 'docs/a b'"
