"""A run's metrics: ``metrics.jsonl`` and TensorBoard events in the workdir (process 0).

TensorBoard events come from clu's writer where TensorFlow is installed; without it (an
install without the ``tf`` extra) from ``ScalarWriter``, which writes the same event files
with the ``tensorboard`` package alone, each scalar as ``tf.summary.scalar`` writes it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from typing import Any

import jax
from etils import epath


def have_tensorflow() -> bool:
  return importlib.util.find_spec('tensorflow') is not None


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
  """clu's asynchronous TensorBoard writer where TensorFlow is installed, else a
  ``ScalarWriter``."""
  if not have_tensorflow():
    return ScalarWriter(logdir)
  from clu import metric_writers

  return metric_writers.AsyncWriter(metric_writers.SummaryWriter(logdir))


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
    self.jsonl = epath.Path(workdir) / 'metrics.jsonl'
    self.append = '://' not in str(workdir) if append is None else append
    self.lines: list[str] = []
    self.rows: dict[int, dict[str, float]] = {}  # Step -> the metrics written at it.
    self.writer = None
    if not self.main:
      return
    self.writer = writer(workdir)
    self.truncate(start_step)

  def truncate(self, step: int) -> None:
    """Keeps the rows up to ``step`` (the run goes on from there: resumed, or rewound)."""
    self.lines, self.rows = [], {}
    if not (self.main and self.jsonl.exists()):
      return
    old = self.jsonl.read_text().splitlines(keepends=True)
    for line in old:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:  # A line cut short by a crash.
        continue
      if row['step'] <= step:
        self.lines.append(line)
        self._note(row)
    if self.lines != old:
      tmp = self.jsonl.parent / f'.{self.jsonl.name}.tmp'
      tmp.write_text(''.join(self.lines))
      tmp.replace(self.jsonl)

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

  def close(self) -> None:
    if self.writer:
      self.writer.close()
