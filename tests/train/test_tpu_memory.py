"""The HBM a device of a named TPU topology holds (`lbjax.train.topology.device_memory`): abstract TPU devices
report none, so it comes from `TPU_CHIPS` by chip and by the TensorCores a device spans; a generation missing
there would compile with no memory check. Needs libtpu."""

import pytest

from lbjax.train import topology

pytestmark = pytest.mark.skipif(not topology.libtpu_installed(), reason="needs libtpu (pip install 'lbjax[tpu]')")
GIB = 2**30


@pytest.mark.parametrize("name, devices, kind, hbm", [
    ("v2:2x2", 8, "TPU v2", 8 * GIB),  # one TensorCore of a 16 GiB chip
    ("v3:2x2", 8, "TPU v3", 16 * GIB),  # one TensorCore of a 32 GiB chip
    ("v4:2x2x1", 4, "TPU v4", 32 * GIB),  # megacore: the chip
    ("v5e:2x2", 4, "TPU v5 lite", 16 * GIB),
    ("v5p:2x2x1", 4, "TPU v5", 95 * 10**9),
    ("v6e:2x2", 4, "TPU v6 lite", 32 * GIB),
    ("tpu7x:2x2x1", 8, "TPU7x", 96 * GIB),  # Ironwood: one TensorCore of a 192 GiB chip
])
def test_each_generation_has_its_chips_hbm_shared_by_its_devices(name, devices, kind, hbm):
  found = topology.topology_devices(name)
  memory = topology.device_memory(found[0])
  assert (len(found), found[0].device_kind, memory.bytes) == (devices, kind, hbm)
  assert "cloud.google.com/tpu/docs" in memory.source

