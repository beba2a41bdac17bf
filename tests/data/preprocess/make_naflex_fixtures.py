"""Writes what transformers' SigLIP 2 (NaFlex) image processors make of the PNGs in images/.

Run OUTSIDE the test environment (CI never installs torch), in the venv of
tests/data/hub/README.md (torch 2.13.0 CPU, torchvision 0.28.0, transformers 5.23.0):

    /work/fixture-venv/bin/python tests/data/preprocess/make_naflex_fixtures.py

Writes ``naflex.npz`` beside this file. For each image (``images``, converted to RGB by PIL
first, as make_predict_fixtures.py does) and each (patch size, max_num_patches) of
``SETTINGS``, the outputs of both of transformers' processors with those settings and their
defaults otherwise (bilinear resize, mean = std = 0.5):

* ``tv/P_N/IMAGE/{pixel_values,pixel_attention_mask,spatial_shapes}``: ``Siglip2ImageProcessor``
  (torchvision backend, the default one: ``AutoImageProcessor`` gives it);
* ``pil/P_N/IMAGE/...``: ``Siglip2ImageProcessorPil`` (PIL backend).

And ``sizes``: rows (height, width, patch, max_num_patches, target height, target width) of
``get_image_size_for_max_num_patches`` (its bisection) over extreme and random shapes.
"""

import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'hub'))
import make_fixtures  # noqa: E402,F401  (its torchvision shim)
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from transformers.models.siglip2 import image_processing_siglip2 as tv_siglip2  # noqa: E402
from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil  # noqa: E402

IMAGES = ('wide', 'tall', 'square', 'grey')
# Up- and downsampling: (16, 16) and (8, 48) resize these 47-90 px images both ways, (4, 16)
# shrinks them 4x or more, (8, 100) enlarges them.
SETTINGS = ((16, 16), (8, 48), (4, 16), (8, 100))


def sizes() -> np.ndarray:
  cases = [(1000, 10, 16, 256), (10, 1000, 16, 256), (10, 10, 16, 256), (224, 224, 16, 256),
           (5, 5, 16, 1), (300, 7000, 14, 1024), (1, 1, 16, 1024), (333, 500, 16, 576),
           (768, 1024, 16, 784), (37, 4000, 8, 7)]
  rng = np.random.default_rng(0)
  for _ in range(200):
    cases.append((int(rng.integers(1, 2000)), int(rng.integers(1, 2000)),
                  int(rng.choice([4, 8, 14, 16, 32])), int(rng.integers(1, 1100))))
  return np.array([(*c, *tv_siglip2.get_image_size_for_max_num_patches(*c)) for c in cases],
                  np.int64)


def main():
  torch.set_num_threads(1)
  out = {'images': np.array(IMAGES), 'settings': np.array(SETTINGS), 'sizes': sizes(),
         'versions': np.array(json.dumps(dict(torch=torch.__version__,
                                              transformers=transformers.__version__)))}
  for name in IMAGES:
    image = Image.open(os.path.join(HERE, 'images', f'{name}.png')).convert('RGB')
    for patch, budget in SETTINGS:
      for tag, cls in (('tv', tv_siglip2.Siglip2ImageProcessor), ('pil', Siglip2ImageProcessorPil)):
        result = cls(patch_size=patch, max_num_patches=budget)(image, return_tensors='np')
        for key in ('pixel_values', 'pixel_attention_mask', 'spatial_shapes'):
          out[f'{tag}/{patch}_{budget}/{name}/{key}'] = np.asarray(result[key][0])
  save_npz(os.path.join(HERE, 'naflex.npz'), out)


def save_npz(path, arrays):
  """``arrays`` as a compressed .npz at ``path``, written whole or not at all."""
  fd, tmp = tempfile.mkstemp(suffix='.npz', dir=os.path.dirname(path))
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez_compressed(f, **arrays)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
  print(f'wrote {path}')


if __name__ == '__main__':
  main()
