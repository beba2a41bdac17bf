"""Writes images and what timm's and transformers' own evaluation preprocessing makes of them.

Run OUTSIDE the test environment (CI never installs torch), in the venv of
tests/data/hub/README.md (torch 2.13.0 CPU, timm 1.0.31, transformers 5.23.0):

    /work/fixture-venv/bin/python tests/data/preprocess/make_fixtures.py

Writes, beside this file: ``images/*.png`` (deterministic, odd sizes, one greyscale) and
``reference.npz``: for each case (32x32 inputs, and two at 24x32), its settings as JSON
(``CASE/settings``) and the float32 CHW tensor the library's eval transform makes of each
image (``CASE/IMAGE``). timm's cases go through ``timm.data.resolve_data_config`` and
``create_transform`` with a model's ``pretrained_cfg`` (as ``timm.create_model`` gives it),
transformers' through the image processor classes built from a ``preprocessor_config.json``
-style dict.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'hub'))
import make_fixtures  # noqa: E402,F401  (its torchvision shim, before timm is imported)
import timm.data  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 32
IMAGENET = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
OPENAI = dict(mean=[0.48145466, 0.4578275, 0.40821073], std=[0.26862954, 0.26130258, 0.27577711])
HALF = dict(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
# (name, timm pretrained_cfg): DeiT/DINOv2-like, CLIP-like, AugReg-like, SigLIP-like (squash).
TIMM = [
    ('timm_imagenet', dict(crop_pct=0.875, interpolation='bicubic', crop_mode='center',
                           **IMAGENET)),
    ('timm_clip', dict(crop_pct=1.0, interpolation='bicubic', crop_mode='center', **OPENAI)),
    ('timm_augreg', dict(crop_pct=0.9, interpolation='bilinear', crop_mode='center', **HALF)),
    ('timm_squash', dict(crop_pct=0.9, interpolation='bicubic', crop_mode='squash', **HALF)),
    # A non-square input (the 24x32 of ../hub/timm_gap_nofcnorm): timm keeps the image's aspect
    # ratio (ResizeKeepRatio to cover 26x35, then CenterCrop), or squashes where told to.
    ('timm_24x32', dict(input_size=[3, 24, 32], crop_pct=0.9, interpolation='bicubic',
                        crop_mode='center', **HALF)),
    ('timm_squash_24x32', dict(input_size=[3, 24, 32], crop_pct=0.9, interpolation='bicubic',
                               crop_mode='squash', **HALF)),
]
# (name, processor class, preprocessor_config.json fields).
HF = [
    ('hf_vit', 'ViTImageProcessor', dict(size=dict(height=SIZE, width=SIZE))),
    ('hf_clip', 'CLIPImageProcessor', dict(size=dict(shortest_edge=SIZE), crop_size=dict(
        height=SIZE, width=SIZE), do_center_crop=True, resample=3, image_mean=OPENAI['mean'],
        image_std=OPENAI['std'])),
    ('hf_dinov2', 'BitImageProcessor', dict(size=dict(shortest_edge=36), crop_size=dict(
        height=SIZE, width=SIZE), do_center_crop=True, resample=3, image_mean=IMAGENET['mean'],
        image_std=IMAGENET['std'], do_convert_rgb=True)),
]
IMAGES = {'wide': (61, 83, 3), 'tall': (90, 47, 3), 'square': (50, 50, 3), 'grey': (70, 64)}


def main():
  os.makedirs(os.path.join(HERE, 'images'), exist_ok=True)
  rng = np.random.RandomState(0)
  images = {}
  for name, shape in IMAGES.items():
    # Smooth content (a random low-resolution image upsampled) so resizes are well defined.
    small = rng.randint(0, 256, (8, 8, *shape[2:])).astype(np.uint8)
    image = Image.fromarray(small).resize(shape[1::-1], Image.BICUBIC)
    image.save(os.path.join(HERE, 'images', f'{name}.png'))
    images[name] = Image.open(os.path.join(HERE, 'images', f'{name}.png'))
  out = {'versions': np.array(json.dumps(dict(timm=timm.__version__,
                                              transformers=transformers.__version__)))}
  for name, cfg in TIMM:
    settings = {'input_size': [3, SIZE, SIZE], **cfg}
    config = timm.data.resolve_data_config(pretrained_cfg=settings)
    transform = timm.data.create_transform(**config, is_training=False)
    out[f'{name}/settings'] = np.array(json.dumps(settings))
    for image, pil in images.items():
      out[f'{name}/{image}'] = transform(pil.convert('RGB')).numpy()
  for name, cls, fields in HF:
    processor = getattr(transformers, cls)(**fields)
    out[f'{name}/settings'] = np.array(json.dumps(fields))
    for image, pil in images.items():
      out[f'{name}/{image}'] = processor(pil.convert('RGB'), return_tensors='np')[
          'pixel_values'][0].astype(np.float32)
  np.savez(os.path.join(HERE, 'reference.npz'), **out)
  print('wrote', len(out), 'entries')


if __name__ == '__main__':
  main()
