"""Orbax's own reports go to `<workdir>/logs/`, not the console.

A failed background save (a full disk, a lost host) makes each of Orbax's writer threads log its error
with a traceback and raise in its thread; with lbjax's one message that says what failed, what is kept
and what to do, the console showed up to ~150 lines. `keep_orbax_reports_in_log` sends every record Orbax
logs (through absl or asyncio), every uncaught exception of a thread running Orbax code, and asyncio's
"Event loop is closed" errors that Orbax's storage callbacks raise once their loop is gone (printed
through `sys.excepthook`, up to 139 tracebacks in one CI run) to a log file instead, in full, so the
console keeps lbjax's message alone.
"""

import logging
import pathlib
import sys
import threading
import traceback
from types import TracebackType

LOG_NAME = "orbax.log"


def _involves_orbax(tb: TracebackType | None) -> bool:
  return any("orbax" in frame.filename for frame in traceback.extract_tb(tb))


def _is_closed_loop_callback(exc_type: type[BaseException] | None, exc_value: BaseException | None,
                             tb: TracebackType | None) -> bool:
  """asyncio's "Event loop is closed", raised in a callback that C++ (Orbax's storage layer) hands to an
  event loop already closed: a traceback of asyncio frames only, printed through `sys.excepthook`."""
  frames = traceback.extract_tb(tb)
  return (exc_type is RuntimeError and str(exc_value) == "Event loop is closed" and bool(frames)
          and all("asyncio" in pathlib.Path(frame.filename).parts for frame in frames))


def _reported_by_orbax(exc_type, exc_value, tb) -> bool:
  return _involves_orbax(tb) or _is_closed_loop_callback(exc_type, exc_value, tb)


def _log_error(handler: logging.Handler, message: str, args: tuple, exc_info: tuple) -> None:
  handler.handle(logging.LogRecord("orbax", logging.ERROR, __file__, 0, message, args, exc_info))


def _from_orbax(record: logging.LogRecord) -> bool:
  return "orbax" in record.pathname or bool(record.exc_info and _involves_orbax(record.exc_info[2]))


class _QuietFileHandler(logging.FileHandler):
  """A file handler that drops what it cannot write: the log may sit on the disk that just filled up."""

  def handleError(self, record: logging.LogRecord) -> None:
    del record


class _ToLog(logging.Filter):
  """On a logger: hands Orbax's records to the log file's handler, and keeps them off the console."""

  def __init__(self, handler: logging.Handler):
    super().__init__()
    self.handler = handler

  def filter(self, record: logging.LogRecord) -> bool:
    if not _from_orbax(record):
      return True
    if record.levelno >= self.handler.level:
      self.handler.handle(record)
    return False


def keep_orbax_reports_in_log(workdir: str | pathlib.Path, name: str | None = None) -> pathlib.Path:
  """Sends Orbax's log records (WARNING and above) and its threads' uncaught exceptions to
  `<workdir>/logs/<name>` (default `LOG_NAME`) from now on; returns that path."""
  path = pathlib.Path(workdir).absolute() / "logs" / (name or LOG_NAME)
  path.parent.mkdir(parents=True, exist_ok=True)
  handler = _QuietFileHandler(path, delay=True)
  handler.setLevel(logging.WARNING)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(pathname)s:%(lineno)d] "
                                         "%(message)s"))
  for logger in ("absl", "asyncio"):
    logging.getLogger(logger).addFilter(_ToLog(handler))
  default_hook = threading.excepthook

  def thread_exception(args: threading.ExceptHookArgs) -> None:
    if not _reported_by_orbax(args.exc_type, args.exc_value, args.exc_traceback):
      default_hook(args)
      return
    thread = args.thread.name if args.thread is not None else "?"
    _log_error(handler, "Uncaught exception in thread %s", (thread,),
               (args.exc_type, args.exc_value, args.exc_traceback))

  threading.excepthook = thread_exception
  sys.unraisablehook = _unraisable_to(handler, sys.unraisablehook)
  sys.excepthook = _excepthook_to(handler, sys.excepthook)
  return path


def _excepthook_to(handler: logging.Handler, default_hook):
  """`sys.excepthook` for the errors C++ callbacks print with `PyErr_Print` (asyncio's "Event loop is
  closed" from Orbax's storage threads once a save failed); anything else goes to `default_hook`, and so does
  the main thread's own uncaught exception, Orbax's frames in it or not (a multi-host start whose checkpoint
  barrier failed because a peer did not start: it ended the process with nothing on the console)."""

  def hook(exc_type, exc_value, tb) -> None:
    on_main_thread = threading.current_thread() is threading.main_thread()
    if not (_is_closed_loop_callback(exc_type, exc_value, tb)
            or (_involves_orbax(tb) and not on_main_thread)):
      default_hook(exc_type, exc_value, tb)
      return
    _log_error(handler, "Error in a callback", (), (exc_type, exc_value, tb))

  return hook


def _unraisable_to(handler: logging.Handler, default_hook):
  """`sys.unraisablehook` for the "Event loop is closed" errors of Orbax's abandoned coroutines."""

  def hook(unraisable) -> None:
    if not _reported_by_orbax(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback):
      default_hook(unraisable)
      return
    _log_error(handler, "%s: %r", (unraisable.err_msg, unraisable.object),
               (unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))

  return hook
