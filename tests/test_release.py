"""Tests of vit_jax.checkpoints.formats.release (the release .npz layout, both ways), layout and
fit (adaptation to a model)."""

import logging
import os
import pathlib
import subprocess
import sys
import uuid

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage

from vit_jax.base import errors, paths
from vit_jax.checkpoints.formats import fit, layout, release
from vit_jax.models import get_model

import numpy_vit

SMALL = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8)


def small(image_size=32, **kw):
  return get_model('ti16', num_classes=kw.pop('num_classes', 5), image_size=image_size,
                   **{**SMALL, **kw})


def init(model, seed=0):
  images = jnp.zeros((1, *model.image_size, 3))
  return model.init(jax.random.key(seed), images)['params']


def randomise(params, seed=1):
  """Non-trivial values everywhere (the zero head would hide mistakes)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [jax.random.normal(k, x.shape, x.dtype) * 0.1
                                   for k, x in zip(keys, leaves, strict=True)])


def images(model, batch=2, seed=3):
  return np.asarray(jax.random.uniform(jax.random.key(seed), (batch, *model.image_size, 3),
                                       minval=-1, maxval=1))


def bilinear_reference(posemb, old_grid, new_grid, prefix):
  """The releases' resize: scipy.ndimage.zoom with order=1 on the patch grid."""
  grid = posemb[0, prefix:].reshape(*old_grid, -1)
  zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
  grid = scipy.ndimage.zoom(grid.astype(np.float64), zoom, order=1)
  assert grid.shape[:2] == tuple(new_grid)
  return np.concatenate([posemb[:, :prefix], grid.reshape(1, -1, grid.shape[-1])], axis=1)


def test_release_layout_of_b16():
  model = get_model('b16', num_classes=1000, representation_size=768)
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  flat = layout.flatten(jax.eval_shape(model.init, jax.random.key(0), x)['params'])
  shapes = {k: v.shape for k, v in flat.items()}
  expected = {
      'embedding/kernel': (16, 16, 3, 768), 'embedding/bias': (768,), 'cls': (1, 1, 768),
      'Transformer/posembed_input/pos_embedding': (1, 197, 768),
      'Transformer/encoder_norm/scale': (768,), 'Transformer/encoder_norm/bias': (768,),
      'pre_logits/kernel': (768, 768), 'pre_logits/bias': (768,),
      'head/kernel': (768, 1000), 'head/bias': (1000,),
  }
  for i in range(12):
    b = f'Transformer/encoderblock_{i}/'
    for ln in ('LayerNorm_0', 'LayerNorm_2'):
      expected.update({b + ln + '/scale': (768,), b + ln + '/bias': (768,)})
    for qkv in ('query', 'key', 'value'):
      a = b + 'MultiHeadDotProductAttention_1/' + qkv
      expected.update({a + '/kernel': (768, 12, 64), a + '/bias': (12, 64)})
    a = b + 'MultiHeadDotProductAttention_1/out'
    expected.update({a + '/kernel': (12, 64, 768), a + '/bias': (768,)})
    m = b + 'MlpBlock_3/'
    expected.update({m + 'Dense_0/kernel': (768, 3072), m + 'Dense_0/bias': (3072,),
                     m + 'Dense_1/kernel': (3072, 768), m + 'Dense_1/bias': (768,)})
  assert shapes == expected


def test_hybrid_release_names():
  model = get_model('r50_b16', num_classes=10)
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  flat = layout.flatten(jax.eval_shape(model.init, jax.random.key(0), x)['params'])
  for key, shape in [('conv_root/kernel', (7, 7, 3, 64)), ('gn_root/scale', (64,)),
                     ('block1/unit1/conv_proj/kernel', (1, 1, 64, 256)),
                     ('block1/unit1/gn_proj/bias', (256,)),
                     ('block3/unit9/conv2/kernel', (3, 3, 256, 256)),
                     ('block3/unit9/conv3/kernel', (1, 1, 256, 1024)), ('block3/unit9/gn3/scale',
                                                                        (1024,)),
                     ('embedding/kernel', (1, 1, 1024, 768))]:
    assert flat[key].shape == shape, key
  assert 'block2/unit2/conv_proj/kernel' not in flat  # Only shape-changing units project.


