"""A run's metrics: ``metrics.jsonl`` and TensorBoard events in the workdir (process 0).

TensorBoard events come from clu's writer where TensorFlow is installed; without it (an
install without the ``tf`` extra) from ``ScalarWriter``, which writes the same event files
with the ``tensorboard`` package alone, each scalar as ``tf.summary.scalar`` writes it.
A write that fails (a full disk) stops the run in one line, as a failed checkpoint does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Iterator, Mapping
from typing import Any

import jax
from absl import logging
from etils import epath

from vit_jax.base import errors
from vit_jax.checkpoints.run import record
from vit_jax.checkpoints.run import workdir as workdir_lib


class ScalarWriter:
  """``write_scalars(step, {tag: value})``, ``write_hparams`` and ``close()``, as clu's
  writers."""

  def __init__(self, logdir: str):
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    self._writer = EventFileWriter(str(logdir))

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    import time

    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar import metadata
    from tensorboard.util import tensor_util

    values = [summary_pb2.Summary.Value(
        tag=tag, tensor=tensor_util.make_tensor_proto(float(value), dtype='float32'),
        metadata=metadata.create_summary_metadata(display_name=tag, description=''))
              for tag, value in scalars.items()]
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                           summary=summary_pb2.Summary(value=values)))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """The run's config in TensorBoard's HPARAMS tab, as clu's writer puts it there."""
    import time

    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.hparams import summary_v2

    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=0,
                                           summary=summary_v2.hparams_pb(dict(hparams))))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def writer(logdir: str) -> Any:
  """clu's TensorBoard writer where TensorFlow is installed, else a ``ScalarWriter``.

  Not clu's ``AsyncWriter``: a write that fails there is logged as a traceback from its
  thread; here it raises where it was asked for (a log line: a few ms every N steps).
  """
  if importlib.util.find_spec('tensorflow') is None:
    return ScalarWriter(logdir)
  from clu import metric_writers

  return metric_writers.SummaryWriter(logdir)


class MetricsLog:
  """``write(step, scalars)`` to ``metrics.jsonl`` and TensorBoard; process 0 only.

  The JSON-lines file keeps the rows up to the step the run starts from: a resumed
  run writes the rows after it again (the same training, bit for bit), so nothing is
  there twice, and a finished run started again adds no row. Local files are
  appended to; object stores (``gs://``) cannot append, so there the file is
  rewritten whole at each write.
  """

  def __init__(self, workdir: str, start_step: int = 0, append: bool | None = None):
    self.main = jax.process_index() == 0
    self.workdir = workdir
    self.jsonl = epath.Path(workdir) / record.METRICS_FILE
    self.append = '://' not in str(workdir) if append is None else append
    self.lines: list[str] = []
    self.rows: dict[int, dict[str, float]] = {}  # Step -> the metrics written at it.
    self.writer = None
    self.failed = False  # A write failed: reported once, the clean-up stays quiet.
    if not self.main:
      return
    self.writer = writer(workdir)
    self.truncate(start_step)

  def truncate(self, step: int) -> None:
    """Keeps the rows up to ``step`` (the run goes on from there: resumed, or rewound)."""
    self.lines, self.rows = [], {}
    if not (self.main and self.jsonl.exists()):
      return
    old = self.jsonl.read_text()
    for line, row in record.parse_metrics(old):  # The text read once.
      if row['step'] <= step:
        self.lines.append(line)
        self._note(row)
    if ''.join(self.lines) != old:
      workdir_lib.write_atomically(self.jsonl, ''.join(self.lines))

  def _note(self, row: dict[str, float]) -> None:
    self.rows.setdefault(int(row['step']), {}).update(row)

  def has(self, step: int, key: str) -> bool:
    """Whether ``key`` was written at ``step`` (by this run or the one it resumes)."""
    return key in self.rows.get(step, {})

  def history(self, key: str) -> dict[int, float]:
    """{step: value} of ``key``."""
    return {s: row[key] for s, row in sorted(self.rows.items()) if key in row}

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.main:
      return
    with self._failing_as_one_line(f'the metrics at step {step}'):
      self.writer.write_scalars(step, scalars)
      row = {'step': step, **{k: float(v) for k, v in scalars.items()}}
      self._note(row)
      line = json.dumps(row) + '\n'
      if self.append:
        with self.jsonl.open('a') as f:
          f.write(line)
      else:
        self.lines.append(line)
        self.jsonl.write_text(''.join(self.lines))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """The run's config, in TensorBoard's HPARAMS tab."""
    if self.main:
      with self._failing_as_one_line('the config to TensorBoard'):
        self.writer.write_hparams(hparams)

  @contextlib.contextmanager
  def _failing_as_one_line(self, what: str) -> Iterator[None]:
    """A failed write (disk full, permission) as one ``errors.MetricsWriteError``."""
    try:
      yield
    except Exception as e:  # OSError, or TensorFlow's ResourceExhaustedError for its events.
      self.failed = True
      cause, fix = errors.write_failure(e)
      kept = record.steps(self.workdir)
      before = (f'The checkpoints are intact (steps {", ".join(map(str, kept))}): '
                if kept else 'No checkpoint was written before it: ')
      raise errors.MetricsWriteError(
          f'Writing {what} in {self.workdir} failed: {cause}. {before}{fix}, then run the '
          f'same command again to resume{f" from step {kept[-1]}" if kept else ""}.') from None

  def close(self) -> None:
    """Flushes TensorBoard's events; a failure then is a warning (metrics.jsonl has every
    row), never an error that would hide the one that ended the run."""
    if not self.writer:
      return
    try:
      self.writer.close()
    except Exception as e:
      if not self.failed:
        logging.warning('TensorBoard\'s last events in %s could not be written (%s); '
                        'metrics.jsonl has every row.', self.workdir, e)
