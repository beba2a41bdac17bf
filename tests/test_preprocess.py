"""Tests of vit_jax.data.preprocess against exact expected pixels.

Each op is checked on small images whose every pixel is known, so that an op that
shifts, scales or skips its work by one pixel or one step fails here; a checkpoint's own
preprocessing (``EvalSpec``) against what timm and transformers make of real PNGs.
"""

import json
import pathlib

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.base import errors
from vit_jax.data import preprocess


def numbered(h, w, c=3):
  """An image whose pixel (y, x, ch) is 100 * y + 10 * x + ch (all distinct, uint8)."""
  y, x, ch = np.meshgrid(np.arange(h), np.arange(w), np.arange(c), indexing='ij')
  return (100 * y + 10 * x + ch).astype(np.uint8)


def test_flip_lr_mirrors_the_columns_for_half_the_seeds():
  """Guards a flip_lr that never flips (or always does): exact pixels, over 400 draws."""
  image = numbered(2, 3)
  mirrored = np.array([[[20, 21, 22], [10, 11, 12], [0, 1, 2]],
                       [[120, 121, 122], [110, 111, 112], [100, 101, 102]]], np.uint8)
  flip = preprocess.parse('flip_lr')
  flipped = 0
  for seed in range(400):
    out = flip(image, np.random.default_rng(seed))
    assert out.dtype == np.uint8 and out.shape == image.shape
    if np.array_equal(out, mirrored):
      flipped += 1
    else:
      np.testing.assert_array_equal(out, image)  # Either mirrored or left as it is.
  assert 170 <= flipped <= 230  # Binomial(400, 1/2): mean 200, std 10.


def test_value_range_maps_0_and_255_to_the_ends():
  """Guards value_range's scale (255 steps, not 256) on the host and on the device."""
  image = np.array([[[0, 51, 255]], [[102, 204, 127]]], np.uint8)  # 2 x 1 x 3
  expected = {(-1, 1): np.array([[[-1., -0.6, 1.]], [[-0.2, 0.6, 127 / 127.5 - 1]]]),
              (0, 1): np.array([[[0., 0.2, 1.]], [[0.4, 0.8, 127 / 255]]])}
  for (lo, hi), want in expected.items():
    pipeline = preprocess.parse(f'value_range({lo}, {hi})')
    out = pipeline(image, np.random.default_rng(0))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6)
    on_device = pipeline.on_device(jnp.asarray(image[None]))
    chex.assert_type(on_device, jnp.float32)
    np.testing.assert_allclose(on_device[0], want, rtol=0, atol=1e-6)


@pytest.mark.parametrize('shape, size, top, left', [
    ((5, 6), 2, 1, 2),    # Even margins: 3 rows (1 above, 2 below), 4 columns (2 and 2).
    ((4, 7), 3, 0, 2),    # One spare row (below), four spare columns (2 and 2).
    ((7, 4), 4, 1, 0),
    ((3, 3), 3, 0, 0),
])
def test_central_crop_takes_the_middle(shape, size, top, left):
  """Guards central_crop's window (e.g. the top-left corner instead of the centre).

  The expected offsets are written out by hand: the spare pixels split evenly, the odd
  one below or to the right, as TensorFlow's ``crop_to_bounding_box`` calls in big_vision.
  """
  image = numbered(*shape)
  out = preprocess.parse(f'central_crop({size})')(image, np.random.default_rng(0))
  expected = numbered(size, size) + np.uint8(100 * top + 10 * left)
  np.testing.assert_array_equal(out, expected)


def test_central_crop_of_a_too_small_image_is_refused():
  with pytest.raises(ValueError, match=r'central_crop\(8\) of a 5x6 image: resize it first'):
    preprocess.parse('central_crop(8)')(numbered(5, 6), np.random.default_rng(0))


def test_resize_small_keeps_the_aspect_ratio_and_resize_matches_opencv_bilinear():
  """resize_small(4) of 8x12 is 4x6; a 2x downscale of a linear ramp is its 2-pixel means."""
  ramp = np.repeat(np.repeat((np.arange(12) * 20).astype(np.uint8)[None, :, None], 8, 0), 3, 2)
  out = preprocess.parse('resize_small(4)')(ramp, np.random.default_rng(0))
  assert out.shape == (4, 6, 3)
  # Half-pixel centres: output column j samples input column 2j + 0.5, between 2j and 2j + 1.
  np.testing.assert_array_equal(out[0, :, 0], [10, 50, 90, 130, 170, 210])