@pytest.mark.slow
@pytest.mark.parametrize('scan', [False, True])
def test_save_then_load_is_exact(tmp_path, scan):
  model = small(scan=scan, num_classes=7, representation_size=16)
  params = randomise(init(model))
  path = tmp_path / 'model.npz'
  release.save_npz(path, {'params': params})
  loaded = release.load_npz(path)
  assert 'encoderblock_1' in loaded['Transformer']  # Always the release layout on disk.
  chex.assert_trees_all_equal(layout.to_model_layout(loaded, scanned=scan),
                              jax.tree.map(np.asarray, params))
  # Plain numpy reads the file with the release's flat keys.
  with np.load(path) as f:
    assert 'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel' in f.files
    assert all(f[k].dtype == np.float32 for k in f.files)
  assert not list(tmp_path.glob('.*tmp*'))  # No temporary file left behind.


@pytest.mark.slow
def test_a_release_file_on_a_non_local_filesystem_loads_as_the_local_one(tmp_path,
                                                                        monkeypatch):
  # ram:// (TensorFlow's in-memory filesystem) goes through epath's gfile backend, as gs://
  # does; os.path and open() cannot see it, so any fallback to them fails here.
  model = small(num_classes=7, representation_size=16)
  params = randomise(init(model))
  remote = f'ram://{uuid.uuid4().hex}/released/ViT-tiny.npz'
  monkeypatch.setattr(release, '_CHUNK', 4096)  # Written in many pieces.
  release.save_npz(remote, params)  # gfile's writers cannot tell(): numpy's zip needs it.
  release.save_npz(tmp_path / 'local.npz', params)
  assert paths.is_file(remote) and not os.path.exists(remote)
  assert [p.name for p in paths.path(remote).parent.iterdir()] == ['ViT-tiny.npz']
  local = release.load_npz(tmp_path / 'local.npz')
  chex.assert_trees_all_equal(release.load_npz(remote), local)
  chex.assert_trees_all_equal(release.load_npz(paths.path(remote)), local)
  # Fine-tuning from it and reading its architecture go through the same reads.
  target = small(image_size=48, num_classes=3)
  chex.assert_trees_all_equal(release.load_pretrained(remote, init(target), target),
                              release.load_pretrained(tmp_path / 'local.npz', init(target),
                                                      target))
  loaded = release.load_npz_model(remote)
  assert loaded.source == remote and loaded.model.num_classes == 7
  missing = remote.replace('ViT-tiny', 'ViT-absent')
  with pytest.raises(errors.MissingFileError, match=f'No checkpoint file at {missing}'):
    release.load_npz(missing)


def test_bfloat16_params_export_as_float32(tmp_path):
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), init(small()))
  release.save_npz(tmp_path / 'm.npz', params)
  loaded = release.load_npz(tmp_path / 'm.npz')
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(loaded))


