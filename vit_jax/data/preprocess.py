"""Per-example preprocessing ops, composed from a config string.

A pipeline is written as ``'decode|inception_crop(224)|flip_lr|value_range(-1, 1)'``. Each op
maps (image, numpy Generator) to an image: HWC uint8 arrays (OpenCV's kernels, or PIL's where a
resize names one, as torchvision and transformers resize) until ``value_range`` or ``normalize``
makes float32; inputs are encoded bytes (``decode`` first) or arrays. Random ops draw from the
generator the loader seeds per example, so pipelines are deterministic. The loader runs a
trailing ``value_range`` or ``normalize`` on the devices (``Pipeline.host``, then
``Pipeline.on_device``): batches go over as uint8, a quarter of the bytes. ``EvalSpec`` is a
checkpoint's own evaluation preprocessing, written as such a pipeline for any input size.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np
from PIL import Image

from vit_jax.base import errors
from vit_jax.data import randaugment

Op = Callable[[Any, np.random.Generator], Any]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

cv2.setNumThreads(1)  # The loader parallelises over examples.


def as_array(image: Any) -> np.ndarray:
  """Encoded bytes, PIL image or array -> HWC uint8 array."""
  if isinstance(image, bytes):
    return decode()(image, None)
  return randaugment.as_hwc(np.asarray(image))


def decode() -> Op:
  """Encoded bytes -> RGB array (greyscale, palette and alpha images converted)."""
  flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    if not isinstance(image, bytes):
      return _rgb(image)
    array = cv2.imdecode(np.frombuffer(image, np.uint8), flags)
    if array is None:
      raise ValueError('decode: the bytes are not an image OpenCV can read.')
    return array
  return op


def _rgb(image: Any, rng: np.random.Generator | None = None) -> np.ndarray:
  array = as_array(image)
  return np.repeat(array, 3, axis=-1) if array.shape[-1] == 1 else array[..., :3]


def to_rgb() -> Op:
  """Any image -> RGB (greyscale replicated to three channels)."""
  return _rgb


# Resize methods: 'bilinear' is OpenCV's (as tf.image.resize: no antialiasing, big_vision's and
# the releases'); 'pil_*' are PIL's filters, antialiased, as torchvision and transformers resize.
_PIL_FILTERS = {'pil_nearest': Image.NEAREST, 'pil_bilinear': Image.BILINEAR,
                'pil_bicubic': Image.BICUBIC, 'pil_box': Image.BOX,
                'pil_hamming': Image.HAMMING, 'pil_lanczos': Image.LANCZOS}
METHODS = ('bilinear', *_PIL_FILTERS)


def _resizer(method: str) -> Callable[[np.ndarray, int, int], np.ndarray]:
  if method == 'bilinear':
    return lambda image, h, w: as_array(cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR))
  if method not in _PIL_FILTERS:
    raise ValueError(f'Unknown resize method {method!r}: one of {", ".join(METHODS)}.')

  def resize_pil(image: np.ndarray, h: int, w: int) -> np.ndarray:
    grey = image.shape[-1] == 1
    out = Image.fromarray(image[..., 0] if grey else image).resize((w, h), _PIL_FILTERS[method])
    return as_array(np.asarray(out))
  return resize_pil


def resize(size: int | tuple[int, int], method: str = 'bilinear') -> Op:
  """Resize to (size, size) or (height, width)."""
  h, w = (size, size) if isinstance(size, int) else size
  resize_to = _resizer(method)
  return lambda image, rng: resize_to(as_array(image), h, w)


def resize_small(size: int | tuple[int, int], method: str = 'bilinear') -> Op:
  """Resizes so that the shorter side is ``size``, keeping the aspect ratio; with (height,
  width), to the smallest size of the image's aspect ratio that covers both (timm's
  ``ResizeKeepRatio``: each side divided by the smaller of the two ratios, rounded), so that a
  central crop of a non-square size keeps the image's proportions."""
  resize_to = _resizer(method)

  # The longer side: rounded (big_vision's), or truncated as torchvision and transformers do.
  longer = round if method == 'bilinear' else int

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    h, w = image.shape[:2]
    if not isinstance(size, int):
      ratio = min(h / size[0], w / size[1])
      return resize_to(image, round(h / ratio), round(w / ratio))
    scale = size / min(h, w)
    return resize_to(image, max(size, longer(h * scale)), max(size, longer(w * scale)))
  return op


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int,
                eps: float = 1e-5, upscale: bool = True) -> tuple[int, int]:
  """The (height, width) NaFlex resizes an image to: its aspect ratio nearly kept, each side a
  multiple of the patch (rounded up, one patch at least), as many patches as fit in
  ``max_num_patches``. The scale is found by bisection on [eps / 10, 100], to ``eps``, as
  transformers' ``get_image_size_for_max_num_patches`` (SigLIP 2) finds it.
  ``upscale=False``: no scale above 1, so an image within the budget keeps its own size
  (each side rounded up to the patch): NaViT's native resolution."""
  def scaled(scale: float, side: int) -> int:
    return max(patch_size, math.ceil(side * scale / patch_size) * patch_size)

  if not upscale and scaled(1., height) * scaled(1., width) <= max_num_patches * patch_size**2:
    return scaled(1., height), scaled(1., width)
  lo, hi = eps / 10, 100.
  while hi - lo >= eps:
    scale = (lo + hi) / 2
    if scaled(scale, height) * scaled(scale, width) <= max_num_patches * patch_size**2:
      lo = scale
    else:
      hi = scale
  return scaled(lo, height), scaled(lo, width)