PP = pathlib.Path(__file__).resolve().parent / 'data' / 'preprocess'
# Cases of tests/data/preprocess/reference.npz: what timm's and transformers' own eval
# transforms make of the PNGs beside it (make_fixtures.py wrote them).
PP_CASES = ('timm_imagenet', 'timm_clip', 'timm_augreg', 'timm_squash', 'timm_24x32',
            'timm_squash_24x32', 'hf_vit', 'hf_clip', 'hf_dinov2')


@pytest.mark.parametrize('case', PP_CASES)
def test_a_checkpoints_preprocessing_is_its_librarys_own(case):
  """timm's pipelines pixel for pixel; transformers' within one intensity level (it resizes
  through its own conversions)."""
  from vit_jax.checkpoints.formats import timm, transformers

  reference = np.load(PP / 'reference.npz')
  settings = json.loads(str(reference[f'{case}/settings']))
  spec = (timm.preprocessing({'pretrained_cfg': settings}) if case.startswith('timm')
          else transformers.preprocessing(settings))
  size = tuple(settings.get('input_size', (3, 32, 32))[1:])  # A non-square one: timm's 24x32.
  pipeline = preprocess.parse(spec.spec(size))
  for image in ('wide', 'tall', 'square', 'grey'):
    got = pipeline((PP / 'images' / f'{image}.png').read_bytes(), None).transpose(2, 0, 1)
    want = reference[f'{case}/{image}']
    chex.assert_shape(got, want.shape)
    levels = np.abs(got - want) * np.asarray(spec.std)[:, None, None] * 255
    assert levels.max() <= (1e-3 if case.startswith('timm') else 1.01), (image, levels.max())
    # On the devices as on the host: the trailing normalisation is the same affine map.
    on_device = np.asarray(pipeline.on_device(pipeline.host(
        (PP / 'images' / f'{image}.png').read_bytes(), None)[None]))[0].transpose(2, 0, 1)
    chex.assert_trees_all_close(on_device, got, atol=1e-5)


def test_the_release_preprocessing_is_unchanged_and_unknown_settings_are_one_line():
  assert preprocess.EvalSpec().spec((224, 224)) == 'decode|resize(224)|value_range(-1, 1)'
  assert preprocess.EvalSpec().spec((24, 32)) == 'decode|resize((24, 32))|value_range(-1, 1)'
  # timm's rule at a non-square size: the aspect ratio kept, 26x35 covered, then the crop.
  assert preprocess.EvalSpec('shorter', 0.9, crop_offset='round').spec((24, 32)) == (
      "decode|resize_small((26, 35))|central_crop((24, 32), 'round')|value_range(-1, 1)")
  for spec in (preprocess.EvalSpec(resize='border'), preprocess.EvalSpec(method='pil_random')):
    with pytest.raises(errors.ConfigError, match="checkpoint's preprocessing .* give the "):
      spec.spec((32, 32))


def test_an_evaluation_pipeline_is_read_back_as_the_eval_spec_it_does():
  """A run's pp_eval as the EvalSpec its exports say: read back, it writes the same pipeline;
  what one EvalSpec cannot say is None."""
  timm_like = preprocess.EvalSpec(resize='shorter', crop_pct=0.875, method='pil_bicubic',
                                  mean=preprocess.IMAGENET_MEAN, std=preprocess.IMAGENET_STD,
                                  crop_offset='round')
  for spec, size in ((timm_like, (224, 224)), (preprocess.EvalSpec(), (224, 224)),
                     (preprocess.EvalSpec(crop_pct=0.875), (224, 224)),
                     (preprocess.EvalSpec(), (24, 32))):
    pipeline = spec.spec(size)
    assert preprocess.EvalSpec.of_pipeline(pipeline) == spec, pipeline
  for pipeline in ('to_rgb|resize(16)|value_range(-1, 1)', 'to_rgb|value_range(-1, 1)',
                   "decode|resize_small(256)|central_crop(224)|normalize()"):
    assert preprocess.EvalSpec.of_pipeline(pipeline).spec((224, 224)).split('|')[-1] == (
        pipeline.split('|')[-1].replace('normalize()', 'normalize([0.485, 0.456, 0.406], '
                                        '[0.229, 0.224, 0.225])'))
  unit = preprocess.EvalSpec.of_pipeline('decode|resize(32)|value_range(0, 1)')
  assert (unit.mean, unit.std) == ((0.,) * 3, (1.,) * 3)
  for pipeline in ('decode|resize(32)', 'decode|flip_lr|value_range(-1, 1)',
                   'decode|central_crop(16)|value_range(-1, 1)',
                   'decode|value_range(-1, 1)|resize(32)',
                   'decode|resize(32, "area")|value_range()',
                   'decode|resize((28, 36))|central_crop((24, 32))|value_range(-1, 1)'):
    assert preprocess.EvalSpec.of_pipeline(pipeline) is None, pipeline


