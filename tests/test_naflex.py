"""vit_jax.models.naflex: the ViT on patch sequences (NaFlex). A square image's sequence gives
what the image gives; padding changes nothing and gets no gradient; images of different
aspect ratios in one batch give what they give alone; the per-image resize of the position
embeddings is jax.image.resize's and transformers' (SigLIP 2's, written by torch). Packed
(NaViT), each image of a row gives what it gives alone, and nothing crosses between images."""

import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.data import packing, preprocess
from vit_jax.models import naflex
from vit_jax.models.vit import VisionTransformer

DATA = pathlib.Path(__file__).resolve().parent / 'data'
P = 8
TINY = dict(num_classes=0, patch_size=P, hidden_size=32, num_layers=2, mlp_dim=64, num_heads=2,
            image_size=32, attention_impl='einsum')
# Each pool, each position encoding, the prefix tokens both ways, scanned and rematerialised
# blocks, and jax.nn's attention with a mask.
CASES = {
    'learn_token': dict(pool='token'),
    'learn_gap_xla': dict(pool='gap', num_registers=1, prefix_posemb=False,
                          attention_impl='xla'),
    'map': dict(pool='map', prefix_posemb=False),
    'rope_dinov3': dict(pool='token', posemb='none', rope='dinov3', num_registers=2),
    'rope_axial': dict(pool='gap', posemb='none', rope='axial'),
    'sincos2d_scan': dict(pool='token', posemb='sincos2d', scan=True, remat_policy='full'),
}


def image(h: int, w: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)


def sequence(images: list[np.ndarray], max_num_patches: int) -> naflex.PatchSequence:
  """The naflex op's output for each image, batched, its pixels in [-1, 1]."""
  op = preprocess.naflex(P, max_num_patches)
  outs = [op(i, np.random.default_rng(0)) for i in images]
  b = {k: np.stack([o[k] for o in outs]) for k in preprocess.PATCH_KEYS}
  return naflex.PatchSequence(b['image'].astype(np.float32) / 127.5 - 1, b['patch_coords'],
                              b['patch_mask'], b['patch_grid'])


def pad(seq: naflex.PatchSequence, n: int, seed: int = 1) -> naflex.PatchSequence:
  """``seq`` padded to ``n`` patches of garbage: large pixels, coordinates anywhere (outside
  the grid and the sequence too)."""
  rng = np.random.default_rng(seed)
  b, m, d = seq.patches.shape
  return naflex.PatchSequence(
      np.concatenate([seq.patches, 50 * rng.standard_normal((b, n - m, d), np.float32)], 1),
      np.concatenate([seq.coords, rng.integers(-5, 100, (b, n - m, 2), np.int32)], 1),
      np.concatenate([seq.mask, np.zeros((b, n - m), bool)], 1), seq.grid)


@pytest.fixture(scope='module', params=list(CASES))
def case(request):
  """(model, params, a 32 x 32 image, its sequence): the params random (a zero-initialised
  layer would hide a difference)."""
  model = VisionTransformer(**dict(TINY, **CASES[request.param]))
  img = image(32, 32, seed=3)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))['params']
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(tree, [p + 0.1 * jax.random.normal(k, p.shape, p.dtype)
                                     for p, k in zip(leaves, keys, strict=True)])
  return model, {'params': params}, img, sequence([img], 16)


def test_a_square_image_gives_through_its_sequence_what_it_gives_as_an_image(case):
  model, params, img, seq = case
  assert seq.mask.all() and seq.grid.tolist() == [[4, 4]]
  images = img[None].astype(np.float32) / 127.5 - 1
  want = jax.jit(model.apply)(params, images)
  chex.assert_trees_all_close(jax.jit(model.apply)(params, seq), want, atol=1e-5, rtol=1e-5)
  # The same parameters: the sequence path initialises the image path's tree.
  seq_params = jax.eval_shape(model.init, jax.random.key(0), seq)['params']
  chex.assert_trees_all_equal_shapes_and_dtypes(seq_params, params['params'])


def test_padding_changes_nothing_and_gets_no_gradient(case):
  """The sequence padded with garbage gives the same outputs, and the garbage patches' gradient
  is exactly zero (the image's own patches' is not)."""
  model, params, _, seq = case
  want = jax.jit(model.apply)(params, seq)
  padded = pad(seq, 27)

  @jax.jit
  def loss(patches):
    out = model.apply(params, padded._replace(patches=patches))
    return (out ** 2).sum(), out
  (_, got), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(padded.patches))
  chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-5)
  assert np.all(np.asarray(grad[:, 16:]) == 0)
  assert np.all(np.abs(np.asarray(grad[:, :16])).sum(-1) > 0)


@pytest.mark.parametrize('grid', [(4, 4), (3, 5), (2, 9), (7, 3), (9, 11), (1, 13)])
def test_the_table_resized_per_image_is_jax_image_resize(grid):
  table = jax.random.normal(jax.random.key(0), (4, 6, 8))
  want = jax.image.resize(table, (*grid, 8), 'bilinear', antialias=True).reshape(-1, 8)
  n = grid[0] * grid[1] + 3  # Padded: no side exceeds the sequence.
  rows, cols, _ = naflex.posemb.grid_positions(grid)
  coords = np.zeros((1, n, 2), np.int32)
  coords[0, :len(rows)] = np.stack([rows, cols], -1)
  got = jax.jit(naflex.resized_table)(table, coords, np.array([grid]))
  chex.assert_trees_all_close(got[0, :len(rows)], want, atol=1e-5, rtol=1e-5)


