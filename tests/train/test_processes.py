"""Runs in real subprocesses: the CLI on MNIST, SIGTERM preemption, and two jax.distributed processes."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from lbjax.train import train_and_evaluate
from lbjax.train.checkpointing import Checkpointer
from tests.train import helpers

REPO = pathlib.Path(__file__).resolve().parents[2]


def _env(num_devices: int) -> dict[str, str]:
  return dict(os.environ, JAX_NUM_CPU_DEVICES=str(num_devices), JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait_until_training(metrics: pathlib.Path, processes) -> None:
  """Returns once a train record is in `metrics`; fails if a process exits first or after 300 s."""
  deadline = time.monotonic() + 300
  while not (metrics.exists() and '"train"' in metrics.read_text()):
    assert all(p.poll() is None for p in processes) and time.monotonic() < deadline, \
        processes[0].communicate()[1][-3000:]
    time.sleep(0.2)


def test_cli_mnist_lstm_learns_in_a_fraction_of_an_epoch(tmp_path, shared_data):
  """papers/001's MNIST LSTM from the command line on the real files: 0.2 epoch (94 steps of 128)."""
  command = [sys.executable, "-m", "lbjax.main", "--config", "mnist_lstm",
             "--workdir", str(tmp_path), "--config.num_epochs=0.2", f"--config.data_dir={shared_data}"]
  done = subprocess.run(command, env=_env(1), capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(tmp_path / "metrics.jsonl") as f:
    final = [r for r in map(json.loads, f) if r["kind"] == "eval"][-1]
  assert final["accuracy"] > 0.6  # chance is 0.1
  assert "ex/s" in done.stdout and "done: step 94" in done.stdout


def test_sigterm_saves_a_restorable_checkpoint_and_exits_0(tmp_path):
  script = ("from tests.train import helpers; from lbjax.train import train_and_evaluate; "
            "r = train_and_evaluate(helpers.tiny_classifier_config(num_epochs=500.0, eval_every_epochs=1000.0, "
            f"checkpoint_every_steps=0), {str(tmp_path)!r}); print('preempted' if r.preempted else 'finished')")
  process = subprocess.Popen([sys.executable, "-c", script], env=_env(8), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  _wait_until_training(tmp_path / "metrics.jsonl", [process])
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=300)
  assert process.returncode == 0, stderr[-3000:]
  assert stdout.strip().endswith("preempted")
  step = Checkpointer(tmp_path).latest_step()
  assert step is not None and step >= 4
  resumed_epochs = (step + 8) * 32 / 256
  resumed = train_and_evaluate(helpers.tiny_classifier_config(num_epochs=resumed_epochs), tmp_path)
  assert resumed.step == step + 8 and not resumed.preempted


def _start_two_processes(workdir: pathlib.Path, out: pathlib.Path, *mode: str) -> list[subprocess.Popen]:
  """Starts `multihost_worker` (in `mode`) as 2 processes of 2 devices each."""
  port = _free_port()
  return [subprocess.Popen(
      [sys.executable, "-m", "tests.train.multihost_worker", str(i), "2", str(port), str(workdir), str(out), *mode],
      env=_env(2), cwd=REPO, stderr=subprocess.PIPE, text=True) for i in range(2)]


def _wait_for_success(workers: list[subprocess.Popen]) -> None:
  for worker in workers:
    _, stderr = worker.communicate(timeout=600)
    assert worker.returncode == 0, stderr[-3000:]


def _assert_two_processes_of_two_devices_equal_one_of_four(tmp_path: pathlib.Path, *mode: str):
  """Runs `multihost_worker` (in `mode`) as 2 processes of 2 devices each and, at the same time, as 1
  process of 4 devices; asserts they save the same values and returns them."""
  workers = _start_two_processes(tmp_path / "multi", tmp_path / "multi.npz", *mode)
  single = subprocess.run(
      [sys.executable, "-m", "tests.train.multihost_worker", "0", "1", "0", str(tmp_path / "single"),
       str(tmp_path / "single.npz"), *mode], env=_env(4), cwd=REPO, capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  _wait_for_success(workers)
  multi, one = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
  assert multi["devices"] == one["devices"] == 4
  assert sorted(multi.files) == sorted(one.files)
  for name in multi.files:
    np.testing.assert_allclose(multi[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
  return multi


def test_two_processes_draw_the_dropout_masks_and_evaluate_the_stream_of_one_process(tmp_path):
  """The PTB LSTM with dropout on the any-batch step, whose micro-batches each process cuts from its
  own rows: row n of the global batch draws its masks from fold_in(step key, n) whichever process and
  micro-batch hold it, so 2 processes of 2 devices end with the parameters of 1 process of 4.
  Its stream evaluation fills row 0 only: process 1's share of every evaluation batch is padding. Whether
  the split is empty is decided over both processes (process 1 refused to start, process 0 waited for it)."""
  assert helpers.tiny_language_model_config().model_options.dropout_rate > 0
  values = _assert_two_processes_of_two_devices_equal_one_of_four(tmp_path, "ptb")
  assert values["step"] == 4 and np.isfinite(values["perplexity"])


def test_two_processes_place_each_calls_stacked_batches_as_one_process_does(tmp_path):
  """With 4 steps per device call each process stacks its rows of the call's 4 batches and the call's
  [4, B, ...] arrays are assembled from both processes' shares in one transfer: the run ends with the
  parameters of 1 process of 4 devices."""
  values = _assert_two_processes_of_two_devices_equal_one_of_four(tmp_path, "calls")
  assert values["step"] == 8


def test_two_processes_gather_the_batches_of_one_process_from_the_training_set_on_the_devices(tmp_path):
  """With the training set held on every device, each process places its rows' indices (one step, or a
  call's 3 stacked) and the devices gather the rows: the run ends with the parameters of 1 process of 4."""
  values = _assert_two_processes_of_two_devices_equal_one_of_four(tmp_path, "on_device")
  assert values["step"] == 8


def test_two_processes_equal_one_of_four_devices_trace_into_their_own_folders_and_agree_on_a_finished_run(tmp_path):
  """The tiny classifier ends with the same parameters and metrics on 2 processes of 2 devices as on 1 process
  of 4. Both processes start and stop their traces at the same steps (they wait for their devices there, no
  collective), each writes its own; process 0 reads its back for the record. Relaunched on the finished run,
  they agree that its last step was evaluated: only process 0 reads `metrics.jsonl`, which says so, and a
  process that disagreed would wait in the evaluation's collectives alone."""
  first = _assert_two_processes_of_two_devices_equal_one_of_four(tmp_path, "profile")
  for process in (0, 1):
    assert list((tmp_path / "multi" / "profile" / f"process_{process}").glob("plugins/profile/*/*.xplane.pb"))
  with open(tmp_path / "multi" / "metrics.jsonl") as f:
    [record] = [r for r in map(json.loads, f) if r["kind"] == "profile"]
  assert (record["first_step"], record["steps"], record["device_kind"]) == (3, 2, "cpu")
  assert record["directory"].endswith("profile/process_0")
  _wait_for_success(_start_two_processes(tmp_path / "multi", tmp_path / "again.npz", "profile"))
  again = np.load(tmp_path / "again.npz")
  assert again["step"] == first["step"] == 8 and again["accuracy"] == first["accuracy"]
  with open(tmp_path / "multi" / "metrics.jsonl") as f:
    records = [r["kind"] for r in map(json.loads, f)]
  assert records.count("eval") == 1 and records.count("resume") == 1


@pytest.mark.parametrize("mode", ["until_sigterm", "until_sigterm_in_calls"])
def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step_with_a_checkpoint(tmp_path, mode):
  """A preempted host must not stop alone (the others would wait in the next collective forever):
  JAX's preemption service makes both processes save the same step and exit 0; with 4 steps per
  device call, at the end of a call (JAX's sync point counts the step boundaries the loop checks)."""
  port = _free_port()
  workers = [subprocess.Popen(
      [sys.executable, "-m", "tests.train.multihost_worker", str(i), "2", str(port), str(tmp_path),
       str(tmp_path / "unused.npz"), mode], env=_env(2), cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  _wait_until_training(tmp_path / "metrics.jsonl", workers)
  workers[1].send_signal(signal.SIGTERM)
  outputs = []
  for worker in workers:
    stdout, stderr = worker.communicate(timeout=300)
    assert worker.returncode == 0, stderr[-3000:]
    outputs.append(stdout.strip().splitlines()[-1])
  assert outputs[0] == outputs[1] and outputs[0].startswith("preempted=True step=")
  step = int(outputs[0].split("step=")[1])
  assert Checkpointer(tmp_path).latest_step() == step
  if mode == "until_sigterm_in_calls":
    assert step % 4 == 0


def test_two_cli_processes_find_each_other_from_environment_variables(tmp_path):
  """`lbjax-train --distributed` with JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, as a
  launcher without JAX's own cluster detection sets them (docs/running.md): 2 processes x 2 devices."""
  port = _free_port()
  config = str(REPO / "tests" / "experiments" / "tiny_sweep_config.py")
  processes = []
  for process_id in range(2):
    env = dict(_env(2), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(process_id))
    processes.append(subprocess.Popen(
        [sys.executable, "-m", "lbjax.main", "--config", config, "--distributed", "--workdir", str(tmp_path),
         "--config.num_steps=4"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outputs = [p.communicate(timeout=600) for p in processes]
  for process, (_, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-3000:]
  record = json.loads((tmp_path / "config.json").read_text())
  assert "4 cpu on 2 process(es)" in record["resolved"]["devices"]
  with open(tmp_path / "metrics.jsonl") as f:
    assert [r for r in map(json.loads, f) if r["kind"] == "eval"][-1]["step"] == 4
