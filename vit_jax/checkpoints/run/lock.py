"""One run per workdir: a lock taken before anything is written there.

``workdir/run.lock`` names its holder (host, PID, when it started) and a heartbeat that the
holder renews every ``HEARTBEAT_S``. On a local or network filesystem the holder also keeps
an advisory lock on the file (``flock``), which the kernel drops when the process dies, however
it dies: a second run finds it taken and stops with one line naming the holder; a run killed
with ``kill -9`` leaves the file, and the next run takes it over with a warning. A lock whose
PID is gone on this host (or is another process now), or, from another host, whose heartbeat is
older than ``STALE_S`` (filesystems without ``flock``, object stores), is taken over the same
way. A record that cannot be read (a crash mid-write, a damaged disk) is no proof of a
holder: where the file's ``flock`` is free it is taken over with a warning (the kernel would hold
it for a live run); where there is no ``flock`` to ask, it is refused in one line naming the file
to remove, as two runs in one workdir would spoil each other's checkpoints. The file is emptied,
never removed, at the end (removing it would let a run lock a file no one else sees). A
multi-process run takes it once, in process 0, for the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from absl import logging
from etils import epath

from vit_jax.base import errors, platforms

LOCK_FILE = 'run.lock'
HEARTBEAT_S = 60.0  # How often the holder renews its heartbeat.
STALE_S = 600.0  # A heartbeat this old is a dead run's (for holders on other hosts).
_SIZE = 1024  # The record, padded: rewritten in place with one write.
_HELD: set[str] = set()  # The workdirs this process holds (``hold`` is re-entrant).


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a workdir's lock."""

  host: str
  pid: int
  started: float  # time.time() when it took the lock.
  heartbeat: float  # time.time() of its last renewal.
  process_start: str = ''  # /proc/PID/stat's start time: tells a reused PID.

  def describe(self) -> str:
    started = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))
    return (f'PID {self.pid} on {self.host}, started {started}, heartbeat '
            f'{max(0, time.time() - self.heartbeat):.0f}s ago')

  def gone(self) -> str:
    """Why its run is gone ('' if it may be running)."""
    if self.host == socket.gethostname():
      if not _alive(self.pid):
        return f'PID {self.pid} is not running on this host'
      if self.process_start and _process_start(self.pid) != self.process_start:
        return f'PID {self.pid} is another process now'
      return ''
    if time.time() - self.heartbeat > STALE_S:
      return f'its heartbeat is {time.time() - self.heartbeat:.0f}s old (> {STALE_S:.0f}s)'
    return ''


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


def _process_start(pid: int) -> str:
  """The start time of process ``pid`` (clock ticks since boot), '' where unknown."""
  stat = platforms.read_text(f'/proc/{pid}/stat')
  return stat.rsplit(')', 1)[-1].split()[19] if stat else ''  # Field 22; the name may hold spaces.


_TYPES = {'host': str, 'pid': int, 'started': (int, float), 'heartbeat': (int, float),
          'process_start': str}


def _read(data: bytes) -> Holder | None:
  """The holder recorded in ``data``; None where it is empty (released). ``ValueError`` where
  it is not a record: being written, or garbage (a crash mid-write, a damaged disk)."""
  text = data.decode('utf-8', 'replace').strip(' \n')
  if not text:
    return None
  fields = json.loads(text)
  if (not isinstance(fields, dict) or not {'host', 'pid', 'started', 'heartbeat'} <= set(fields)
      or any(k not in _TYPES or not isinstance(v, _TYPES[k]) for k, v in fields.items())):
    raise ValueError(f'not a lock record: {text[:40]!r}')
  return Holder(**fields)


