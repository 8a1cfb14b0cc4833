"""Multi-host runs that end cleanly when a host is lost.

`lbjax-train` with `--coordinator_address` or `--distributed` runs as two processes per host: a small
supervisor (this module's `supervise`, which starts no JAX backend) and the training process it starts
(the same command, marked by `SUPERVISED_ENV`). The training process joins the job with `initialize`
and keeps the JAX runtime's own stderr (the coordination service, Gloo, XLA) in
`<workdir>/logs/<name>.runtime.log`; Python's output stays on the console.

When any process of the job dies or stops answering (killed, machine lost, network cut, hung), JAX's
coordination service notices within `config.heartbeat_timeout_seconds` (the heartbeat timeout, passed to
`jax.distributed.initialize`) and the runtime ends every other training process: at once when the
coordinator (process 0, which hosts the service) is gone, after the timeout when a worker stopped
sending heartbeats. A training process whose collective fails first (Gloo's "Connection reset by
peer") waits for that verdict instead of printing a traceback (`wait_for_runtime_verdict`). The runtime
ends the process with an abort whose message names the lost task; the supervisor reads it from the log
and prints a few lines instead (`lost_host_message`): which process was lost (index and host), the step
this one reached, the newest complete checkpoint, and the command that resumes; exit status
`LOST_HOST_EXIT`. A checkpoint being written when the host was lost is never complete: Orbax renames a
step's temporary folder only after every process wrote its part (and lbjax verifies its checksums on
restore), so the relaunch resumes from the newest complete one, bit-exactly.

A job that never forms (a process not started, or started with another `--num_processes` or
`--coordinator_address`, or the coordinator's port unreachable) ends the same way once
`jax.distributed.initialize` gives up waiting for the others (its `initialization_timeout`, 300 s): the
supervisor then says that the job did not start and what to check (`job_not_formed_message`), exit status 2.

Every other ending of the training process passes through: its exit status, or 128 + the signal that
killed it, with one line naming the runtime log.
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, NoReturn

SUPERVISED_ENV = "LBJAX_SUPERVISED_STATE"  # set in the training process: where it records its progress
LOST_HOST_EXIT = 5
LOG_DIR = "logs"
# How long the training process waits for the runtime's verdict after a failed collective, beyond the
# heartbeat timeout, before it gives up and reports the error itself.
VERDICT_MARGIN_SECONDS = 30
_HOSTS_KEY = "lbjax/host/"
_PROGRESS_EVERY_SECONDS = 1.0
# The runtime's ways of ending a process whose peer is gone.
_RUNTIME_VERDICT = "JAX distributed service detected fatal errors"
_UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*([\d,\s]+)")
_TASK = re.compile(r"/job:[^/]+/replica:\d+/task:(\d+)")
_PEER_FAILURE = re.compile(r"Gloo|Connection (reset|closed|refused)|UNAVAILABLE|coordination service")
_LEADER_LOST = ("Failed to send RPC to coordination service", "leader task was preempted/died")
_REGISTER = "CoordinationService/RegisterTask"  # the call of a process joining the job
JOB_NOT_FORMED_EXIT = 2
JOIN_TIMEOUT_SECONDS = 300  # jax.distributed.initialize's initialization_timeout


def supervised_state() -> pathlib.Path | None:
  """In the training process of a supervised run: the file where it records its progress."""
  value = os.environ.get(SUPERVISED_ENV)
  return pathlib.Path(value) if value else None


def _log_name(process_id: int | None) -> str:
  return f"process{process_id}" if process_id is not None else f"{socket.gethostname()}-{os.getpid()}"


def check_heartbeat_timeout(seconds: Any) -> None:
  """Raises `ConfigError` unless `config.heartbeat_timeout_seconds` is a whole number of seconds >= 1."""
  from lbjax.train.errors import ConfigError  # pylint: disable=import-outside-toplevel
  if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
    raise ConfigError(f"config.heartbeat_timeout_seconds must be an integer >= 1 (seconds a process may be silent "
                      f"before the others stop), got {seconds!r}.")


def supervise(argv: list[str], workdir: str, process_id: int | None, heartbeat_timeout_seconds: int,
              num_processes: int | None = None) -> int:
  """Runs `python -m lbjax.main argv` as the training process of this host and returns its exit status,
  or `LOST_HOST_EXIT` with the lost-host message when the JAX runtime ended it because a process of the
  job was lost. SIGTERM and SIGINT are passed on to it (a preemption saves, as without a supervisor);
  it dies with the supervisor (`kill -9` of either is the loss of this host).

  Raises:
    WorkdirInUseError: a run of this host holds the workdir (checked before its logs are touched).
  """
  from lbjax.train import workdir_lock  # pylint: disable=import-outside-toplevel
  check_heartbeat_timeout(heartbeat_timeout_seconds)
  workdir_lock.WorkdirLock(workdir).refuse_if_held_here()
  logs = pathlib.Path(workdir).absolute() / LOG_DIR
  logs.mkdir(parents=True, exist_ok=True)
  name = _log_name(process_id)
  state_file, runtime_log = logs / f"{name}.json", logs / f"{name}.runtime.log"
  state_file.unlink(missing_ok=True)
  start = runtime_log.stat().st_size if runtime_log.exists() else 0  # an earlier launch's messages stay before
  env = dict(os.environ, **{SUPERVISED_ENV: str(state_file)})
  # Its own process group: a Ctrl-C at the terminal reaches it once, through the supervisor.
  child = subprocess.Popen([sys.executable, "-m", "lbjax.main", *argv], env=env, preexec_fn=_die_with_parent,
                           process_group=0)
  forward = lambda signum, frame: child.send_signal(signum)
  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    status = child.wait()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  if status >= 0 and status != 134:
    return status
  runtime = ""
  if runtime_log.exists():
    with open(runtime_log, "rb") as log:
      log.seek(start)
      runtime = log.read().decode(errors="replace")
  progress = json.loads(state_file.read_text()) if state_file.exists() else {}
  if _RUNTIME_VERDICT in runtime and "process_index" not in progress and _REGISTER in runtime:
    print(job_not_formed_message(argv, process_id, num_processes, runtime_log), file=sys.stderr, flush=True)
    return JOB_NOT_FORMED_EXIT
  if _RUNTIME_VERDICT in runtime:
    progress.setdefault("process_index", "?" if process_id is None else process_id)
    progress.setdefault("process_count", num_processes)
    print(lost_host_message(runtime, progress, workdir, argv, heartbeat_timeout_seconds, runtime_log),
          file=sys.stderr, flush=True)
    return LOST_HOST_EXIT
  signum = -status if status < 0 else signal.SIGABRT
  print(f"lbjax-train: the training process ended by {signal.Signals(signum).name}; the JAX runtime's messages "
        f"are in {runtime_log}.", file=sys.stderr, flush=True)
  return 128 + signum


def _die_with_parent() -> None:
  """In the training process, before exec (Linux): SIGKILL when the supervisor dies."""
  if sys.platform.startswith("linux"):
    import ctypes  # pylint: disable=import-outside-toplevel
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def lost_processes(runtime_log: str) -> list[int]:
  """The process indices the runtime's verdict names as lost; [0] when the coordinator is unreachable."""
  verdict = runtime_log[max(0, runtime_log.find(_RUNTIME_VERDICT) - 2000):]
  unhealthy = _UNHEALTHY.search(verdict)
  if unhealthy:
    return sorted({int(i) for i in re.findall(r"\d+", unhealthy.group(1))})
  if any(text in verdict for text in _LEADER_LOST):
    return [0]
  return sorted({int(i) for i in _TASK.findall(verdict)})


