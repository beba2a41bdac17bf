"""vit_jax.models.mpp: masked patch prediction, the paper's self-supervised pre-training."""

import logging
import math
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from vit_jax import main
from vit_jax.base import errors
from vit_jax.checkpoints.run import workdir as workdir_lib
from vit_jax.data import convert, local
from vit_jax.models import get_model, mpp
from vit_jax.training import plan as plan_lib

from runs import read_metrics, restore_state, tiny_config

PP = 'decode|to_rgb|resize(16)|value_range(-1, 1)'


# The paper's measure of a self-supervised encoder: few-shot accuracy of its features.
FEWSHOT = dict(type='fewshot', datasets=('digits',), shots=(1, 5), seeds=1,
               pp='to_rgb|resize(16)|value_range(-1, 1)')


def mpp_config(data_dir, **overrides):
  """The tiny recipe pre-trained by masked patch prediction on an unlabelled local dataset,
  evaluated by its own objective on held-out images and by few-shot accuracy on digits."""
  config = tiny_config(**{'objective': 'mpp', 'model.pool': 'token', 'total_steps': 10,
                          'checkpoint_every_steps': 5, 'dataset.name': 'unlabelled',
                          'dataset.eval_split': 'validation',
                          'dataset.num_classes': 0, 'dataset.pp_train': PP,
                          'dataset.pp_eval': PP, 'evals.eval': dict(type='mpp'),
                          'evals.fewshot': FEWSHOT, **overrides})
  with config.unlocked():
    config.dataset.data_dir = str(data_dir)
  return config


@pytest.fixture(scope='module')
def unlabelled(tmp_path_factory):
  """scikit-learn's digits as one folder of PNG files, no class folders, converted."""
  from sklearn.datasets import load_digits

  folder = tmp_path_factory.mktemp('unlabelled') / 'images'
  folder.mkdir()
  for i, image in enumerate(load_digits().images[:400]):
    Image.fromarray(np.uint8(image * 255 / 16)).save(folder / f'{i:04d}.png')
  out = folder.parent / 'local'
  convert.convert(str(folder), str(out), shards=2, workers=2, val_fraction=0.2)
  return out


@pytest.fixture(scope='module')
def mpp_run(unlabelled, tmp_path_factory):
  """A workdir pre-trained by masked patch prediction: 10 steps, checkpoints at 5 and 10."""
  directory = tmp_path_factory.mktemp('mpp_run')
  result = main.train_and_evaluate(mpp_config(unlabelled), str(directory))
  return directory, result


def hand_targets(images: np.ndarray, patch: int) -> np.ndarray:
  """The 3-bit mean colour of each patch, by loops: the issue's definition."""
  n, height, width, _ = images.shape
  out = []
  for b in range(n):
    for i in range(0, height, patch):
      for j in range(0, width, patch):
        mean = (images[b, i:i + patch, j:j + patch].reshape(-1, 3).mean(0) + 1) / 2
        r, g, bl = (min(int(c * 8), 7) for c in mean)
        out.append(r * 64 + g * 8 + bl)
  return np.array(out).reshape(n, -1)


def test_color_targets_are_the_3_bit_mean_colour():
  images = np.random.default_rng(0).uniform(-1, 1, (3, 8, 12, 3)).astype(np.float32)
  # Patches of one colour at the edges of the range and of the bins: 0 -> bin 0, 1 -> bin
  # 7, red most significant.
  images[0, :4, :4] = [1., -1., -1.]  # Pure red: 7 * 64.
  images[0, :4, 4:8] = [-1., -1., 1.]  # Pure blue: 7.
  images[0, 4:, :4] = [-0.75 + 1e-3, 0.25 + 1e-3, 1.]  # [0.125, 0.625, 1]: 64 + 5 * 8 + 7.
  targets = np.asarray(mpp.color_targets(jnp.asarray(images), 4))
  chex.assert_shape(targets, (3, 6))
  np.testing.assert_array_equal(targets, hand_targets(images, 4))
  assert (targets[0, 0], targets[0, 1], targets[0, 3]) == (448, 7, 64 + 40 + 7)
  assert targets.min() >= 0 and targets.max() < mpp.COLORS


