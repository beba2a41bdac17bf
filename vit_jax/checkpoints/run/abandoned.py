"""What Orbax leaves behind when a save or a read fails: its abandoned reads and writes,
which print dozens of tracebacks around the one real error, and the threads of a failed
save, which would keep the process from exiting. ``manager`` reports the error itself."""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from typing import Any

import jax


def after_failed_save() -> None:
  """Quiets what a failed save abandoned, and ends its threads."""
  silence_reads()  # The writes abandoned after the first failure.
  # Orbax's coroutines of the abandoned save, collected at exit, each warned (two lines).
  warnings.filterwarnings('ignore', message=r"coroutine '.*' was never awaited",
                          category=RuntimeWarning)
  release_threads()


def release_threads() -> None:
  """Ends Orbax's threads of a failed save that still wait for the signals of its steps that
  never ran (e.g. creating the step's folder on a read-only file system): they are not
  daemons, so the process would hang at exit, at 0% CPU, for Orbax's barrier timeout. Each
  is cancelled, then woken by its own signals. One process only: the signals of a
  multi-process run are the job's."""
  if jax.process_count() > 1:
    return
  try:
    from orbax.checkpoint._src.futures import future
  except ImportError:  # Another Orbax: nothing known to release.
    return
  signaling = getattr(future, '_SignalingThread', None)
  for thread in threading.enumerate():
    if signaling is not None and isinstance(thread, signaling) and thread.is_alive():
      thread.cancel()
      future.set_signals(thread._receive_signals, operation_id=thread._operation_id)


def silence_reads() -> None:
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