def test_a_naflex_eval_spec_is_the_naflex_pipeline_for_any_size_and_reads_back():
  """A SigLIP 2 checkpoint's preprocessing: the naflex op with its patch, budget and resize,
  then its scaling, whatever the model's input size; a run's such pp_eval reads back as it
  (its exports say it); other ops beside naflex are not one EvalSpec."""
  spec = preprocess.EvalSpec('naflex', method='pil_bicubic', patch_size=16,
                             max_num_patches=256, mean=preprocess.IMAGENET_MEAN,
                             std=preprocess.IMAGENET_STD)
  pipeline = spec.spec((224, 224))
  assert pipeline == spec.spec((384, 512)) == (
      "decode|naflex(16, 256, 'pil_bicubic')|normalize([0.485, 0.456, 0.406], "
      '[0.229, 0.224, 0.225])')
  assert preprocess.parse(pipeline).patches
  assert preprocess.EvalSpec.of_pipeline(pipeline) == spec
  assert preprocess.EvalSpec.of_pipeline('to_rgb|naflex(8, 64)|value_range(-1, 1)') == (
      preprocess.EvalSpec('naflex', method='pil_bilinear', patch_size=8, max_num_patches=64))
  for other in ('decode|flip_lr|naflex(8, 64)|value_range(-1, 1)', 'decode|naflex(8, 64)',
                "decode|naflex(8, 64, 'area')|value_range(-1, 1)"):
    assert preprocess.EvalSpec.of_pipeline(other) is None, other


NAFLEX = np.load(PP / 'naflex.npz')  # transformers' SigLIP 2 processors (make_naflex_fixtures.py)


def test_naflex_size_is_transformers_bisection():
  """Extreme and random shapes, patch sizes and budgets: the same (height, width) as
  transformers' get_image_size_for_max_num_patches."""
  for h, w, p, n, want_h, want_w in NAFLEX['sizes']:
    assert preprocess.naflex_size(int(h), int(w), int(p), int(n)) == (want_h, want_w), (h, w, p, n)


@pytest.mark.parametrize('patch, budget', [tuple(map(int, s)) for s in NAFLEX['settings']])
def test_naflex_is_siglip2s_image_processor(patch, budget):
  """The PNGs (47-90 px, 3:4 to 2:1, one greyscale) resized up and down: pixel_values,
  pixel_attention_mask and spatial_shapes of transformers' PIL processor to 1e-5; of its
  default (torchvision) one within one intensity level (torchvision's antialiased resize
  rounds a few pixels the other way)."""
  pipeline = preprocess.parse(f'decode|naflex({patch}, {budget})|value_range(-1, 1)')
  differing = []
  for image in NAFLEX['images']:
    out = pipeline((PP / 'images' / f'{image}.png').read_bytes(), None)
    assert sorted(out) == sorted(preprocess.PATCH_KEYS)
    chex.assert_shape([out['image'], out['patch_coords'], out['patch_mask'], out['patch_grid']],
                      [(budget, patch * patch * 3), (budget, 2), (budget,), (2,)])
    for tag in ('pil', 'tv'):
      ref = {k: NAFLEX[f'{tag}/{patch}_{budget}/{image}/{k}']
             for k in ('pixel_values', 'pixel_attention_mask', 'spatial_shapes')}
      np.testing.assert_array_equal(out['patch_grid'], ref['spatial_shapes'])
      np.testing.assert_array_equal(out['patch_mask'], ref['pixel_attention_mask'] == 1)
      diff = np.abs(out['image'] - ref['pixel_values'])
      if tag == 'pil':
        chex.assert_trees_all_close(out['image'], ref['pixel_values'], atol=1e-5, rtol=0)
      else:
        assert diff.max() <= 2 / 255 + 1e-5, (image, diff.max() * 127.5)
        differing.append((diff > 1e-5).mean())
    n = int(out['patch_mask'].sum())
    rows, cols = out['patch_grid']
    assert n == rows * cols and out['patch_mask'][:n].all()
    # Row-major coordinates; the grid is their extent (big_vision's coords.max() + 1).
    np.testing.assert_array_equal(out['patch_coords'][:n],
                                  np.stack(np.divmod(np.arange(n), cols), axis=-1))
    np.testing.assert_array_equal(out['patch_coords'][:n].max(0) + 1, out['patch_grid'])
    assert not out['patch_coords'][n:].any() and not out['image'][n:].any()
  assert max(differing) < 0.2  # Of the torchvision processor's values, one level off.