class WorkdirLock:
  """The lock of one workdir: ``acquire`` (raises ``errors.WorkdirInUseError``), ``release``."""

  def __init__(self, workdir: str | os.PathLike):
    self.path = epath.Path(workdir) / LOCK_FILE
    self.local = '://' not in str(workdir)
    self.fd: int | None = None
    self.holder: Holder | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def acquire(self) -> None:
    self.path.parent.mkdir(parents=True, exist_ok=True)
    flocked = self.local and self._flock(os.O_RDWR | os.O_CREAT)
    previous = self._wait_for_record(0.0 if flocked else 1.0)
    if isinstance(previous, bytes) and flocked:
      logging.warning('%s holds no readable record (%d bytes: a crash mid-write or a damaged '
                      'disk) and no run holds its flock: taking it over.', self.path,
                      len(previous))
    elif isinstance(previous, bytes):
      raise errors.WorkdirInUseError(
          f'{self.path} holds no readable record ({len(previous)} bytes: a crash mid-write or a '
          'damaged disk), and this filesystem cannot tell whether a run holds it: if no run '
          f'uses {self.path.parent}, remove {self.path}; else use another --workdir.')
    elif previous is not None:
      if why := previous.gone():
        logging.warning('%s was left by a run that is gone (%s; %s): taking it over.',
                        self.path, previous.describe(), why)
      else:  # Alive by its record: another host's, or a filesystem without flock.
        self._refuse(previous, 'running, by its record')
    now = time.time()
    self.holder = Holder(socket.gethostname(), os.getpid(), now, now,
                         _process_start(os.getpid()))
    self._write()
    self._thread = threading.Thread(target=self._beat, daemon=True, name='vit_jax lock')
    self._thread.start()

  def release(self) -> None:
    self._stop.set()
    if self._thread:
      self._thread.join()
    with contextlib.suppress(OSError):
      if self.fd is not None:
        os.ftruncate(self.fd, 0)  # Emptied, not removed: see the module's doc.
      elif self.holder is not None:
        self.path.write_text('')
    self._close()

  def _flock(self, flags: int) -> bool:
    """Opens the file (``os.open``'s ``flags``) and takes its flock: True; False on a
    filesystem without flock (the record decides); refused where a run holds it."""
    self.fd = os.open(self.path, flags, 0o644)
    try:
      fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      return True
    except BlockingIOError:
      self._refuse(self._wait_for_record(), 'it is locked')  # Unreadable: still its flock.
    except OSError as e:
      if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        raise
    return False

  def _close(self) -> None:
    if self.fd is not None:
      os.close(self.fd)  # Drops the flock.
      self.fd = None

  def _wait_for_record(self, patience: float = 2.0) -> Holder | bytes | None:
    """The record in the file (None: empty); a holder that has just created it is given
    ``patience`` seconds to write it. Its bytes where they are still not a record then."""
    deadline = time.time() + patience
    while True:
      try:
        data = (os.pread(self.fd, _SIZE, 0) if self.fd is not None
                else self.path.read_bytes() if self.path.exists() else b'')
      except OSError:
        data = b''
      try:
        if (holder := _read(data)) is not None or time.time() >= deadline:
          return holder
      except ValueError:
        if time.time() >= deadline:
          return data
      time.sleep(0.05)

  def _refuse(self, holder: Holder | bytes | None, how: str) -> None:
    self._close()
    who = (holder.describe() if isinstance(holder, Holder)
           else f'a process whose record in {self.path} is unreadable' if holder
           else f'a process that has not written {self.path} yet')
    raise errors.WorkdirInUseError(
        f'{self.path.parent} is in use by another run ({who}; {how}): one run per workdir. '
        'Wait for it to end or stop it, or use another --workdir; if that run is gone, '
        f'remove {self.path}.')

  def _write(self) -> None:
    text = json.dumps(dataclasses.asdict(self.holder)).ljust(_SIZE)
    if self.fd is not None:
      os.pwrite(self.fd, text.encode(), 0)
    else:
      self.path.write_text(text)

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      self.holder = dataclasses.replace(self.holder, heartbeat=time.time())
      with contextlib.suppress(OSError):  # A full disk: the next save says so.
        self._write()


def check_free(workdir: str | os.PathLike) -> None:
  """Refuses (``errors.WorkdirInUseError``) a workdir that another run holds, as ``hold``
  would, creating and writing nothing: a command's answer before it starts jax (``hold``
  still takes the lock after). Single-process only: on a job's other hosts, process 0 may
  hold it already."""
  lock = WorkdirLock(workdir)
  if not lock.path.exists():
    return
  if lock.local:
    lock._flock(os.O_RDONLY)
  try:
    previous = lock._wait_for_record(0.0)
  finally:
    lock._close()
  if isinstance(previous, Holder) and not previous.gone():
    lock._refuse(previous, 'running, by its record')


@contextlib.contextmanager
def hold(workdir: str | os.PathLike) -> Iterator[None]:
  """Holds ``workdir``'s lock for the block (re-entrant within a process). Multi-process:
  process 0 takes it for the job; if it cannot, every process raises."""
  key = os.path.abspath(workdir) if '://' not in str(workdir) else str(workdir)
  if key in _HELD:
    yield
    return
  lock, failure = WorkdirLock(workdir), None
  count, index = _processes()
  if index == 0:
    try:
      lock.acquire()
    except errors.WorkdirInUseError as e:
      failure = e
  if count > 1 and _process_0_failed(failure is not None) and failure is None:
    failure = errors.WorkdirInUseError(
        f'Process 0 could not take the lock of {workdir} (its log says why): one run per '
        'workdir.')
  if failure is not None:
    raise failure
  _HELD.add(key)
  try:
    yield
  finally:
    _HELD.discard(key)
    if index == 0:
      lock.release()


def _processes() -> tuple[int, int]:
  """(process count, this process's index): (1, 0) where jax has not been imported."""
  jax: Any = sys.modules.get('jax')
  if jax is None:
    return 1, 0
  return jax.process_count(), jax.process_index()


def _process_0_failed(failed: bool) -> bool:
  """Process 0's ``failed``, on every process."""
  import numpy as np
  from jax.experimental import multihost_utils

  return bool(multihost_utils.broadcast_one_to_all(np.int32(failed)))
