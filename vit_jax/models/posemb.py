"""Position encodings, in one place: where each token is, and how the model is told.

Two kinds, which a model may combine:
- **Absolute**, added to the tokens before the first block (``VisionTransformer.posemb``):
  'learn' (1-D learned, one row per token: the paper's), 'sincos2d' (fixed 2-D sine-cosine),
  or 'none'.
- **Rotary** (RoPE), applied to each head's queries and keys of the patch tokens inside every
  attention (``VisionTransformer.rope``, a spec string parsed by ``Rope.parse``; the prefix
  tokens, class and registers, are never rotated, as in timm and transformers). Half of each
  head's rotated channels turn with one coordinate of the patch and half with the other.

Rotary encodings take **coordinates**, not a grid: ``grid_positions`` gives the (row, column)
of each patch of an image's grid, and a caller with patches of several grids (native
resolution, packing) passes each patch's own (row, column) and its image's grid shape. A row of
``KINDS`` is a variant (timm ``layers/pos_embed_sincos.py``, transformers ``dinov3_vit``):

- 'axial' (timm's default 'cat': EVA-02, PE, RoPE-ViT): a patch at index i of n along an axis
  is at i + offset (times ref / n with a ``ref_grid``); frequencies temperature^(-k/K), K =
  head_dim / 4; interleaved pairs.
- 'dinov3': at 2 (i + 0.5 + offset) / n - 1, in [-1, 1]; frequencies 2 pi temperature^(-k/K);
  half-rotation pairs.
- 'mixed' (RoPE-Mixed, Heo et al. 2024): at i; frequencies learned per block and head, each
  mixing both axes; interleaved pairs.

A rotation's angle for frequency k is ``coordinate . frequency``; in 'interleaved' layout the
pairs are channels (2k, 2k+1), in 'half' layout (k, k + D/2).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

POSEMBS = ('learn', 'sincos2d', 'none')
# kind -> its defaults: coordinates ('index' or 'centered'), the frequencies' scale, layout,
# temperature; 'mixed' learns its frequencies (the temperature sets their initial magnitudes).
KINDS: dict[str, dict[str, Any]] = {
    'axial': dict(coordinates='index', scale=1., layout='interleaved', temperature=10_000.),
    'dinov3': dict(coordinates='centered', scale=2 * math.pi, layout='half', temperature=100.),
    'mixed': dict(coordinates='index', scale=1., layout='interleaved', temperature=10.),
}
LAYOUTS = ('interleaved', 'half')


@dataclasses.dataclass(frozen=True)
class Rope:
  """A rotary encoding: a ``KINDS`` row and its settings.

  ``temperature``: the frequencies' base (None: the kind's). ``layout``: 'interleaved' or
  'half' (None: the kind's). ``xy``: the first half of the rotated channels turns with the
  column, the second with the row (timm's ``grid_indexing='xy'``); else row first.
  ``offset``: added to each index (PE: 1). ``ref_grid``: 'axial' only, coordinates scaled so
  the grid spans this (rows, columns) grid, the pre-training one (EVA-02's ``ref_feat_shape``).
  A setting equal to the kind's default is held as None: one rope, one spec string.
  """

  kind: str = 'axial'
  temperature: float | None = None
  layout: str | None = None
  xy: bool = False
  offset: float = 0.
  ref_grid: tuple[int, int] | None = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'rope kind {self.kind!r} is not one of {tuple(KINDS)}.')
    if self.layout not in (None, *LAYOUTS):
      raise ValueError(f'rope layout {self.layout!r} is not one of {LAYOUTS}.')
    if self.kind == 'mixed' and self.resolved('layout') != 'interleaved':
      raise ValueError("rope kind 'mixed' rotates interleaved pairs (layout='interleaved').")
    if self.ref_grid is not None and self.kind != 'axial':
      raise ValueError(f"rope ref_grid scales 'axial' coordinates, not {self.kind!r} ones.")
    if self.ref_grid is not None:
      object.__setattr__(self, 'ref_grid', tuple(int(s) for s in self.ref_grid))
    for name in ('temperature', 'layout'):  # The kind's default: None.
      if getattr(self, name) == KINDS[self.kind][name]:
        object.__setattr__(self, name, None)
    if self.temperature is not None:
      object.__setattr__(self, 'temperature', float(self.temperature))
    object.__setattr__(self, 'offset', float(self.offset))

  def resolved(self, name: str) -> Any:
    """A setting, the kind's default where this rope leaves it None."""
    value = getattr(self, name, None)
    return KINDS[self.kind][name] if value is None else value

  @property
  def learned(self) -> bool:
    return self.kind == 'mixed'

  def __str__(self) -> str:
    """The spec ``parse`` reads back: the kind, then the settings that are not defaults."""
    settings = [f'{f.name}={getattr(self, f.name)!r}' for f in dataclasses.fields(self)[1:]
                if getattr(self, f.name) != f.default]
    return f'{self.kind}({", ".join(settings)})' if settings else self.kind

  @staticmethod
  @functools.cache
  def parse(spec: str) -> Rope:
    """A spec string, ``KIND`` or ``KIND(setting=value, ...)``: ``'dinov3'``,
    ``"axial(temperature=100.0, xy=True)"``. ValueError names what is wrong."""
    m = re.fullmatch(r'\s*(\w+)\s*(?:\((.*)\))?\s*', spec or '')
    if not m:
      raise ValueError(f'rope {spec!r} is not KIND or KIND(setting=value, ...).')
    settings = {}
    if m.group(2) and m.group(2).strip():
      try:
        call = ast.parse(f'f({m.group(2)})', mode='eval').body
        settings = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        if call.args or None in settings:
          raise ValueError
      except (SyntaxError, ValueError) as e:
        raise ValueError(f'rope {spec!r}: settings are name=value pairs.') from e
    names = [f.name for f in dataclasses.fields(Rope)[1:]]
    if unknown := sorted(set(settings) - set(names)):
      raise ValueError(f'rope {spec!r}: unknown setting {unknown[0]!r} (settings: '
                       f'{", ".join(names)}).')
    return Rope(m.group(1), **settings)


def grid_positions(grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
  """(rows, columns, grid) of the patches of a grid, in the model's row-major token order."""
  rows, cols = np.mgrid[:grid[0], :grid[1]]
  return rows.reshape(-1), cols.reshape(-1), tuple(grid)


def coordinates(rope: Rope, rows: Array, cols: Array, grid: Any) -> Array:
  """Each patch's coordinates (..., tokens, 2) in the order its channels turn (``rope.xy``).

  ``rows``, ``cols``: the patches' indices (..., tokens); ``grid``: (rows, columns) of the
  grid they come from, a pair or an array (..., 2) of one pair per image.
  """
  grid = jnp.asarray(grid, jnp.float32)
  size = [grid[..., 0:1], grid[..., 1:2]]  # Broadcast over the tokens.
  axes = [jnp.asarray(rows, jnp.float32), jnp.asarray(cols, jnp.float32)]
  kind = rope.resolved('coordinates')
  if kind == 'centered':
    axes = [2. * (a + .5 + rope.offset) / n - 1. for a, n in zip(axes, size, strict=True)]
  else:
    axes = [a + rope.offset for a in axes]
    if rope.ref_grid is not None:
      axes = [a / n * r for a, n, r in zip(axes, size, rope.ref_grid, strict=True)]
  if rope.xy:
    axes = axes[::-1]
  return jnp.stack(axes, axis=-1)


def frequencies(rope: Rope, head_dim: int) -> np.ndarray:
  """The fixed kinds' frequencies as a (2, head_dim // 2) matrix: coordinate 0 turns the first
  head_dim // 4 pairs, coordinate 1 the rest (``angles = coordinates @ frequencies``)."""
  if head_dim % 4:
    raise ValueError(f'rotary position embeddings need a head_dim divisible by 4, got {head_dim}.')
  k = head_dim // 4
  bands = rope.resolved('scale') / rope.resolved('temperature') ** (np.arange(k) / k)
  out = np.zeros((2, 2 * k), np.float32)
  out[0, :k], out[1, k:] = bands, bands
  return out


def mixed_init(temperature: float, num_heads: int, head_dim: int):
  """RoPE-Mixed's initial frequencies (2, heads, head_dim // 2): per head, the bands of
  temperature turned by a random angle, half of them by another 90 degrees."""
  def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
    magnitude = 1. / temperature ** (jnp.arange(0, head_dim, 4) / head_dim)
    theta = jax.random.uniform(key, (num_heads, 1)) * 2 * jnp.pi
    fx = jnp.concatenate([magnitude * jnp.cos(theta), magnitude * jnp.cos(theta + jnp.pi / 2)], -1)
    fy = jnp.concatenate([magnitude * jnp.sin(theta), magnitude * jnp.sin(theta + jnp.pi / 2)], -1)
    return jnp.stack([fx, fy]).astype(dtype).reshape(shape)
  return init


def rotate(x: Array, angles: Array, layout: str) -> Array:
  """Rotates the channel pairs of ``x`` (..., head_dim) by ``angles`` (..., head_dim // 2), in
  float32, returned in x's dtype."""
  dtype, x = x.dtype, x.astype(jnp.float32)
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  if layout == 'half':
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(dtype)
  a, b = x[..., 0::2], x[..., 1::2]
  return jnp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(x.shape).astype(dtype)


def apply_rope(module: nn.Module, rope: Rope, q: Array, k: Array, coords: Array,
               prefix: int) -> tuple[Array, Array]:
  """Queries and keys (batch, tokens, heads, head_dim) with the patch tokens (all but the first
  ``prefix``) rotated by their coordinates (patches, 2) or (batch, patches, 2). A 'mixed' rope
  learns its frequencies in ``module`` (``rope_freqs``, (2, heads, head_dim // 2)).

  Queries may be fewer than the keys (the last block's ``query_tokens``): only prefix tokens
  then, which are not rotated."""
  heads, head_dim = k.shape[-2:]
  coords = coords.astype(jnp.float32)
  if rope.learned:
    freqs = module.param('rope_freqs', mixed_init(rope.resolved('temperature'), heads, head_dim),
                         (2, heads, head_dim // 2), jnp.float32)
    angles = jnp.einsum('...nc,chk->...nhk', coords, freqs.astype(jnp.float32))
  else:
    angles = (coords @ frequencies(rope, head_dim))[..., None, :]  # The same for every head.
  layout = rope.resolved('layout')
  turn = lambda t: t if t.shape[1] <= prefix else jnp.concatenate(
      [t[:, :prefix], rotate(t[:, prefix:], angles, layout)], axis=1)
  return turn(q), turn(k)


def sincos_2d_at(rows: Any, cols: Any, width: int, temperature: float = 10_000.,
                 xp: Any = np) -> Any:
  """Fixed 2-D sine-cosine position embeddings (..., width) of patches at ``rows``, ``cols``
  (...): sin and cos of the column, then of the row, each at width / 4 frequencies. ``xp``:
  numpy (a grid's constants) or jax.numpy (traced coordinates, in float32)."""
  if width % 4:
    raise ValueError(f'sincos2d position embeddings need a width divisible by 4, got {width}.')
  omega = np.arange(width // 4) / max(width // 4 - 1, 1)
  omega = 1. / temperature**omega
  if xp is not np:
    rows, cols, omega = (xp.asarray(a, xp.float32) for a in (rows, cols, omega))
  y = rows[..., None] * omega
  x = cols[..., None] * omega
  return xp.concatenate([xp.sin(x), xp.cos(x), xp.sin(y), xp.cos(y)], axis=-1)


def posemb_sincos_2d(grid: tuple[int, int], width: int,
                     temperature: float = 10_000.) -> np.ndarray:
  """Fixed 2-D sine-cosine position embeddings of a grid's patches, shape (1, h * w, width)."""
  rows, cols, _ = grid_positions(grid)
  return sincos_2d_at(rows, cols, width, temperature)[None].astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Learned 1-D position embeddings, one per token, N(0, 0.02) initialised."""

  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    pe = self.param('pos_embedding', nn.initializers.normal(stddev=0.02),
                    (1,) + x.shape[1:], self.param_dtype)
    return pe.astype(x.dtype)


def add_absolute(x: Array, posemb: str, grid: tuple[int, int], prefix: int, prefix_posemb: bool,
                 param_dtype: Any) -> Array:
  """``x`` (batch, prefix + patches, width) with its absolute position embeddings added, inside
  the calling module ('learn': its ``posembed_input``, on every token where ``prefix_posemb``,
  else on the patches; 'sincos2d': on the patches; 'none': nothing)."""
  if posemb == 'learn' and prefix_posemb:
    return x + AddPositionEmbs(param_dtype=param_dtype, name='posembed_input')(x)
  if posemb == 'learn':  # The patches only; the prefix tokens get none.
    pe = AddPositionEmbs(param_dtype=param_dtype, name='posembed_input')(x[:, prefix:])
    return jnp.concatenate([x[:, :prefix], x[:, prefix:] + pe], axis=1)
  if posemb == 'sincos2d':  # Fixed 2-D sin-cos for the patches; prefix tokens get none.
    pe = np.pad(posemb_sincos_2d(grid, x.shape[-1]), ((0, 0), (prefix, 0), (0, 0)))
    return x + jnp.asarray(pe, x.dtype)
  return x
