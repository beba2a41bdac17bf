"""RandAugment against its references: big_vision's TF ops and timm's rand-m9-mstd0.5-inc1.

The per-op values are those of the reference definitions on a fixed image (big_vision's
TF functions gave the same, bit for bit); the draws are compared over many images with
the references' formulas.
"""

import collections
import math

import numpy as np
import pytest

from vit_jax.data import preprocess
from vit_jax.data import randaugment as ra

IMAGE = np.array([[[0, 10, 200], [30, 128, 255], [64, 90, 127]],
                  [[250, 3, 77], [128, 127, 129], [17, 220, 45]],
                  [[99, 160, 5], [200, 66, 140], [255, 255, 0]],
                  [[12, 34, 56], [78, 90, 111], [222, 199, 180]]], np.uint8)
G = [128, 128, 128]  # big_vision's fill of the geometric ops.

# big_vision's functions on IMAGE (4 x 3): the reference definitions worked through.
BIG_VISION = {
    # Each channel stretched from its [min, max] to [0, 255], truncated.
    ('AutoContrast', ()): [[[0, 7, 200], [30, 126, 255], [64, 88, 127]],
                           [[250, 0, 77], [128, 125, 129], [17, 219, 45]],
                           [[99, 158, 5], [200, 63, 140], [255, 254, 0]],
                           [[12, 31, 56], [78, 88, 111], [222, 198, 180]]],
    # TF's shift is clamped to 7: 0 bits keep the top bit.
    ('Posterize', (0,)): [[[0, 0, 128], [0, 128, 128], [0, 0, 0]],
                          [[128, 0, 0], [128, 0, 128], [0, 128, 0]],
                          [[0, 128, 0], [128, 0, 128], [128, 128, 0]],
                          [[0, 0, 0], [0, 0, 0], [128, 128, 128]]],
    ('Posterize', (4,)): [[[0, 0, 192], [16, 128, 240], [64, 80, 112]],
                          [[240, 0, 64], [128, 112, 128], [16, 208, 32]],
                          [[96, 160, 0], [192, 64, 128], [240, 240, 0]],
                          [[0, 32, 48], [64, 80, 96], [208, 192, 176]]],
    # The threshold 384 (magnitude 15) is 128 as a uint8.
    ('Solarize', (384,)): [[[0, 10, 55], [30, 127, 0], [64, 90, 127]],
                           [[5, 3, 77], [127, 127, 126], [17, 35, 45]],
                           [[99, 95, 5], [55, 66, 115], [0, 0, 0]],
                           [[12, 34, 56], [78, 90, 111], [33, 56, 75]]],
    ('SolarizeAdd', (110,)): [[[110, 120, 200], [140, 128, 255], [174, 200, 237]],
                              [[250, 113, 187], [128, 237, 129], [127, 220, 155]],
                              [[209, 160, 115], [200, 176, 140], [255, 255, 110]],
                              [[122, 144, 166], [188, 200, 221], [222, 199, 180]]],
    # Grey (0.2989, 0.587, 0.114) extrapolated by 1.9, clipped.
    ('Color', (1.9,)): [[[0, 0, 255], [0, 141, 255], [44, 93, 163]],
                        [[255, 0, 69], [128, 127, 130], [0, 255, 0]],
                        [[76, 192, 0], [255, 22, 163], [255, 255, 0]],
                        [[0, 38, 80], [69, 91, 131], [238, 194, 158]]],
    # The grey is 4 x 3 / 256 -> 0 (histogram sum, not the mean): Brightness's result.
    ('Contrast', (0.1,)): [[[0, 1, 20], [3, 12, 25], [6, 9, 12]],
                           [[25, 0, 7], [12, 12, 12], [1, 22, 4]],
                           [[9, 16, 0], [20, 6, 14], [25, 25, 0]],
                           [[1, 3, 5], [7, 9, 11], [22, 19, 18]]],
    ('Brightness', (1.9,)): [[[0, 19, 255], [57, 243, 255], [121, 171, 241]],
                             [[255, 5, 146], [243, 241, 245], [32, 255, 85]],
                             [[188, 255, 9], [255, 125, 255], [255, 255, 0]],
                             [[22, 64, 106], [148, 171, 210], [255, 255, 255]]],
    # Only the interior pixels are smoothed (borders kept), then extrapolated.
    ('Sharpness', (1.9,)): [[[0, 10, 200], [30, 128, 255], [64, 90, 127]],
                            [[250, 3, 77], [136, 133, 142], [17, 220, 45]],
                            [[99, 160, 5], [237, 27, 176], [255, 255, 0]],
                            [[12, 34, 56], [78, 90, 111], [222, 199, 180]]],
    # Output (x, y) takes input round(x + 0.3 y, y).
    ('ShearX', (0.3,)): [[[0, 10, 200], [30, 128, 255], [64, 90, 127]],
                         [[250, 3, 77], [128, 127, 129], [17, 220, 45]],
                         [[200, 66, 140], [255, 255, 0], G],
                         [[78, 90, 111], [222, 199, 180], G]],
    # Halves round away from zero (C's round): x + 0.5 reads x + 1 (np.rint would read x).
    ('ShearX', (0.5,)): [[[0, 10, 200], [30, 128, 255], [64, 90, 127]],
                         [[128, 127, 129], [17, 220, 45], G],
                         [[200, 66, 140], [255, 255, 0], G],
                         [[222, 199, 180], G, G]],
    ('ShearY', (-0.3,)): [[[0, 10, 200], [30, 128, 255], G],
                          [[250, 3, 77], [128, 127, 129], [64, 90, 127]],
                          [[99, 160, 5], [200, 66, 140], [17, 220, 45]],
                          [[12, 34, 56], [78, 90, 111], [255, 255, 0]]],
    ('TranslateX', (1.,)): [[[30, 128, 255], [64, 90, 127], G],
                            [[128, 127, 129], [17, 220, 45], G],
                            [[200, 66, 140], [255, 255, 0], G],
                            [[78, 90, 111], [222, 199, 180], G]],
    ('TranslateY', (-1.,)): [[G, G, G],
                             [[0, 10, 200], [30, 128, 255], [64, 90, 127]],
                             [[250, 3, 77], [128, 127, 129], [17, 220, 45]],
                             [[99, 160, 5], [200, 66, 140], [255, 255, 0]]],
    ('Rotate', (30.,)): [[[30, 128, 255], [64, 90, 127], G],
                         [[250, 3, 77], [128, 127, 129], [255, 255, 0]],
                         [[250, 3, 77], [200, 66, 140], [255, 255, 0]],
                         [G, [12, 34, 56], [78, 90, 111]]],
    # A half-side 1 at (1, 2): rows 0-1, column 1-2.
    ('Cutout', (1, 1, 2)): [[[0, 10, 200], G, G],
                            [[250, 3, 77], G, G],
                            [[99, 160, 5], [200, 66, 140], [255, 255, 0]],
                            [[12, 34, 56], [78, 90, 111], [222, 199, 180]]],
}


