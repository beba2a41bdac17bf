"""vit_jax.evals.fewshot: the regression against closed forms, the draws, and real features of a
trained model on the bundled digits."""

import chex
import jax
import numpy as np
import pytest

from vit_jax.base import errors, sharding
from vit_jax.checkpoints.run import workdir
from vit_jax.data import preprocess, sources
from vit_jax.evals import fewshot


def ridge_by_lstsq(x, y, x_test, num_classes, l2_reg):
  """The paper's regression, independently: standardise with the few-shot set's statistics,
  append the constant 100, and solve min |XW - Y|^2 + l2 |W|^2 as the least-squares problem
  [X; sqrt(l2) I] W = [Y; 0] (numpy.linalg.lstsq). Returns the test predictions."""
  mean, std = x.mean(0), x.std(0) + 1e-5
  aug = lambda f: np.hstack([(f - mean) / std, np.full((len(f), 1), 100.)])
  a, a_test = aug(x.astype(np.float64)), aug(x_test.astype(np.float64))
  targets = np.where(np.arange(num_classes)[None] == y[:, None], 1., -1.)
  stacked = np.vstack([a, np.sqrt(l2_reg) * np.eye(a.shape[1])])
  w = np.linalg.lstsq(stacked, np.vstack([targets, np.zeros((a.shape[1], num_classes))]),
                      rcond=None)[0]
  return np.argmax(a_test @ w, 1)


@pytest.mark.parametrize('n_per_class,dims', [(25, 8), (5, 64)])  # N >= D and N < D.
def test_accuracy_is_the_closed_form_ridge_solution(n_per_class, dims):
  rng = np.random.default_rng(0)
  num_classes = 6
  for trial in range(20):
    centres = rng.normal(size=(num_classes, dims)) * rng.uniform(0.2, 1.)
    scales = rng.uniform(0.1, 10., dims)  # Standardisation matters.
    # Balanced K-shot sets, and unbalanced ones (there the bias feature's size matters too).
    counts = [n_per_class] * num_classes if trial % 2 else rng.integers(1, 2 * n_per_class,
                                                                         num_classes)
    y = np.repeat(np.arange(num_classes), counts)
    y_test = rng.integers(0, num_classes, 300)
    x = (centres[y] + rng.normal(size=(len(y), dims))) * scales + 5.
    x_test = (centres[y_test] + rng.normal(size=(300, dims))) * scales + 5.
    for l2 in (2.0**10, 1.):
      got = fewshot.linear_fewshot_accuracy(x.astype(np.float32), y, x_test.astype(np.float32),
                                            y_test, num_classes, l2)
      expected = np.mean(ridge_by_lstsq(x.astype(np.float32), y, x_test.astype(np.float32),
                                        num_classes, l2) == y_test)
      assert got == pytest.approx(expected, abs=1e-12), (trial, l2)


def test_known_answers_on_synthetic_problems():
  rng = np.random.default_rng(1)
  num_classes, dims = 10, 32
  # Separable: each class a far-apart point plus small noise -> every test example right.
  centres = rng.normal(size=(num_classes, dims)) * 10
  y = np.repeat(np.arange(num_classes), 5)
  y_test = rng.integers(0, num_classes, 500)
  noise = lambda n: rng.normal(size=(n, dims)) * 0.1
  assert fewshot.linear_fewshot_accuracy(centres[y] + noise(len(y)), y,
                                         centres[y_test] + noise(500), y_test, num_classes) == 1.
  # Features that carry no information about the labels: chance (1/10) on average.
  chance = [fewshot.linear_fewshot_accuracy(rng.normal(size=(50, dims)), y,
                                            rng.normal(size=(500, dims)), y_test, num_classes)
            for _ in range(40)]
  assert abs(np.mean(chance) - 0.1) < 0.015, np.mean(chance)
  # The labels of the test set swapped for another class: nothing right.
  assert fewshot.linear_fewshot_accuracy(centres[y] + noise(len(y)), y, centres[y_test],
                                         (y_test + 1) % num_classes, num_classes) == 0.


