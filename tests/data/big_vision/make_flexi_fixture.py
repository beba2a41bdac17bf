"""Writes flexi_resample.npz here: patch-embedding kernels resampled by big_vision's own
``resample_patchemb`` (FlexiViT, big_vision/models/proj/flexi/vit.py).

Run OUTSIDE the tests, in a venv with jax, flax, numpy, absl-py, ml_collections, einops and
tensorflow-cpu (big_vision's flexi module imports big_vision.utils and tensorflow; vit_jax's
own .venv has them all), with a big_vision checkout (commit
0127fb6b337ee2a27bf4e54dea79cff176527356) named by VIT_JAX_BIG_VISION:

    JAX_PLATFORMS=cpu VIT_JAX_BIG_VISION=/path/to/big_vision \
      python tests/data/big_vision/make_flexi_fixture.py [OUT_FILE]

For each case i of CASES: ``in_{i}``, a float32 (h, w, 3, 4) kernel drawn from
N(0, 1) with numpy's default_rng(i), and ``out_{i}``, ``resample_patchemb(in_{i}, new_hw)``;
``new_hw_{i}`` the target (height, width). Up- and downsampling, integer and non-integer
factors, non-square kernels and targets.
"""

import os
import sys
import tempfile

sys.path.insert(0, os.environ['VIT_JAX_BIG_VISION'])

import numpy as np  # noqa: E402
from big_vision.models.proj.flexi import vit as flexi  # noqa: E402

# (old (h, w), new (h, w))
CASES = [((4, 4), (8, 8)), ((4, 4), (6, 6)), ((8, 8), (4, 4)), ((8, 8), (5, 5)),
         ((4, 4), (8, 6)), ((6, 4), (4, 4)), ((16, 16), (8, 8)), ((16, 16), (24, 24)),
         ((16, 16), (10, 10)), ((3, 3), (3, 3))]


def main(out: str) -> None:
  arrays = {}
  for i, (old, new) in enumerate(CASES):
    kernel = np.random.default_rng(i).standard_normal((*old, 3, 4)).astype(np.float32)
    arrays[f'in_{i}'] = kernel
    arrays[f'new_hw_{i}'] = np.asarray(new)
    arrays[f'out_{i}'] = np.asarray(flexi.resample_patchemb(kernel, new), np.float32)
  fd, tmp = tempfile.mkstemp(suffix='.npz', dir=os.path.dirname(os.path.abspath(out)))
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, **arrays)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
  except BaseException:
    os.unlink(tmp)
    raise
  print(f'wrote {out}: {len(CASES)} cases')


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else
       os.path.join(os.path.dirname(os.path.abspath(__file__)), 'flexi_resample.npz'))