@pytest.mark.parametrize('op, args', list(BIG_VISION))
def test_big_vision_ops_give_the_reference_pixels(op, args):
  out = ra.BigVision.apply(IMAGE, [(op, args)])
  assert out.dtype == np.uint8
  np.testing.assert_array_equal(out, np.array(BIG_VISION[op, args], np.uint8))


def test_big_vision_point_ops_by_their_definitions():
  # Solarize at magnitude 10: the threshold 256 is 0 as a uint8, every pixel inverted
  # (TF, big_vision issue #110), as Invert does.
  solarized = ra.BigVision.apply(IMAGE, [('Solarize', ra.big_vision_args('Solarize', 10, None,
                                                                          IMAGE.shape))])
  np.testing.assert_array_equal(solarized, 255 - IMAGE)
  np.testing.assert_array_equal(ra.BigVision.apply(IMAGE, [('Invert', ())]), 255 - IMAGE)
  # Equalize: 400 x 10, 200 x 20, 165 x 30: step (765 - 165) // 255 = 2, lut (cumsum + 1) // 2
  # of the values below: 10 -> 0, 20 -> 200, 30 -> 255 (clipped from 300).
  values = np.repeat(np.array([10, 20, 30], np.uint8), [400, 200, 165])
  image = np.stack([values, values[::-1], np.full_like(values, 7)], -1)[None]
  out = ra.BigVision.apply(image, [('Equalize', ())])
  np.testing.assert_array_equal(out[0, [0, 400, 600], 0], [0, 200, 255])
  np.testing.assert_array_equal(out[0, [0, 165, 365], 1], [255, 200, 0])
  np.testing.assert_array_equal(out[..., 2], image[..., 2])  # One value: step 0, unchanged.


