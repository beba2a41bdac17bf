"""Tests of vit_jax.evaluate: the metric of the eval step against hand-counted values, the
evaluation of a trained run against what training logged, and `python -m vit_jax.evaluate`."""

import re
import subprocess
import sys

import chex
import flax.linen as nn
import jax
import numpy as np
import pytest

from vit_jax import evaluate
from vit_jax.base import sharding
from vit_jax.checkpoints import workdir

from runs import env, read_metrics


class FirstPixel(nn.Module):
  """A parameter-free model whose logits are an image's first pixel: logits set by hand."""

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    return images[:, 0, 0, :]


def run(loss, logits, labels, mask):
  mesh = sharding.make_mesh(None)
  step = evaluate.make_eval_step(FirstPixel(), loss, {}, sharding.batch_sharding(mesh),
                                 sharding.replicated(mesh))
  batch = {'image': np.asarray(logits, np.float32)[:, None, None, :],
           'label': np.asarray(labels, np.float32), 'mask': np.asarray(mask, np.float32)}
  batch = jax.device_put(batch, sharding.batch_sharding(mesh))
  return evaluate.evaluate(step, {}, [batch], evaluate.metric_name(loss))


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
  assert evaluate.metric_name('softmax_xent') == 'accuracy'
  assert evaluate.metric_name('sigmoid_xent') == 'prec@1'


def test_evaluate_params_equals_what_training_logged(tiny_run):
  """The run's last eval row was computed by training's Evaluator on the same weights."""
  config = workdir.load_config(tiny_run)
  params, step = workdir.restore_params(tiny_run)
  logged = next(row for row in read_metrics(tiny_run)
                if row['step'] == step and 'eval/accuracy' in row)
  result = evaluate.evaluate_params(config, params)
  chex.assert_trees_all_close(result['accuracy'], logged['eval/accuracy'], atol=1e-6)
  chex.assert_trees_all_close(result['loss'], logged['eval/loss'], rtol=1e-5)
  assert result['examples'] == logged['eval/examples'] == 359


def test_command_prints_the_metric_with_progress(tiny_run):
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={tiny_run}', '--progress_every=0'],
      env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r'evaluating step 10: [\d,]+/359 images \(\d+%\), [\d,]+/s, ETA',
                   result.stderr)
  line = result.stdout.strip().splitlines()[-1]
  logged = [row for row in read_metrics(tiny_run) if 'eval/accuracy' in row][-1]
  assert re.fullmatch(rf'.* step 10, split test: accuracy {logged["eval/accuracy"]:.4f}, '
                      r'loss [\d.]+ \(359 examples\)', line), line


def test_command_refuses_a_missing_workdir_in_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={tmp_path / "nothing"}'],
      env=env(devices=1), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().startswith('error: ') and '\n' not in result.stderr.strip()