def job_not_formed_message(argv: list[str], process_id: int | None, num_processes: int | None,
                           log_path: pathlib.Path) -> str:
  """The few lines a process prints when the runtime ended it because the job never formed: not every
  process joined the coordinator within `JOIN_TIMEOUT_SECONDS`."""
  me = "This process" if process_id is None else f"Process {process_id}"
  count = f"all {num_processes}" if num_processes else "all the"
  return "\n".join([
      f"lbjax-train: the job did not start: {me} waited {JOIN_TIMEOUT_SECONDS} s for the other processes to join "
      "the coordinator, and not all did. Nothing was trained.",
      f"Start {count} processes within {JOIN_TIMEOUT_SECONDS} s of each other, with the same --coordinator_address "
      "(process 0's host and a free port, reachable from every host) and --num_processes, and each its own "
      "--process_id (0 on the coordinator's host); a process that failed before joining says why on its console. "
      "This one's command:",
      f"  {' '.join(['lbjax-train', *argv])}",
      f"(The JAX runtime's messages of this process are in {log_path}.)"])


def lost_host_message(runtime_log: str, progress: dict[str, Any], workdir: str, argv: list[str],
                      heartbeat_timeout_seconds: int, log_path: pathlib.Path) -> str:
  """The few lines a process prints when the runtime ended it because another process was lost."""
  from lbjax.train import checkpointing  # pylint: disable=import-outside-toplevel  (imports JAX; only now)
  hosts = progress.get("hosts", {})
  lost = lost_processes(runtime_log)
  named = ", ".join(f"{i} (host {hosts.get(str(i), '?')})" for i in lost)
  named = f"process{'es' * (len(lost) > 1)} {named}" if lost else "a process (the runtime's log does not say which)"
  errors = {i: error for i in lost if (error := _recorded_error(workdir, i))}
  how = ("the coordinator (process 0) cannot be reached" if lost == [0] else
         f"no heartbeat for config.heartbeat_timeout_seconds={heartbeat_timeout_seconds} s")
  if errors:
    how = "; ".join(f"process {i} stopped on an error: {error}" for i, error in errors.items())
  me = progress.get("process_index", "?")
  step = progress.get("step")
  at = f"at step {step}" if step is not None else "before its first step"
  steps = checkpointing.complete_steps(pathlib.Path(workdir) / "checkpoints")
  directory = pathlib.Path(workdir).absolute() / "checkpoints"
  newest = (f"The newest complete checkpoint is step {steps[0]} in {directory}; a checkpoint being written when "
            "the process was lost is incomplete and not used."
            if steps else "No checkpoint is complete yet: the relaunch starts from the beginning.")
  count = progress.get("process_count") or "the"
  command = " ".join(["lbjax-train", *argv])
  return "\n".join([
      f"lbjax-train: lost {named} of the job: {how}. This process ({me}) stopped {at}.",
      newest,
      ("To resume, mend what stopped it (its console says more), then relaunch" if errors else "To resume, relaunch")
      + f" all {count} processes with the commands they were started with; this one's:",
      f"  {command}",
      f"(The JAX runtime's messages of this process are in {log_path}.)"])


