"""vit_jax.tools.analysis: attention capture, attention distance, rollout, embedding analyses."""

import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import get_model
from vit_jax.models.posemb import posemb_sincos_2d
from vit_jax.tools import analysis

TINY = dict(image_size=(24, 40), patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4,
            num_layers=3)  # A non-square 3x5 grid: transposed axes show.


def _random_params(model, seed=0):
  """Random values of the model's shapes (numpy: no init to compile), a non-zero head."""
  images = jax.ShapeDtypeStruct((1, 24, 40, 3), jnp.float32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), images)['params']
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0., 0.3, s.shape).astype(np.float32), shapes)


def _images(n=2):
  return np.random.default_rng(2).uniform(-1., 1., (n, 24, 40, 3)).astype(np.float32)


def _random_attention(shape, seed=0):
  logits = np.random.default_rng(seed).normal(0., 2., shape)
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope='module')
def captured():
  """A tiny model's logits without capture, and with: (model, params, plain, logits, weights)."""
  model = get_model('ti16', num_classes=5, pool='token', **TINY)
  params = _random_params(model)
  plain = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(params, _images())
  logits, weights = jax.jit(lambda p, x: analysis.attention_weights(model, p, x))(
      params, _images())
  return model, params, plain, logits, weights


def test_capture_leaves_the_logits_unchanged(captured):
  _, _, plain, logits, weights = captured
  assert float(np.std(plain)) > 0.1  # Logits that differ: the comparison is not vacuous.
  # Up to rounding: capturing makes the last block compute every token, not the class token only.
  chex.assert_trees_all_close(logits, plain, atol=1e-5, rtol=1e-5)
  chex.assert_shape(weights, (3, 2, 4, 16, 16))  # (layers, batch, heads, tokens, tokens)
  chex.assert_trees_all_close(np.asarray(weights).sum(-1), np.ones((3, 2, 4, 16)), atol=1e-5)


