"""`benchmarks.loop_trace` reads the device's busy time of every way of feeding the loop from its trace (a GPU
session runs it unattended: it must not break between sessions)."""

import argparse

import pytest

from benchmarks import loop_trace


@pytest.mark.parametrize("variant", loop_trace.VARIANTS)
def test_each_variant_traces_its_steps_and_reads_the_device_time_back(tmp_path, variant):
  args = argparse.Namespace(skip=2, traced=4, log_every=2, steps_per_call=2)
  record = loop_trace.traced_run("mnist_lstm", 8, variant, args, tmp_path)
  if variant != "bare step":
    assert (record["first_step"], record["steps"]) == (3, 4)
  assert record["device_kind"] == "cpu" and record["kernels_per_step"] > 0
  assert 0 < record["device_busy_fraction"] <= 1.01