@pytest.mark.slow
def test_corruption_proportions_over_many_draws():
  batch, patches = 512, 64
  corrupted, mask, source = (np.asarray(x) for x in mpp.corrupt(jax.random.key(3), batch,
                                                                 patches))
  own = np.arange(patches)
  # Exactly half of every image's patches, each patch as often as any other.
  np.testing.assert_array_equal(corrupted.sum(1), patches // 2)
  per_position = corrupted.mean(0)
  assert np.abs(per_position - 0.5).max() < 5 * math.sqrt(0.25 / batch)
  # Of the corrupted: 80% mask, 10% another patch, 10% unchanged (5 standard errors).
  total = corrupted.sum()
  replaced = source != own
  shares = [(mask & corrupted).sum() / total, (replaced & corrupted).sum() / total,
            (corrupted & ~mask & ~replaced).sum() / total]
  for share, p in zip(shares, (0.8, 0.1, 0.1), strict=True):
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / total), shares
  assert not (mask & replaced).any()
  # The rest untouched.
  assert not (mask & ~corrupted).any() and not (replaced & ~corrupted).any()
  # The random patch: another one of the same image, uniform over the other 63.
  offsets = ((source - own) % patches)[replaced]
  assert offsets.min() >= 1
  counts = np.bincount(offsets, minlength=patches)[1:]
  expected = len(offsets) / (patches - 1)
  chi2 = ((counts - expected)**2 / expected).sum()
  assert chi2 < 63 + 5 * math.sqrt(2 * 63), chi2  # Chi-square, 63 degrees of freedom.
  # And every patch as likely to be the one copied (a draw that could land on the patch
  # itself would never copy the last one): 8192 images, about 26k replaced patches.
  _, _, many = mpp.corrupt(jax.random.key(5), 8192, patches)
  many = np.asarray(many)
  copied = many[many != own]
  counts = np.bincount(copied, minlength=patches)
  expected = len(copied) / patches
  chi2 = ((counts - expected)**2 / expected).sum()
  assert chi2 < 63 + 5 * math.sqrt(2 * 63), chi2
  # Another key, another draw.
  assert not np.array_equal(corrupted, np.asarray(mpp.corrupt(jax.random.key(4), batch,
                                                               patches)[0]))


def test_the_model_corrupts_patch_embeddings_as_told():
  model = get_model('ti16', num_classes=0, image_size=16, patch_size=4, hidden_size=32,
                    mlp_dim=64, num_heads=4, num_layers=2, mpp_outputs=mpp.COLORS)
  images = jax.random.uniform(jax.random.key(0), (2, 16, 16, 3), minval=-1., maxval=1.)
  params = model.init(jax.random.key(1), images)['params']
  assert set(params) == {'embedding', 'cls', 'Transformer', 'mask_token', 'mpp_head'}
  params['mask_token'] = jax.random.normal(jax.random.key(2), (1, 1, 32))
  params['mpp_head']['kernel'] = jax.random.normal(jax.random.key(3), (32, mpp.COLORS))
  apply = lambda x, corruption=None: model.apply({'params': params}, x, corruption=corruption)
  chex.assert_shape(apply(images), (2, 16, mpp.COLORS))
  none = jnp.zeros((2, 16), bool)
  own = jnp.broadcast_to(jnp.arange(16), (2, 16))
  chex.assert_trees_all_close(apply(images, (none, own)), apply(images))
  # Patch 5 of image 0 takes patch 10's embedding: the same as copying its pixels (the
  # embedding is per patch, before the position embeddings).
  source = own.at[0, 5].set(10)
  moved = images.at[0, 4:8, 4:8].set(images[0, 8:12, 8:12])
  chex.assert_trees_all_close(apply(images, (none, source)), apply(moved), atol=1e-5)
  # A masked patch: its pixels no longer matter, and the mask embedding does.
  mask = none.at[1, 3].set(True)
  changed = images.at[1, 0:4, 12:16].set(0.3)
  chex.assert_trees_all_close(apply(images, (mask, own)), apply(changed, (mask, own)),
                              atol=1e-6)
  assert not np.allclose(apply(images, (mask, own)), apply(images))