def test_file_from_independent_implementation_gives_its_logits(tmp_path):
  """A release file written by numpy_vit loads here and reproduces its logits."""
  rng = np.random.default_rng(0)
  flat = numpy_vit.random_release_params(rng, width=32, depth=2, heads=4, mlp=64, patch=8,
                                         grid=(4, 4), classes=6, representation=24)
  np.savez(tmp_path / 'independent.npz', **flat)
  model = small(num_classes=6, representation_size=24)
  params = release.load_npz(tmp_path / 'independent.npz')
  x = images(model)
  ours = model.apply({'params': params}, x)
  chex.assert_trees_all_close(ours, numpy_vit.forward(flat, x).astype(np.float32),
                              atol=1e-4, rtol=1e-4)
  scanned = small(num_classes=6, representation_size=24, scan=True)
  chex.assert_trees_all_close(
      scanned.apply({'params': layout.to_model_layout(params, scanned=True)}, x), ours,
      atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_exported_file_gives_our_logits_in_independent_implementation(tmp_path):
  model = small(num_classes=6, scan=True)
  params = randomise(init(model))
  release.save_npz(tmp_path / 'ours.npz', params)
  with np.load(tmp_path / 'ours.npz') as f:
    flat = dict(f)
  x = images(model)
  chex.assert_trees_all_close(numpy_vit.forward(flat, x).astype(np.float32),
                              model.apply({'params': params}, x), atol=1e-4, rtol=1e-4)


# Checkpoints written by big_vision's own model code (how: tests/data/big_vision/README.md),
# with the options of ours that are the same model: file -> (options, big_vision's pool_type).
BIG_VISION = pathlib.Path(__file__).resolve().parent / 'data' / 'big_vision'
BIG_VISION_FILES = {
    'tok_params': dict(pool='token', representation_size=8),  # 'params/' prefix.
    'tok_scan': dict(pool='token'),
    'gap_scan_params': dict(pool='gap'),
    'map_sincos2d': dict(pool='map', posemb='sincos2d'),
}


def big_vision_model(image_size=(16, 24), **kw):
  return get_model('ti16', num_classes=5, image_size=image_size, patch_size=4, hidden_size=16,
                   mlp_dim=32, num_heads=2, num_layers=2, **kw)


def zeros_like_init(model):
  """The model's params tree as zeros: all that loading takes from it (traced, not run)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *model.image_size, 3)))
  return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes['params'])


@pytest.mark.slow
@pytest.mark.parametrize('name', BIG_VISION_FILES)
def test_big_vision_checkpoints_give_big_vision_logits(name):
  expected = np.load(BIG_VISION / 'logits.npz')
  path = BIG_VISION / f'{name}.npz'
  released = release.load_npz(path)
  for scan in (False, True):
    model = big_vision_model(scan=scan, **BIG_VISION_FILES[name])
    params = layout.to_model_layout(released, scanned=scan)
    chex.assert_trees_all_close(jax.jit(model.apply)({'params': params}, expected['images']),
                                expected[name], atol=1e-5, rtol=1e-5)
    pool = 'gap' if BIG_VISION_FILES[name]['pool'] == 'gap' else None  # Its arrays don't say.
    loaded = release.load_pretrained(path, zeros_like_init(model), model, keep_head=True,
                                     source_grid=(4, 6), source_pool=pool)
    chex.assert_trees_all_equal(loaded, params)
  if BIG_VISION_FILES[name]['pool'] == 'token':  # The class token's row: zero, added.
    posemb = released['Transformer']['posembed_input']['pos_embedding']
    chex.assert_shape(posemb, (1, 1 + 4 * 6, 16))
    chex.assert_trees_all_equal(posemb[:, 0], np.zeros((1, 16), np.float32))
    with np.load(path) as f:
      bv_posemb = f['params/pos_embedding' if 'params' in name else 'pos_embedding']
    chex.assert_trees_all_equal(posemb[:, 1:], bv_posemb)


def test_big_vision_checkpoint_fine_tunes_at_other_grids(caplog):
  path = BIG_VISION / 'tok_params.npz'
  source = release.load_npz(path)['Transformer']['posembed_input']['pos_embedding']
  caplog.set_level(logging.INFO)
  for size, grid in (((24, 16), (6, 4)), ((32, 32), (8, 8))):  # Transposed; larger.
    model = big_vision_model(size, pool='token')
    caplog.clear()
    params = release.load_pretrained(path, zeros_like_init(model), model, source_grid=(4, 6))
    chex.assert_trees_all_close(params['Transformer']['posembed_input']['pos_embedding'],
                                bilinear_reference(source, (4, 6), grid, 1), atol=1e-6)
    assert f'from the 4x6 grid to the {grid[0]}x{grid[1]} grid' in caplog.text
  # Without its grid, a source as large as a non-square model's grid is refused (it could be
  # that grid or its transpose), the transposed one and the same one alike.
  for size in ((24, 16), (16, 24)):
    model = big_vision_model(size, pool='token')
    with pytest.raises(errors.CheckpointMismatchError, match='init_source_grid'):
      release.load_pretrained(path, zeros_like_init(model), model)


@pytest.mark.slow
@pytest.mark.parametrize('pool', ['token', 'gap'])
@pytest.mark.parametrize('target_size, target_grid', [(48, (6, 6)), ((40, 56), (5, 7))])
def test_load_pretrained_resizes_position_embeddings(tmp_path, pool, target_size, target_grid):
  source = small(image_size=32, pool=pool, num_classes=10)
  source_params = randomise(init(source))
  release.save_npz(tmp_path / 'src.npz', source_params)

  target = small(image_size=target_size, pool=pool, num_classes=3)
  assert target.grid == target_grid
  init_params = init(target, seed=5)
  params = release.load_pretrained(tmp_path / 'src.npz', init_params, target)

  prefix = 1 if pool == 'token' else 0
  posemb = params['Transformer']['posembed_input']['pos_embedding']
  expected = bilinear_reference(np.asarray(source_params['Transformer']['posembed_input'][
      'pos_embedding']), (4, 4), target_grid, prefix)
  chex.assert_shape(posemb, (1, prefix + target_grid[0] * target_grid[1], 32))
  chex.assert_trees_all_close(posemb, expected, atol=1e-6, rtol=1e-6)
  # New zero head for 3 classes; everything else bit-identical to the source.
  chex.assert_trees_all_equal(params['head'], jax.tree.map(np.asarray, init_params['head']))
  chex.assert_trees_all_equal(params['head']['kernel'], np.zeros((32, 3), np.float32))
  rest = lambda p: {k: v for k, v in layout.flatten(p).items()
                    if k.split('/')[0] != 'head' and k != layout.POSEMB_KEY}
  chex.assert_trees_all_equal(rest(params), jax.tree.map(np.asarray, rest(source_params)))
  chex.assert_shape(target.apply({'params': params}, images(target)), (2, 3))


@pytest.mark.slow
def test_224_to_384_with_class_token(tmp_path):
  kw = dict(num_layers=1)
  source = get_model('ti16', num_classes=10, image_size=224, **kw)
  source_params = init(source)
  release.save_npz(tmp_path / 'ti16_224.npz', source_params)
  target = get_model('ti16', num_classes=10, image_size=384, **kw)
  params = release.load_pretrained(tmp_path / 'ti16_224.npz', init(target), target)
  expected = bilinear_reference(
      np.asarray(source_params['Transformer']['posembed_input']['pos_embedding']),
      (14, 14), (24, 24), 1)
  posemb = params['Transformer']['posembed_input']['pos_embedding']
  chex.assert_shape(posemb, (1, 577, 192))
  chex.assert_trees_all_close(posemb, expected, atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_equal(posemb[:, 0], np.asarray(
      source_params['Transformer']['posembed_input']['pos_embedding'])[:, 0])


def test_non_square_source_needs_its_grid(tmp_path):
  source = small(image_size=(32, 48))
  release.save_npz(tmp_path / 'wide.npz', init(source))
  target = small(image_size=(48, 48))
  with pytest.raises(ValueError, match='not a square grid'):
    release.load_pretrained(tmp_path / 'wide.npz', init(target), target)
  params = release.load_pretrained(tmp_path / 'wide.npz', init(target), target,
                                      source_grid=(4, 6))
  chex.assert_shape(params['Transformer']['posembed_input']['pos_embedding'], (1, 37, 32))
  # The transposed grid has as many positions, and is resized all the same.
  transposed = small(image_size=(48, 32))
  params = release.load_pretrained(tmp_path / 'wide.npz', zeros_like_init(transposed),
                                      transposed, source_grid=(4, 6))
  source = release.load_npz(tmp_path / 'wide.npz')['Transformer']['posembed_input']
  chex.assert_trees_all_close(params['Transformer']['posembed_input']['pos_embedding'],
                              bilinear_reference(source['pos_embedding'], (4, 6), (6, 4), 1),
                              atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('scan', [False, True])
def test_pre_logits_kept_or_dropped_as_configured(tmp_path, scan):
  source = small(representation_size=16, num_classes=10)
  source_params = randomise(init(source))
  release.save_npz(tmp_path / 'i21k.npz', source_params)

  keep = small(representation_size=16, num_classes=3, scan=scan)
  params = release.load_pretrained(tmp_path / 'i21k.npz', init(keep), {
      'name': 'ti16', 'num_classes': 3, 'image_size': 32, 'representation_size': 16,
      'scan': scan, **SMALL})
  chex.assert_trees_all_equal(params['pre_logits'],
                              jax.tree.map(np.asarray, source_params['pre_logits']))
  assert layout.is_scanned(params) == scan

  drop = small(num_classes=3, scan=scan)
  params = release.load_pretrained(tmp_path / 'i21k.npz', init(drop), drop)
  assert 'pre_logits' not in params
  chex.assert_trees_all_equal_structs(params, init(drop))


def test_keep_head(tmp_path):
  model = small(num_classes=5)
  params = randomise(init(model))
  release.save_npz(tmp_path / 'ft.npz', params)
  loaded = release.load_pretrained(tmp_path / 'ft.npz', init(model), model, keep_head=True)
  chex.assert_trees_all_equal(loaded, jax.tree.map(np.asarray, params))
  with pytest.raises(errors.CheckpointMismatchError, match=r'head/kernel: \(32, 5\) vs'):
    other = small(num_classes=9)
    release.load_pretrained(tmp_path / 'ft.npz', init(other), other, keep_head=True)


def test_b16_into_s16_fails_listing_the_keys(tmp_path):
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  b16 = get_model('b16', num_classes=10)
  shapes = layout.flatten(jax.eval_shape(b16.init, jax.random.key(0), x)['params'])
  np.savez(tmp_path / 'ViT-B_16.npz', **{k: np.zeros(v.shape, np.float32)
                                          for k, v in shapes.items()})
  s16 = get_model('s16', num_classes=10)
  s16_params = jax.eval_shape(s16.init, jax.random.key(0), x)['params']
  with pytest.raises(errors.CheckpointMismatchError) as error:
    release.load_pretrained(tmp_path / 'ViT-B_16.npz', s16_params, s16)
  message = str(error.value)
  assert 'does not fit the model ViT-S_16' in message
  assert 'embedding/kernel: (16, 16, 3, 768) vs (16, 16, 3, 384)' in message
  # Lines that differ only in the block index are grouped.
  assert ('Transformer/encoderblock_{0-11}/MultiHeadDotProductAttention_1/query/kernel: '
          '(768, 12, 64) vs (384, 6, 64)') in message
  assert 'shape mismatch (checkpoint vs model) (198)' in message
  assert 'The checkpoint holds width 768, 12 layers, 16x16 patches (ViT-B_16).' in message


def test_deeper_checkpoint_lists_extra_and_missing(tmp_path):
  release.save_npz(tmp_path / 'deep.npz', init(small(num_layers=3)))
  shallow = small(num_layers=2)
  with pytest.raises(errors.CheckpointMismatchError,
                     match=r'in the checkpoint but not in the model \(16\):\n'
                           r'    Transformer/encoderblock_2/LayerNorm_0/scale'):
    release.load_pretrained(tmp_path / 'deep.npz', init(shallow), shallow)
  deeper = small(num_layers=4)
  with pytest.raises(errors.CheckpointMismatchError,
                     match=r'missing from the checkpoint \(16\)'):
    release.load_pretrained(tmp_path / 'deep.npz', init(deeper), deeper)


def test_bad_files_get_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='No checkpoint file at .*nothing.npz'):
    release.load_npz(tmp_path / 'nothing.npz')
  (tmp_path / 'notes.txt').write_text('not a checkpoint')
  with pytest.raises(ValueError, match='notes.txt is not a .npz checkpoint'):
    release.load_npz(tmp_path / 'notes.txt')
  np.save(tmp_path / 'array.npy', np.zeros(3))
  with pytest.raises(ValueError, match='array.npy is not a .npz checkpoint.*single array'):
    release.load_npz(tmp_path / 'array.npy')
  np.savez(tmp_path / 'other.npz', weights=np.zeros(3), bias=np.zeros(2))
  with pytest.raises(ValueError, match='other.npz is not a ViT release checkpoint.*bias, weights'):
    release.load_npz(tmp_path / 'other.npz')
  good = tmp_path / 'good.npz'
  release.save_npz(good, init(small()))
  (tmp_path / 'truncated.npz').write_bytes(good.read_bytes()[:2000])
  with pytest.raises(ValueError, match='truncated.npz is not a .npz checkpoint'):
    release.load_npz(tmp_path / 'truncated.npz')


def test_a_release_file_holding_inf_is_refused_in_one_line(tmp_path):
  params = layout.flatten(init(small()))
  params['head/bias'] = np.full(params['head/bias'].shape, np.inf, np.float32)
  release.save_npz(tmp_path / 'inf.npz', layout.unflatten(params))
  with pytest.raises(errors.NonFiniteCheckpointError, match='inf.npz: head/bias hold NaN or Inf'):
    release.load_npz(tmp_path / 'inf.npz')


@pytest.mark.parametrize('damage', ['garbage', 'truncated', 'flipped', 'objects'])
def test_a_damaged_npz_file_is_one_line_that_says_what_is_wrong(tmp_path, damage):
  """Real damaged files: each a ``CheckpointError`` (one ``error:`` line), none quoting numpy's
  advice to load the file with pickles allowed."""
  good = tmp_path / 'good.npz'
  release.save_npz(good, init(small()))
  data = good.read_bytes()
  bad = tmp_path / 'bad.npz'
  if damage == 'garbage':
    bad.write_bytes(np.random.RandomState(0).bytes(4096))
  elif damage == 'truncated':
    bad.write_bytes(data[:len(data) // 2])
  elif damage == 'flipped':  # A byte inside the first array's compressed-free data.
    bad.write_bytes(data[:200] + bytes([data[200] ^ 0xFF]) + data[201:])
  else:
    np.savez(bad, cls=np.array([{'a': 1}], dtype=object))
  with pytest.raises(errors.CheckpointError) as e:
    release.load_npz(bad)
  message = str(e.value)
  assert '\n' not in message and 'allow_pickle' not in message, message
  assert message.startswith(f'{bad} is not a'), message


def test_scanned_layout_of_a_deep_release_file_gives_the_independent_logits(tmp_path):
  """Guards the order in which release blocks are stacked for ``scan=True``.

  ``encoderblock_10`` sorts before ``encoderblock_2`` by name: a layout stacked in name
  order scrambles every model of 11 or more blocks (all released B/16, L/16, H/14), which
  2-4 block tests cannot see. Here a 12-block file from numpy_vit is loaded, stacked and
  run scanned, and fine-tuned through ``load_pretrained`` with the head kept.
  """
  depth = 12
  rng = np.random.default_rng(depth)
  flat = numpy_vit.random_release_params(rng, width=16, depth=depth, heads=2, mlp=32, patch=8,
                                         grid=(2, 2), classes=4)
  np.savez(tmp_path / 'deep.npz', **flat)
  model = get_model('ti16', num_classes=4, image_size=16, hidden_size=16, mlp_dim=32,
                    num_heads=2, num_layers=depth, patch_size=8, scan=True)
  stacked = layout.to_model_layout(release.load_npz(tmp_path / 'deep.npz'), scanned=True)
  for i in range(depth):  # Block i of the file is slice i of the stack.
    np.testing.assert_array_equal(
        stacked['Transformer']['encoderblock']['MlpBlock_3']['Dense_0']['kernel'][i],
        flat[f'Transformer/encoderblock_{i}/MlpBlock_3/Dense_0/kernel'])
  x = images(model)
  expected = numpy_vit.forward(flat, x).astype(np.float32)
  apply = jax.jit(model.apply)
  chex.assert_trees_all_close(apply({'params': stacked}, x), expected, atol=1e-4, rtol=1e-4)
  fresh = jax.tree.map(np.zeros_like, stacked)  # The model's layout (init is slow at 12 blocks).
  adapted = release.load_pretrained(tmp_path / 'deep.npz', fresh, model,
                                    keep_head=True)
  chex.assert_trees_all_close(apply({'params': adapted}, x), expected, atol=1e-4, rtol=1e-4)
  # And back: the scanned parameters export to the same release file.
  release.save_npz(tmp_path / 'back.npz', adapted)
  with np.load(tmp_path / 'back.npz') as f:
    chex.assert_trees_all_equal(dict(f), flat)
# The case: a checkpoint trained at 224x320 (a 14x20 grid of 16 px patches).
WIDE = dict(hidden_size=16, mlp_dim=32, num_heads=2, num_layers=1, patch_size=16)


@pytest.mark.slow
@pytest.mark.parametrize('target_size, source_grid, outcome', [
    ((320, 224), None, 'init_source_grid'),  # Transposed: as many positions, other layout.
    ((320, 224), (14, 20), (20, 14)),
    ((224, 320), None, 'init_source_grid'),  # The same grid, but nothing says so.
    ((224, 320), (14, 20), (14, 20)),
    (224, None, 'not a square grid'),
    (224, (14, 20), (14, 14)),
    ((320, 224), (20, 14), (20, 14)),  # The model's grid, as the user says: used as it is.
    ((320, 224), (16, 16), 'has 256 positions, the position embeddings hold 280'),
])
def test_non_square_sources_load_as_given_or_are_refused(tmp_path, target_size, source_grid,
                                                          outcome):
  source = get_model('ti16', num_classes=5, image_size=(224, 320), **WIDE)
  source_params = randomise(init(source))
  release.save_npz(tmp_path / 'wide.npz', source_params)
  target = get_model('ti16', num_classes=5, image_size=target_size, **WIDE)
  if isinstance(outcome, str):
    with pytest.raises(errors.CheckpointMismatchError, match=outcome):
      release.load_pretrained(tmp_path / 'wide.npz', zeros_like_init(target), target,
                              source_grid=source_grid)
    return
  params = release.load_pretrained(tmp_path / 'wide.npz', zeros_like_init(target), target,
                                   source_grid=source_grid)
  posemb = np.asarray(source_params['Transformer']['posembed_input']['pos_embedding'])
  chex.assert_trees_all_close(params['Transformer']['posembed_input']['pos_embedding'],
                              bilinear_reference(posemb, source_grid, outcome, 1), atol=1e-6)


@pytest.mark.slow
def test_square_source_into_a_non_square_model_is_taken_as_square(tmp_path, caplog):
  source = get_model('ti16', num_classes=5, image_size=224, **WIDE)
  source_params = randomise(init(source))
  release.save_npz(tmp_path / 'square.npz', source_params)
  target = get_model('ti16', num_classes=5, image_size=(224, 320), **WIDE)
  caplog.set_level(logging.INFO)
  params = release.load_pretrained(tmp_path / 'square.npz', zeros_like_init(target), target)
  posemb = np.asarray(source_params['Transformer']['posembed_input']['pos_embedding'])
  chex.assert_trees_all_close(params['Transformer']['posembed_input']['pos_embedding'],
                              bilinear_reference(posemb, (14, 14), (14, 20), 1), atol=1e-6)
  assert 'taken as the square 14x14 grid of its 196 positions' in caplog.text


def test_big_vision_pool_types_the_arrays_do_not_tell(caplog):
  # big_vision's 'gap', '0' (the first patch token's output) and 'none' (the head on
  # every token) store the same arrays: with the file's classifier, only a said 'gap' loads.
  path = BIG_VISION / 'gap_scan_params.npz'
  model = big_vision_model(pool='gap')
  load = lambda **kw: release.load_pretrained(path, zeros_like_init(model), model,
                                              source_grid=(4, 6), **kw)
  for pool, message in ((None, "'gap', '0' or 'none' stores the same arrays"),
                        ('0', 'the output of the first patch token'),
                        ('none', r'no pooling \(the head applied to every token\)'),
                        ('tok', "holds no class token, no MAP head: its pool type is not 'tok'")):
    with pytest.raises(errors.CheckpointMismatchError, match=message):
      load(keep_head=True, source_pool=pool)
  with pytest.raises(errors.ConfigError, match="'avg' is not one of big_vision's"):
    load(keep_head=True, source_pool='avg')
  expected = layout.to_model_layout(release.load_npz(path), scanned=False)
  chex.assert_trees_all_equal(load(keep_head=True, source_pool='gap'), expected)
  # A new head: only the encoder is taken, whatever the source pooled with.
  for pool in (None, '0', 'none'):
    params = load(source_pool=pool)
    chex.assert_trees_all_equal(params['Transformer'], expected['Transformer'])
  # The class token and the MAP head say their pool type: nothing more is asked.
  with pytest.raises(errors.CheckpointMismatchError, match="its pool type is not '0'"):
    release.load_pretrained(BIG_VISION / 'tok_scan.npz', zeros_like_init(model), model,
                            keep_head=True, source_pool='0')


@pytest.mark.slow
def test_predict_refuses_a_big_vision_file_of_unknown_pooling(tmp_path):
  from PIL import Image

  Image.fromarray(np.zeros((16, 24, 3), np.uint8)).save(tmp_path / 'x.png')
  command = [sys.executable, '-m', 'vit_jax.tools.predict',
             f'--npz={BIG_VISION / "gap_scan_params.npz"}', str(tmp_path / 'x.png')]
  result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and '--pool' in lines[-1], result.stderr[-2000:]
  assert 'Traceback' not in result.stderr

  loaded = release.load_npz_model(BIG_VISION / 'gap_scan_params.npz', image_size=(16, 24),
                                  pool='gap', source_grid=(4, 6))
  expected = np.load(BIG_VISION / 'logits.npz')
  chex.assert_trees_all_close(loaded.model.apply({'params': loaded.params}, expected['images']),
                              expected['gap_scan_params'], atol=1e-5, rtol=1e-5)


def shapes(model):
  """The parameters' shapes and dtypes (adapt's target), without running an init."""
  return jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *model.image_size, 3)))[
      'params']


def test_a_release_file_into_a_model_without_class_position_embedding_is_the_same_function(
    tmp_path):
  """The class token's row moves into the token (cls + row): DeiT III's layout, exactly; its
  layer scales start at one. At another size, the patches' rows are resized as ever."""
  source = small()
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                        shapes(source))
  release.save_npz(tmp_path / 'm.npz', params)
  deit3 = small(prefix_posemb=False, layer_scale=1e-6)
  adapted = release.load_pretrained(tmp_path / 'm.npz', shapes(deit3), deit3, keep_head=True)
  pe = params['Transformer']['posembed_input']['pos_embedding']
  chex.assert_trees_all_close(adapted['cls'], params['cls'] + pe[:, :1], atol=1e-7)
  chex.assert_trees_all_equal(adapted['Transformer']['encoderblock_0']['ls1'], np.ones(32))
  x = images(source)
  chex.assert_trees_all_close(jax.jit(deit3.apply)({'params': adapted}, x),
                              jax.jit(source.apply)({'params': params}, x), atol=1e-5, rtol=1e-5)
  bigger = small(48, prefix_posemb=False)
  resized = release.load_pretrained(tmp_path / 'm.npz', shapes(bigger), bigger, keep_head=True)
  chex.assert_trees_all_close(resized['Transformer']['posembed_input']['pos_embedding'],
                              bilinear_reference(np.asarray(pe), (4, 4), (6, 6), 1)[:, 1:],
                              atol=1e-6)


