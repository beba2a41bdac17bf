"""What a person reads on the console: vit_jax's own lines, and progress with an ETA.

Orbax, clu, jax and TensorFlow log at INFO through the same absl handler as vit_jax
(Orbax alone printed 133 of the quickstart's 279 lines). ``quiet_third_party`` keeps
their warnings and errors and drops their INFO lines, and Orbax's own reports of a failed
save (vit_jax reports it in one line); the command-line tools call it unless
``--verbosity`` is given. ``silence_abandoned_reads`` drops the tracebacks of the reads and
writes Orbax abandons after such a failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import vit_jax
from vit_jax.base import cpu

_OURS = os.path.dirname(os.path.abspath(vit_jax.__file__)) + os.sep


def _ours_or_warning(record: logging.LogRecord) -> bool:
  if _orbax_failure(record) or _orbax_preemption(record):
    return False
  return record.levelno >= logging.WARNING or os.path.abspath(record.pathname).startswith(_OURS)


def _orbax_failure(record: logging.LogRecord) -> bool:
  """Orbax's own report of a failed save or read, with its tracebacks (its threads log each
  one again: hundreds of lines); vit_jax reports the failure in one line with its cause."""
  if record.levelno < logging.ERROR or f'{os.sep}orbax{os.sep}' not in record.pathname:
    return False
  message = str(record.msg)
  return bool(record.exc_info) or any(
      sign in message for sign in ('raised an exception', 'Failed to run', 'failed'))


def _orbax_preemption(record: logging.LogRecord) -> bool:
  """Orbax's warning that a SIGTERM's sync point is reached, one per thread that asks: the
  run says in one line which step it saved."""
  return (f'{os.sep}orbax{os.sep}' in record.pathname
          and 'Reached preemption sync point' in str(record.msg))


# ``logging.info(..., extra=console.FILE_ONLY)``: a line for the log file, not the console.
FILE_ONLY = {'vit_jax_file_only': True}


def _console_line(record: logging.LogRecord) -> bool:
  return not getattr(record, 'vit_jax_file_only', False)


class _Plain(logging.Formatter):
  """A console line as a person reads it: the message, ``warning:`` or ``error:`` before
  the messages of those levels; no absl prefix (date, time, thread, file:line: the log
  file keeps them)."""

  def format(self, record: logging.LogRecord) -> str:
    message = record.getMessage()
    if record.levelno >= logging.WARNING:
      message = f'{"error" if record.levelno >= logging.ERROR else "warning"}: {message}'
    if record.exc_info:
      message += '\n' + self.formatException(record.exc_info)
    return message


def plain_console() -> None:
  """The console's log lines without absl's prefix, and without the ``FILE_ONLY`` lines."""
  from absl import logging as absl_logging

  handler = absl_logging.get_absl_handler()
  handler.setFormatter(_Plain())
  handler.addFilter(_console_line)  # Once: logging's addFilter skips a filter it holds.


class _LogFile(logging.Handler):
  """Appends absl-prefixed lines to ``path`` once its directory exists: the run creates
  its workdir only after checking its config, so the lines before are held until then
  (and dropped if the run ends first: its error is on the console). A file that cannot
  be written (or stops being writable: a full disk) is said once, in one warning, and no
  more lines are tried."""

  def __init__(self, path: str):
    from absl import logging as absl_logging

    super().__init__()
    self.path = path
    self.held: list[logging.LogRecord] = []
    self.stream = None
    self.setFormatter(absl_logging.PythonFormatter())

  def emit(self, record: logging.LogRecord) -> None:
    if self.stream is None:
      self.held.append(record)
      if not os.path.isdir(os.path.dirname(self.path)):
        return
      try:
        self.stream = open(self.path, 'a', encoding='utf-8')  # noqa: SIM115 (the process's)
      except OSError as e:
        self._give_up(e)
        return
      records, self.held = self.held, []
    else:
      records = [record]
    try:
      for held in records:
        self.stream.write(self.format(held) + '\n')
      self.stream.flush()
    except OSError as e:
      self._give_up(e)

  def _give_up(self, e: OSError) -> None:
    logging.getLogger().removeHandler(self)
    if self.stream is not None:
      with contextlib.suppress(OSError):  # What it held could not be written either.
        self.stream.close()
      self.stream = None
    logging.getLogger('absl').warning('Cannot write the log file %s (%s): no more lines go '
                                      'there.', self.path, e.strerror)

  def close(self) -> None:
    if self.stream is not None:
      self.stream.close()
    super().close()


def log_file(workdir: str, process_index: int) -> str:
  """Every log line from now on (third-party INFO lines too) with absl's prefix, appended
  to ``workdir/log.txt`` (``log.process{N}.txt`` for process N > 0) once the run creates
  its workdir; to absl's ``--log_dir`` (or the temporary directory) where the workdir is
  remote (an object store cannot be appended to). Returns the file's path."""
  from absl import flags

  name = 'log.txt' if process_index == 0 else f'log.process{process_index}.txt'
  directory = str(workdir)
  if '://' in directory:
    directory = flags.FLAGS['log_dir'].value or tempfile.gettempdir()
    name = f'vit_jax.{os.getpid()}.{name}'
  path = os.path.join(directory, name)
  logging.getLogger().addHandler(_LogFile(path))
  return path


