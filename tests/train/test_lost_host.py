"""A lost host (README, "What survives what"): `lbjax-train` jobs of 2 and 3 processes on 127.0.0.1, one of
them killed (`kill -9`, a lost machine) or stopped (SIGSTOP, a hung one) at a random step.

Every other process must exit with status 5 within the heartbeat timeout, naming the lost process, the
newest complete checkpoint and the command that resumes, with no traceback or runtime dump on the
console; relaunched, the job resumes from that checkpoint and ends bit-exactly where a job that was
never interrupted ends (the any-batch step with the adaptive policy on the PTB LSTM with its carries:
tests/experiments/tiny_adaptive_ptb_config.py). Each process has 1 CPU device; heartbeats time out
after 5 s.
"""

import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from unittest import mock

import pytest

from lbjax.train import distributed
from lbjax.train.checkpointing import Checkpointer, complete_steps

REPO = pathlib.Path(__file__).resolve().parents[2]
PTB = str(REPO / "tests" / "experiments" / "tiny_adaptive_ptb_config.py")
CLASSIFIER = str(REPO / "tests" / "experiments" / "tiny_sweep_config.py")
HEARTBEAT = 5
STEPS = 12  # of the PTB job; a checkpoint after every step
PTB_JOB = ("--config.checkpoint_every_steps=1", f"--config.num_steps={STEPS}", "--config.num_epochs=50",
           "--config.eval_every_epochs=1000", "--config.progress=True")
# What must not reach the console: Python tracebacks, the runtime's abort dump and its log lines.
CONSOLE_NOISE = re.compile(r"Traceback|Check failure|^\*\*\*|^[FE]\d{4} ", re.MULTILINE)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Job:
  """`lbjax-train` as `count` processes of one jax.distributed job; each one's console goes to files."""

  def __init__(self, workdir: pathlib.Path, count: int, config: str, *overrides: str):
    self.workdir = workdir
    launches = len(list(workdir.parent.glob(f"{workdir.name}_console*")))
    self.logs = workdir.parent / f"{workdir.name}_console{launches}"  # a relaunch keeps the first one's
    self.logs.mkdir(parents=True)
    port = _free_port()
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="1", JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    self.processes = []
    for i in range(count):
      command = [sys.executable, "-m", "lbjax.main", "--config", config, "--workdir", str(workdir),
                 "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", str(count), "--process_id", str(i),
                 f"--config.heartbeat_timeout_seconds={HEARTBEAT}", *overrides]
      with open(self.logs / f"{i}.out", "w") as out, open(self.logs / f"{i}.err", "w") as err:
        self.processes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err))

  def console(self, i: int) -> tuple[str, str]:
    return (self.logs / f"{i}.out").read_text(), (self.logs / f"{i}.err").read_text()

  def wait_for_checkpoint(self, step: int) -> None:
    """Returns once checkpoint `step` is complete; fails if a process exits first or after 300 s."""
    deadline = time.monotonic() + 300
    while not [s for s in complete_steps(self.workdir / "checkpoints") if s >= step]:
      assert all(p.poll() is None for p in self.processes), self.console(0)[1][-3000:]
      assert time.monotonic() < deadline
      time.sleep(0.1)

  def training_process(self, i: int) -> int:
    """The pid of process i's training process (the child of its `lbjax-train` supervisor)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      pid = self.processes[i].pid
      children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
      if children:
        return int(children[0])
      time.sleep(0.1)
    raise AssertionError(f"process {i} started no training process")

  def finish(self, timeout: float) -> list[int]:
    return [p.wait(timeout=timeout) for p in self.processes]

  def kill_all(self) -> None:
    for p in self.processes:
      if p.poll() is None:
        p.kill()
        p.wait(timeout=60)


def _assert_ended_cleanly(job: Job, survivor: int, lost: int, ended_after: float) -> None:
  """The survivor exited 5 within the heartbeat timeout (and a margin for a loaded machine) with the
  lost-host message, and nothing else on its console's stderr."""
  stdout, stderr = job.console(survivor)
  assert job.processes[survivor].returncode == distributed.LOST_HOST_EXIT, stderr[-3000:]
  assert ended_after < HEARTBEAT + 60, ended_after
  assert f"lost process {lost} (host {socket.gethostname()})" in stderr, stderr[-3000:]
  newest = complete_steps(job.workdir / "checkpoints")[0]
  assert f"The newest complete checkpoint is step {newest} in {job.workdir / 'checkpoints'}" in stderr
  assert f"--process_id {survivor}" in stderr and f"process{survivor}.runtime.log" in stderr
  assert not CONSOLE_NOISE.search(stdout + stderr), stderr[-3000:]
  assert "Terminating process because the JAX distributed service" in (
      job.workdir / "logs" / f"process{survivor}.runtime.log").read_text()


