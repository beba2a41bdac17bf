"""vit_jax.evals.classification: accuracy and precision@1 with their losses, padding never
counted."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from vit_jax.base import sharding
from vit_jax.evals import base, classification


class FirstPixel(nn.Module):
  """A parameter-free model whose logits are an image's first pixel: logits set by hand."""

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    return images[:, 0, 0, :]


def run(loss, logits, labels, mask):
  mesh = sharding.make_mesh(None)
  step = classification.make_eval_step(FirstPixel(), loss, mesh)
  batch = {'image': np.asarray(logits, np.float32)[:, None, None, :],
           'label': np.asarray(labels, np.float32), 'mask': np.asarray(mask, np.float32)}
  batch = jax.device_put(batch, sharding.batch_sharding(mesh))
  return classification.metrics(base.sums(step, {}, [batch]),
                                classification.metric_name(loss))


def test_precision_at_1_counts_a_top_class_among_several_labels():
  """Guards precision@1 on multi-hot labels: the top-scoring class must be one of the
  example's labels, not the first of them (argmax(labels) == argmax(logits) is wrong)."""
  logits = [[0., 5., 1.],   # top 1, labels {0, 1}: correct (argmax of the labels is 0)
            [0., 1., 5.],   # top 2, labels {1, 2}: correct (argmax of the labels is 1)
            [0., 5., 1.],   # top 1, labels {0}: wrong
            [1., 0., 5.],   # top 2, labels {0, 2}: correct
            [5., 0., 1.],   # top 0, labels {1, 2}: wrong
            [5., 0., 1.],   # top 0, labels {0, 1, 2}: correct
            [0., 5., 1.],   # padding (mask 0): right, but not counted
            [0., 5., 1.]]   # padding, not counted
  labels = [[1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1], [0, 1, 0],
            [0, 1, 1]]
  mask = [1, 1, 1, 1, 1, 1, 0, 0]
  result = run('sigmoid_xent', logits, labels, mask)
  assert result['examples'] == 6
  assert result['prec@1'] == pytest.approx(4 / 6)
  # The loss: the mean over the 6 real examples of the per-class sigmoid cross-entropies.
  x, y = np.asarray(logits[:6], np.float64), np.asarray(labels[:6], np.float64)
  expected = np.mean(np.sum(np.logaddexp(0, x) - x * y, axis=-1))
  assert result['loss'] == pytest.approx(expected, rel=1e-5)


def test_accuracy_with_one_hot_labels():
  logits = [[0., 5., 1.], [0., 1., 5.], [5., 0., 1.], [1., 5., 0.]] * 2
  labels = np.eye(3)[[1, 1, 0, 1, 1, 2, 0, 1]]
  mask = [1, 1, 1, 1, 1, 0, 0, 0]
  result = run('softmax_xent', logits, labels, mask)
  # Examples 0, 2, 3, 4 right (4: top 1, label 1), 1 wrong; 5-7 are padding (all right).
  assert result['examples'] == 5 and result['accuracy'] == pytest.approx(4 / 5)
  x = np.asarray(logits[:5], np.float64)
  log_softmax = x - np.log(np.exp(x).sum(-1, keepdims=True))
  assert result['loss'] == pytest.approx(-np.mean((labels[:5] * log_softmax).sum(-1)), rel=1e-5)


def test_metric_name_follows_the_loss():
  assert classification.metric_name('softmax_xent') == 'accuracy'
  assert classification.metric_name('sigmoid_xent') == 'prec@1'
