"""`lbjax.train.orbax_log`: what Orbax logs and raises in its threads goes to the log file, nothing else does.

In a subprocess (the routing is process-wide): an Orbax record through absl's logger, an exception raised
in a thread from Orbax code, asyncio's "Event loop is closed" printed from C (as Orbax's storage callbacks
print it), and, for contrast, a record and a thread exception of other code.
"""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, sys, threading
from lbjax.train import orbax_log
logging.basicConfig()
path = orbax_log.keep_orbax_reports_in_log(sys.argv[1])
absl = logging.getLogger("absl")
absl.handle(absl.makeRecord("absl", logging.ERROR, "/site-packages/orbax/checkpoint/writer.py", 1,
                            "orbax writer failed", None, None))
absl.handle(absl.makeRecord("absl", logging.WARNING, "/lbjax/train/run.py", 1, "lbjax warning", None, None))
namespace = {}
exec(compile("def write():\\n  raise OSError('orbax thread: no space left')", "/site-packages/orbax/fake.py", "exec"),
     namespace)
def other():
  raise ValueError("another thread's error")
for target in (namespace["write"], other):
  thread = threading.Thread(target=target)
  thread.start()
  thread.join()
import asyncio
loop = asyncio.new_event_loop()
loop.close()
for code in ("loop.call_soon_threadsafe(print)", "raise RuntimeError('Event loop is closed')"):
  try:  # the first is what Orbax's storage callbacks meet once their loop is closed
    exec(code)
  except RuntimeError as e:
    # PyErr_Print, with which C++ reports a callback's error, hands it to sys.excepthook; from C, the
    # traceback of the first holds asyncio's frames only
    sys.excepthook(RuntimeError, e, e.__traceback__.tb_next.tb_next)
print(path)
"""


def test_orbax_reports_go_to_the_log_and_everything_else_to_the_console(tmp_path):
  done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                        timeout=120, check=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
  log = pathlib.Path(done.stdout.strip()).read_text()
  assert done.stdout.strip() == str(tmp_path / "logs" / "orbax.log")
  assert "orbax writer failed" in log and "OSError: orbax thread: no space left" in log
  assert log.count("RuntimeError: Event loop is closed") == 1 and "call_soon_threadsafe" in log
  assert done.stderr.count("RuntimeError: Event loop is closed") == 1  # raised from other code: the console
  assert "orbax" not in done.stderr
  assert "lbjax warning" in done.stderr and "ValueError: another thread's error" in done.stderr
  assert "lbjax warning" not in log and "another thread" not in log


MAIN_THREAD_SCRIPT = """
import sys
from lbjax.train import orbax_log
orbax_log.keep_orbax_reports_in_log(sys.argv[1])
namespace = {}
exec(compile("def sync():\\n  raise RuntimeError('barrier timed out: a peer did not start')",
             "/site-packages/orbax/checkpoint/multihost.py", "exec"), namespace)
namespace["sync"]()
"""


def test_the_main_thread_s_uncaught_exception_stays_on_the_console_with_orbax_frames_in_it(tmp_path):
  """A multi-host start whose Orbax barrier failed (a peer did not start) ended with an empty console."""
  done = subprocess.run([sys.executable, "-c", MAIN_THREAD_SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True,
                        text=True, timeout=120, check=False, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
  assert done.returncode == 1
  assert "RuntimeError: barrier timed out: a peer did not start" in done.stderr
  assert not (tmp_path / "logs" / "orbax.log").exists()