@pytest.mark.slow
def test_the_loss_counts_the_corrupted_patches_only():
  target = mpp.TARGETS['mean_color']
  images = jax.random.uniform(jax.random.key(0), (2, 8, 8, 3), minval=-1., maxval=1.)
  logits = jax.random.normal(jax.random.key(1), (2, 4, mpp.COLORS))
  corrupted = jnp.array([[True, False, False, True], [False, True, False, False]])
  loss = mpp.masked_loss(logits, images, corrupted, target, 4)
  targets = hand_targets(np.asarray(images), 4)
  log_p = np.asarray(jax.nn.log_softmax(logits))
  hand = [-log_p[b, i, targets[b, i]] for b, i in zip(*np.nonzero(np.asarray(corrupted)),
                                                       strict=True)]
  np.testing.assert_allclose(loss, np.mean(hand), rtol=1e-6)
  # Another colour in an uncorrupted patch (image 0's patch 1) changes nothing; in a
  # corrupted one (image 0's patch 0) it does.
  recoloured = images.at[0, :4, 4:].set(1.)
  assert mpp.masked_loss(logits, recoloured, corrupted, target, 4) == loss
  recoloured = images.at[0, :4, :4].set(1.)
  assert mpp.masked_loss(logits, recoloured, corrupted, target, 4) != loss


def pixel_classes(images: np.ndarray, patch: int) -> np.ndarray:
  """Each pixel's 3-bit colour, grouped by patch, row-major in both: (b, patches, patch**2)."""
  n, height, width, _ = images.shape
  bins = np.minimum(((images + 1) / 2 * 8).astype(int), 7)
  classes = bins[..., 0] * 64 + bins[..., 1] * 8 + bins[..., 2]
  return classes.reshape(n, height // patch, patch, width // patch, patch).transpose(
      0, 1, 3, 2, 4).reshape(n, -1, patch * patch)


# Outputs per patch of 4x4 px: the 4x4 cells are single pixels.
WIDTHS = {'mean_color': 512, 'color_4x4': 16 * 512, 'l2_mean_color': 3, 'l2_patch': 16 * 3}


@pytest.mark.slow
@pytest.mark.parametrize('name', list(mpp.TARGETS))
def test_every_target_is_the_papers_and_trains(name):
  config = tiny_config(**{'objective': 'mpp', 'mpp.target': name})
  plan = plan_lib.validate(config)
  model = plan.model
  assert model.mpp_outputs == WIDTHS[name] and plan.num_classes == 0
  images = jax.random.uniform(jax.random.key(0), (2, 16, 16, 3), minval=-1., maxval=1.)
  x = np.asarray(images)
  target, every = mpp.TARGETS[name], jnp.ones((2, 16), bool)
  if target.loss == 'xent':  # Certain of the hand-computed classes: no loss.
    classes = (hand_targets(x, 4)[..., None] if name == 'mean_color' else pixel_classes(x, 4))
    logits = 100. * jax.nn.one_hot(classes, mpp.COLORS).reshape(2, 16, -1)
    assert mpp.masked_loss(logits, images, every, target, 4) < 1e-6
    assert mpp.masked_loss(jnp.roll(logits, 1, -1), images, every, target, 4) > 50
  else:  # A zero prediction: the loss is the colours' squared norm, in [0, 1] per channel.
    colors = (x + 1) / 2
    if name == 'l2_mean_color':
      colors = colors.reshape(2, 4, 4, 4, 4, 3).mean(axis=(2, 4))
    hand = np.mean(np.sum(colors**2, -1))
    zeros = jnp.zeros((2, 16, WIDTHS[name]))
    np.testing.assert_allclose(mpp.masked_loss(zeros, images, every, target, 4), hand,
                               rtol=1e-5)
  # One step's gradients through the whole model reach the head.
  params = model.init(jax.random.key(1), images)['params']
  options = plan.step_options.mpp
  value, grads = jax.value_and_grad(lambda p: mpp.loss(model, options, p, images,
                                                        jax.random.key(2)))(params)
  assert np.isfinite(value) and value > 0
  assert np.abs(np.asarray(grads['mpp_head']['kernel'])).sum() > 0


