"""TensorBoard scalars without TensorFlow: the writer of an install without the ``tf`` extra.

clu's ``metric_writers`` imports TensorFlow (1.3 GB installed) to write TensorBoard events.
The ``tensorboard`` package writes the same event files by itself: each scalar as a
0-d float32 tensor with the scalars plugin's metadata, as ``tf.summary.scalar`` writes it,
so TensorBoard and ``EventAccumulator.Tensors`` read both alike. Where TensorFlow is
installed, ``tensorboard`` writes through its file layer (``gs://`` too); without it,
local paths only.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any


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
