"""Writes what transformers' SigLIP 2 makes of a position-embedding table resized per image.

Run OUTSIDE the test environment (CI never installs torch), in the venv of
tests/data/hub/README.md (torch 2.13.0 CPU, transformers 5.23.0):

    /work/fixture-venv/bin/python tests/data/preprocess/make_naflex_posemb_fixture.py

Writes ``naflex_posemb.npz`` beside this file: ``table`` a random (4, 6, 8) float32 table (a
4 x 6 grid of width 8), ``grids`` (B, 2) the (rows, columns) it is resized to (down, up and
both at once, non-square), and ``resized`` (B, max rows * columns, 8):
``Siglip2VisionEmbeddings.resize_positional_embeddings`` of them (``F.interpolate(...,
mode='bilinear', align_corners=False, antialias=True)`` per image, flattened row-major, the
rows past each image's patches left as transformers leaves them: copies of the first).
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'hub'))
import make_fixtures  # noqa: E402,F401  (its torchvision shim)
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings  # noqa: E402

sys.path.insert(0, HERE)
import make_naflex_fixtures  # noqa: E402  (save_npz)

GRIDS = ((3, 5), (2, 9), (7, 3), (9, 11), (4, 6), (1, 13))


def main():
  torch.set_num_threads(1)
  table = np.random.default_rng(0).standard_normal((4, 6, 8)).astype(np.float32)
  grids = np.array(GRIDS, np.int64)
  length = int(max(h * w for h, w in GRIDS))
  resized = Siglip2VisionEmbeddings.resize_positional_embeddings(
      torch.from_numpy(table), torch.from_numpy(grids), max_length=length)
  out = {'table': table, 'grids': grids, 'resized': resized.numpy(),
         'versions': np.array(json.dumps(dict(torch=torch.__version__,
                                              transformers=transformers.__version__)))}
  make_naflex_fixtures.save_npz(os.path.join(HERE, 'naflex_posemb.npz'), out)


if __name__ == '__main__':
  main()