def test_bad_inputs_are_refused():
  x, y = np.zeros((4, 3)), np.array([0, 1, 0, 1])
  with pytest.raises(ValueError, match='same dims'):
    fewshot.linear_fewshot_accuracy(x, y, np.zeros((2, 4)), y[:2], 2)
  with pytest.raises(ValueError, match=r'integers in \[0, 2\)'):
    fewshot.linear_fewshot_accuracy(x, y + 1, x, y, 2)
  with pytest.raises(ValueError, match='one integer per example'):
    fewshot.linear_fewshot_accuracy(x, y[:3], x, y, 2)


def test_draws_take_k_per_class_nested_and_seeded():
  labels = np.random.default_rng(0).integers(0, 5, 200)
  for seed in range(3):
    five = fewshot.fewshot_indices(labels, 5, 5, seed)
    one = fewshot.fewshot_indices(labels, 5, 1, seed)
    chex.assert_trees_all_equal(np.bincount(labels[five], minlength=5), np.full(5, 5))
    assert set(one) <= set(five)  # One draw per seed, its first K of each class.
    chex.assert_trees_all_equal(five, fewshot.fewshot_indices(labels, 5, 5, seed))
  assert set(fewshot.fewshot_indices(labels, 5, 5, 0)) != set(
      fewshot.fewshot_indices(labels, 5, 5, 1))
  # Each class's permutation drawn in class order from default_rng(seed).
  rng = np.random.default_rng(7)
  expected = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:3] for c in range(5)])
  chex.assert_trees_all_equal(fewshot.fewshot_indices(labels, 5, 3, 7), expected)
  with pytest.raises(errors.DataError, match='class 4 has 0 examples'):
    fewshot.fewshot_indices(labels % 4, 5, 1, 0)


def _short_class_digits(short_class=3, keep=4):
  """digits' training split with class ``short_class`` cut to ``keep`` examples."""
  train = sources.digits('train')
  index = np.concatenate([np.flatnonzero(train.labels != short_class),
                          np.flatnonzero(train.labels == short_class)[:keep]])
  return sources.ArraySource(train.images[index], train.labels[index], 10, train.class_names)


def test_a_shot_count_a_class_cannot_supply_is_skipped_and_the_others_computed(caplog):
  """One class of 4 examples: 5- and 25-shot are skipped for that dataset with one warning
  naming the class and its count; 1- and 4-shot (all that class has: a count a class supplies
  exactly) are computed, as if asked alone (the same draws), and by lstsq's ridge solution;
  the headline metric is the largest computed."""
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(3), [30, 30, 4])
  x, x_test = rng.normal(size=(64, 6)) + labels[:, None], rng.normal(size=(30, 6))
  y_test = np.arange(30) % 3
  per_shot = fewshot.accuracies((x, labels), (x_test, y_test), 3, (1, 4, 5, 25), 2)
  assert set(per_shot) == {1, 4}
  assert per_shot == fewshot.accuracies((x, labels), (x_test, y_test), 3, (1, 4), 2)
  index = fewshot.fewshot_indices(labels, 3, 4, 1)
  assert sorted(index[8:]) == [60, 61, 62, 63]  # Every example of the class of 4.
  assert per_shot[4][1] == np.mean(ridge_by_lstsq(x[index], labels[index], x_test, 3, 2.0**10)
                                   == y_test)
  assert fewshot.shot_counts(labels, 3, (1, 4, 5, 25)) == ((1, 4), (2, 4))
  assert fewshot.shot_counts(labels, 3, (1, 4)) == ((1, 4), None)

  from vit_jax.models import get_model

  model = get_model('ti16', num_classes=10, image_size=8, patch_size=4, hidden_size=16,
                    mlp_dim=32, num_heads=2, num_layers=1)
  params = jax.jit(model.init)(jax.random.key(0), np.zeros((1, 8, 8, 3), np.float32))['params']
  dataset = fewshot.Dataset('digits', _short_class_digits(), sources.digits('test'), 10)
  mesh = sharding.make_mesh()
  pp = preprocess.parse('to_rgb|value_range(-1, 1)')
  with caplog.at_level('WARNING'):
    kept = [fewshot.check_shots(dataset, (1, 4, 5, 25))]
    evaluator = fewshot.Evaluator('fewshot', 0, model, mesh, [dataset], pp, (1, 4, 5, 25), 2,
                                  2.0**10, 64)
    evaluator.known_shots(kept)
    metrics = evaluator.run(params)
    evaluator.run(params)
  warnings = [r.getMessage() for r in caplog.records if 'few-shot dataset' in r.getMessage()]
  assert warnings == ["few-shot dataset 'digits': class 3 has 4 training examples, too few "
                      'for 5-shot, 25-shot: skipped (1-shot, 4-shot computed).']
  assert set(metrics) == {'digits_1shot', 'digits_4shot'}
  assert evaluator.metric == 'digits_4shot'
  assert 0 <= metrics['digits_1shot'] <= 1 and 0 <= metrics['digits_4shot'] <= 1
  # Shots no class can supply at all: nothing to evaluate, refused.
  with pytest.raises(errors.ConfigError, match=r"--shots=\(5, 25\): no class of few-shot "
                     "dataset 'digits'"):
    fewshot.check_computable([fewshot.check_shots(dataset, (5, 25))], [dataset], (5, 25), '--')