def test_adapt_gives_prefix_rows_where_the_model_has_them():
  deit3 = small(prefix_posemb=False)
  rng = np.random.default_rng(0)
  source = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                        shapes(deit3))
  plain = small()
  adapted = fit.adapt(layout.flatten(source), shapes(plain), plain, keep_head=True,
                          source_model=deit3)
  pe = adapted['Transformer']['posembed_input']['pos_embedding']
  chex.assert_trees_all_equal(pe[:, 0], np.zeros((1, 32), np.float32))
  chex.assert_trees_all_equal(pe[:, 1:],
                              source['Transformer']['posembed_input']['pos_embedding'])


def test_a_mismatch_with_a_known_source_names_its_model_options():
  registers = small(num_registers=4, pool='gap', class_token=False, fc_norm=True)
  with pytest.raises(errors.CheckpointMismatchError) as e:
    source = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes(registers))
    fit.adapt(layout.flatten(source), shapes(small()), small(), source_model=registers)
  assert "config.model: name='b16', image_size=32, patch_size=8, hidden_size=32" in str(e.value)
  assert "pool='gap'" in str(e.value) and 'num_registers=4' in str(e.value)
  assert 'fc_norm=True' in str(e.value) and "activation" not in str(e.value)


@pytest.mark.parametrize('options, problem', [
    ({'layer_scale': 0.1}, 'layer_scale=0.1'), ({'num_registers': 1}, 'num_registers=1'),
    ({'fc_norm': True}, 'fc_norm=True'), ({'activation': 'gelu'}, "activation='gelu'"),
    ({'norm_epsilon': 1e-12}, 'norm_epsilon=1e-12'),
    ({'pool': 'gap', 'class_token': True}, "class_token=True with pool='gap'"),
    ({}, ''), ({'prefix_posemb': False}, '')])
def test_what_a_release_file_cannot_hold(options, problem):
  assert release.npz_problem(small(**options)) == '' if not problem else (
      release.npz_problem(small(**options)).startswith(problem))


def test_registers_keep_their_position_rows_at_another_grid():
  source = small(num_registers=2)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                        shapes(source))
  bigger = small(48, num_registers=2)
  adapted = fit.adapt(layout.flatten(params), shapes(bigger), bigger, keep_head=True,
                          source_model=source)
  pe = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  chex.assert_trees_all_close(adapted['Transformer']['posembed_input']['pos_embedding'],
                              bilinear_reference(pe, (4, 4), (6, 6), 3), atol=1e-6)
  chex.assert_trees_all_equal(adapted['registers'], params['registers'])