def test_the_table_resized_per_image_is_transformers_siglip2():
  """Six grids in one batch (down, up, both), against ``Siglip2VisionEmbeddings.
  resize_positional_embeddings`` (torch's antialiased bilinear), make_naflex_posemb_fixture.py."""
  ref = np.load(DATA / 'preprocess' / 'naflex_posemb.npz')
  grids, n = ref['grids'], ref['resized'].shape[1]
  coords = np.zeros((len(grids), n, 2), np.int32)
  for i, (h, w) in enumerate(grids):
    rows, cols, _ = naflex.posemb.grid_positions((h, w))
    coords[i, :h * w] = np.stack([rows, cols], -1)
  got = np.asarray(jax.jit(naflex.resized_table)(ref['table'], coords, grids))
  for i, (h, w) in enumerate(grids):
    np.testing.assert_allclose(got[i, :h * w], ref['resized'][i, :h * w], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', ['learn_token', 'rope_dinov3'])
def test_images_of_different_aspect_ratios_give_in_one_batch_what_they_give_alone(name):
  model = VisionTransformer(**dict(TINY, **CASES[name]))
  wide, tall = image(24, 56, seed=4), image(48, 20, seed=5)
  seq = sequence([wide, tall], 20)
  assert seq.grid.tolist() != [[4, 4]] * 2 and seq.grid[0].tolist() != seq.grid[1].tolist()
  assert not seq.mask.all()  # One of them is padded.
  params = jax.jit(model.init)(jax.random.key(0), seq)
  apply = jax.jit(model.apply)
  both = apply(params, seq)
  for i in range(2):
    alone = apply(params, jax.tree.map(lambda a, i=i: a[i:i + 1], seq))
    chex.assert_trees_all_close(both[i:i + 1], alone, atol=1e-5, rtol=1e-5)
  assert not np.allclose(both[0], both[1])


def test_a_sequence_of_the_wrong_patch_or_a_hybrid_is_refused():
  seq = sequence([image(32, 32, seed=3)], 16)
  with pytest.raises(ValueError, match=r'patches \(batch, N, 48\).*patch_size=4'):
    VisionTransformer(**dict(TINY, patch_size=4)).init(jax.random.key(0), seq)
  with pytest.raises(ValueError, match='hybrid'):
    VisionTransformer(**dict(TINY, resnet_layers=())).init(jax.random.key(0), seq)


# The models a packed row takes (no prefix tokens): each pool per image, each encoding.
PACKABLE = {
    'learn_map_scan': dict(pool='map', prefix_posemb=False, scan=True),
    'rope_axial_gap_xla': dict(pool='gap', posemb='none', rope='axial', attention_impl='xla'),
}


@pytest.fixture(scope='module', params=list(PACKABLE))
def packed(request):
  """(model, params, four images' sequences alone, a row packing the first three of them
  (the packer's own: the fourth does not fit) and a row with its three slots empty)."""
  model = VisionTransformer(**dict(TINY, **PACKABLE[request.param]))
  images = [image(24, 56, seed=4), image(48, 20, seed=5), image(32, 32, seed=6),
            image(40, 40, seed=7)]
  alone = sequence(images, 20)
  batch = {'image': alone.patches, 'patch_coords': alone.coords, 'patch_mask': alone.mask,
           'patch_grid': alone.grid}
  row = packing.pack_row(batch, np.eye(4, dtype=np.float32), seq_len=56)
  # 18 + 18 + 16 patches; 16 more do not fit.
  assert row['image_mask'].tolist() == [True, True, True, False]
  empty = jax.tree.map(np.zeros_like, row)
  rows = {k: np.stack([row[k], empty[k]]) for k in row}
  params = jax.jit(model.init)(jax.random.key(0), alone)
  return model, params, alone, naflex.PatchSequence.from_batch(rows)


def test_each_image_of_a_packed_row_gives_what_it_gives_alone(packed):
  model, params, alone, seq = packed
  apply = jax.jit(model.apply)
  got, want = apply(params, seq), apply(params, alone)
  chex.assert_shape(got, (2, 4, 32))  # Per image slot: (rows, images per row, width).
  chex.assert_trees_all_close(got[0, :3], want[:3], atol=1e-5, rtol=1e-5)
  chex.assert_tree_all_finite(got)  # Empty slots too.


def test_nothing_crosses_between_packed_images_and_padding_gets_no_gradient(packed):
  """The gradient of image k's output reaches image k's patches only: none of another image's
  and none of the padding's, however large the padding's pixels."""
  model, params, _, seq = packed
  seq = seq._replace(patches=jnp.where(seq.mask[..., None], seq.patches, 50.))

  def output(patches, k):
    return (model.apply(params, seq._replace(patches=patches))[0, k] ** 2).sum()
  grads = jax.jit(jax.vmap(jax.grad(output), in_axes=(None, 0)))(seq.patches, jnp.arange(3))
  touched = np.abs(np.asarray(grads[:, 0])).sum(-1) > 0  # (images, tokens) of the first row.
  segments = np.asarray(seq.segments[0])
  np.testing.assert_array_equal(touched, segments[None] == np.arange(1, 4)[:, None])


def test_a_packed_row_is_refused_by_a_model_with_prefix_tokens(packed):
  _, _, _, seq = packed
  with pytest.raises(ValueError, match="prefix tokens.*pool='gap' or 'map'"):
    VisionTransformer(**dict(TINY, pool='token')).init(jax.random.key(0), seq)
