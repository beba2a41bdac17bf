"""vit_jax.data.packing: NaViT's greedy packing of NaFlex patch sequences, its invariants, and
the loader's packed batches (a function of the step, for any number of processes)."""

import jax
import numpy as np
import pytest

from vit_jax.base import sharding
from vit_jax.data import loader, packing, preprocess, sources

# Digits (8x8) cropped to random aspect ratios, at 2-px patches up to 16 of them: 4 to 16
# patches per image, so that rows of 3 images in 24 tokens drop some and pad others.
SPEC = 'to_rgb|inception_crop(8, 0.1)|resize_small(8)|naflex(2, 16)|value_range(-1, 1)'


def varied(seed=0, count=12, budget=16, patch=2):
  """``count`` naflex outputs of random sizes (3-30 px a side) and their one-hot labels."""
  rng = np.random.default_rng(seed)
  op = preprocess.parse(f'naflex({patch}, {budget})')
  outs = [op(rng.integers(0, 256, (rng.integers(3, 30), rng.integers(3, 30), 3), np.uint8),
             None) for _ in range(count)]
  batch = {k: np.stack([o[k] for o in outs]) for k in preprocess.PATCH_KEYS}
  batch['label'] = np.eye(10, dtype=np.float32)[rng.integers(0, 10, count)]
  return batch


def unpacked(row, slot):
  """The patches, coordinates and grid of ``row``'s image ``slot``, read back by segment."""
  tokens = row['segment_ids'] == slot + 1
  return row['image'][tokens], row['patch_coords'][tokens], row['patch_grid'][slot]


@pytest.mark.parametrize('images_per_row, seq_len', [(3, 24), (4, 40), (1, 16), (6, 16)])
def test_a_packed_row_holds_each_kept_image_exactly_and_drops_only_what_does_not_fit(
    images_per_row, seq_len):
  batch = varied()
  packed = packing.pack(batch, packing.Packing(images_per_row, seq_len))
  rows = len(batch['label']) // images_per_row
  assert {k: v.shape for k, v in packed.items()} == {
      'image': (rows, seq_len, 12), 'patch_coords': (rows, seq_len, 2),
      'patch_mask': (rows, seq_len), 'segment_ids': (rows, seq_len),
      'patch_grid': (rows, images_per_row, 2), 'image_mask': (rows, images_per_row),
      'label': (rows, images_per_row, 10)}
  lengths = batch['patch_mask'].sum(1)
  for r in range(rows):
    row = {k: v[r] for k, v in packed.items()}
    used, slot = 0, 0
    for i in range(r * images_per_row, (r + 1) * images_per_row):
      if used + lengths[i] > seq_len:  # Greedy: dropped only where it does not fit.
        continue
      n = lengths[i]
      patches, coords, grid = unpacked(row, slot)
      np.testing.assert_array_equal(patches, batch['image'][i, :n])  # Its own, in order.
      np.testing.assert_array_equal(coords, batch['patch_coords'][i, :n])
      np.testing.assert_array_equal(grid, batch['patch_grid'][i])
      np.testing.assert_array_equal(row['label'][slot], batch['label'][i])
      # Contiguous, one segment per image, after the one before.
      np.testing.assert_array_equal(np.nonzero(row['segment_ids'] == slot + 1)[0],
                                    np.arange(used, used + n))
      used, slot = used + n, slot + 1
    assert row['image_mask'].sum() == slot and row['image_mask'][:slot].all()
    # Padding: no segment, no mask, zeros; empty slots: no label, no grid.
    pad = row['segment_ids'] == 0
    np.testing.assert_array_equal(pad, ~row['patch_mask'])
    assert pad.sum() == seq_len - used and not row['image'][pad].any()
    assert not row['label'][slot:].any() and not row['patch_grid'][slot:].any()