# The keys of a patch sequence (``naflex``), each of a fixed shape for any image.
PATCH_KEYS = ('image', 'patch_coords', 'patch_mask', 'patch_grid')


def naflex(patch_size: int, max_num_patches: int, method: str = 'pil_bilinear',
           upscale: bool = True) -> Op:
  """An image as a NaFlex patch sequence (SigLIP 2): resized keeping its aspect ratio to the
  most patches that fit in ``max_num_patches`` (``naflex_size``), cut into patches, padded.

  Yields a dict of fixed shapes (``PATCH_KEYS``), whatever the image's: ``image`` the patches
  (max_num_patches, patch_size**2 * 3), each patch's pixels in (row, column, channel) order
  (an HWIO patch-embedding kernel reshaped to (patch_size**2 * 3, width) embeds them),
  patches in row-major order of the grid, zeros after the last; ``patch_coords``
  (max_num_patches, 2) int32, each patch's (row, column) in the grid (0 for padding);
  ``patch_mask`` (max_num_patches,) bool, True for the image's patches; ``patch_grid`` (2,)
  int32, the grid's (rows, columns). transformers' ``Siglip2ImageProcessor`` gives the same
  as ``pixel_values``, ``pixel_attention_mask`` and ``spatial_shapes``. ``method``: the
  resize, PIL's antialiased bilinear by default (transformers'). ``upscale=False``: an image
  within the budget is not enlarged to fill it (``naflex_size``; NaViT's native resolution,
  where packing saves the most). Only ``value_range`` or ``normalize`` may follow: they scale
  the patches.
  """
  if not isinstance(patch_size, int) or patch_size < 1:
    raise ValueError(f'naflex: patch_size={patch_size!r} must be a positive int.')
  if not isinstance(max_num_patches, int) or max_num_patches < 1:
    raise ValueError(f'naflex: max_num_patches={max_num_patches!r} must be a positive int.')
  resize_to, p = _resizer(method), patch_size

  def op(image: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    image = _rgb(image)
    if image.dtype != np.uint8:
      raise ValueError('naflex resizes uint8 pixels: put value_range or normalize after it.')
    h, w = naflex_size(*image.shape[:2], p, max_num_patches, upscale=upscale)
    image = resize_to(image, h, w)
    rows, cols = h // p, w // p
    n = rows * cols
    patches = np.zeros((max_num_patches, p * p * 3), image.dtype)
    patches[:n] = image.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(n, -1)
    coords = np.zeros((max_num_patches, 2), np.int32)
    coords[:n] = np.stack(np.divmod(np.arange(n), cols), axis=-1)
    return {'image': patches, 'patch_coords': coords,
            'patch_mask': np.arange(max_num_patches) < n,
            'patch_grid': np.array([rows, cols], np.int32)}
  op.patch_sequence = True
  op.patch_size, op.max_num_patches = p, max_num_patches  # For the checks of a run's config.
  return op


def central_crop(size: int | tuple[int, int], offset: str = 'floor') -> Op:
  """The central ``size`` x ``size`` (or (height, width)) crop. An odd margin puts the extra
  pixel after the crop (``'floor'``: big_vision's, transformers') or, ``'round'``, wherever
  Python's round of half the margin says (torchvision's ``CenterCrop``, so timm's)."""
  ch, cw = (size, size) if isinstance(size, int) else size
  start = {'floor': lambda margin: margin // 2, 'round': lambda margin: round(margin / 2)}[offset]

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    h, w = image.shape[:2]
    if h < ch or w < cw:
      raise ValueError(f'central_crop({size}) of a {h}x{w} image: resize it first.')
    top, left = start(h - ch), start(w - cw)
    return image[top:top + ch, left:left + cw]
  return op


def inception_crop(size: int, area_min: float = 0.05, area_max: float = 1.0) -> Op:
  """Random crop of ``area_min``-``area_max`` of the area and aspect 3/4-4/3, resized.

  The "Inception" crop of the paper's training pipelines (area 5%-100% in the
  releases); after 10 failed draws it takes the central square.
  """
  resize_to = _resizer('bilinear')

  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    h, w = image.shape[:2]
    for _ in range(10):
      area = h * w * rng.uniform(area_min, area_max)
      aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
      ch, cw = round(np.sqrt(area / aspect)), round(np.sqrt(area * aspect))
      if 0 < ch <= h and 0 < cw <= w:
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        return resize_to(image[top:top + ch, left:left + cw], size, size)
    return resize_to(central_crop(min(h, w))(image, rng), size, size)
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
  """Random erasing (Zhong et al., 2020) as timm's ``RandomErasing(mode='pixel')`` (DeiT's
  0.25): with probability ``prob``, a box of ``area_min``-``area_max`` of the image, aspect
  ``aspect_min``-1/``aspect_min``, is replaced by standard normal noise per pixel and
  channel, in the model's normalised units: it goes after ``value_range`` (``parse``
  refuses it before). 10 failed draws erase nothing.
  """
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    image = as_array(image)
    if image.dtype == np.uint8:
      raise ValueError('random_erase fills N(0, 1) in normalised units: put it after '
                       'value_range.')
    if rng.random() > prob:
      return image
    h, w, c = image.shape
    for _ in range(10):
      area = h * w * rng.uniform(area_min, area_max)
      aspect = np.exp(rng.uniform(np.log(aspect_min), -np.log(aspect_min)))
      eh, ew = round(np.sqrt(area * aspect)), round(np.sqrt(area / aspect))
      if eh < h and ew < w:
        top, left = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
        image = image.copy()
        image[top:top + eh, left:left + ew] = rng.standard_normal((eh, ew, c))
        return image
    return image
  return op


def _scaling(scale: Any, offset: Any) -> Op:
  """uint8 -> float32 x * scale + offset (per channel where they are arrays); the op keeps
  them (``scale_offset``: the pipeline's ``affine``, which ``on_device`` applies in jax)."""
  def op(image: Any, rng: np.random.Generator) -> np.ndarray:
    return scale_pixels(as_array(image), scale, offset)
  op.scale_offset = (scale, offset)
  return op


def scale_pixels(pixels: Any, scale: Any, offset: Any, mask: Any = None) -> Any:
  """float32 ``pixels * scale + offset``, ``scale`` and ``offset`` per channel where they are
  arrays: channels last, alone (an image's) or innermost (a patch sequence's rows), in numpy
  or jax. ``mask``: a patch sequence's ``patch_mask``; its padding patches stay zero (as
  transformers pads after scaling)."""
  if mask is not None:
    return scale_pixels(pixels, scale, offset) * mask[..., None]
  if (np.ndim(scale) == 0 and np.ndim(offset) == 0) or pixels.shape[-1] == 3:
    if isinstance(pixels, np.ndarray):  # In place: one float32 copy of a host image.
      out = pixels.astype(np.float32)
      out *= scale
      out += offset
      return out
    return pixels.astype(np.float32) * scale + offset
  channels = pixels.reshape(*pixels.shape[:-1], -1, 3).astype(np.float32)
  return (channels * scale + offset).reshape(pixels.shape).astype(np.float32)


def value_range(lo: float = -1., hi: float = 1.) -> Op:
  """uint8 [0, 255] -> float32 [lo, hi]."""
  return _scaling((hi - lo) / 255., lo)


def normalize(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> Op:
  """uint8 [0, 255] -> float32 (x / 255 - mean) / std per channel (timm's and transformers'
  normalisation; mean = std = 0.5 is ``value_range(-1, 1)``)."""
  mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
  return _scaling(1. / (255. * std), -mean / std)


def randaug(num_layers: int = 2, magnitude: float = 10.) -> Op:
  """big_vision's RandAugment: ``num_layers`` of its 16 TF ops at ``magnitude``
  (``randaugment.BigVision``)."""
  augment = randaugment.BigVision(num_layers, magnitude)
  return lambda image, rng: augment(_rgb(image), rng)


def rand_augment(config_str: str = 'rand-m9-mstd0.5-inc1',
                 fill: tuple[int, int, int] = randaugment.IMAGENET_MEAN_FILL) -> Op:
  """timm's RandAugment from its config string (DeiT's ``'rand-m9-mstd0.5-inc1'``), PIL ops
  filled with ``fill`` (``randaugment.Timm``)."""
  augment = randaugment.Timm(config_str, fill)
  return lambda image, rng: augment(_rgb(image), rng)


OPS: dict[str, Callable[..., Op]] = {
    'decode': decode, 'to_rgb': to_rgb, 'resize': resize, 'resize_small': resize_small,
    'central_crop': central_crop, 'inception_crop': inception_crop, 'pad_crop': pad_crop,
    'flip_lr': flip_lr, 'value_range': value_range, 'normalize': normalize, 'randaug': randaug,
    'rand_augment': rand_augment, 'random_erase': random_erase, 'naflex': naflex,
}
_CALL = re.compile(r'^\s*(\w+)\s*(?:\((.*)\))?\s*$')
_SCALINGS = ('value_range', 'normalize')  # uint8 -> float32


def _run(ops: list[Op], image: Any, rng: np.random.Generator) -> Any:
  for op in ops:
    if isinstance(image, dict):  # A patch sequence (naflex): a scaling scales its patches.
      image = {**image, 'image': scale_pixels(image['image'], *op.scale_offset,
                                              image['patch_mask'])}
    else:
      image = op(image, rng)
  return image if isinstance(image, dict) else as_array(image)


class Pipeline:
  """The composed ops of a pipeline string; calling it runs them all on the host.

  ``affine`` is the (scale, offset) of a trailing ``value_range`` or ``normalize`` (else None):
  then ``host`` runs the ops before it and ``on_device`` the scaling, in jax.
  """

  def __init__(self, spec: str, ops: list[Op], affine: tuple[float, float] | None):
    self.spec, self.ops, self.affine = spec, ops, affine

  def __call__(self, image: Any, rng: np.random.Generator) -> Any:
    return _run(self.ops, image, rng)

  def host(self, image: Any, rng: np.random.Generator) -> Any:
    """Every op but a trailing scaling: uint8 images where there is one."""
    return _run(self.ops[:-1] if self.affine else self.ops, image, rng)

  def on_device(self, images: Any, mask: Any = None) -> Any:
    """The trailing scaling of a batch of ``host`` outputs (images, or a patch sequence's
    patches and its ``patch_mask``), as float32."""
    return scale_pixels(images, *self.affine, mask)  # Only for pipelines ending in a scaling.

  @property
  def patches(self) -> bool:
    """Whether it makes patch sequences (``naflex``: a dict of ``PATCH_KEYS``), not images."""
    return any(getattr(op, 'patch_sequence', False) for op in self.ops)

  @property
  def naflex(self) -> Op | None:
    """Its ``naflex`` op (``patch_size``, ``max_num_patches``), or None."""
    return next((op for op in self.ops if getattr(op, 'patch_sequence', False)), None)


def parse(spec: str) -> Pipeline:
  """Builds the pipeline of a string; unknown ops get a clear error."""
  ops, affine, scaled, patched = [], None, False, False
  for part in spec.split('|'):
    m = _CALL.match(part)
    if not m or m.group(1) not in OPS:
      raise ValueError(f'Unknown preprocessing op {part.strip()!r} in {spec!r}. '
                       f'Known ops: {sorted(OPS)}.')
    if patched and m.group(1) not in _SCALINGS:
      raise ValueError(f'{part.strip()} in {spec!r} comes after naflex, which cuts the image '
                       'into patches: put it before naflex (only value_range or normalize may '
                       'follow it).')
    if m.group(1) == 'naflex' and scaled:
      raise ValueError(f'naflex in {spec!r} comes after value_range or normalize: it resizes '
                       'uint8 pixels, so put the scaling after it.')
    patched = patched or m.group(1) == 'naflex'
    if m.group(1) == 'random_erase' and not scaled:
      raise ValueError(f'random_erase in {spec!r} comes before value_range: it fills N(0, 1) '
                       "in the model's units (timm's 'pixel' mode), so put it after "
                       "value_range, e.g. '...|value_range(-1, 1)|random_erase(0.25)'.")
    scaled = scaled or m.group(1) in _SCALINGS
    args = ast.literal_eval(f'({m.group(2)},)') if m.group(2) else ()
    ops.append(OPS[m.group(1)](*args))
    affine = getattr(ops[-1], 'scale_offset', None)
  return Pipeline(spec, ops, affine)


def check_output(pipeline: Pipeline, image: Any, size: tuple[int, int], where: str,
                 what: str, patch_size: tuple[int, int] | None = None) -> None:
  """``pipeline`` makes the model's (height, width, 3) input from ``image`` (``what``: which
  example it is, for the message), or, for a model that takes patch sequences (its
  ``patch_size``; None: it takes images only), a ``naflex`` patch sequence of its patch size;
  a ConfigError naming the field ``where`` and the fix."""
  expected = (*size, 3)
  if pipeline.patches and patch_size is None:
    raise errors.ConfigError(f'{where}={pipeline.spec!r} makes NaFlex patch sequences '
                             '(naflex), which this model does not take: end the pipeline with '
                             'resize or a crop to its image size.')
  try:
    out = pipeline(image, np.random.default_rng(0))
  except Exception as e:  # Any failure of the user's pipeline on the user's data.
    raise errors.ConfigError(f'{where}={pipeline.spec!r} fails on {what}: '
                             f'{type(e).__name__}: {e}') from None
  if pipeline.patches:
    _check_patches(pipeline, out, patch_size, where, what)
    return
  shape = tuple(out.shape)
  if shape != expected:
    got = 'x'.join(map(str, shape))
    resize = size[0] if size[0] == size[1] else tuple(size)
    raise errors.ConfigError(
        f'{where}={pipeline.spec!r} makes {got} images (on {what}), but the model takes '
        f'{size[0]}x{size[1]}x3 (config.model.image_size). End the pipeline with '
        f'resize({resize}) or a crop to it, or change the image size'
        f'{" (and add to_rgb)" if len(shape) != 3 or shape[-1] != 3 else ""}.')


def _check_patches(pipeline: Pipeline, out: dict[str, np.ndarray], patch_size: tuple[int, int],
                   where: str, what: str) -> None:
  """A ``naflex`` output of the model's square ``patch_size``, of ``PATCH_KEYS``' shapes."""
  op = pipeline.naflex
  if patch_size[0] != patch_size[1]:
    raise errors.ConfigError(
        f'{where}={pipeline.spec!r} cuts square patches, but the model\'s are '
        f'{patch_size[0]}x{patch_size[1]} (config.model.patch_size): give it a square one.')
  if patch_size[0] != op.patch_size:
    raise errors.ConfigError(
        f'{where}={pipeline.spec!r} cuts {op.patch_size}x{op.patch_size} patches, but the '
        f"model's are {patch_size[0]}x{patch_size[0]} (config.model.patch_size): use "
        f'naflex({patch_size[0]}, {op.max_num_patches}).')
  n, p = op.max_num_patches, op.patch_size
  expected = {'image': (n, p * p * 3), 'patch_coords': (n, 2), 'patch_mask': (n,),
              'patch_grid': (2,)}
  got = {k: tuple(np.shape(out.get(k))) for k in expected}
  if got != expected:
    raise errors.ConfigError(f'{where}={pipeline.spec!r} makes patch sequences of shapes {got} '
                             f'(on {what}), not naflex\'s {expected}: end it with naflex(...) '
                             'and a value_range or normalize only.')


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """A checkpoint's own evaluation preprocessing, for any input size (timm's ``pretrained_cfg``,
  transformers' image processor): resize (``'exact'`` to the size / ``crop_pct``, ``'shorter'``
  side to it (at a non-square size, timm's rule: the image's proportions kept, both sides
  covered), or ``'squash'`` both sides to it), take the central crop of the input size, scale
  by ``mean`` and ``std``. The default is the releases': a resize to the input, [-1, 1].
  ``'naflex'``: NaFlex patch sequences instead of images (SigLIP 2's processor, timm's
  ``ResizeToSequence``): each image at its own aspect ratio, ``max_num_patches`` of
  ``patch_size`` at most (the ``naflex`` op), whatever the input size."""

  resize: str = 'exact'
  crop_pct: float = 1.
  method: str = 'bilinear'
  mean: tuple[float, ...] = (0.5, 0.5, 0.5)
  std: tuple[float, ...] = (0.5, 0.5, 0.5)
  crop_offset: str = 'floor'  # 'round': torchvision's (timm's), see ``central_crop``.
  patch_size: int | None = None  # resize='naflex': the patch side, and the patches at most.
  max_num_patches: int | None = None

  @property
  def naflex(self) -> bool:
    """Whether it makes NaFlex patch sequences (``resize='naflex'``)."""
    return self.resize == 'naflex'

  def spec(self, size: tuple[int, int]) -> str:
    """The pipeline string for (height, width) inputs (a NaFlex one's: for any size)."""
    if self.resize not in ('exact', 'shorter', 'squash', 'naflex') or self.method not in METHODS:
      raise errors.ConfigError(
          f"The checkpoint's preprocessing (resize {self.resize!r}, {self.method!r}) is not one "
          "vit_jax's ops have: give the preprocessing (--pp, or config.dataset.pp_eval).")
    if self.naflex:
      return (f'decode|naflex({self.patch_size}, {self.max_num_patches}, {self.method!r})'
              f'|{self.scaling}')
    h, w = size
    scaled = (math.floor(h / self.crop_pct), math.floor(w / self.crop_pct))
    method = '' if self.method == 'bilinear' else f', {self.method!r}'
    # 'shorter' at a non-square size: the aspect ratio kept, the scaled size covered (timm's
    # ResizeKeepRatio, then its CenterCrop).
    shorter = self.resize == 'shorter'
    offset = '' if self.crop_offset == 'floor' else f', {self.crop_offset!r}'
    crop = (f'|central_crop({(h, w) if h != w else h}{offset})'
            if shorter or scaled != (h, w) else '')
    resize = 'resize_small' if shorter else 'resize'
    side = scaled[0] if scaled[0] == scaled[1] else scaled
    return f'decode|{resize}({side}{method}){crop}|{self.scaling}'

  @classmethod
  def of_pipeline(cls, spec: str) -> EvalSpec | None:
    """The EvalSpec an evaluation pipeline does (a run's ``pp_eval``, for its exports):
    decoding, a ``resize`` or ``resize_small``, a ``central_crop`` and a ``value_range`` or
    ``normalize``, each optional but the scaling (none: a resize to the input); None where it
    is not one (other ops, a non-square crop)."""
    found: dict[str, tuple[Any, ...]] = {}
    if naflex := cls._of_naflex_pipeline(spec):
      return naflex
    for part in spec.split('|'):
      m = _CALL.match(part)
      if not m:
        return None
      try:
        args = ast.literal_eval(f'({m.group(2)},)') if m.group(2) else ()
      except (ValueError, SyntaxError):
        return None
      name = m.group(1)
      if name in ('decode', 'to_rgb') and not found:
        continue
      order = ('resize', 'resize_small', 'central_crop', *_SCALINGS)
      if name not in order or any(order.index(k) >= order.index(name) for k in found):
        return None
      found[name] = args
    scaling = next(((k, found[k]) for k in _SCALINGS if k in found), None)
    sizes = [a[0] for k, a in found.items() if k in ('resize_small', 'central_crop')]
    if (scaling is None or {'resize', 'resize_small'} <= set(found)
        or not all(isinstance(s, int) for s in sizes)
        or ('resize' in found and not isinstance(found['resize'][0], int)
            and 'central_crop' in found)):  # A non-square resize: to the input itself.
      return None
    if scaling[0] == 'value_range':
      lo, hi = (tuple(scaling[1]) + (-1., 1.)[len(scaling[1]):])[:2]
      mean, std = (-lo / (hi - lo),) * 3, (1 / (hi - lo),) * 3
    else:
      mean, std = (tuple(scaling[1]) + (IMAGENET_MEAN, IMAGENET_STD)[len(scaling[1]):])[:2]
    resize = next((k for k in ('resize', 'resize_small') if k in found), None)
    crop = found.get('central_crop')
    method = found[resize][1] if resize and len(found[resize]) > 1 else 'bilinear'
    if method not in METHODS or (crop and not resize):
      return None
    return cls(resize='shorter' if resize == 'resize_small' else 'exact',
               crop_pct=crop[0] / found[resize][0] if crop else 1., method=method,
               mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
               crop_offset=crop[1] if crop and len(crop) > 1 else 'floor')

  @classmethod
  def _of_naflex_pipeline(cls, spec: str) -> EvalSpec | None:
    """The NaFlex EvalSpec of ``[decode|]naflex(P, N[, METHOD])|SCALING``; None otherwise."""
    parts = [p.strip() for p in spec.split('|')]
    parts = parts[1:] if parts and parts[0] in ('decode', 'decode()', 'to_rgb') else parts
    if len(parts) != 2 or not parts[0].startswith('naflex('):
      return None
    try:
      args = ast.literal_eval(f'({_CALL.match(parts[0]).group(2)},)')
      scaling = cls.of_pipeline(f'resize(1)|{parts[1]}')
    except (ValueError, SyntaxError, AttributeError):
      return None
    if scaling is None or len(args) not in (2, 3) or not all(isinstance(a, int) for a in args[:2]):
      return None
    method = args[2] if len(args) == 3 else 'pil_bilinear'
    return cls(resize='naflex', method=method, mean=scaling.mean, std=scaling.std,
               patch_size=args[0], max_num_patches=args[1]) if method in METHODS else None

  @property
  def scaling(self) -> str:
    """The op that scales uint8 pixels by ``mean`` and ``std``."""
    if self.mean == (0.5,) * 3 and self.std == (0.5,) * 3:
      return 'value_range(-1, 1)'
    return f'normalize({list(self.mean)}, {list(self.std)})'


def _scalings(parts: list[str]) -> list[int]:
  """The indices of a pipeline's ``value_range`` and ``normalize`` ops."""
  return [i for i, part in enumerate(parts) if part.split('(')[0].strip() in _SCALINGS]


def last_scaling(spec: str) -> str:
  """The last ``value_range`` or ``normalize`` op of ``spec`` ('' where it has none)."""
  parts = spec.split('|')
  return next((parts[i].strip() for i in reversed(_scalings(parts))), '')


def rescaled(spec: str, scaling: str) -> str:
  """``spec`` with ``scaling`` (a ``value_range`` or ``normalize`` op) in place of its last
  such op, or appended where it has none."""
  parts = spec.split('|')
  scaled = _scalings(parts)
  if not scaled:
    return f'{spec}|{scaling}'
  parts[scaled[-1]] = scaling
  return '|'.join(parts)