@pytest.mark.slow
def test_features_of_a_trained_model_on_digits(tiny_run):
  """The sharded feature pass over 8 devices gives the model's own pre-logits features (the
  head's input: logits = features @ kernel + bias), and the accuracy on them is lstsq's."""
  loaded = workdir.load_run(tiny_run)
  model, params = loaded.model, loaded.params
  mesh = sharding.make_mesh()
  batch_sharding = sharding.batch_sharding(mesh)
  step = fewshot.make_feature_step(model, batch_sharding)
  pp = preprocess.parse(loaded.config.dataset.pp_eval)
  test = sources.digits('test')
  features, labels = fewshot.split_features(step, params, test, pp, batch_size=64,
                                            batch_sharding=batch_sharding, num_classes=10)
  chex.assert_shape(features, (len(test), model.hidden_size))
  chex.assert_trees_all_equal(labels, test.labels.astype(np.int64))
  images = np.stack([pp(test[i]['image'], np.random.default_rng(0)) for i in range(len(test))])
  logits = np.asarray(model.apply({'params': params}, images, train=False))
  head = params['head']
  chex.assert_trees_all_close(features @ np.asarray(head['kernel']) + np.asarray(head['bias']),
                              logits, atol=1e-4, rtol=1e-4)

  train_f, train_y = fewshot.split_features(step, params, sources.digits('train'), pp,
                                            batch_size=64, batch_sharding=batch_sharding,
                                            num_classes=10)
  per_shot = fewshot.accuracies((train_f, train_y), (features, labels), 10, (1, 10), 2)
  for k, per_seed in per_shot.items():
    for seed, accuracy in enumerate(per_seed):
      index = fewshot.fewshot_indices(train_y, 10, k, seed)
      expected = np.mean(ridge_by_lstsq(train_f[index], train_y[index], features, 10,
                                        2.0**10) == labels)
      assert accuracy == pytest.approx(expected, abs=1e-12)
  assert np.mean(per_shot[10]) > 0.2  # Above chance (0.1) after 10 steps of training.


@pytest.mark.slow
def test_a_pre_logits_layer_is_the_representation():
  from vit_jax.models import get_model

  model = get_model('ti16', num_classes=5, image_size=8, patch_size=4, hidden_size=16,
                    mlp_dim=32, num_heads=2, num_layers=1, representation_size=12)
  images = np.random.default_rng(0).uniform(-1, 1, (3, 8, 8, 3)).astype(np.float32)
  params = jax.jit(model.init)(jax.random.key(0), images)['params']
  params['head']['kernel'] = np.random.default_rng(1).normal(size=(12, 5)).astype(np.float32)
  features = jax.jit(fewshot.feature_model(model).apply)({'params': params}, images)
  chex.assert_shape(features, (3, 12))
  assert np.all(np.abs(features) <= 1)  # tanh's output.
  chex.assert_trees_all_close(features @ params['head']['kernel'] + params['head']['bias'],
                              jax.jit(model.apply)({'params': params}, images), atol=1e-5)
