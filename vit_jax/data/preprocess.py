"""Per-example preprocessing ops, composed from a config string.

A pipeline is written as ``'to_rgb|resize(32)|pad_crop(2)|value_range(-1, 1)'``.
Each op maps (HWC image, numpy Generator) to an image; random ops draw from the
generator, which the loader seeds per example, so a pipeline is deterministic.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

import numpy as np
from PIL import Image

Op = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def to_rgb() -> Op:
  """Greyscale (H, W, 1) -> RGB (H, W, 3); RGB passes through."""
  return lambda image, rng: np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def resize(size: int | tuple[int, int]) -> Op:
  """Bilinear resize to (size, size) or (height, width)."""
  h, w = (size, size) if isinstance(size, int) else size
  return lambda image, rng: _resize_to(image, h, w)


def _resize_to(image: np.ndarray, h: int, w: int) -> np.ndarray:
  grey = image.shape[-1] == 1
  out = np.asarray(Image.fromarray(image[..., 0] if grey else image).resize((w, h),
                                                                            Image.BILINEAR))
  return out[..., None] if grey else out


def resize_small(size: int) -> Op:
  """Resizes so that the shorter side is ``size``, keeping the aspect ratio."""
  def op(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = image.shape[:2]
    scale = size / min(h, w)
    return _resize_to(image, max(size, round(h * scale)), max(size, round(w * scale)))
  return op


def central_crop(size: int) -> Op:
  """The central ``size`` x ``size`` crop."""
  def op(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = image.shape[:2]
    if h < size or w < size:
      raise ValueError(f'central_crop({size}) of a {h}x{w} image: resize it first.')
    top, left = (h - size) // 2, (w - size) // 2
    return image[top:top + size, left:left + size]
  return op


def inception_crop(size: int, area_min: float = 0.05, area_max: float = 1.0) -> Op:
  """Random crop of ``area_min``-``area_max`` of the area and aspect 3/4-4/3, resized.

  The "Inception" crop of the paper's training pipelines (area 5%-100% in the
  releases); after 10 failed draws it takes the central square.
  """
  def op(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = image.shape[:2]
    for _ in range(10):
      area = h * w * rng.uniform(area_min, area_max)
      aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
      ch, cw = round(np.sqrt(area / aspect)), round(np.sqrt(area * aspect))
      if 0 < ch <= h and 0 < cw <= w:
        top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        return _resize_to(image[top:top + ch, left:left + cw], size, size)
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return _resize_to(image[top:top + side, left:left + side], size, size)
  return op


def pad_crop(pad: int) -> Op:
  """Random translation by up to ``pad`` pixels (zero padding, then a random crop)."""
  def op(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = image.shape[:2]
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
    y, x = rng.integers(0, 2 * pad + 1, size=2)
    return padded[y:y + h, x:x + w]
  return op


def flip_lr() -> Op:
  """Horizontal flip with probability 1/2."""
  return lambda image, rng: image[:, ::-1] if rng.random() < 0.5 else image


def value_range(lo: float = -1., hi: float = 1.) -> Op:
  """uint8 [0, 255] -> float32 [lo, hi]."""
  return lambda image, rng: (image.astype(np.float32) / 255.) * (hi - lo) + lo


OPS: dict[str, Callable[..., Op]] = {
    'to_rgb': to_rgb, 'resize': resize, 'resize_small': resize_small,
    'central_crop': central_crop, 'inception_crop': inception_crop, 'pad_crop': pad_crop,
    'flip_lr': flip_lr, 'value_range': value_range,
}
_CALL = re.compile(r'^\s*(\w+)\s*(?:\((.*)\))?\s*$')


def parse(spec: str) -> Op:
  """Builds the composed op of a pipeline string; unknown ops get a clear error."""
  ops = []
  for part in spec.split('|'):
    m = _CALL.match(part)
    if not m or m.group(1) not in OPS:
      raise ValueError(f'Unknown preprocessing op {part.strip()!r} in {spec!r}. '
                       f'Known ops: {sorted(OPS)}.')
    args = ast.literal_eval(f'({m.group(2)},)') if m.group(2) else ()
    ops.append(OPS[m.group(1)](*args))

  def pipeline(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    for op in ops:
      image = op(image, rng)
    return image
  return pipeline
