"""vit_jax.models.flexi: FlexiViT's model at any patch size on its base parameters, the same
numbers as a checkpoint resampled to it (checkpoints.formats.fit) and as big_vision's
resample_patchemb; its gradients back to the base; the per-step draw; the config's refusals."""

import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import config as config_lib
from vit_jax.base import errors
from vit_jax.checkpoints.formats import fit
from vit_jax.models import flexi, get_model
from vit_jax.training import plan as plan_lib

from runs import tiny_config

BIG_VISION = pathlib.Path(__file__).resolve().parent / 'data' / 'big_vision'
# Base patch 4 at 16 px: a 4x4 grid; a class token (a prefix row in the position embeddings).
MODEL = dict(name='ti16', image_size=16, patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2,
             num_layers=1, pool='token', num_classes=5)


@pytest.fixture(scope='module')
def base():
  model = get_model(**MODEL)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3)))['params']
  rng = np.random.default_rng(0)  # Random weights everywhere (the head too: not zero).
  params = jax.tree.map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), shapes)
  images = rng.uniform(-1, 1, (3, 16, 16, 3)).astype(np.float32)
  return model, params, images


def _resampled(model, params, patch):
  """The base's parameters at ``patch`` as a checkpoint load makes them (numpy, float64)."""
  params = jax.tree.map(np.asarray, params)
  grid = (16 // patch,) * 2
  params['embedding']['kernel'] = fit.resample_patchemb(params['embedding']['kernel'], patch)
  posemb = params['Transformer']['posembed_input']
  posemb['pos_embedding'] = fit.resize_posemb(posemb['pos_embedding'], grid, model.grid, 1)
  return params


def test_the_model_at_a_patch_size_is_the_plain_model_on_the_resampled_parameters(base):
  """Up (2: an 8x8 grid) and down (8: 2x2), with a class token's prefix row."""
  model, params, images = base
  resampled = {patch: _resampled(model, params, patch) for patch in (2, 8)}

  @jax.jit
  def outputs(params, resampled):  # One program: one compile.
    return {patch: (flexi.at_patch_size(model, patch).apply({'params': params}, images),
                    model.clone(patch_size=patch).apply({'params': resampled[patch]}, images))
            for patch in resampled}

  for patch, (ours, plain) in outputs(params, resampled).items():
    assert ours.shape == (3, 5)
    chex.assert_trees_all_close(ours, plain, atol=1e-5, rtol=0, custom_message=f'{patch}')


def test_at_its_own_patch_size_it_is_the_model_itself(base):
  model, _, _ = base
  assert flexi.at_patch_size(model, 4) is model and flexi.at_patch_size(model, None) is model


def test_the_jax_resample_gives_big_visions_numbers():
  """flexi_resample.npz (written by big_vision's own resample_patchemb): the differentiable
  resample of the forward pass, as the checkpoint formats' numpy one (test_formats)."""
  cases = np.load(BIG_VISION / 'flexi_resample.npz')
  n = len([k for k in cases if k.startswith('in_')])
  sizes = [tuple(int(s) for s in cases[f'new_hw_{i}']) for i in range(n)]
  ours = jax.jit(lambda kernels: [flexi.resample_patchemb(k, s) for k, s in zip(
      kernels, sizes, strict=True)])([cases[f'in_{i}'] for i in range(n)])  # One compile.
  for i, new in enumerate(sizes):
    chex.assert_trees_all_close(ours[i], cases[f'out_{i}'], atol=1e-5, rtol=0)
    chex.assert_trees_all_close(ours[i], fit.resample_patchemb(cases[f'in_{i}'], new), atol=1e-5,
                                rtol=0)


def test_gradients_flow_back_to_the_base_parameters(base):
  """The base parameters' gradient of the forward pass at P is the gradient at P taken back
  through the resample's linear maps (their transposes): the kernel's, the position
  embeddings' (the class token's row as it is), every other parameter's unchanged."""
  model, params, _ = base
  patch, grid = 8, (2, 2)
  at = flexi.at_patch_size(model, patch)
  rng = np.random.default_rng(1)
  cotangent = jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(np.float32),
                           jax.eval_shape(at.params, params))
  (grads,) = jax.jit(lambda p, c: jax.vjp(at.params, p)[1](c))(params, cotangent)
  g = np.asarray(cotangent['embedding']['kernel'], np.float64).reshape(patch * patch, -1)
  chex.assert_trees_all_close(
      np.asarray(grads['embedding']['kernel']).reshape(16, -1),
      flexi.pinv_resize_matrix((4, 4), (patch, patch)).T @ g, atol=1e-4, rtol=1e-4)
  g = np.asarray(cotangent['Transformer']['posembed_input']['pos_embedding'], np.float64)
  rows = flexi.interpolation_matrix(4, grid[0])
  pos = np.asarray(grads['Transformer']['posembed_input']['pos_embedding'])
  chex.assert_trees_all_close(
      pos[0, 1:], np.einsum('ih,jw,ijd->hwd', rows, rows, g[0, 1:].reshape(*grid, -1)).reshape(
          16, -1), atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(pos[0, :1], g[0, :1])
  chex.assert_trees_all_equal(grads['Transformer']['encoderblock_0'],
                              cotangent['Transformer']['encoderblock_0'])


def test_the_draw_is_a_function_of_the_seed_and_step():
  sizes = (4, 8, 16)
  draws = [flexi.draw(0, s, sizes) for s in range(1, 1201)]
  assert draws[600:] == [flexi.draw(0, s, sizes) for s in range(601, 1201)]  # Resumed.
  counts = np.array([draws.count(p) for p in sizes])
  assert np.all(np.abs(counts / 1200 - 1 / 3) < 0.05), counts  # Uniform.
  assert draws[:100] != [flexi.draw(1, s, sizes) for s in range(1, 101)]  # Another seed.
  weighted = [flexi.draw(-7, s, sizes, (0.8, 0., 0.2)) for s in range(1, 601)]
  assert 8 not in weighted and abs(weighted.count(4) / 600 - 0.8) < 0.06


@pytest.mark.parametrize('overrides, message', [
    ({'flexi.patch_sizes': (4, 8, 4)}, r'config.flexi.patch_sizes=\(4, 8, 4\) names a patch '
     r'size twice: give each once.'),
    ({'flexi.patch_sizes': (4, 8), 'flexi.probabilities': (1.0,)},
     r'config.flexi.probabilities=\(1.0,\) must be \(\) \(uniform\) or one number >= 0 for each'),
    ({'flexi.patch_sizes': (4, 8), 'flexi.probabilities': (0, 0)}, r'not all 0'),
    ({'flexi.patch_sizes': (4, 0)}, r'config.flexi.patch_sizes'),
])
def test_a_config_that_cannot_draw_is_one_line(overrides, message):
  config = config_lib.complete(tiny_config(**overrides))
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.check(config)


def test_a_patch_size_that_does_not_tile_the_images_is_refused_before_anything_compiles():
  with pytest.raises(errors.ConfigError, match=(
      r'^config.flexi.patch_sizes=\(4, 3, 5\): 3, 5 do not tile the 16x16 images '
      r'\(config.model.image_size\): give divisors of its sides.$')):
    plan_lib.validate(tiny_config(**{'flexi.patch_sizes': (4, 3, 5)}), num_train_examples=64)
  hybrid = get_model('r26_s32', num_classes=2, image_size=64)
  assert 'FlexiViT needs a plain ViT' in flexi.check(hybrid, (32,))
  assert flexi.check(get_model(**MODEL), (2, 4, 8, 16)) == ''


@pytest.fixture(scope='module')
def flexi_plan():
  plan = plan_lib.validate(tiny_config(**{'flexi.patch_sizes': (16, 8)}), num_train_examples=64)
  state, shardings = plan.train_state(abstract=True)
  return plan, state, shardings


def test_a_run_has_one_step_per_patch_size_made_when_first_drawn(flexi_plan):
  from vit_jax.training import step as step_lib

  plan, _, shardings = flexi_plan
  steps = plan.train_step(shardings)
  assert isinstance(steps, step_lib.PatchSizeSteps)
  made = {s: steps.at(s) for s in range(1, 11)}
  assert sorted(steps.steps) == [8, 16]
  assert all(made[s] is steps.steps[flexi.draw(0, s, (16, 8))] for s in made)


@pytest.mark.slow  # Traces and lowers a train step.
def test_a_flexivit_run_is_planned_at_its_smallest_patch_size(flexi_plan):
  """Ahead of time (vit_jax.tools.aot): the most tokens, the most memory and time."""
  from vit_jax.base import sharding

  plan, state, shardings = flexi_plan
  batch = {k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding.batch_sharding(plan.mesh))
           for k, shape in (('image', (64, 16, 16, 3)), ('label', (64, 10)))}
  text = plan.train_step(shardings).lower(state, batch).as_text()
  assert 'stride = [8, 8]' in text and 'stride = [16, 16]' not in text, text[:2000]