def _final_state(workdir: pathlib.Path) -> tuple[dict, dict]:
  """The checksums of every state leaf of the final checkpoint (sums of their bits: equal checksums are
  equal bits) and the final evaluation."""
  step = complete_steps(workdir / "checkpoints")[0]
  meta = Checkpointer(workdir).restore_meta(step)
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  evaluation = [r for r in records if r["kind"] == "eval"][-1]
  return {"step": step, "checksums": meta.get("checksums")}, {k: v for k, v in evaluation.items() if k != "time"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict, dict]:
  """The PTB job of 2 processes, never interrupted: its final state and evaluation."""
  workdir = tmp_path_factory.mktemp("uninterrupted") / "run"
  job = Job(workdir, 2, PTB, *PTB_JOB)
  try:
    assert job.finish(timeout=600) == [0, 0], job.console(0)[1][-3000:]
  finally:
    job.kill_all()
  return _final_state(workdir)


@pytest.mark.parametrize("lost, seed", [(1, 0), (0, 1)], ids=["worker", "coordinator"])
def test_kill_9_at_a_random_step_ends_the_other_process_and_the_relaunch_ends_bit_exactly(tmp_path, uninterrupted,
                                                                                           lost, seed):
  """`kill -9` of a process's `lbjax-train` (its training process dies with it) after a random number of
  checkpoints; the other exits 5 with the message; the relaunched job resumes from the newest complete
  checkpoint and ends with the uninterrupted job's state and evaluation, bit for bit."""
  workdir = tmp_path / "run"
  job = Job(workdir, 2, PTB, *PTB_JOB)
  try:
    job.wait_for_checkpoint(random.Random(seed).randint(2, STEPS - 3))
    job.processes[lost].kill()
    killed_at = time.monotonic()
    survivor = 1 - lost
    job.processes[survivor].wait(timeout=HEARTBEAT + 120)
    _assert_ended_cleanly(job, survivor, lost, time.monotonic() - killed_at)
  finally:
    job.kill_all()
  newest = complete_steps(workdir / "checkpoints")[0]

  relaunched = Job(workdir, 2, PTB, *PTB_JOB)
  try:
    assert relaunched.finish(timeout=600) == [0, 0], relaunched.console(0)[1][-3000:]
  finally:
    relaunched.kill_all()
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r for r in records if r["kind"] == "resume"][-1]["step"] == newest
  assert _final_state(workdir) == uninterrupted


