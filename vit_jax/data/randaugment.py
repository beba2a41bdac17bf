"""RandAugment (Cubuk et al., 2020) as its two reference implementations define it.

``BigVision``: big_vision's ``randaug(N, M)`` (TF ops; the AugReg and plain-ViT recipes): 16 ops
drawn uniformly, each always applied at fixed arguments of M, with the TF quirks the recipes
trained on kept (Solarize's threshold wraps modulo 256, google-research/big_vision issue #110).
``Timm``: timm's ``rand_augment_transform`` strings, e.g. DeiT's ``rand-m9-mstd0.5-inc1`` (PIL
ops, each applied with probability p at a magnitude drawn around M). Each op is (name, arguments
drawn from the generator, function); ``plan`` draws one image's arguments and ``apply`` runs
them, so the tests check the draws and the functions against the references apart. Every
op's arguments and quirks: docs/data.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import cv2
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

Plan = list[tuple[str, tuple]]

# --- big_vision (TF) ops on HWC uint8 RGB arrays -------------------------------------------


def blend(image1: np.ndarray, image2: np.ndarray, factor: float) -> np.ndarray:
  """image1 + factor x (image2 - image1) in float32, cast (truncated) to uint8; clipped to
  [0, 255] first unless 0 < factor < 1 (TF's ``blend``)."""
  if factor == 0.:
    return image1
  if factor == 1.:
    return image2
  one = image1.astype(np.float32)
  temp = image2.astype(np.float32)
  temp -= one
  temp *= np.float32(factor)
  temp += one
  if not 0. < factor < 1.:
    np.minimum(np.maximum(temp, 0., out=temp), 255., out=temp)
  return temp.astype(np.uint8)


def grayscale(image: np.ndarray) -> np.ndarray:
  """tf.image.rgb_to_grayscale of uint8: (0.2989, 0.587, 0.114) on x / 255, then x 255.5
  truncated. Shape (H, W, 1)."""
  floats = image.astype(np.float32) * np.float32(1. / 255.)
  weights = np.array([0.2989, 0.5870, 0.1140], np.float32)
  gray = floats[..., 0] * weights[0] + floats[..., 1] * weights[1] + floats[..., 2] * weights[2]
  return (gray * np.float32(255.5)).astype(np.uint8)[..., None]


def autocontrast(image: np.ndarray) -> np.ndarray:
  """Each channel stretched from [min, max] to [0, 255] (unchanged where min == max)."""
  values = np.arange(256, dtype=np.float32)
  luts = []
  for channel in cv2.split(np.ascontiguousarray(image)):
    lo, hi = np.float32(channel.min()), np.float32(channel.max())
    if hi > lo:  # The same float32 arithmetic per value, as a table.
      scale = np.float32(255.) / (hi - lo)
      luts.append(np.clip(values * scale + (-lo * scale), 0., 255.).astype(np.uint8))
    else:
      luts.append(np.arange(256, dtype=np.uint8))
  return _lut(image, luts)


def _lut(image: np.ndarray, luts: list[np.ndarray]) -> np.ndarray:
  """Each channel through its table of 256 values."""
  table = np.stack(luts, -1).astype(np.uint8)[:, None, :]  # (256, 1, 3).
  return as_hwc(cv2.LUT(np.ascontiguousarray(image), table))


def as_hwc(array: np.ndarray) -> np.ndarray:
  return array[..., None] if array.ndim == 2 else array


def equalize(image: np.ndarray) -> np.ndarray:
  """PIL's histogram equalisation per channel, as big_vision's TF version computes it."""
  luts, image = [], np.ascontiguousarray(image)
  for c in range(3):
    hist = cv2.calcHist([image], [c], None, [256], [0, 256]).ravel().astype(np.int64)
    nonzero = hist[hist > 0]
    step = (nonzero.sum() - nonzero[-1]) // 255
    if step:
      lut = np.concatenate([[0], ((np.cumsum(hist) + step // 2) // step)[:-1]])
      luts.append(np.clip(lut, 0, 255))
    else:
      luts.append(np.arange(256))
  return _lut(image, luts)


def invert(image: np.ndarray) -> np.ndarray:
  return 255 - image


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
  """Keeps the top ``bits`` bits; TF clamps the shift 8 - bits to [0, 7]."""
  shift = np.uint8(min(max(8 - bits, 0), 7))
  return (image >> shift) << shift


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
  """Inverts the pixels >= threshold, the threshold cast to uint8 as TF does (256 -> 0)."""
  return np.where(image < np.uint8(threshold % 256), image, 255 - image).astype(np.uint8)


def solarize_add(image: np.ndarray, addition: int, threshold: int = 128) -> np.ndarray:
  """Adds ``addition`` (clipped to 255) to the pixels below ``threshold``."""
  values = np.arange(256)
  lut = np.where(values < threshold, np.clip(values + addition, 0, 255), values)
  return _lut(image, [lut] * 3)


def color(image: np.ndarray, factor: float) -> np.ndarray:
  return blend(np.repeat(grayscale(image), 3, axis=-1), image, factor)


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
  """Blend with a grey of H x W / 256 (the reference's histogram sum / 256, not the mean)."""
  h, w = image.shape[:2]
  grey = np.uint8(np.clip(np.float32(h * w) / np.float32(256.), 0., 255.))
  return blend(np.full_like(image, grey), image, factor)


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
  return blend(np.zeros_like(image), image, factor)


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
  """Blend with the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13 (borders kept)."""
  h, w = image.shape[:2]
  degenerate = image.copy()
  if h > 2 and w > 2:
    degenerate[1:-1, 1:-1] = _smooth(image)
  return blend(degenerate, image, factor)


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / np.float32(13.)


def _smooth(image: np.ndarray) -> np.ndarray:
  """The interior of TF's depthwise convolution by ``_SMOOTH``, truncated to uint8.

  TF's CPU kernel sums the 9 taps row by row with fused multiply-adds (each an exact
  product and sum rounded once to float32). OpenCV's sum differs from it by a few float32
  ulps on a few values (1 in 6,300 on a smooth image), which changes the truncation only
  next to an integer: those values are summed again the TF way.
  """
  image = np.ascontiguousarray(image)
  h, w = image.shape[:2]
  approx = as_hwc(cv2.filter2D(image.astype(np.float32), -1, _SMOOTH))[1:-1, 1:-1]
  out = approx.astype(np.uint8)  # In [0, 255]: the weights are positive and sum to 1.
  distance = approx - np.rint(approx)
  y, x, c = np.nonzero((distance < 1e-3) & (distance > -1e-3))
  flat, corner = image.reshape(-1), (y * w + x) * 3 + c
  exact = np.zeros(len(y), np.float32)
  for dy in range(3):
    for dx in range(3):
      tap = flat[corner + (dy * w + dx) * 3].astype(np.float64) * np.float64(_SMOOTH[dy, dx])
      exact = (exact + tap).astype(np.float32)
  out[y, x, c] = exact.astype(np.uint8)
  return out


def projective(image: np.ndarray, transform: tuple[float, ...], fill: int = 128) -> np.ndarray:
  """Output pixel (x, y) = input pixel round(a0 x + a1 y + a2, b0 x + b1 y + b2) (nearest,
  as tfa.image.transform); outside the image: ``fill``."""
  h, w = image.shape[:2]
  a0, a1, a2, b0, b1, b2 = (np.float32(t) for t in transform)
  y, x = np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None]

  def source(a: np.float32, b: np.float32, c: np.float32) -> np.ndarray:
    """round(a x + b y + c) in float32, halves away from zero (C's round; np.round's go to
    the even neighbour)."""
    v = a * x + b * y + c
    return np.trunc(v + np.copysign(np.float32(0.5), v))

  # Whole pixel positions, so OpenCV's nearest-pixel lookup reads exactly those.
  src_x, src_y = np.broadcast_arrays(source(a0, a1, a2), source(b0, b1, b2))
  return as_hwc(cv2.remap(np.ascontiguousarray(image), np.ascontiguousarray(src_x),
                          np.ascontiguousarray(src_y), cv2.INTER_NEAREST,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 3))


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
  """tfa.image.rotate by ``degrees`` about the centre (nearest, fill 128)."""
  h, w = (np.float32(n - 1) for n in image.shape[:2])
  angle = np.float32(degrees * math.pi / 180.)  # tfa computes the matrix in float32.
  cos, sin = np.cos(angle), np.sin(angle)
  x_offset = (w - (cos * w - sin * h)) / np.float32(2.)
  y_offset = (h - (sin * w + cos * h)) / np.float32(2.)
  return projective(image, (cos, -sin, x_offset, sin, cos, y_offset))


# The shears and translations of both references, by the op's value: (a0, a1, a2, b0, b1, b2)
# of ``projective``, which PIL's affine transform reads alike; a translation by v pixels moves
# the content left (up) by v.
_AFFINE: dict[str, Callable[[float], tuple[float, ...]]] = {
    'ShearX': lambda v: (1., v, 0., 0., 1., 0.), 'ShearY': lambda v: (1., 0., 0., v, 1., 0.),
    'TranslateX': lambda v: (1., 0., v, 0., 1., 0.),
    'TranslateY': lambda v: (1., 0., 0., 0., 1., v)}


def cutout(image: np.ndarray, pad: int, center_y: int, center_x: int,
           fill: int = 128) -> np.ndarray:
  """Rows [cy - pad, cy + pad) x columns [cx - pad, cx + pad), clipped, set to ``fill``."""
  out = image.copy()
  out[max(0, center_y - pad):center_y + pad, max(0, center_x - pad):center_x + pad] = fill
  return out


_BIG_VISION_FN: dict[str, Callable[..., np.ndarray]] = {
    'AutoContrast': autocontrast, 'Equalize': equalize, 'Invert': invert, 'Rotate': rotate,
    'Posterize': posterize, 'Solarize': solarize, 'Color': color, 'Contrast': contrast,
    'Brightness': brightness, 'Sharpness': sharpness,
    **{name: lambda image, v, m=m: projective(image, m(v)) for name, m in _AFFINE.items()},
    'Cutout': cutout, 'SolarizeAdd': solarize_add,
}
BIG_VISION_OPS = tuple(_BIG_VISION_FN)  # In this order: the draws index it.


def _signed(rng: np.random.Generator, value: float) -> float:
  return value if rng.random() < 0.5 else -value


def big_vision_args(name: str, magnitude: float, rng: np.random.Generator,
                    shape: tuple[int, ...]) -> tuple:
  """The arguments of op ``name`` at ``magnitude`` (big_vision's ``level_to_arg``)."""
  level = magnitude / 10.
  if name in ('AutoContrast', 'Equalize', 'Invert'):
    return ()
  if name == 'Rotate':
    return (_signed(rng, level * 30.),)
  if name == 'Posterize':
    return (int(level * 4),)
  if name == 'Solarize':
    return (int(level * 256),)
  if name == 'SolarizeAdd':
    return (int(level * 110),)
  if name in ('Color', 'Contrast', 'Brightness', 'Sharpness'):
    return (level * 1.8 + 0.1,)
  if name in ('ShearX', 'ShearY'):
    return (_signed(rng, level * 0.3),)
  if name in ('TranslateX', 'TranslateY'):
    return (_signed(rng, level * 100.),)
  # Cutout: a half-side and a centre drawn uniformly over the image.
  return (int(level * 40), int(rng.integers(0, shape[0])), int(rng.integers(0, shape[1])))


class BigVision:
  """big_vision's ``randaug(num_layers, magnitude)``: see the module docstring."""

  def __init__(self, num_layers: int = 2, magnitude: float = 10.):
    if not isinstance(num_layers, int) or num_layers < 0:
      raise ValueError(f'randaug({num_layers!r}, ...): the number of layers must be an '
                       'integer >= 0 (big_vision: 2).')
    if not isinstance(magnitude, (int, float)) or magnitude < 0:
      raise ValueError(f'randaug(..., {magnitude!r}): the magnitude must be a number >= 0 '
                       '(big_vision: 10, 15 or 20; it is not clipped).')
    self.num_layers, self.magnitude = num_layers, float(magnitude)

  def plan(self, rng: np.random.Generator, shape: tuple[int, ...]) -> Plan:
    names = [BIG_VISION_OPS[i] for i in rng.integers(0, len(BIG_VISION_OPS), self.num_layers)]
    return [(name, big_vision_args(name, self.magnitude, rng, shape)) for name in names]

  @staticmethod
  def apply(image: np.ndarray, plan: Plan) -> np.ndarray:
    for name, args in plan:
      image = _BIG_VISION_FN[name](image, *args)
    return image

  def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return self.apply(image, self.plan(rng, image.shape))


# --- timm (PIL) ops ---------------------------------------------------------------------------

TIMM_OPS = ('AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize', 'Solarize',
            'SolarizeAdd', 'Color', 'Contrast', 'Brightness', 'Sharpness', 'ShearX', 'ShearY',
            'TranslateXRel', 'TranslateYRel')
TIMM_INCREASING_OPS = tuple(f'{op}Increasing' if op in ('Posterize', 'Solarize', 'Color',
                            'Contrast', 'Brightness', 'Sharpness') else op for op in TIMM_OPS)
IMAGENET_MEAN_FILL = (124, 116, 104)  # round(255 x (0.485, 0.456, 0.406)): DeiT's fill.


def timm_args(name: str, magnitude: float, rng: np.random.Generator) -> tuple:
  """The arguments of timm op ``name`` at ``magnitude`` (timm's ``LEVEL_TO_ARG``): big_vision's
  where they agree (the same draws), else timm's own."""
  level = magnitude / 10.
  if name == 'PosterizeIncreasing':
    return (4 - int(level * 4),)
  if name == 'Solarize':
    return (min(256, int(level * 256)),)
  if name == 'SolarizeIncreasing':
    return (256 - min(256, int(level * 256)),)
  if name == 'SolarizeAdd':
    return (min(128, int(level * 110)),)
  if name.endswith('Increasing'):  # Color, Contrast, Brightness, Sharpness.
    return (max(0.1, 1. + _signed(rng, level * 0.9)),)
  if name in ('TranslateXRel', 'TranslateYRel'):  # A share of the side.
    return (_signed(rng, level * 0.45),)
  return big_vision_args(name, magnitude, rng, ())


def timm_apply(image: Image.Image, name: str, args: tuple, fill: tuple[int, ...],
               resample: Image.Resampling = Image.Resampling.BICUBIC) -> Image.Image:
  """timm's op ``name`` (PIL) with ``args``."""
  base = name.removesuffix('Increasing')
  affine = dict(resample=resample, fillcolor=fill)
  if base in ('AutoContrast', 'Equalize', 'Invert'):  # ImageOps.autocontrast, ...
    return getattr(ImageOps, base.lower())(image)
  if base == 'Rotate':
    return image.rotate(args[0], **affine)
  if base == 'Posterize':  # PIL's mask; bits 0 (at M = 10) is black, as in the PIL of DeiT's
    mask = ~(2 ** (8 - args[0]) - 1)  # time (Pillow >= 10 refuses 0 bits, timm then fails).
    return image if args[0] >= 8 else image.point([i & mask for i in range(256)] * 3)
  if base == 'Solarize':
    return ImageOps.solarize(image, args[0])
  if base == 'SolarizeAdd':
    lut = [min(255, i + args[0]) if i < 128 else i for i in range(256)]
    return image.point(lut * len(image.getbands()))
  if base in ('Color', 'Contrast', 'Brightness', 'Sharpness'):
    return getattr(ImageEnhance, base)(image).enhance(args[0])
  side = {'TranslateXRel': image.size[0], 'TranslateYRel': image.size[1]}.get(base, 1)
  matrix = _AFFINE[base.removesuffix('Rel')](args[0] * side)  # Rel: a share of the side.
  return image.transform(image.size, Image.Transform.AFFINE, matrix, **affine)


_TIMM_SECTION = re.compile(r'^([a-z]+)(\d.*)$')
_TIMM_SECTIONS = {  # A section's key: (the attribute it sets, how its value is read).
    'm': ('magnitude', lambda v: float(int(v))), 'n': ('num_layers', int), 'p': ('prob', float),
    'mstd': ('magnitude_std', lambda v: math.inf if float(v) > 100 else float(v)),
    'mmax': ('magnitude_max', lambda v: float(int(v)))}


class Timm:
  """timm's ``rand_augment_transform(config_str)``: 'rand' then '-'-separated sections
  m (magnitude, 10), n (layers, 2), p (each op's probability, 0.5), mstd (magnitude noise;
  > 100: uniform in [0, m]), mmax (the magnitude's upper clip, 10), inc1 (the increasing
  ops). timm reads ``inc0`` as increasing too: refused here, leave the section out."""

  def __init__(self, config_str: str, fill: tuple[int, int, int] = IMAGENET_MEAN_FILL):
    sections = str(config_str).split('-')
    if sections[0] != 'rand':
      raise ValueError(f"rand_augment({config_str!r}): the string must start with 'rand' "
                       "(timm's form, e.g. 'rand-m9-mstd0.5-inc1').")
    self.magnitude, self.num_layers, self.prob = 10., 2, 0.5
    self.magnitude_std, self.magnitude_max, increasing = 0., 10., False
    for section in sections[1:]:
      match = _TIMM_SECTION.match(section)
      key, value = match.groups() if match else (section, '')
      try:
        if key == 'inc' and value == '1':
          increasing = True
        else:
          attr, read = _TIMM_SECTIONS[key]
          setattr(self, attr, read(value))
      except (KeyError, ValueError):
        raise ValueError(
            f'rand_augment({config_str!r}): cannot read the section {section!r}. Known: m9 '
            '(magnitude), n2 (layers), p0.5 (probability), mstd0.5 (magnitude noise), mmax10, '
            'inc1 (increasing ops; leave it out for the plain ones, timm reads inc0 as inc1); '
            "timm's weighted sets (t...) are not implemented.") from None
    if not 0. <= self.prob <= 1. or self.num_layers < 0 or self.magnitude_std < 0:
      raise ValueError(f'rand_augment({config_str!r}): p must be in [0, 1], n and mstd >= 0.')
    self.ops = TIMM_INCREASING_OPS if increasing else TIMM_OPS
    self.fill = tuple(fill)

  def draw_magnitude(self, rng: np.random.Generator) -> float:
    magnitude = self.magnitude
    if self.magnitude_std == math.inf:
      magnitude = rng.uniform(0., magnitude)
    elif self.magnitude_std > 0:
      magnitude = rng.normal(magnitude, self.magnitude_std)
    return max(0., min(magnitude, self.magnitude_max))

  def plan(self, rng: np.random.Generator) -> Plan:
    """The ops applied to one image (a skipped op is left out) and their arguments."""
    plan = []
    for i in rng.integers(0, len(self.ops), self.num_layers):
      if self.prob < 1. and rng.random() > self.prob:
        continue
      plan.append((self.ops[i], timm_args(self.ops[i], self.draw_magnitude(rng), rng)))
    return plan

  def apply(self, image: np.ndarray, plan: Plan) -> np.ndarray:
    if not plan:
      return image
    pil = Image.fromarray(np.ascontiguousarray(image))
    for name, args in plan:
      pil = timm_apply(pil, name, args, self.fill)
    return np.asarray(pil)

  def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return self.apply(image, self.plan(rng))

