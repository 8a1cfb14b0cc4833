"""`benchmarks.train_loop` measures every way of taking steps (a GPU session runs it unattended: it must not
break between sessions)."""

import argparse

from benchmarks import train_loop


def test_every_variant_and_host_piece_is_measured_in_each_round():
  args = argparse.Namespace(rounds=2, steps=4, log_every=2, steps_per_call=2)
  times = train_loop.measure("mnist_lstm", 8, args)
  host = times.pop("host")
  assert set(times) == {"hand step", "trainer step", "trainer call", "trainer call, unrolled", "loop",
                        "loop, no prefetch", "loop, step places", "loop, k per call", "loop, data on device"}
  assert all(len(seconds) == 2 and min(seconds) > 0 for seconds in times.values())
  assert set(host) == {"next_batch", "global_batch", "k in one call", "k stacked", "by index", "as uint8",
                       "lr_scalar", "schedules", "metrics"}
  assert all(seconds > 0 for seconds in host.values())
