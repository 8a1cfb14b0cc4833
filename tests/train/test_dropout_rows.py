"""Dropout masks per row of the global batch: row n of step s draws its masks from
fold_in(fold_in(key(seed), s), n), so a row's mask, and with it the update, is the same whatever the
micro-batch count (max_device_batch, batch.micro_batch_size) and the number of devices."""

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from lbjax.models import PtbLSTM
from lbjax.train import any_batch, train_and_evaluate
from lbjax.train import step as step_lib
from tests.train import helpers

BATCH = 16
SPLITS = [(devices, k) for devices in (1, 4) for k in (1, 2, 4)]  # (data-parallel devices, micro-batches)


def _mesh(devices):
  return Mesh(np.array(jax.devices()[:devices]).reshape(devices, 1), ("data", "fsdp"))


@pytest.mark.parametrize("devices, num_microbatches", SPLITS)
def test_micro_batch_rows_are_the_rows_the_batch_split_puts_in_each_micro_batch(devices, num_microbatches):
  """`micro_batch_rows` with traced j and k (the any-batch step's) equals the in-step split of the rows
  0..B-1 on the mesh (`_split_microbatches`, the per-size step's) and the host-side placement by P
  processes (`split_local_batch` of each process's contiguous block of rows on its D/P devices, the
  processes' parts joined in order, as `make_array_from_process_local_data` joins them)."""
  rows = np.arange(BATCH, dtype=np.int32)
  micro = BATCH // num_microbatches
  mesh = _mesh(devices)
  placed = jax.device_put(rows, NamedSharding(mesh, P(("data", "fsdp"))))
  in_step = np.asarray(jax.jit(lambda r: step_lib._split_microbatches(r, num_microbatches, mesh))(placed))
  traced_rows = jax.jit(step_lib.micro_batch_rows, static_argnums=(2, 3))
  on_hosts = {processes: [any_batch.split_local_batch({"rows": local}, num_microbatches, devices // processes)
                          for local in np.split(rows, processes)]
              for processes in (1, 2, devices) if devices % processes == 0}
  for j in range(num_microbatches):
    expected = np.asarray(traced_rows(jnp.int32(j), jnp.int32(num_microbatches), micro, devices))
    np.testing.assert_array_equal(in_step[j], expected)
    for processes, parts in on_hosts.items():
      np.testing.assert_array_equal(np.concatenate([part[j]["rows"] for part in parts]), expected,
                                    err_msg=f"{processes} processes")
  # The split is not the contiguous one on several devices: the row ids matter.
  if devices > 1 and num_microbatches > 1:
    assert not np.array_equal(in_step[0], rows[:micro])


@pytest.mark.parametrize("devices, num_microbatches", SPLITS)
def test_a_rows_dropout_mask_is_the_same_whatever_the_micro_batch_and_device_split(devices, num_microbatches):
  """The PTB LSTM (dropout 0.5) on the whole batch of 16 rows with the step's per-row keys, and on each
  micro-batch of the split (sharded over `devices`) with its rows' keys: every row's logits are the
  same, so its masks are (rows are independent in the model; other keys give other logits)."""
  model = PtbLSTM(vocab_size=20, embed_size=8, hidden_size=8, dropout_rate=0.5, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (BATCH, 5), 0, 20)
  carry = model.initial_carry(BATCH)
  step_key = jax.random.fold_in(jax.random.key(7), 3)
  call = jax.jit(lambda tokens, carry, keys: model(tokens, carry, train=True, dropout_key=keys)[0])
  whole = np.asarray(call(tokens, carry, step_lib.dropout_keys(step_key, jnp.arange(BATCH))))
  other_step = np.asarray(call(tokens, carry, step_lib.dropout_keys(jax.random.fold_in(step_key, 1),
                                                                    jnp.arange(BATCH))))
  assert not np.allclose(whole, other_step)
  micro = BATCH // num_microbatches
  sharded = NamedSharding(_mesh(devices), P(("data", "fsdp")))
  for j in range(num_microbatches):
    rows = step_lib.micro_batch_rows(jnp.int32(j), jnp.int32(num_microbatches), micro, devices)
    part = jax.device_put((tokens[rows], jax.tree.map(lambda x: x[rows], carry),
                           step_lib.dropout_keys(step_key, rows)), sharded)
    np.testing.assert_allclose(np.asarray(call(*part)), whole[np.asarray(rows)], rtol=1e-5, atol=1e-6)


# Half an epoch of the tiny PTB LSTM (12 updates of 16 rows), dropout rate 0.1.
HALF_EPOCH = {"num_epochs": 0.5}
ACCUMULATING = {
    "one_device_4_micro_batches": {"mesh.num_devices": 1, "max_device_batch": 4},
    "data4_2_micro_batches": {"mesh.num_devices": 4, "max_device_batch": 2},
    "data4_per_device_gradients_2_micro_batches": {"mesh.num_devices": 4, "max_device_batch": 2,
                                                   "mesh.per_device_gradients": True},
}


@pytest.mark.parametrize("layout", ACCUMULATING)
def test_accumulated_updates_with_dropout_equal_the_one_device_one_batch_run(tmp_path, layout):
  """The per-size step accumulating micro-batches (max_device_batch) with dropout on ends with the
  parameters, optimizer state and carry of the one-device run that takes each batch of 16 whole."""
  reference = train_and_evaluate(helpers.tiny_language_model_config(**HALF_EPOCH, **{"mesh.num_devices": 1}),
                                 tmp_path / "reference")
  accumulated = train_and_evaluate(helpers.tiny_language_model_config(**HALF_EPOCH, **ACCUMULATING[layout]),
                                   tmp_path / layout)
  assert accumulated.step == reference.step == 12
  assert helpers.tiny_language_model_config().model_options.dropout_rate > 0
  helpers.assert_trees_close(accumulated.state.params, reference.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(accumulated.state.opt_state, reference.state.opt_state, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(accumulated.state.carry, reference.state.carry, rtol=2e-5, atol=2e-6)
