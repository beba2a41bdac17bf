r"""A mixed-size, mixed-aspect copy of an image folder: each image one random crop.

    python -m vit_jax.tools.crops --source=../shared/data/imagenette_224 \
        --out=/tmp/imagenette_crops
    python -m vit_jax.data.convert --source=/tmp/imagenette_crops --out=/tmp/imagenette_mixed

For native-resolution training (NaFlex, NaViT packing: docs/training.md) where the data has
one size: each image of ``SOURCE/SPLIT/CLASS/`` is cut to one crop of ``--min_area`` to all of
its area and an aspect ratio between 1:``--max_aspect`` and ``--max_aspect``:1 (log-uniform),
kept at its own pixels (no resize), and written as a JPEG under the same names in ``--out``.
Each crop is a function of ``--seed`` and the image's path. ``--out`` appears whole or not at
all: it is written beside itself and renamed at the end; a stop removes the partial copy.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from typing import Any

from absl import flags

from vit_jax.base import errors, paths

EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp')


def _define_flags() -> dict[str, Any]:
  return dict(
      source=paths.DEFINE_path('source', None, 'An image folder: SPLIT/CLASS/images.'),
      out=paths.DEFINE_path('out', None, 'The folder to write (must not exist).'),
      seed=flags.DEFINE_integer('seed', 0, 'The crops are a function of it and each path.'),
      min_area=flags.DEFINE_float('min_area', 0.1, 'The smallest crop, a fraction of the area.'),
      max_aspect=flags.DEFINE_float('max_aspect', 3., 'The most elongated crop, long : short.'),
      quality=flags.DEFINE_integer('quality', 95, 'JPEG quality of the crops.'))


def crop_box(height: int, width: int, key: str, seed: int, min_area: float,
             max_aspect: float) -> tuple[int, int, int, int]:
  """(top, left, crop height, crop width) of one image: aspect (width / height) log-uniform in
  [1 / max_aspect, max_aspect], area fraction uniform in [min_area, 1] (made smaller, the
  aspect kept, where a side would exceed the image's), the place uniform; drawn from ``seed``
  and ``key`` alone."""
  import numpy as np

  digest = hashlib.sha256(f'{seed}:{key}'.encode()).digest()
  rng = np.random.default_rng(int.from_bytes(digest[:8], 'little'))
  area = rng.uniform(min_area, 1.) * height * width
  aspect = math.exp(rng.uniform(-math.log(max_aspect), math.log(max_aspect)))
  h, w = math.sqrt(area / aspect), math.sqrt(area * aspect)
  fit = min(1., height / h, width / w)
  h, w = min(height, max(1, round(h * fit))), min(width, max(1, round(w * fit)))
  return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


def images(source: str) -> list[str]:
  """The image files under ``source``, relative to it, sorted."""
  found = []
  for root, _, files in os.walk(source):
    found += [os.path.relpath(os.path.join(root, f), source) for f in files
              if f.lower().endswith(EXTENSIONS)]
  return sorted(found)


def write_crops(source: str, out: str, *, seed: int, min_area: float, max_aspect: float,
                quality: int) -> int:
  """Writes each image's crop under ``out`` (beside it first, renamed when all are written);
  returns how many."""
  from PIL import Image

  files = images(source)
  if not files:
    raise errors.DataError(f'--source={source} holds no images ({", ".join(EXTENSIONS)}).')
  partial = os.path.join(os.path.dirname(os.path.abspath(out)),
                         f'.{os.path.basename(out)}.tmp-{os.getpid()}')
  try:
    for i, name in enumerate(files):
      with Image.open(os.path.join(source, name)) as image:
        image = image.convert('RGB')
        top, left, h, w = crop_box(image.height, image.width, name, seed, min_area, max_aspect)
        target = os.path.join(partial, os.path.splitext(name)[0] + '.jpg')
        os.makedirs(os.path.dirname(target), exist_ok=True)
        image.crop((left, top, left + w, top + h)).save(target, quality=quality)
      if (i + 1) % 2000 == 0:
        print(f'{i + 1}/{len(files)} images', flush=True)
    os.replace(partial, out)
  except BaseException as e:
    shutil.rmtree(partial, ignore_errors=True)
    if isinstance(e, OSError) and paths.filesystem_error(e):
      cause, fix = errors.write_failure(e, run=False)
      raise errors.WriteError(f'Writing {out} failed: {cause}. Nothing was written there: '
                              f'{fix}, then run the same command again.') from None
    if isinstance(e, KeyboardInterrupt):
      raise errors.Interrupted(f'Stopped by Ctrl-C: nothing was written to {out}.') from None
    raise
  return len(files)


def main(flag: dict[str, Any]) -> None:
  source = paths.input_path(flag['source'].value, 'source', 'image folder')
  out = flag['out'].value
  if not os.path.isdir(paths.local(source)):
    raise errors.PathError(f'--source={source} is a file: name an image folder.')
  paths.output_path(out, 'out', folder=True)
  if os.path.exists(out):
    raise errors.PathError(f'--out={out} exists: name a new folder (nothing is overwritten).')
  if not 0 < flag['min_area'].value <= 1:
    raise errors.ConfigError(f'--min_area={flag["min_area"].value} must be in (0, 1].')
  if flag['max_aspect'].value < 1:
    raise errors.ConfigError(f'--max_aspect={flag["max_aspect"].value} must be at least 1.')
  if not 1 <= flag['quality'].value <= 100:
    raise errors.ConfigError(f'--quality={flag["quality"].value} must be in [1, 100].')
  count = write_crops(paths.local(source), out, seed=flag['seed'].value,
                      min_area=flag['min_area'].value, max_aspect=flag['max_aspect'].value,
                      quality=flag['quality'].value)
  print(f'Wrote {out}: {count} crops of {source}.')


if __name__ == '__main__':
  defined = _define_flags()
  errors.run(lambda argv: main(defined), arguments=False)
