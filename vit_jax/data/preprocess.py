"""Per-example preprocessing ops, composed from a config string.

A pipeline is written as ``'decode|inception_crop(224)|flip_lr|value_range(-1, 1)'``.
Each op maps (image, numpy Generator) to an image. Images are HWC uint8 arrays
(crops are views; decoding and resizing use OpenCV's SIMD kernels) until
``value_range`` makes the float32 array; a pipeline without it returns uint8.
Inputs may be encoded bytes (``decode`` first) or arrays. Random ops draw from
the generator, which the loader seeds per example: pipelines are deterministic.

The loader runs a trailing ``value_range`` on the devices instead (``Pipeline.host``
then ``Pipeline.on_device``): batches are assembled and transferred as uint8, a
quarter of the bytes, and scaled where the model runs.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
from PIL import Image

Op = Callable[[Any, np.random.Generator], Any]

cv2.setNumThreads(1)  # The loader parallelises over examples.


def as_array(image: Any) -> np.ndarray:
  """Encoded bytes, PIL image or array -> HWC uint8 array."""
  if isinstance(image, bytes):
    return decode()(image, None)
  array = np.asarray(image)
  return array[..., None] if array.ndim == 2 else array


def decode() -> Op:
  """Encoded bytes -> RGB array (greyscale, palette and alpha images converted)."""
  flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    if not isinstance(image, bytes):
      return to_rgb()(image, rng)
    array = cv2.imdecode(np.frombuffer(image, np.uint8), flags)
    if array is None:
      raise ValueError('decode: the bytes are not an image OpenCV can read.')
    return array
  return op


def to_rgb() -> Op:
  """Any image -> RGB (greyscale replicated to three channels)."""
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    array = as_array(image)
    return np.repeat(array, 3, axis=-1) if array.shape[-1] == 1 else array[..., :3]
  return op


def _resize_to(image: np.ndarray, h: int, w: int) -> np.ndarray:
  """Bilinear resize (as tf.image.resize: no antialiasing)."""
  return as_array(cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR))


def resize(size: int | tuple[int, int]) -> Op:
  """Bilinear resize to (size, size) or (height, width)."""
  h, w = (size, size) if isinstance(size, int) else size
  return lambda image, rng: _resize_to(as_array(image), h, w)


def resize_small(size: int) -> Op:
  """Resizes so that the shorter side is ``size``, keeping the aspect ratio."""
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    h, w = image.shape[:2]
    scale = size / min(h, w)
    return _resize_to(image, max(size, round(h * scale)), max(size, round(w * scale)))
  return op


def central_crop(size: int) -> Op:
  """The central ``size`` x ``size`` crop."""
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
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
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    h, w = image.shape[:2]
    for _ in range(10):
      area = h * w * rng.uniform(area_min, area_max)
      aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
      ch, cw = round(np.sqrt(area / aspect)), round(np.sqrt(area * aspect))
      if 0 < ch <= h and 0 < cw <= w:
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        return _resize_to(image[top:top + ch, left:left + cw], size, size)
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return _resize_to(image[top:top + side, left:left + side], size, size)
  return op


def pad_crop(pad: int) -> Op:
  """Random translation by up to ``pad`` pixels (zero padding, then a random crop)."""
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    h, w = image.shape[:2]
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
    y, x = rng.integers(0, 2 * pad + 1, size=2)
    return padded[y:y + h, x:x + w]
  return op


def flip_lr() -> Op:
  """Horizontal flip with probability 1/2."""
  # cv2.flip returns a contiguous array: later ops on a negative-stride view are slow.
  return lambda image, rng: as_array(cv2.flip(as_array(image), 1)) if rng.random() < 0.5 \
      else image


def random_erase(prob: float = 0.25, area_min: float = 0.02, area_max: float = 1 / 3,
                 aspect_min: float = 0.3) -> Op:
  """Random erasing (Zhong et al., 2020; DeiT's 0.25): with probability ``prob``, a box
  of ``area_min``-``area_max`` of the image, aspect ``aspect_min``-1/``aspect_min``, is
  replaced by noise: uniform uint8 values (standard normal ones in a float image, as
  timm's in normalised pixels). Put it before ``value_range``; 10 failed draws erase
  nothing.
  """
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    if rng.random() >= prob:
      return image
    h, w, c = image.shape
    for _ in range(10):
      area = h * w * rng.uniform(area_min, area_max)
      aspect = np.exp(rng.uniform(np.log(aspect_min), -np.log(aspect_min)))
      eh, ew = round(np.sqrt(area * aspect)), round(np.sqrt(area / aspect))
      if 0 < eh < h and 0 < ew < w:
        top, left = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
        noise = (rng.integers(0, 256, (eh, ew, c), dtype=np.uint8) if image.dtype == np.uint8
                 else rng.standard_normal((eh, ew, c)).astype(image.dtype))
        image = image.copy()
        image[top:top + eh, left:left + ew] = noise
        return image
    return image
  return op


def _affine(lo: float = -1., hi: float = 1.) -> tuple[float, float]:
  return (hi - lo) / 255., lo


def value_range(lo: float = -1., hi: float = 1.) -> Op:
  """uint8 [0, 255] -> float32 [lo, hi]."""
  scale, offset = _affine(lo, hi)

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    array = as_array(image).astype(np.float32)
    array *= scale
    array += offset
    return array
  return op


def _randaug_ops(magnitude: float, fill: tuple[int, int, int]) -> list[Callable]:
  """The RandAugment operations (Cubuk et al., 2020) at a magnitude in [0, 10]."""
  from PIL import ImageEnhance, ImageOps

  m = magnitude / 10.

  def signed(rng: np.random.Generator, value: float) -> float:
    return value if rng.random() < 0.5 else -value

  def affine(image: Image.Image, matrix: tuple) -> Image.Image:
    return image.transform(image.size, Image.AFFINE, matrix, fillcolor=fill)

  return [
      lambda im, rng: ImageOps.autocontrast(im),
      lambda im, rng: ImageOps.equalize(im),
      lambda im, rng: ImageOps.invert(im),
      lambda im, rng: im.rotate(signed(rng, 30. * m), fillcolor=fill),
      lambda im, rng: ImageOps.posterize(im, max(1, int(8 - 4 * m))),
      lambda im, rng: ImageOps.solarize(im, int(256 - 256 * m)),
      lambda im, rng: ImageEnhance.Color(im).enhance(1. + signed(rng, 0.9 * m)),
      lambda im, rng: ImageEnhance.Contrast(im).enhance(1. + signed(rng, 0.9 * m)),
      lambda im, rng: ImageEnhance.Brightness(im).enhance(1. + signed(rng, 0.9 * m)),
      lambda im, rng: ImageEnhance.Sharpness(im).enhance(1. + signed(rng, 0.9 * m)),
      lambda im, rng: affine(im, (1, signed(rng, 0.3 * m), 0, 0, 1, 0)),
      lambda im, rng: affine(im, (1, 0, 0, signed(rng, 0.3 * m), 1, 0)),
      lambda im, rng: affine(im, (1, 0, signed(rng, 0.45 * m * im.size[0]), 0, 1, 0)),
      lambda im, rng: affine(im, (1, 0, 0, 0, 1, signed(rng, 0.45 * m * im.size[1]))),
  ]


def randaug(num_layers: int = 2, magnitude: float = 10.) -> Op:
  """RandAugment: ``num_layers`` operations drawn uniformly, at ``magnitude`` (0-10)."""
  ops = _randaug_ops(magnitude, fill=(128, 128, 128))

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    pil = Image.fromarray(np.ascontiguousarray(to_rgb()(image, rng)))
    for i in rng.integers(0, len(ops), num_layers):
      pil = ops[i](pil, rng)
    return np.asarray(pil)
  return op


OPS: dict[str, Callable[..., Op]] = {
    'decode': decode, 'to_rgb': to_rgb, 'resize': resize, 'resize_small': resize_small,
    'central_crop': central_crop, 'inception_crop': inception_crop, 'pad_crop': pad_crop,
    'flip_lr': flip_lr, 'value_range': value_range, 'randaug': randaug,
    'random_erase': random_erase,
}
_CALL = re.compile(r'^\s*(\w+)\s*(?:\((.*)\))?\s*$')


def _run(ops: list[Op], image: Any, rng: np.random.Generator) -> np.ndarray:
  for op in ops:
    image = op(image, rng)
  return as_array(image)


class Pipeline:
  """The composed ops of a pipeline string; calling it runs them all on the host.

  ``affine`` is the (scale, offset) of a trailing ``value_range`` (else None): then
  ``host`` runs the ops before it and ``on_device`` the scaling, in jax.
  """

  def __init__(self, spec: str, ops: list[Op], affine: tuple[float, float] | None):
    self.spec, self.ops, self.affine = spec, ops, affine

  def __call__(self, image: Any, rng: np.random.Generator) -> np.ndarray:
    return _run(self.ops, image, rng)

  def host(self, image: Any, rng: np.random.Generator) -> np.ndarray:
    """Every op but a trailing ``value_range``: uint8 images where there is one."""
    return _run(self.ops[:-1] if self.affine else self.ops, image, rng)

  def on_device(self, images: Any) -> Any:
    """The trailing ``value_range`` of a batch of ``host`` outputs, as float32."""
    import jax.numpy as jnp

    scale, offset = self.affine  # Only for pipelines that end with value_range.
    return images.astype(jnp.float32) * scale + offset


def parse(spec: str) -> Pipeline:
  """Builds the pipeline of a string; unknown ops get a clear error."""
  ops, affine = [], None
  for part in spec.split('|'):
    m = _CALL.match(part)
    if not m or m.group(1) not in OPS:
      raise ValueError(f'Unknown preprocessing op {part.strip()!r} in {spec!r}. '
                       f'Known ops: {sorted(OPS)}.')
    args = ast.literal_eval(f'({m.group(2)},)') if m.group(2) else ()
    ops.append(OPS[m.group(1)](*args))
    affine = _affine(*args) if m.group(1) == 'value_range' else None
  return Pipeline(spec, ops, affine)
