"""vit_jax.training.metrics: the metrics.jsonl rows across a resume, and the TensorBoard writer
of an install without TensorFlow, read back by TensorBoard's own reader as clu's writer is, and
a full disk under both."""

import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from vit_jax.base import errors
from vit_jax.training import metrics

from runs import fill, read_metrics


def test_scalars_and_hparams_read_back_by_tensorboard(tmp_path):
  writer = metrics.ScalarWriter(str(tmp_path))
  writer.write_hparams({'batch_size': '128', 'model.name': 'ti16'})
  writer.write_scalars(5, {'train/loss': 2.5, 'train/mfu': np.float32(0.25)})
  writer.write_scalars(10, {'train/loss': 1.25})
  writer.close()
  events = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={'tensors': 0})
  events.Reload()
  loss = events.Tensors('train/loss')
  assert [e.step for e in loss] == [5, 10]
  assert [float(e.tensor_proto.float_val[0]) for e in loss] == [2.5, 1.25]
  assert [e.tensor_proto.tensor_shape.dim for e in loss] == [[], []]  # 0-d, as tf.summary's.
  assert events.Tensors('train/mfu')[0].tensor_proto.float_val[0] == pytest.approx(0.25)
  assert events.SummaryMetadata('train/loss').plugin_data.plugin_name == 'scalars'
  assert '_hparams_/session_start_info' in events.Tags()['tensors']


def test_clu_writer_with_tensorflow_this_one_without(tmp_path, monkeypatch):
  from clu import metric_writers

  with_tf = metrics.writer(str(tmp_path / 'a'))
  assert isinstance(with_tf, metric_writers.SummaryWriter)
  with_tf.close()
  monkeypatch.setitem(sys.modules, 'tensorflow', None)  # As in an install without it.
  without = metrics.writer(str(tmp_path / 'b'))
  assert isinstance(without, metrics.ScalarWriter)
  without.close()


@pytest.mark.parametrize('append', [True, False])
def test_metrics_log_keeps_earlier_lines_across_a_resume(tmp_path, append):
  # append=False is how gs:// workdirs are written (object stores cannot append).
  # A run logs steps 1-3 and stops; resumed from its step-2 checkpoint, it logs 3 again.
  for start, steps in ((0, (1, 2, 3)), (2, (3,))):
    log = metrics.MetricsLog(str(tmp_path), start, append=append)
    for step in steps:
      log.write(step, {'train/loss': 1. / step})
    log.close()
  assert [m['step'] for m in read_metrics(tmp_path)] == [1, 2, 3]
  assert read_metrics(tmp_path)[2]['train/loss'] == pytest.approx(1 / 3)


def test_a_full_disk_stops_the_metrics_in_one_error_and_the_close_stays_quiet(small_disk):
  """TensorFlow's events writer and metrics.jsonl on a real full disk: whichever fails first,
  one ``MetricsWriteError`` (exit status 74) with the OS's words; the close after it is quiet."""
  log = metrics.MetricsLog(str(small_disk))
  log.write(1, {'train/loss': 1.})
  fill(small_disk, leave=0)
  with pytest.raises(errors.MetricsWriteError, match=(
      r'^Writing the metrics at step \d+ in .*/disk failed: the disk is full \(No space left on '
      r'device.*\)\. No checkpoint was written before it: free space there .*, then run the '
      r'same command again to resume\.$')) as raised:
    for step in range(2, 5000):
      log.write(step, {'train/loss': 1. / step, 'train/learning_rate': 1e-3})
  assert raised.value.exit_status == errors.SAVE_FAILED_STATUS
  log.close()