def test_an_image_that_does_not_fit_is_dropped_and_the_next_one_that_fits_is_kept():
  """Greedy in order, not stopping at the first overflow: 10 + 10 + 4 tokens in 16."""
  lengths = [10, 10, 4]
  batch = {'image': np.arange(3 * 16 * 12).reshape(3, 16, 12).astype(np.uint8),
           'patch_coords': np.zeros((3, 16, 2), np.int32),
           'patch_mask': np.arange(16) < np.array(lengths)[:, None],
           'patch_grid': np.array([[2, 5], [5, 2], [2, 2]], np.int32),
           'label': np.eye(3, dtype=np.float32)}
  row = packing.pack_row({k: v for k, v in batch.items() if k != 'label'}, batch['label'], 16)
  np.testing.assert_array_equal(row['segment_ids'], [1] * 10 + [2] * 4 + [0] * 2)
  np.testing.assert_array_equal(row['image_mask'], [True, True, False])
  np.testing.assert_array_equal(row['label'][:2], batch['label'][[0, 2]])
  np.testing.assert_array_equal(row['patch_grid'][:2], batch['patch_grid'][[0, 2]])
  np.testing.assert_array_equal(unpacked(row, 1)[0], batch['image'][2, :4])


def test_packing_refuses_what_it_cannot_pack():
  with pytest.raises(ValueError, match='does not split into rows of images_per_row=5'):
    packing.pack(varied(), packing.Packing(5, 32))
  with pytest.raises(ValueError, match='end the preprocessing with naflex'):
    packing.pack({'image': np.zeros((4, 8, 8, 3)), 'label': np.zeros((4, 10))},
                 packing.Packing(2, 32))
  for bad in (dict(images_per_row=0, seq_len=8), dict(images_per_row=2, seq_len=True)):
    with pytest.raises(ValueError, match='must be a positive int'):
      packing.Packing(**bad)


def make_loader(**kw):
  mesh = sharding.make_mesh(None)
  return loader.TrainLoader(sources.digits('train'), preprocess.parse(SPEC),
                            global_batch_size=24, seed=0, sharding=sharding.batch_sharding(mesh),
                            num_classes=10, packing=packing.Packing(3, 24), **kw)


def test_packed_batches_are_a_function_of_the_step_for_any_number_of_processes():
  """The loader's packed batch k is the packing of its unpacked batch k; the same for a
  resumed loader and for 2 processes' halves joined; the patches scaled on the devices with
  padding zero."""
  a = make_loader()
  local = a.local_batch(5)
  assert local['image'].shape == (8, 24, 12) and local['label'].shape == (8, 3, 10)
  assert 0 < local['image_mask'].sum() < 24  # Some images dropped: the budget binds.
  mesh = sharding.make_mesh(None)
  plain = loader.TrainLoader(sources.digits('train'), preprocess.parse(SPEC),
                             global_batch_size=24, seed=0,
                             sharding=sharding.batch_sharding(mesh), num_classes=10)
  expected = packing.pack(plain.local_batch(5), packing.Packing(3, 24))
  for key in packing.PACKED_KEYS:
    np.testing.assert_array_equal(local[key], expected[key])
  halves = [make_loader(process_index=i, process_count=2).local_batch(5) for i in range(2)]
  for key in packing.PACKED_KEYS:
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), local[key])
  _, resumed = next(make_loader().iterate(start_step=5))
  scaled = preprocess.scale_pixels(local['image'], 2 / 255, -1., local['patch_mask'])
  np.testing.assert_allclose(jax.device_get(resumed['image']), scaled, atol=1e-6)
  for key in ('segment_ids', 'image_mask', 'label', 'patch_grid'):
    np.testing.assert_array_equal(jax.device_get(resumed[key]), local[key])


@pytest.mark.parametrize('spec, packed', [(SPEC, True), (SPEC, False),
                                          ('to_rgb|value_range(-1, 1)', False)])
def test_batch_shapes_are_the_loaders_batches(spec, packed):
  """What the planner lowers the step for (``loader.batch_shapes``) is what the loader gives
  the step: images, patch sequences, packed rows; the same keys, shapes and dtypes."""
  mesh = sharding.make_mesh(None)
  pack = packing.Packing(3, 24) if packed else None
  train = loader.TrainLoader(sources.digits('train'), preprocess.parse(spec),
                             global_batch_size=24, seed=0, sharding=sharding.batch_sharding(mesh),
                             num_classes=10, packing=pack)
  stream = train.iterate()
  _, batch = next(stream)
  stream.close()
  want = {k: (v.shape, v.dtype) for k, v in batch.items()}
  got = loader.batch_shapes(preprocess.parse(spec), 24, (8, 8), 10, pack)
  assert {k: (v.shape, v.dtype) for k, v in got.items()} == want