def test_a_hung_process_of_three_ends_the_other_two_within_the_heartbeat_timeout(tmp_path):
  """SIGSTOP of process 2 of 3 (a hung host: it holds its connections but answers nothing)."""
  job = Job(tmp_path / "run", 3, CLASSIFIER, "--config.batch_size=24", "--config.eval_batch_size=24",
            "--config.num_epochs=500", "--config.eval_every_epochs=1000", "--config.checkpoint_every_steps=2")
  try:
    job.wait_for_checkpoint(2)
    hung = job.training_process(2)
    os.kill(hung, signal.SIGSTOP)
    os.kill(job.processes[2].pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    for survivor in (0, 1):
      job.processes[survivor].wait(timeout=HEARTBEAT + 120)
      _assert_ended_cleanly(job, survivor, 2, time.monotonic() - stopped_at)
  finally:
    job.kill_all()


def test_an_error_on_one_process_ends_it_with_its_message_and_the_other_naming_it(tmp_path):
  """Process 1 alone meets an undecodable record (tests/train/one_bad_record.py). It exits 1 with the message at
  once, and process 0 exits 5 naming process 1 and its error. Before, process 1's exit waited in
  jax.distributed.shutdown's barrier for process 0, which waited in a collective for process 1: both hung for
  300 s, then reported a lost host."""
  job = Job(tmp_path / "run", 2, CLASSIFIER, "--config.dataset=tests.train.one_bad_record:bad_mnist",
            "--config.num_epochs=2", "--config.eval_every_epochs=1000")
  started = time.monotonic()
  try:
    statuses = job.finish(timeout=HEARTBEAT + 120)
  finally:
    job.kill_all()
  assert statuses == [distributed.LOST_HOST_EXIT, 1] and time.monotonic() - started < 100
  _, failed = job.console(1)
  assert "cannot be decoded" in failed and not CONSOLE_NOISE.search(failed), failed[-3000:]
  _, survivor = job.console(0)
  assert "lbjax-train: lost process 1 (host" in survivor and "process 1 stopped on an error: " in survivor, survivor
  assert "cannot be decoded" in survivor and "mend what stopped it" in survivor
  assert not CONSOLE_NOISE.search(survivor), survivor[-3000:]


def test_ctrl_c_at_one_process_of_two_saves_and_stops_both_at_the_same_step(tmp_path):
  """SIGINT to process 1's `lbjax-train` (a Ctrl-C at its terminal) is a preemption, as SIGTERM is: both save
  the same step and exit 0. Before, it raised KeyboardInterrupt in process 1's step alone ("interrupted before
  training started; nothing was saved"), and the job hung 300 s."""
  workdir = tmp_path / "run"
  job = Job(workdir, 2, CLASSIFIER, "--config.num_epochs=500", "--config.eval_every_epochs=1000",
            "--config.checkpoint_every_steps=2")
  try:
    job.wait_for_checkpoint(2)
    job.processes[1].send_signal(signal.SIGINT)
    statuses = job.finish(timeout=HEARTBEAT + 120)
  finally:
    job.kill_all()
  assert statuses == [0, 0], job.console(1)[1][-3000:]
  newest = complete_steps(workdir / "checkpoints")[0]
  for i in (0, 1):
    stdout, stderr = job.console(i)
    assert f"preemption: saved checkpoint {newest}" in stdout + stderr
    assert "interrupted before training started" not in stderr and not CONSOLE_NOISE.search(stderr)


def test_a_second_job_on_a_workdir_in_use_ends_at_once_on_every_process_touching_nothing(tmp_path):
  """A job of 2 started on the workdir of a running job of 2 (on this host): both of its supervisors exit 2 at once
  naming the running one, before they touch the workdir's logs, and the running job goes on. Before, its process
  0 printed the message and waited at the shutdown barrier for process 1, which waited for it in a collective."""
  workdir = tmp_path / "run"
  running = Job(workdir, 2, CLASSIFIER, "--config.num_epochs=500", "--config.eval_every_epochs=1000",
                "--config.checkpoint_every_steps=2")
  try:
    running.wait_for_checkpoint(2)
    second = Job(workdir, 2, CLASSIFIER)
    try:
      assert second.finish(timeout=120) == [2, 2]
    finally:
      second.kill_all()
    for i in (0, 1):
      assert "is in use by another run" in second.console(i)[1]
    assert all(p.poll() is None for p in running.processes)
  finally:
    running.kill_all()


@pytest.mark.parametrize("log, lost", [
    # what the runtime of jax 0.10 and 0.12 writes when a worker stops sending heartbeats (3 processes: 2 lost) ...
    ("F1126 16:10:00.468580 22569 client.h:86] Terminating process because the JAX distributed service detected "
     "fatal errors. [...] absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending "
     "heartbeats):\n1, 2\nThe tasks have crashed.", [1, 2]),
    # ... and when the coordinator, which hosts the service, is gone
    ("F1126 15:12:49.342650 12477 client.h:86] Terminating process because the JAX distributed service detected "
     "fatal errors. [...] absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader "
     "task was preempted/died/restarted unexpectedly or this task is experiencing network issues.", [0]),
    ("Terminating process because the JAX distributed service detected fatal errors. INTERNAL: other", []),
])
def test_the_lost_processes_are_read_from_the_runtime_verdict(log, lost):
  assert distributed.lost_processes("earlier lines\n" * 500 + log) == lost


def test_a_job_that_never_formed_is_told_apart_from_a_lost_host(tmp_path, capsys):
  """Process 0 of 2 alone: after jax.distributed.initialize's 300 s its runtime aborts with a failed
  RegisterTask (the log below, jax 0.12). The supervisor says the job did not start and what to check
  (exit 2); it said a process had stopped sending heartbeats, and "relaunch all all processes"."""
  workdir = tmp_path / "run"
  argv = ["--config", CLASSIFIER, "--workdir", str(workdir), "--coordinator_address", "127.0.0.1:1",
          "--num_processes", "2", "--process_id", "0"]
  with mock.patch.object(subprocess, "Popen", _aborted_child(workdir / distributed.LOG_DIR / "process0.runtime.log")):
    status = distributed.supervise(argv, str(workdir), 0, HEARTBEAT, 2)
  stderr = capsys.readouterr().err
  assert status == distributed.JOB_NOT_FORMED_EXIT == 2
  assert stderr.startswith("lbjax-train: the job did not start: Process 0 waited 300 s for the other processes to "
                           "join the coordinator, and not all did. Nothing was trained.\nStart all 2 processes")
  assert " ".join(argv) in stderr and "heartbeat" not in stderr


def _aborted_child(runtime_log: pathlib.Path):
  """subprocess.Popen's stand-in: a training process whose runtime wrote `runtime_log` the abort of a job that never
  formed, then aborted (SIGABRT)."""

  class AbortedChild:

    def __init__(self, *args, **kwargs):
      del args, kwargs

    def wait(self):
      runtime_log.write_text(
          "F1202 00:41:14.596597   11881 client.h:86] Terminating process because the JAX distributed service "
          "detected fatal errors. This most likely indicates that another task died; see the other task logs for more "
          "details. absl::Status: DEADLINE_EXCEEDED: Deadline Exceeded\n"
          "RPC: /xla.coordination.CoordinationService/RegisterTask\n")
      return -signal.SIGABRT

  return AbortedChild


def test_the_step_recorder_and_an_error_record_the_progress_at_the_same_time(tmp_path, monkeypatch):
  """`watch`'s thread records the step while the main thread records the error it stops on (`stop_on_error`): both
  wrote `process1.tmp`, and one's rename found it gone (FileNotFoundError, a traceback in CI instead of the error's
  message)."""
  state = tmp_path / "process1.json"
  monkeypatch.setenv(distributed.SUPERVISED_ENV, str(state))
  monkeypatch.setattr(distributed, "_PROGRESS", {"process_index": 1})
  errors = []

  def write(key):
    try:
      for value in range(300):
        distributed._PROGRESS[key] = value  # pylint: disable=protected-access
        distributed._write_progress(state)  # pylint: disable=protected-access
    except OSError as e:
      errors.append(e)

  threads = [threading.Thread(target=write, args=(key,)) for key in ("step", "error", "other")]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors
  assert json.loads(state.read_text()) == {"process_index": 1, "step": 299, "error": 299, "other": 299}