@contextlib.contextmanager
def logging_to(workdir: str) -> Iterator[str]:
  """``log_file`` for the lines of one run among several in a process (a sweep's, VTAB's
  tasks): the file is closed at the end of the block. Yields its path."""
  import jax

  path = log_file(workdir, jax.process_index())
  handler = logging.getLogger().handlers[-1]
  try:
    yield path
  finally:
    logging.getLogger().removeHandler(handler)
    handler.close()


def start(cpu_devices: int | None) -> str | None:
  """An entry point's start-up before it uses jax: XLA:CPU's set-up where jax will run on
  the CPU (``vit_jax.base.cpu.prepare``: may re-execute the process once), plain console lines
  (``plain_console``) with the third-party log lines quiet unless ``--verbosity`` was given
  (then absl's own lines, prefixes and all: for debugging), and ``cpu_devices`` CPU devices
  where set. Returns the malloc mode of a CPU run, else
  None."""
  from absl import flags

  malloc = cpu.prepare(cpu_devices or 0) if cpu.runs_on_cpu() else None
  if not flags.FLAGS['verbosity'].present:
    plain_console()
    quiet_third_party(preload_tensorflow=True)
  if cpu_devices:
    import jax

    jax.config.update('jax_num_cpu_devices', cpu_devices)
  return malloc


