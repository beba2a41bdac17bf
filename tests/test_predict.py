"""vit_jax.tools.predict on timm and transformers folders: the libraries' own predictions."""

import argparse
import json
import pathlib
import re

import chex
import numpy as np
import pytest

from vit_jax.data import preprocess
from vit_jax.tools import predict

DATA = pathlib.Path(__file__).resolve().parent / 'data'
LABELS = ('tench', 'goldfish', 'great white shark', 'tiger shark', 'hammerhead')
_TOP = re.compile(r'^  1\.\s+([\d.]+)%  (.+)$')


@pytest.mark.parametrize('folder', ['timm_clip', 'timm_siglip_map', 'timm_dinov2',
                                    'hf_deit_distilled', 'timm_dinov3', 'timm_eva02'])
def test_predict_on_a_folder_is_its_librarys_eval_pipeline(folder, capsys):
  """The top-1 class and its probability (within 0.5 points) of each PNG, as timm's
  create_transform and model, or transformers' image processor and model, give them
  (tests/data/preprocess/make_predict_fixtures.py; the rotary ones, make_rope_fixtures.py):
  CLIP's OpenAI mean and std, SigLIP's 0.5, DINOv2's, DINOv3's and DeiT's ImageNet, EVA-02's
  CLIP's, each with its own resize and crop (DINOv3 at the 256 px its config names, not the
  size it was saved at)."""
  rope = folder in ('timm_dinov3', 'timm_eva02')
  reference = np.load(DATA / 'preprocess' / ('predict_rope.npz' if rope else 'predict.npz'))
  images = [str(DATA / 'preprocess' / 'images' / f'{name}.png') for name in reference['images']]
  assert predict.main([f'--source={DATA / "hub" / folder}', '--top=1', *images]) == 0
  lines = capsys.readouterr().out.splitlines()[1:]  # After the '# model from ...' line.
  config = json.loads((DATA / 'hub' / folder / 'config.json').read_text())
  labels = config.get('label_names') or [config['id2label'][str(i)]
                                         for i in range(len(config['id2label']))]
  for i, image in enumerate(images):
    assert lines[2 * i] == image
    percent, label = _TOP.match(lines[2 * i + 1]).groups()
    assert label == labels[reference[f'{folder}/top1'][i]], image
    assert abs(float(percent) - 100 * reference[f'{folder}/prob'][i]) < 0.5, image


def test_predict_on_a_non_square_timm_folder_keeps_the_aspect_ratio_as_timm_does():
  """A 24x32 timm folder (crop 0.9): the tall PNG resized keeping its proportions to cover
  26x35, then cropped, as timm's own eval transform made it (preprocess/make_fixtures.py's
  timm_24x32, the same pretrained_cfg), not squashed to 26x35."""
  parser = argparse.ArgumentParser()
  predict.add_source_flags(parser)
  folder = DATA / 'hub' / 'timm_gap_nofcnorm'
  source = predict.load_source(parser.parse_args([f'--source={folder}']))
  reference = np.load(DATA / 'preprocess' / 'reference.npz')
  settings = json.loads(str(reference['timm_24x32/settings']))
  config = json.loads((folder / 'config.json').read_text())
  assert {k: config['pretrained_cfg'][k] for k in settings} == settings
  for image in ('tall', 'wide'):
    got = preprocess.parse(source.pp_spec)(
        (DATA / 'preprocess' / 'images' / f'{image}.png').read_bytes(), None)
    chex.assert_trees_all_close(got.transpose(2, 0, 1), reference[f'timm_24x32/{image}'],
                                atol=1e-5)


def test_the_pixels_shown_of_a_normalising_checkpoint_are_its_inputs_before_scaling():
  """inspect's images (``display``): a CLIP folder's pipeline without its normalize op, as uint8
  pixels, the very ones the model's input is scaled from."""
  parser = argparse.ArgumentParser()
  predict.add_source_flags(parser)
  source = predict.load_source(parser.parse_args([f'--source={DATA / "hub" / "timm_clip"}']))
  assert 'normalize(' in source.pp_spec
  image = predict.read_image(DATA / 'preprocess' / 'images' / 'wide.png')
  shown = predict.preprocess_fn(source, display=True)(image)
  assert shown.dtype == np.uint8
  np.testing.assert_array_equal(shown, preprocess.parse(source.pp_spec).host(image, None))


@pytest.mark.parametrize('folder', [
    'hf_siglip2_cls', pytest.param('timm_naflex_siglip', marks=pytest.mark.slow)])
def test_predict_on_a_naflex_folder_is_its_librarys_processor_and_model(folder, capsys):
  """A SigLIP 2 NaFlex folder (tests/data/hub/make_naflex_fixtures.py): each PNG (2:1 to 3:4,
  one greyscale) cut into patches at its own aspect ratio as the checkpoint's processor says
  (transformers' Siglip2ImageProcessor; timm's NaFlex transform, bicubic, at its input size's
  25 patches), every class's probability within 0.5 points of the library's own."""
  reference = np.load(DATA / 'hub' / 'naflex_logits.npz')
  images = [str(DATA / 'preprocess' / 'images' / f'{name}.png') for name in reference['images']]
  assert predict.main([f'--source={DATA / "hub" / folder}', '--top=5', *images]) == 0
  out = capsys.readouterr().out.splitlines()
  assert 'patch sequences, each image at its own aspect ratio' in out[0]
  labels = list(json.loads((DATA / 'hub' / folder / 'config.json').read_text()).get(
      'label_names') or LABELS)
  for i, image in enumerate(images):
    assert out[1 + 6 * i] == image
    for line in out[2 + 6 * i:7 + 6 * i]:
      percent, label = re.match(r'^  \d\.\s+([\d.]+)%  (.+)$', line).groups()
      assert abs(float(percent) - 100 * reference[f'{folder}/probs'][i, labels.index(label)]) < 0.5