def test_bad_objective_settings_are_named():
  for overrides, message in (
      ({'objective': 'masked'}, r"config.objective='masked' is not one of"),
      ({'objective': 'mpp', 'mpp.target': 'mean'}, r"config.mpp.target='mean' is not one of"),
      ({'objective': 'mpp', 'mpp.mask_rate': 0.95}, r'mask_rate \+ random_rate = 1.05'),
      ({'objective': 'mpp', 'mpp.corrupt_rate': 0.01}, r'corrupts no patch of the 16'),
      ({'objective': 'mpp', 'mpp.target': 'color_4x4', 'model.patch_size': 2},
       r'cuts each patch into 4x4 cells, but the patches are 2x2 px'),
  ):
    with pytest.raises(errors.ConfigError, match=message):
      plan_lib.validate(tiny_config(**overrides))


def test_a_classifier_evaluation_of_a_self_supervised_run_is_refused_before_it_starts(tmp_path):
  """The quickstart's evaluators on a masked-patch-prediction run: its 'eval' entry scores a
  classifier the run does not train (one line with the fix); its few-shot entry applies."""
  config = tiny_config(objective='mpp', **{'evals.fewshot': FEWSHOT})
  with pytest.raises(errors.ConfigError, match=r"^config.evals.eval has type 'classification', "
                                               r"but config.objective='mpp' trains no "
                                               r'classifier: use --config.evals.eval.type=mpp'):
    main.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_unlabelled_data_trains_only_self_supervised(unlabelled):
  metadata = local.read_metadata(unlabelled)
  assert (metadata['num_classes'], metadata['multi_label']) == (0, False)
  assert sorted(metadata['splits']) == ['train', 'validation']
  assert sum(s['num_examples'] for s in metadata['splits'].values()) == 400
  config = mpp_config(unlabelled, objective='classification')
  with pytest.raises(errors.ConfigError, match=r"has no labels. Pre-train on it without "
                                               r"labels \(config.objective='mpp'\)"):
    plan_lib.validate(config)


@pytest.mark.slow
def test_a_self_supervised_run_resumes_exactly(mpp_run, unlabelled, tmp_path):
  directory, result = mpp_run
  config = mpp_config(unlabelled)
  rows = read_metrics(directory)
  assert [r['step'] for r in rows] == [5, 10, 10, 10]
  assert set(rows[-2]) == {'step', 'eval/color_accuracy', 'eval/loss', 'eval/examples',
                           'eval/patches'}
  assert rows[-2]['eval/examples'] == 80  # Images, not patches: the validation split's 20%.
  assert rows[-2]['eval/patches'] == 80 * 8  # Half of each image's 16 patches corrupted.
  assert 0 < result['eval/color_accuracy'] <= 1 and result['eval/loss'] < math.log(mpp.COLORS)
  # Few-shot accuracy of the encoder's pooled features, above chance (0.1) on digits.
  assert set(rows[-1]) == {'step', 'fewshot/digits_1shot', 'fewshot/digits_5shot'}
  assert rows[-1]['fewshot/digits_5shot'] > 0.2
  # Restarted from its step-5 checkpoint: the same state at step 10, bit for bit.
  (tmp_path / 'checkpoints').mkdir()
  shutil.copytree(directory / 'checkpoints' / '5', tmp_path / 'checkpoints' / '5')
  resumed = main.train_and_evaluate(config, str(tmp_path))
  state = restore_state(directory, config)
  assert set(state.params) >= {'mask_token', 'mpp_head'} and 'head' not in state.params
  chex.assert_trees_all_equal(state, restore_state(tmp_path, config))
  assert resumed == result