def _recorded_error(workdir: str, process_id: int) -> str:
  """The error process `process_id` of the job recorded before it stopped (`stop_on_error`), or ""."""
  state = pathlib.Path(workdir).absolute() / LOG_DIR / f"{_log_name(process_id)}.json"
  try:
    return json.loads(state.read_text()).get("error", "")
  except (OSError, ValueError):
    return ""


def in_job() -> bool:
  """Whether this is the supervised training process of a job of several processes, joined (`initialize`)."""
  return supervised_state() is not None and _PROGRESS.get("process_count", 1) > 1


def stop_on_error(message: str, status: int) -> NoReturn:
  """Ends the training process of a job of several processes that stops on an error (`in_job`), at once: records
  `message` (its first line) for the other processes' lost-host message and exits with `status`, skipping the
  interpreter's exit. That exit would call `jax.distributed.shutdown`, whose barrier waits up to 300 s for
  processes that are themselves waiting in a collective for this one: the job hung for 5 minutes, then every
  process reported a lost host."""
  state = supervised_state()
  if state is not None and message.strip():
    _PROGRESS["error"] = message.strip().splitlines()[0]
    _write_progress(state)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def initialize(coordinator_address: str | None, num_processes: int | None, process_id: int | None,
               heartbeat_timeout_seconds: int) -> None:
  """`jax.distributed.initialize` with the heartbeat timeout; in a supervised training process, first
  moves the runtime's stderr to `<workdir>/logs/<name>.runtime.log` (Python's stays on the console),
  then records this process's index and every process's host for the supervisor."""
  import jax  # pylint: disable=import-outside-toplevel
  state = supervised_state()
  if state is not None:
    _runtime_stderr_to(state.with_suffix(".runtime.log"))
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, heartbeat_timeout_seconds=heartbeat_timeout_seconds)
  if state is not None:
    _PROGRESS.update(process_index=jax.process_index(), process_count=jax.process_count(), hosts=_hosts(),
                     heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    _write_progress(state)


_PROGRESS: dict[str, Any] = {}


def _hosts() -> dict[str, str]:
  """Every process's host name, exchanged through the coordination service's key-value store."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import distributed  # pylint: disable=import-outside-toplevel  (the client Orbax uses too)
  client = distributed.global_state.client
  client.key_value_set(f"{_HOSTS_KEY}{jax.process_index()}", socket.gethostname())
  client.wait_at_barrier("lbjax_hosts", 120_000)
  return {key.rsplit("/", 1)[1]: host for key, host in client.key_value_dir_get(_HOSTS_KEY)}


def _runtime_stderr_to(path: pathlib.Path) -> None:
  """Points file descriptor 2 (what C++ writes to) at `path`, and Python's stderr, with the logging
  handlers that write to it, at the console it was."""
  import logging  # pylint: disable=import-outside-toplevel
  sys.stderr.flush()
  console = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
  with open(path, "ab") as log:
    os.dup2(log.fileno(), 2)
  old = sys.stderr
  sys.stderr = console
  loggers = [logging.getLogger()] + [logging.getLogger(name) for name in ("absl",)]
  for logger in loggers:
    for handler in logger.handlers:
      if isinstance(handler, logging.StreamHandler) and handler.stream in (old, sys.__stderr__):
        handler.setStream(console)
  try:
    from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
    handler = absl_logging.get_absl_handler().python_handler
    if handler.stream in (old, sys.__stderr__):
      handler.stream = console
  except ImportError:
    pass


_PROGRESS_WRITE = threading.Lock()


def _write_progress(state: pathlib.Path) -> None:
  """Writes `_PROGRESS` to `state` atomically. One writer at a time: the step recorder (`watch`) and the main
  thread (`stop_on_error`) shared the temporary file, and one's rename found it gone."""
  with _PROGRESS_WRITE:
    temporary = state.with_suffix(".tmp")
    temporary.write_text(json.dumps(_PROGRESS))
    temporary.replace(state)


def watch(step: Callable[[], int]) -> None:
  """In a supervised training process: records `step()` for the supervisor about every second (a
  daemon thread; the step loop is not touched). Elsewhere nothing."""
  state = supervised_state()
  if state is None:
    return

  def record():
    while True:
      current = step()
      if current != _PROGRESS.get("step"):
        _PROGRESS["step"] = current
        _write_progress(state)
      time.sleep(_PROGRESS_EVERY_SECONDS)

  threading.Thread(target=record, name="lbjax-progress", daemon=True).start()


def _caused_by_runtime(error: BaseException | None) -> bool:
  """Whether `error` or an error it was raised from is a `JaxRuntimeError` or reports a failed exchange
  with another process (a failed save wraps one; jax 0.10 raises Gloo's as a `ValueError`)."""
  seen = set()
  while error is not None and id(error) not in seen:
    if type(error).__name__ == "JaxRuntimeError" or _PEER_FAILURE.search(str(error)):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


def wait_for_runtime_verdict(error: BaseException) -> None:
  """In a supervised multi-process run, a failed collective (a `JaxRuntimeError`, or an error raised
  from one, such as a failed save) most often means a peer is gone: waits for the runtime to end this
  process (the supervisor then reports the lost host), at most the heartbeat timeout and a margin; then
  returns, and the caller raises `error`."""
  if supervised_state() is None or _PROGRESS.get("process_count", 1) < 2:
    return
  if not _caused_by_runtime(error):
    return
  time.sleep(_PROGRESS.get("heartbeat_timeout_seconds", 0) + VERDICT_MARGIN_SECONDS)
