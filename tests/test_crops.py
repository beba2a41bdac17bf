"""vit_jax.tools.crops: a mixed-size, mixed-aspect copy of an image folder, run as the command."""

import math
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vit_jax.tools import crops


def run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'vit_jax.tools.crops', *args],
                        capture_output=True, text=True)


@pytest.fixture
def folder(tmp_path):
  for split, cls, i in [('train', 'a', 0), ('train', 'a', 1), ('train', 'b', 2), ('val', 'b', 3)]:
    (tmp_path / 'src' / split / cls).mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[:60 + 10 * i, :80]  # Smooth (JPEG keeps it), and each place its own.
    pixels = np.stack([2 * y, 3 * x, np.full_like(x, 40 * i)], -1).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / 'src' / split / cls / f'{i}.png')
  return tmp_path


def test_each_image_becomes_one_crop_of_its_own_pixels_under_the_same_name(folder):
  done = run(f'--source={folder / "src"}', f'--out={folder / "out"}')
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip().endswith('4 crops of ' + str(folder / 'src') + '.')
  assert crops.images(str(folder / 'out')) == ['train/a/0.jpg', 'train/a/1.jpg',
                                               'train/b/2.jpg', 'val/b/3.jpg']
  for name in crops.images(str(folder / 'src')):
    source = np.asarray(Image.open(folder / 'src' / name))
    top, left, h, w = crops.crop_box(*source.shape[:2], name, 0, 0.1, 3.)
    got = np.asarray(Image.open(folder / 'out' / name.replace('.png', '.jpg')), np.float32)
    assert got.shape == (h, w, 3)
    want = source[top:top + h, left:left + w].astype(np.float32)
    assert np.abs(got - want).mean() < 2
  again = run(f'--source={folder / "src"}', f'--out={folder / "again"}')
  assert again.returncode == 0
  assert ((folder / 'out/val/b/3.jpg').read_bytes()
          == (folder / 'again/val/b/3.jpg').read_bytes())  # A function of the seed and path.


def test_the_crops_areas_and_aspects_are_the_distributions_asked():
  boxes = np.array([crops.crop_box(1000, 1000, f'img{i}', 0, 0.1, 3.) for i in range(4000)])
  aspect = np.log(boxes[:, 3] / boxes[:, 2])
  area = boxes[:, 2] * boxes[:, 3] / 1e6
  assert aspect.min() >= -math.log(3) - 0.01 and aspect.max() <= math.log(3) + 0.01
  counts = np.histogram(aspect, bins=4, range=(-math.log(3), math.log(3)))[0]
  assert counts.min() > 0.9 * counts.max(), counts  # Log-uniform.
  near_square = np.abs(aspect) < 0.1  # No side cut at the image's: the area as drawn.
  assert area.min() >= 0.1 - 0.01 and area.max() <= 1
  assert abs(np.median(area[near_square]) - 0.55) < 0.05, np.median(area[near_square])


@pytest.mark.parametrize('args, message', [
    (['--out={tmp}/out'], '--source is required'),
    (['--source={tmp}/none', '--out={tmp}/out'], 'does not exist'),
    (['--source={tmp}/src', '--out={tmp}/src'], 'exists: name a new folder'),
    (['--source={tmp}/src', '--out={tmp}/out', '--min_area=0'], r'--min_area=0.0 must be in'),
    (['--source={tmp}/src', '--out={tmp}/out', '--max_aspect=0.5'], 'must be at least 1'),
    (['--source={tmp}/empty', '--out={tmp}/out'], 'holds no images'),
])
def test_a_mistake_is_one_line_and_writes_nothing(folder, args, message):
  (folder / 'empty').mkdir()
  done = run(*(a.format(tmp=folder) for a in args))
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith('error:'), done.stderr
  assert re.search(message, lines[0]), lines[0]
  assert not (folder / 'out').exists()
