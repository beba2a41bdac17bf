"""The processes of a multi-process run: joined by ``jax.distributed``, and watched.

When one process stops answering (killed, out of memory, its host preempted), jax leaves the
others to a failed or hung collective and then, at its heartbeat timeout, to a C++ abort with
thread dumps (exit status 134). ``start`` joins the processes and starts a watchdog thread in
each: every process publishes a heartbeat in jax's key-value store, and one whose heartbeat
stands still for ``timeout_s`` (shorter than jax's own timeout) ends each survivor with one
line naming it and the step the run resumes from, and exit status 69
(``errors.PEER_LOST_STATUS``), which the launch scripts' ``--restarts=N`` take as "start
again". A survivor whose collective failed first (the dead peer's connection closed) waits for
that verdict (``verdict``). Where the process that dies is process 0, which holds jax's
coordination service, jaxlib aborts the others at once in C++ (it takes no Python callback
there): exit status 134, which the launchers restart as well.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from vit_jax.base import errors

TIMEOUT_S = 60.0  # A peer's heartbeat standing still this long: it is gone.
_KEY = 'vit_jax/heartbeat/'
_DONE = 'done'  # The heartbeat of a process that finished: it is not waited for.
_watchdog: _Watchdog | None = None


def start(coordinator: str | None, num_processes: int | None, process_id: int | None, *,
          timeout_s: float = TIMEOUT_S,
          resumes_from: Callable[[], str] = lambda: 'its newest checkpoint') -> None:
  """``jax.distributed.initialize`` (arguments as its own; None: found by jax on Cloud TPU
  and SLURM), then this process's watchdog; ``resumes_from()`` says where a restart starts
  (e.g. 'step 20, its newest checkpoint'), for the line a survivor ends with."""
  global _watchdog
  import jax
  from jax._src import distributed

  # jax's own timeout well after ours: its verdict is the C++ abort.
  jax.distributed.initialize(coordinator, num_processes, process_id,
                             heartbeat_timeout_seconds=int(max(100, 3 * timeout_s)))
  if jax.process_count() > 1:
    _watchdog = _Watchdog(distributed.global_state.client, jax.process_index(),
                          jax.process_count(), timeout_s, resumes_from)
    _watchdog.start()


def finish() -> None:
  """Marks this process done (its peers stop waiting for its heartbeat) and stops the
  watchdog: at the end of a run that finished."""
  if _watchdog is not None:
    _watchdog.finish()


def verdict() -> None:
  """Waits for the watchdog to find a peer gone, where it may (a failed collective: the
  process exits there with one line); returns if every peer still answers."""
  if _watchdog is not None:
    _watchdog.verdict()


class _Watchdog(threading.Thread):
  """Beats every ``timeout_s / 5`` seconds, and ends the process when a peer's heartbeat
  stands still for ``timeout_s``."""

  def __init__(self, client: Any, index: int, count: int, timeout_s: float,
               resumes_from: Callable[[], str]):
    super().__init__(name='vit_jax peers', daemon=True)
    self.client, self.index, self.count = client, index, count
    self.timeout_s, self.resumes_from = timeout_s, resumes_from
    self.stopped = threading.Event()

  def run(self) -> None:
    beat, seen = 0, {}  # Process index -> (its last heartbeat, when it last changed).
    host = socket.gethostname()
    while not self.stopped.wait(self.timeout_s / 5 if beat else 0):
      beat += 1
      try:
        self.client.key_value_set(f'{_KEY}{self.index}', f'{beat} {host}', allow_overwrite=True)
        beats = {key.rsplit('/', 1)[-1]: value
                 for key, value in self.client.key_value_dir_get(_KEY)}
      except Exception:  # noqa: BLE001 (the coordination service is gone with process 0)
        if self.stopped.is_set():
          return
        self.lost(0, '')
      now = time.monotonic()
      for i in range(self.count):
        value = beats.get(str(i))
        if i == self.index or value == _DONE:
          continue
        if i not in seen or seen[i][0] != value:
          seen[i] = (value, now)
        elif now - seen[i][1] > self.timeout_s:
          self.lost(i, (value or '').partition(' ')[2])

  def lost(self, i: int, host: str) -> None:
    """Ends this process: one line naming process ``i`` and where the run resumes."""
    try:
      resumes = self.resumes_from()
    except Exception as e:  # noqa: BLE001 (the line must come out)
      resumes = f'its newest good checkpoint ({e})'
    errors.report(errors.PeerLost(
        f'process {i} of {self.count}{f" (host {host})" if host else ""} stopped answering '
        f'for {self.timeout_s:.0f}s (killed, out of memory, or its host went down: its own '
        f'log may say which); the run resumes from {resumes}: run the same command again '
        '(the launch scripts\' --restarts=N do it).'))
    sys.stderr.flush()
    os._exit(errors.PEER_LOST_STATUS)  # Not the exit handlers: jax's would wait for process i.

  def finish(self) -> None:
    self.stopped.set()
    self.join()
    with contextlib.suppress(Exception):  # The peers' own watchdogs judge.
      self.client.key_value_set(f'{_KEY}{self.index}', _DONE, allow_overwrite=True)

  def verdict(self) -> None:
    self.stopped.wait(2 * self.timeout_s)
