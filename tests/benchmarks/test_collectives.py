"""benchmarks.collectives compiles the trainer's own step for 8 devices and reads its collectives."""

from benchmarks import collectives
from lbjax.train import hlo_analysis


def test_per_device_gradients_step_all_reduces_the_gradients_once():
  hlo, param_bytes = collectives.compiled_hlo("mnist_lstm", 64, 28, fsdp=1, per_device_gradients=True)
  (op, (count, payload, _)), = hlo_analysis.analyze(hlo).collectives.items()
  assert (op, count) == ("all-reduce", 1)
  assert param_bytes <= payload <= param_bytes + 16  # the gradients and the step's two scalar metrics


def test_data_parallel_lstm_step_all_reduces_inside_its_time_loop():
  hlo, param_bytes = collectives.compiled_hlo("mnist_lstm", 64, 28, fsdp=1)
  count, payload, _ = hlo_analysis.analyze(hlo).collectives["all-reduce"]
  assert count > 28 and payload > 20 * param_bytes  # the LSTM kernel's gradient, once per time step