def test_capture_of_a_scanned_fused_attention_model(captured):
  """scan=True stacks the weights by layer; 'xla' attention is swapped for einsum to record."""
  from vit_jax.checkpoints.formats import layout

  model, params, plain, _, weights = captured
  scanned = model.clone(scan=True, attention_impl='xla')
  logits, scanned_weights = jax.jit(lambda p, x: analysis.attention_weights(scanned, p, x))(
      layout.to_model_layout(params, scanned=True), _images())
  chex.assert_trees_all_close(logits, plain, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(scanned_weights, weights, atol=1e-5)


def test_rollout_rows_sum_to_one_and_follow_the_definition():
  weights = _random_attention((4, 2, 3, 6, 6))
  total = analysis.rollout(weights)
  chex.assert_shape(total, (2, 6, 6))
  chex.assert_trees_all_close(np.asarray(total).sum(-1), np.ones((2, 6)), atol=1e-5)
  # Independently: per layer 0.5 * mean-over-heads + 0.5 * I, product from the last layer down.
  w = np.asarray(weights, np.float64)
  expected = np.stack([np.eye(6)] * 2)
  for layer in w:
    a = 0.5 * layer.mean(axis=1) + 0.5 * np.eye(6)
    expected = a @ expected
  chex.assert_trees_all_close(total, expected.astype(np.float32), atol=1e-5)


def test_rollout_maps_read_the_class_token_or_the_mean():
  weights = _random_attention((2, 3, 4, 1 + 6, 1 + 6), seed=1)
  maps = analysis.rollout_maps(weights, (2, 3), num_prefix_tokens=1)
  total = np.asarray(analysis.rollout(weights))
  row = total[:, 0, 1:].reshape(3, 2, 3)
  chex.assert_trees_all_close(maps, row / row.max(axis=(1, 2), keepdims=True), atol=1e-6)
  patches = weights[..., 1:, 1:] / weights[..., 1:, 1:].sum(-1, keepdims=True)
  gap = analysis.rollout_maps(patches, (2, 3), num_prefix_tokens=0)
  mean_row = np.asarray(analysis.rollout(patches)).mean(axis=1).reshape(3, 2, 3)
  chex.assert_trees_all_close(gap, mean_row / mean_row.max(axis=(1, 2), keepdims=True),
                              atol=1e-6)


def _brute_force_mean_distance(grid, spacing):
  positions = list(itertools.product(range(grid[0]), range(grid[1])))
  total = sum(math.hypot((r1 - r2) * spacing[0], (c1 - c2) * spacing[1])
              for (r1, c1), (r2, c2) in itertools.product(positions, positions))
  return total / len(positions) ** 2


@pytest.mark.parametrize('prefix', [0, 1])
def test_attention_distance_of_self_and_uniform_attention(prefix):
  grid, spacing = (3, 5), (8., 4.)
  tokens = prefix + 15
  self_only = np.broadcast_to(np.eye(tokens, dtype=np.float32), (2, 3, 4, tokens, tokens))
  chex.assert_trees_all_close(analysis.attention_distance(self_only, grid, spacing, prefix),
                              np.zeros((2, 3, 4)), atol=1e-6)
  # Every token alike, the class token included (its share is renormalised away).
  uniform = np.full((2, 3, 4, tokens, tokens), 1. / tokens, np.float32)
  expected = _brute_force_mean_distance(grid, spacing)
  distance = analysis.attention_distance(uniform, grid, spacing, prefix)
  chex.assert_trees_all_close(distance, np.full((2, 3, 4), expected), rtol=1e-5)
  assert analysis.uniform_distance(grid, spacing) == pytest.approx(expected)


def test_attention_distance_of_attention_to_the_right_neighbour():
  """Each query looks one patch to the right (the last column at itself): spacing[1] * 4/5."""
  grid, spacing = (3, 5), (8., 4.)
  index = np.arange(15).reshape(grid)
  target = np.where(np.arange(5) < 4, index + 1, index)
  weights = np.zeros((15, 15), np.float32)
  weights[index.reshape(-1), target.reshape(-1)] = 1.
  distance = analysis.attention_distance(weights[None], grid, spacing, 0)
  chex.assert_trees_all_close(distance, np.array([4. * 4 / 5]), atol=1e-6)


def test_model_token_spacing_in_pixels(captured):
  model = captured[0]
  assert analysis.token_spacing(model) == (8., 8.)
  hybrid = get_model('r_ti16', num_classes=0, image_size=64)  # BiT root /4, then 8x8 patches.
  assert hybrid.grid == (2, 2) and analysis.token_spacing(hybrid) == (32., 32.)


def test_sincos_position_similarity_peaks_at_the_patch_itself():
  model = get_model('ti16', num_classes=5, posemb='sincos2d', pool='token', **TINY)
  params = _random_params(model)
  posemb = analysis.position_embeddings(model, params)
  chex.assert_trees_all_close(posemb, posemb_sincos_2d((3, 5), 32)[0])
  similarity = analysis.position_similarity(posemb, model.grid)
  chex.assert_shape(similarity, (3, 5, 3, 5))
  chex.assert_trees_all_close(similarity, similarity.transpose(2, 3, 0, 1), atol=1e-12)
  for i, j in itertools.product(range(3), range(5)):
    tile = similarity[i, j]
    assert np.unravel_index(tile.argmax(), tile.shape) == (i, j)
    assert tile[i, j] == pytest.approx(1.)
    assert np.delete(tile.reshape(-1), i * 5 + j).max() < 1. - 1e-3


def test_learned_position_embeddings_drop_the_class_token_row(captured):
  model, params, *_ = captured
  table = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  chex.assert_trees_all_equal(analysis.position_embeddings(model, params), table[0, 1:])


def test_embedding_pca_finds_the_dominant_filter_directions():
  rng = np.random.default_rng(0)
  u, v = np.zeros((4, 4, 3)), np.zeros((4, 4, 3))
  u[:2] = 1.  # Top half bright, in every channel.
  v[..., 0], v[..., 2] = 1., -1.  # Red against blue.
  u, v = u / np.linalg.norm(u), v / np.linalg.norm(v)
  a, b = rng.normal(0, 3., 64), rng.normal(0, 1., 64)
  a, b = a - a.mean(), b - b.mean()
  b -= a * (a @ b) / (a @ a)  # Uncorrelated in the sample: the components are exactly u, v.
  filters = a[:, None] * u.reshape(-1) + b[:, None] * v.reshape(-1)
  filters += rng.normal(0, 0.01, filters.shape)
  kernel = filters.T.reshape(4, 4, 3, 64)
  components, ratio = analysis.embedding_pca(kernel, 5)
  chex.assert_shape(components, (5, 4, 4, 3))
  assert abs(np.sum(components[0] * u)) > 0.999
  assert abs(np.sum(components[1] * v)) > 0.999
  assert ratio[0] > ratio[1] > ratio[2] and ratio[:2].sum() > 0.99
  flat = components.reshape(5, -1)
  chex.assert_trees_all_close(flat @ flat.T, np.eye(5), atol=1e-9)


def test_top_k_and_probabilities():
  logits = np.array([[0., 2., 1.], [5., -1., 3.]])
  p = analysis.probabilities(logits, 'softmax')
  chex.assert_trees_all_close(p.sum(-1), np.ones(2), atol=1e-6)
  indices, values = analysis.top_k(p, 5)
  chex.assert_trees_all_equal(indices, np.array([[1, 2, 0], [0, 2, 1]]))
  assert np.all(np.diff(values, axis=-1) <= 0)
  with pytest.raises(ValueError, match="'softmax' or 'sigmoid'"):
    analysis.probabilities(logits, 'relu')