def test_sharpness_sums_as_tfs_cpu_kernel():
  """The smoothed image's float32 values are those of TF's kernel: the 9 taps row by row,
  each a fused multiply-add (exact product and sum, rounded once to float32), so that their
  truncation agrees next to integers too (a plain float32 sum, or OpenCV's alone, differs
  on these smooth images: 3 values of 37,000)."""
  from PIL import Image

  weights = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / np.float32(13.)
  for seed in range(3):
    noise = np.random.default_rng(seed).integers(0, 256, (37, 45, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(noise).resize((90, 70), Image.Resampling.BICUBIC))
    expected = np.zeros((68, 88, 3), np.float32)
    for dy in range(3):
      for dx in range(3):
        tap = image[dy:dy + 68, dx:dx + 88].astype(np.float64) * np.float64(weights[dy, dx])
        expected = (expected + tap).astype(np.float32)
    np.testing.assert_array_equal(ra._smooth(image), expected.astype(np.uint8))


def test_big_vision_draws_follow_its_level_to_arg():
  augment = ra.BigVision(1, 10)
  rng = np.random.default_rng(0)
  plans = [augment.plan(rng, (32, 40, 3))[0] for _ in range(16_000)]
  counts = collections.Counter(name for name, _ in plans)
  assert set(counts) == set(ra.BIG_VISION_OPS) and len(counts) == 16
  # Uniform over the 16 ops: 1000 each, binomial sd 31.
  assert all(abs(n - 1000) < 150 for n in counts.values()), counts
  args = collections.defaultdict(list)
  for name, a in plans:
    args[name].append(a)
  # Magnitude 10: every enhance factor is 10 / 10 x 1.8 + 0.1 = 1.9, never 0.1.
  for name in ('Color', 'Contrast', 'Brightness', 'Sharpness'):
    assert args[name] and all(a == (pytest.approx(1.9),) for a in args[name])
  assert {a for a in args['Posterize']} == {(4,)} and {a for a in args['Solarize']} == {(256,)}
  assert {a for a in args['SolarizeAdd']} == {(110,)}
  for name, value in (('Rotate', 30.), ('ShearX', 0.3), ('ShearY', 0.3), ('TranslateX', 100.),
                      ('TranslateY', 100.)):
    signs = np.sign([a[0] for a in args[name]])
    assert all(abs(a[0]) == pytest.approx(value) for a in args[name])
    assert abs((signs > 0).mean() - 0.5) < 0.07  # ~1000 draws: sd 0.016.
  cutouts = np.array(args['Cutout'])
  assert set(cutouts[:, 0]) == {40}
  # Centres uniform over the rows and columns: means 15.5 and 19.5.
  assert abs(cutouts[:, 1].mean() - 15.5) < 1.5 and abs(cutouts[:, 2].mean() - 19.5) < 1.5
  assert cutouts[:, 1].min() == 0 and cutouts[:, 1].max() == 31
  # Magnitude 15 (AugReg): factor 2.8, threshold 384 (128 as a uint8), 6 bits, 45 degrees.
  rng = np.random.default_rng(1)
  assert ra.big_vision_args('Color', 15, rng, (8, 8, 3)) == (pytest.approx(2.8),)
  assert ra.big_vision_args('Posterize', 15, rng, (8, 8, 3)) == (6,)
  assert abs(ra.big_vision_args('Rotate', 15, rng, (8, 8, 3))[0]) == pytest.approx(45.)


def test_the_share_of_images_left_unchanged():
  """big_vision applies each drawn op: at magnitude 10 only Invert and Solarize (which then
  inverts every pixel) undo each other, (2/16)^2 = 1/64 of the images. timm applies each
  with probability 0.5: (1/2)^2 of the images are untouched."""
  image = np.random.default_rng(0).integers(10, 240, (32, 32, 3), dtype=np.uint8)
  big_vision = preprocess.parse('randaug(2, 10)')
  same = np.mean([np.array_equal(big_vision(image, np.random.default_rng(s)), image)
                  for s in range(3000)])
  assert abs(same - 1 / 64) < 0.008, same  # sd 0.0023.
  timm = preprocess.parse("rand_augment('rand-m9-mstd0.5-inc1')")
  same = np.mean([np.array_equal(timm(image, np.random.default_rng(s)), image)
                  for s in range(3000)])
  assert abs(same - 0.25) < 0.03, same  # sd 0.008.
  # Under 256 pixels PIL's Equalize is the identity too: (1/2 + 1/2 x 1/15)^2 = 0.284.
  same = np.mean([np.array_equal(timm(image[:12, :12], np.random.default_rng(s)),
                                 image[:12, :12]) for s in range(3000)])
  assert abs(same - (0.5 + 0.5 / 15) ** 2) < 0.03, same


def _normal_cdf(x: float) -> float:
  return 0.5 * (1. + math.erf(x / math.sqrt(2.)))


def test_timm_draws_follow_rand_m9_mstd05_inc1():
  augment = ra.Timm('rand-m9-mstd0.5-inc1')
  assert augment.ops == ra.TIMM_INCREASING_OPS and len(augment.ops) == 15
  assert 'Cutout' not in augment.ops
  rng = np.random.default_rng(0)
  plans = [augment.plan(rng) for _ in range(20_000)]
  lengths = np.bincount([len(p) for p in plans], minlength=3) / len(plans)
  np.testing.assert_allclose(lengths, [0.25, 0.5, 0.25], atol=0.015)  # Binomial(2, 1/2).
  counts = collections.Counter(name for p in plans for name, _ in p)
  assert set(counts) == set(ra.TIMM_INCREASING_OPS)
  expected = sum(counts.values()) / 15  # ~1333 each, sd 35.
  assert all(abs(n - expected) < 180 for n in counts.values()), counts
  # The magnitude: N(9, 0.5) clipped to [0, 10], drawn at each application.
  magnitudes = np.array([augment.draw_magnitude(rng) for _ in range(40_000)])
  tail = 1. - _normal_cdf(2.)  # P(N(9, 0.5) > 10) = 0.0228.
  assert abs((magnitudes == 10.).mean() - tail) < 0.004
  mean = 9. * _normal_cdf(2.) - 0.5 * math.exp(-2.) / math.sqrt(2 * math.pi) + 10. * tail
  assert abs(magnitudes.mean() - mean) < 0.01  # E[min(X, 10)] = 8.9958; sd 0.0025.
  # Increasing enhance ops: factor 1 +- 0.09 m, either sign; posterize 4 - int(0.4 m) bits.
  factors = np.array([a[0] for p in plans for name, a in p if name == 'ColorIncreasing'])
  assert abs((factors > 1).mean() - 0.5) < 0.05
  assert abs(np.abs(factors - 1).mean() - 0.09 * mean) < 0.01
  assert factors.min() >= 0.1 and factors.max() <= 1.9 + 1e-9
  bits = collections.Counter(a[0] for p in plans for name, a in p if name == 'PosterizeIncreasing')
  assert set(bits) <= {0, 1, 2} and bits[1] / sum(bits.values()) > 0.95
  thresholds = [a[0] for p in plans for name, a in p if name == 'SolarizeIncreasing']
  # Solarize threshold 256 - int(25.6 m): the truncation adds 0.5 on average.
  assert all(0 <= t <= 256 for t in thresholds)
  assert abs(np.mean(thresholds) - (256.5 - 25.6 * mean)) < 1.5  # sd 0.35.


# Each op's argument at magnitudes 5, 9 and 10, worked by hand from timm's LEVEL_TO_ARG
# (timm/data/auto_augment.py; level = M / 10): (|argument|, whether its sign is drawn).
# Rotate 30 l, Posterize int(4 l), PosterizeIncreasing 4 - int(4 l), Solarize min(256, int(256 l)),
# SolarizeIncreasing 256 - that, SolarizeAdd min(128, int(110 l)), enhance 1.8 l + 0.1,
# enhance increasing max(0.1, 1 +- 0.9 l) (as the distance from 1: the sign of factor - 1),
# Shear 0.3 l, TranslateRel 0.45 l (translate_pct); the three plain ops take no argument.
TIMM_REFERENCE = {
    'AutoContrast': ((), (), (), False), 'Equalize': ((), (), (), False),
    'Invert': ((), (), (), False),
    'Rotate': (15., 27., 30., True),
    'Posterize': (2, 3, 4, False), 'PosterizeIncreasing': (2, 1, 0, False),
    'Solarize': (128, 230, 256, False), 'SolarizeIncreasing': (128, 26, 0, False),
    'SolarizeAdd': (55, 99, 110, False),
    **{op: (1.0, 1.72, 1.9, False) for op in ('Color', 'Contrast', 'Brightness', 'Sharpness')},
    **{f'{op}Increasing': (0.45, 0.81, 0.9, True)
       for op in ('Color', 'Contrast', 'Brightness', 'Sharpness')},
    'ShearX': (0.15, 0.27, 0.3, True), 'ShearY': (0.15, 0.27, 0.3, True),
    'TranslateXRel': (0.225, 0.405, 0.45, True), 'TranslateYRel': (0.225, 0.405, 0.45, True),
}


@pytest.mark.parametrize('increasing', [False, True], ids=['plain', 'inc1'])
def test_timm_arguments_of_every_op_by_their_distribution(increasing):
  """Every op timm's RandAugment draws (its _RAND_TRANSFORMS / _RAND_INCREASING_TRANSFORMS):
  over 30,000 one-op plans, each op's argument has timm's magnitude, its sign drawn with
  probability 1/2 where timm negates it at random, and never otherwise."""
  suffix = '-inc1' if increasing else ''
  timm_list = [
      'AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize', 'Solarize', 'SolarizeAdd',
      'Color', 'Contrast', 'Brightness', 'Sharpness', 'ShearX', 'ShearY', 'TranslateXRel',
      'TranslateYRel']
  if increasing:
    timm_list = [f'{op}Increasing' if op in ('Posterize', 'Solarize', 'Color', 'Contrast',
                                             'Brightness', 'Sharpness') else op
                 for op in timm_list]
  for column, magnitude in enumerate((5, 9, 10)):
    augment = ra.Timm(f'rand-m{magnitude}-n1-p1.0{suffix}')
    assert list(augment.ops) == timm_list
    rng = np.random.default_rng(magnitude)
    args = collections.defaultdict(list)
    for _ in range(30_000):
      (name, a), = augment.plan(rng)
      args[name].append(a)
    assert set(args) == set(timm_list)
    for name, drawn in args.items():
      *values, signed = TIMM_REFERENCE[name]
      want = values[column]
      if want == ():
        assert set(drawn) == {()}, name
        continue
      assert all(len(a) == 1 for a in drawn), name
      x = np.array([a[0] for a in drawn], np.float64)
      if name.endswith('Increasing') and signed:  # A factor around 1: its distance.
        x = x - 1
      np.testing.assert_allclose(np.abs(x), want, rtol=1e-9, atol=1e-12, err_msg=name)
      if signed:  # About 2,000 draws an op: sd 0.011.
        assert abs((x > 0).mean() - 0.5) < 0.05, (name, (x > 0).mean())
      else:
        assert (x >= 0).all(), name


def test_timm_ops_by_their_definitions():
  from PIL import Image

  image = Image.fromarray(IMAGE)
  fill = ra.IMAGENET_MEAN_FILL
  # SolarizeAdd: pixels below 128 get + add, capped at 255.
  out = np.asarray(ra.timm_apply(image, 'SolarizeAdd', (100,), fill))
  np.testing.assert_array_equal(out, np.where(IMAGE < 128, np.minimum(IMAGE + 100., 255),
                                              IMAGE))
  # SolarizeIncreasing at magnitude 9: threshold 256 - int(230.4) = 26, pixels >= 26 inverted.
  threshold = ra.timm_args('SolarizeIncreasing', 9., None)[0]
  assert threshold == 26
  out = np.asarray(ra.timm_apply(image, 'SolarizeIncreasing', (threshold,), fill))
  np.testing.assert_array_equal(out, np.where(IMAGE < 26, IMAGE, 255 - IMAGE))
  # PosterizeIncreasing at magnitude 10 keeps 0 bits: black.
  assert ra.timm_args('PosterizeIncreasing', 10., None) == (0,)
  assert not np.asarray(ra.timm_apply(image, 'PosterizeIncreasing', (0,), fill)).any()
  # TranslateXRel by 1/3 of the width: one column, filled with the ImageNet mean.
  out = np.asarray(ra.timm_apply(image, 'TranslateXRel', (1 / 3,), fill))
  np.testing.assert_array_equal(out[:, :2], IMAGE[:, 1:])
  np.testing.assert_array_equal(out[:, 2], np.broadcast_to(fill, (4, 3)))


def test_rand_augment_strings_are_read_or_refused():
  augment = ra.Timm('rand-m7-n3-p0.8-mstd101')
  assert (augment.magnitude, augment.num_layers, augment.prob) == (7., 3, 0.8)
  assert augment.magnitude_std == math.inf and augment.ops == ra.TIMM_OPS
  magnitudes = [augment.draw_magnitude(np.random.default_rng(s)) for s in range(2000)]
  assert min(magnitudes) >= 0 and max(magnitudes) <= 7 and abs(np.mean(magnitudes) - 3.5) < 0.2
  for bad in ("rand_augment('rand-m9-inc0')", "rand_augment('augmix-m5')",
              "rand_augment('rand-m9-tweights')", 'randaug(2, -1)', 'randaug(2.5, 10)'):
    with pytest.raises(ValueError):
      preprocess.parse(bad)
