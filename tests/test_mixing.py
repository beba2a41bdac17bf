"""vit_jax.training.mixing: mixup and CutMix, their labels, and DeiT's switch between them."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.training import mixing


def numbered_batch(n=8, size=(12, 10)):
  """Example j: an image of value j, one-hot label j."""
  return {'image': jnp.broadcast_to(jnp.arange(n, dtype=jnp.float32)[:, None, None, None],
                                    (n, *size, 3)),
          'label': jnp.eye(n)}


def test_mixup_mixes_images_and_labels_alike():
  rng = np.random.default_rng(0)
  batch = {'image': jnp.asarray(rng.uniform(-1, 1, (8, 4, 4, 3)), jnp.float32),
           'label': jnp.eye(10)[jnp.arange(8)]}
  mixed = mixing.mixup(batch, jax.random.key(1), alpha=0.2)
  p = float(mixed['label'][0, 0])  # Example 0 keeps p of its own class...
  assert 0.5 <= p <= 1.0
  chex.assert_trees_all_close(mixed['label'][0, 7], 1. - p, atol=1e-6)  # ... and its neighbour's.
  chex.assert_trees_all_close(mixed['image'][0],
                              p * batch['image'][0] + (1 - p) * batch['image'][7], atol=1e-6)


def test_cutmix_label_weights_equal_the_pasted_area():
  batch = numbered_batch()
  cutmix = jax.jit(jax.vmap(lambda key: mixing.cutmix(batch, key, alpha=1.0)))
  outputs = jax.device_get(cutmix(jax.random.split(jax.random.key(0), 20)))
  shares = []
  for image, label in zip(outputs['image'], outputs['label'], strict=True):
    pasted = image[..., 0] == np.roll(np.arange(8), 1)[:, None, None]  # The neighbour's pixels.
    assert np.all(pasted | (image[..., 0] == np.arange(8)[:, None, None]))
    # One box, the same for every example, its share of the pixels on the labels.
    assert all(np.array_equal(pasted[0], pasted[j]) for j in range(8))
    rows, cols = np.where(pasted[0])
    if len(rows):
      assert pasted[0, rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
    share = pasted[0].mean()
    np.testing.assert_allclose(np.diag(label), 1 - share, atol=1e-6)
    np.testing.assert_allclose(label[np.arange(8), np.roll(np.arange(8), 1)], share, atol=1e-6)
    shares.append(share)
  assert 0.2 < np.mean(shares) < 0.8 and len(set(shares)) > 10  # Beta(1, 1) areas.


def test_mixup_cutmix_switch():
  """DeiT's switch: each batch takes CutMix or mixup, CutMix with probability 0.3 here."""
  batch = numbered_batch()
  options = mixing.MixOptions(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.3)
  mix = jax.jit(jax.vmap(lambda key: mixing.mix(batch, key, options)['image']))
  images = np.asarray(mix(jax.random.split(jax.random.key(1), 200))[..., 0])
  whole = np.isin(images, np.arange(8)).reshape(200, -1)  # CutMix pastes; mixup blends.
  assert np.all(whole.all(1) | ~whole.any(1))
  assert abs(whole.all(1).mean() - 0.3) <= 0.1