def quiet_third_party(preload_tensorflow: bool = False) -> None:
  """Only vit_jax's INFO lines (everyone's warnings and errors) from now on.

  ``preload_tensorflow``: import TensorFlow (which clu's TensorBoard writer and TFDS
  load) now, with the process's C-level stderr pointed at /dev/null: TensorFlow 2.21
  prints its start-up INFO lines (oneDNN) from C++ before any log setting applies. A
  failing import still raises its Python exception.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')  # TensorFlow's later C++ INFO lines.
  from absl import logging as absl_logging

  absl_logging.get_absl_handler().addFilter(_ours_or_warning)  # Once, as plain_console's.
  if preload_tensorflow and 'tensorflow' not in sys.modules:
    saved = os.dup(2)
    try:
      with open(os.devnull, 'w') as devnull:
        os.dup2(devnull.fileno(), 2)
      import tensorflow  # noqa: F401
    except ModuleNotFoundError as e:  # The core install (no TensorFlow): nothing to quiet.
      if e.name != 'tensorflow':
        raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def silence_abandoned_reads() -> None:
  """Silences the reads and writes Orbax abandons after the first failure, for this process.

  Their TensorStore callbacks find Orbax's event loop closed and each printed a
  traceback ("Event loop is closed", dozens around the one real error, through
  ``sys.unraisablehook``, ``sys.excepthook`` or ``threading.excepthook``); the read
  coroutines left behind raised their own copy of the error as they were collected; the
  asyncio logger added "Task (or _GatheringFuture) exception was never retrieved" for
  each. Only those are dropped (the real error is reported by the caller); anything else
  is reported as before. Installed before a read or the first save, as the callbacks can
  fire before the failure reaches its caller.
  """
  if getattr(sys.unraisablehook, 'vit_jax', False):
    return
  previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook
  previous_thread = threading.excepthook

  def loop_closed(e: BaseException | None) -> bool:
    return isinstance(e, RuntimeError) and str(e) == 'Event loop is closed'

  def unraisable_hook(unraisable: Any) -> None:
    abandoned_read = getattr(unraisable.object, '__qualname__', '') in _ORBAX_READS
    if not (loop_closed(unraisable.exc_value) or abandoned_read):
      previous_unraisable(unraisable)

  def except_hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    if not loop_closed(value):
      previous_except(kind, value, tb)

  def thread_hook(args: Any) -> None:
    if not loop_closed(args.exc_value):
      previous_thread(args)

  unraisable_hook.vit_jax = True
  sys.unraisablehook, sys.excepthook = unraisable_hook, except_hook
  threading.excepthook = thread_hook
  logging.getLogger('asyncio').addFilter(
      lambda record: 'exception was never retrieved' not in record.getMessage())


# Orbax's coroutines that read an array's chunks; abandoned after a failure, they raise
# again when collected.
_ORBAX_READS = ('_read_array_index_and_device_put',)


def duration(seconds: float) -> str:
  """3725 -> '1h02m05s'."""
  seconds = int(seconds)
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s'


class Progress:
  """'{what}: done/total (pct), rate/s, ETA' lines, at most one every ``every`` seconds.

  ``update(done)`` after each piece of work (``fraction`` instead of done/total where
  the total is not known in advance), ``finish(done)`` for the closing line.
  """

  def __init__(self, what: str, total: int | None, unit: str = 'images', every: float = 10.,
               write: Callable[[str], None] | None = None):
    self.what, self.total, self.unit, self.every = what, total, unit, every
    self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
    self.start = self.last = time.perf_counter()

  def line(self, done: int, fraction: float | None = None, final: bool = False) -> str:
    elapsed = time.perf_counter() - self.start
    if fraction is None and self.total:
      fraction = done / self.total
    count = f'{done:,}' + (f'/{self.total:,}' if self.total else '') + f' {self.unit}'
    if fraction is not None and not final:
      count += f' ({100 * fraction:.0f}%)'
    parts = [f'{self.what}: {count}', f'{done / max(elapsed, 1e-9):,.0f}/s']
    if final:
      parts.append(f'in {duration(elapsed)}')
    elif fraction:
      parts.append(f'ETA {duration(elapsed * (1 - fraction) / fraction)}')
    return ', '.join(parts)

  def update(self, done: int, fraction: float | None = None) -> None:
    now = time.perf_counter()
    if now - self.last >= self.every:
      self.last = now
      self.write(self.line(done, fraction))

  def finish(self, done: int) -> None:
    self.write(self.line(done, final=True))


@contextlib.contextmanager
def working(what: str, every: float = 30., write: Callable[[str], None] | None = None
            ) -> Iterator[None]:
  """'{what} ...' as the block starts, '{what}: 0h01m30s so far' every ``every`` seconds
  while it runs (from a thread: one long call that releases the GIL, an XLA compile), and
  '{what}: done in 0h04m24s' when it ends: minutes in one call are not silent."""
  write = write or (lambda line: print(line, file=sys.stderr, flush=True))
  start, done = time.perf_counter(), threading.Event()

  def tick() -> None:
    while not done.wait(every):
      write(f'{what}: {duration(time.perf_counter() - start)} so far')

  write(f'{what} ...')
  thread = threading.Thread(target=tick, daemon=True, name='vit_jax progress')
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
  write(f'{what}: done in {duration(time.perf_counter() - start)}')