@pytest.mark.slow
def test_evaluating_a_self_supervised_run_counts_images_and_names_the_metric(mpp_run):
  """vit_jax.evaluate's line for the run's 'mpp' evaluator: the held-out images counted as
  images, the scored patches beside them, the metric named."""
  from vit_jax import evaluation

  directory, result = mpp_run
  config = workdir_lib.load_config(directory)
  params, _ = workdir_lib.restore_params(directory)
  ((evaluator, metrics),) = evaluation.evaluate_params(config, params, ['eval'])
  assert metrics['color_accuracy'] == pytest.approx(result['eval/color_accuracy'], abs=1e-6)
  assert evaluator.describe(metrics).endswith(
      '(masked-patch colour accuracy), loss '
      f'{metrics["loss"]:.4f} (80 images, 640 masked patches scored)')


@pytest.mark.slow
def test_fine_tuning_drops_the_mask_and_the_prediction_head(mpp_run, tmp_path, caplog):
  directory, _ = mpp_run
  caplog.set_level(logging.INFO)
  config = tiny_config(**{'model.pool': 'token', 'total_steps': 2, 'checkpoint_every_steps': 2,
                          'schedule.warmup_steps': 1})
  with config.unlocked():
    config.init_from = str(directory)
  plan = plan_lib.validate(config)
  init = jax.tree.map(np.asarray, plan.model.init(
      jax.random.key(0), jnp.zeros((1, 16, 16, 3)))['params'])
  params = workdir_lib.init_params_from(str(directory), init, plan.model)
  pretrained, _ = workdir_lib.restore_params(directory)
  assert set(params) == set(init) == {'embedding', 'cls', 'Transformer', 'head'}
  for key in ('embedding', 'cls', 'Transformer'):
    chex.assert_trees_all_equal(params[key], pretrained[key])
  chex.assert_trees_all_equal(params['head'], jax.tree.map(np.zeros_like, init['head']))
  assert 'mask_token (1, 1, 32) dropped' in caplog.text
  assert f'mpp_head/kernel (32, {mpp.COLORS}) dropped' in caplog.text
  # And the run fine-tunes from it like from any checkpoint, on labelled data.
  result = main.train_and_evaluate(config, str(tmp_path))
  assert result['eval/examples'] == 359 and np.isfinite(result['eval/loss'])
  tuned = restore_state(tmp_path, config).params
  assert not np.array_equal(tuned['embedding']['kernel'], pretrained['embedding']['kernel'])
  # Prediction and inspection need a classifier: a self-supervised run is refused.
  with pytest.raises(errors.CheckpointError,
                     match='is a self-supervised run .* Fine-tune it first'):
    workdir_lib.load_run(directory)


def test_the_objective_adds_only_the_mask_embedding_and_the_prediction_head():
  count = lambda model: sum(math.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(
      model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))['params']))
  released = count(get_model('b16', num_classes=1000))
  assert released == 86_567_656  # The paper's ViT-B/16 (REFERENCE.md), objective off.
  pretraining = count(get_model('b16', num_classes=0, mpp_outputs=mpp.COLORS))
  # No classifier (768 x 1000 + 1000); a [mask] embedding (768) and a 512-way head.
  assert pretraining == released - (768 * 1000 + 1000) + 768 + (768 * 512 + 512)


def test_pre_training_can_start_from_a_classifier():
  from vit_jax.checkpoints.formats import fit, layout

  options = dict(image_size=16, patch_size=4, hidden_size=32, mlp_dim=64, num_heads=4,
                 num_layers=2)
  classifier = get_model('ti16', num_classes=10, **options)
  pretraining = get_model('ti16', num_classes=0, mpp_outputs=mpp.COLORS, **options)
  init = lambda model, seed: jax.tree.map(np.asarray, model.init(
      jax.random.key(seed), jnp.zeros((1, 16, 16, 3)))['params'])
  source, fresh = init(classifier, 0), init(pretraining, 1)
  params = fit.adapt(layout.flatten(layout.to_release(source)), fresh, pretraining)
  for key in ('embedding', 'cls', 'Transformer'):
    chex.assert_trees_all_equal(params[key], source[key])
  for key in ('mask_token', 'mpp_head'):  # The model's own, freshly initialised.
    chex.assert_trees_all_equal(params[key], fresh[key])
  assert 'head' not in params
