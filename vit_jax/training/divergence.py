"""Divergence: a non-finite loss, gradient norm or state, caught before anything is saved.

The step's metrics hold the loss and the gradients' global norm; the loop reads them on the
host where it reads them anyway (at each log line, before each save and each evaluation: no
sync of its own), and ``check`` finds the first non-finite one. A save checks the state too
(``manager.save`` records whether each array is finite, in the pass that computes its
checksums) and refuses a non-finite one: a state can turn non-finite in an update whose loss
and gradients were finite. What follows is ``config.on_divergence``'s: 'stop' raises
``errors.Diverged`` (exit status 65) naming the step and the last good checkpoint; 'rewind'
restores the newest good checkpoint and moves the data stream past the batches of the spike
(PaLM's practice), at most ``config.max_rewinds`` times.

The data stream's position is the step (``vit_jax.data.loader``) plus an offset that only
rewinds change. Each rewind is recorded in ``workdir/rewinds.json`` before the state is
restored, so the run stays a pure function of its config and that record: a run killed
during a rewind resumes it exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from vit_jax.base import errors
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.checkpoints.run import workdir as workdir_lib

REWINDS_FILE = 'rewinds.json'
# A test hook: the data positions (comma-separated) whose labels are made NaN, as a bad
# batch would make the loss. Read when the loop starts.
NAN_BATCHES = 'VIT_JAX_NAN_BATCHES'


class Spike(Exception):  # noqa: N818 (the loop's signal; errors.Diverged is the error)
  """The first non-finite step seen, and what was not finite there."""

  def __init__(self, step: int, what: str):
    super().__init__(f'{what} at step {step}')
    self.step, self.what = step, what


def check(pending: list[tuple[int, Any]]) -> list[dict[str, Any]]:
  """The metrics of ``pending`` (step, metrics) on the host; raises ``Spike`` at the first
  step whose loss or gradient norm is not finite."""
  host = jax.device_get([metrics for _, metrics in pending])
  for (step, _), metrics in zip(pending, host, strict=True):
    bad = [f'{name} {float(metrics[key])}' for key, name in
           (('loss', 'loss'), ('grad_norm', 'gradient norm'))
           if not math.isfinite(float(metrics[key]))]
    if bad:
      raise Spike(step, f'non-finite {" and ".join(bad)}')
  return host


@dataclasses.dataclass(frozen=True)
class Rewind:
  """One rewind: the spike's first non-finite step, the checkpoint restored, and the data
  offset from then on (step s trains on the stream's batch s - 1 + data_offset)."""

  at_step: int
  to_step: int
  data_offset: int


class Guard:
  """A run's divergence policy and record: the data offset, safe saves, and the rewinds."""

  def __init__(self, config: Any, workdir: str):
    self.config, self.workdir = config, workdir
    self.path = epath.Path(workdir) / REWINDS_FILE
    self.rewinds = [Rewind(**r) for r in json.loads(self.path.read_text())] \
        if self.path.exists() else []
    self.offset = 0
    self.poisoned = {int(p) for p in os.environ.get(NAN_BATCHES, '').split(',') if p.strip()}

  def start(self, step: int) -> int:
    """Sets and returns the data offset of a run resumed at ``step``: the last recorded
    rewind's to a checkpoint at or before it (0 if none); the same on every process."""
    offsets = [r.data_offset for r in self.rewinds if r.to_step <= step]
    self.offset = offsets[-1] if offsets else 0
    if jax.process_count() > 1:  # Process 0's reading of the record, on every process.
      from jax.experimental import multihost_utils

      self.offset, count = (int(v) for v in multihost_utils.broadcast_one_to_all(
          np.array([self.offset, len(self.rewinds)], np.int64)))
      self.rewinds = self.rewinds[:count]
    if self.offset:
      logging.info('Data offset %d: %d rewinds recorded in %s.', self.offset,
                   len(self.rewinds), self.path)
    return self.offset

  def stream(self, loader: Any, step: int) -> Iterator[tuple[int, Any]]:
    """The loader's batches for the steps after ``step``, at the current offset."""
    stream = loader.iterate(step + self.offset)
    return _poison(stream, self.poisoned) if self.poisoned else stream

  def save(self, manager: Any, step: int, state: Any) -> None:
    """Saves ``state``; a non-finite one raises ``Spike`` (nothing is written)."""
    try:
      manager_lib.save(manager, step, state, force=True)
    except manager_lib.NonFiniteState as e:
      raise Spike(step, f'a non-finite state ({manager_lib.some_paths(e.paths)}) after finite '
                        'losses and gradient norms') from None

  def diverged(self, spike: Spike, manager: Any) -> Rewind:
    """What ``spike`` leads to: the rewind to make (recorded first), or ``errors.Diverged``."""
    manager.wait_until_finished()  # A save in flight is a good one: it counts.
    good = [s for s in manager.all_steps() if manager.is_good(s) is not False]
    last = good[-1] if good else None
    config = self.config
    where = f'The training diverged at step {spike.step}: {spike.what}'
    if last is None:
      kept = ('No checkpoint was saved before it: lower the learning rate '
              '(config.schedule.base_lr), clip the gradients or save earlier '
              '(config.checkpoint_every_steps).')
    else:
      kept = (f'Nothing after step {last} was saved: the last good checkpoint is '
              f'{epath.Path(manager.directory) / str(last)} (python -m vit_jax.evaluate '
              f'--workdir={self.workdir} --step={last}). Lower the learning rate '
              '(config.schedule.base_lr) or clip the gradients')
    if config.on_divergence == 'stop' or last is None:
      if last is not None:
        kept += (', or run the same command with --config.on_divergence=rewind to skip the '
                 "spike's batches.")
      raise errors.Diverged(f'{where}. {kept}')
    if len(self.rewinds) >= config.max_rewinds:
      raise errors.Diverged(
          f'{where}, after {len(self.rewinds)} rewinds (config.max_rewinds='
          f'{config.max_rewinds}; {self.path}). {kept}, or allow more rewinds.')
    skip = max(config.rewind_skip_batches, spike.step - last)
    rewind = Rewind(spike.step, last, self.offset + skip)
    self.rewinds.append(rewind)
    if jax.process_index() == 0:  # Recorded before the state is restored.
      workdir_lib.write_atomically(
          self.path, json.dumps([dataclasses.asdict(r) for r in self.rewinds], indent=1))
    self.offset = rewind.data_offset
    logging.warning('%s. Rewinding to the checkpoint at step %d and skipping %d batches '
                    '(rewind %d of at most %d, recorded in %s).', where, last, skip,
                    len(self.rewinds), config.max_rewinds, self.path)
    return rewind


def _poison(stream: Iterator[tuple[int, Any]], positions: set[int]
            ) -> Iterator[tuple[int, Any]]:
  """``stream`` with the labels of the batches at ``positions`` made NaN (``NAN_BATCHES``)."""
  nan = jax.jit(lambda x: jnp.full_like(x, jnp.nan))
  try:
    for position, batch in stream:
      if position in positions:
        label = batch['label']
        batch = {**batch, 'label': jax.jit(nan, out_shardings=label.sharding)(label)}
      yield position, batch
  finally:
    stream.close()