def test_naflex_patches_are_the_images_own_pixels_and_scale_on_the_device():
  """A patch is the image's block in (row, column, channel) order, as an HWIO kernel reshaped
  to (p * p * 3, width) reads it; a trailing normalize scales per channel on the devices as
  on the host, padding left zero."""
  image = numbered(8, 12)
  # 8x12 at 4-px patches, 6 of them: 2x3, no resize (PIL's resize to the same size is exact).
  out = preprocess.parse('naflex(4, 8)')(image, None)
  np.testing.assert_array_equal(out['patch_grid'], [2, 3])
  np.testing.assert_array_equal(out['image'][4], image[4:8, 4:8].reshape(-1))
  spec = 'naflex(4, 8)|normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])'
  pipeline = preprocess.parse(spec)
  host, full = pipeline.host(image, None), pipeline(image, None)
  assert host['image'].dtype == np.uint8 and full['image'].dtype == np.float32
  expected = (image[4:8, 4:8] / 255 - np.array([0.4, 0.5, 0.6])) / np.array([0.2, 0.25, 0.3])
  chex.assert_trees_all_close(full['image'][4], expected.reshape(-1).astype(np.float32),
                              atol=1e-5)
  assert not full['image'][6:].any()
  on_device = pipeline.on_device(jnp.asarray(host['image'][None]),
                                 jnp.asarray(host['patch_mask'][None]))
  chex.assert_trees_all_close(np.asarray(on_device)[0], full['image'], atol=1e-6)


@pytest.mark.parametrize('spec, message', [
    ('naflex(16, 256)|flip_lr', 'flip_lr in .* comes after naflex, which cuts the image into'),
    ('value_range(-1, 1)|naflex(16, 256)', 'naflex in .* comes after value_range or normalize'),
    ('naflex(0, 256)', r'naflex: patch_size=0 must be a positive int'),
    ('naflex(16, 2.5)', r'naflex: max_num_patches=2.5 must be a positive int'),
])
def test_naflex_in_the_wrong_place_is_one_line(spec, message):
  with pytest.raises(ValueError, match=message) as e:
    preprocess.parse(spec)
  assert '\n' not in str(e.value)


def test_a_model_that_takes_images_refuses_patch_sequences_in_one_line():
  with pytest.raises(errors.ConfigError, match=r"config.dataset.pp_eval='naflex\(4, 8\)' makes "
                     'NaFlex patch sequences .* end the pipeline with resize'):
    preprocess.check_output(preprocess.parse('naflex(4, 8)'), numbered(8, 12), (8, 8),
                            'config.dataset.pp_eval', 'the first example')


def test_naflex_without_upscale_keeps_an_image_within_the_budget_at_its_own_size():
  """NaViT's native resolution: a 40 x 70 image takes 3 x 5 patches of 16 (its sides rounded up
  to the patch) where SigLIP 2 fills the budget (12 x 21); one over the budget is resized as
  SigLIP 2 resizes it."""
  assert preprocess.naflex_size(40, 70, 16, 256, upscale=False) == (48, 80)
  assert preprocess.naflex_size(40, 70, 16, 256) == (192, 336)
  assert (preprocess.naflex_size(300, 500, 16, 64, upscale=False)
          == preprocess.naflex_size(300, 500, 16, 64))
  op = preprocess.parse("naflex(16, 256, 'pil_bilinear', False)").ops[0]
  out = op(np.zeros((40, 70, 3), np.uint8), np.random.default_rng(0))
  assert out['patch_grid'].tolist() == [3, 5] and out['patch_mask'].sum() == 15
