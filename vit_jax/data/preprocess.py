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

  def op(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    grey = image.shape[-1] == 1
    pil = Image.fromarray(image[..., 0] if grey else image)
    out = np.asarray(pil.resize((w, h), Image.BILINEAR))
    return out[..., None] if grey else out
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
    'to_rgb': to_rgb, 'resize': resize, 'pad_crop': pad_crop, 'flip_lr': flip_lr,
    'value_range': value_range,
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
