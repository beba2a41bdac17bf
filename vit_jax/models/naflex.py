"""Patch sequences (NaFlex, SigLIP 2): the ViT's other input, each image at its own grid.

A ``PatchSequence`` holds a batch of images already cut into patches (the ``naflex``
preprocessing op's batch: ``image``, ``patch_coords``, ``patch_mask``, ``patch_grid``), each
image at its own aspect ratio, padded to one length. ``VisionTransformer`` takes it instead of
images; this module holds only what differs from the image path, the embedding of the
sequence (as big_vision's ``naflex_vit.py`` sits over its ``vit.py``): the same patch
embedding applied to each patch, and the position embeddings at each patch's (row, column)
of its own image's grid. Everything after the embedding (blocks, norms, pools, heads) is the
image path's, with the padding masked out of attention and pooling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.base.sizes import pair
from vit_jax.models import posemb

Array = jax.Array


class PatchSequence(NamedTuple):
  """A batch of images as patch sequences, all padded to N patches (real patches first).

  ``patches`` (B, N, p * p * 3): each patch's pixels in (row, column, channel) order, in
  [-1, 1] as images are; ``coords`` (B, N, 2) int: each patch's (row, column) in its
  image's grid; ``mask`` (B, N) bool: True for an image's patches, False for padding;
  ``grid`` (B, 2) int: each image's (rows, columns) of patches.

  Packed (NaViT, ``vit_jax.data.packing``): ``segments`` (B, N) int, k + 1 for the patches
  of the row's k-th image and 0 for padding; ``grid`` is then (B, K, 2), each of the K
  images' grid (0, 0 for an empty slot), and the model's outputs are per image, (B, K, ...).
  """

  patches: Array
  coords: Array
  mask: Array
  grid: Array
  segments: Array | None = None

  @classmethod
  def from_batch(cls, batch: Mapping[str, Any]) -> PatchSequence:
    """A loader batch of ``naflex``'s keys (``preprocess.PATCH_KEYS``), packed or not."""
    return cls(batch['image'], batch['patch_coords'], batch['patch_mask'], batch['patch_grid'],
               batch.get('segment_ids'))

  @property
  def packed(self) -> bool:
    return self.segments is not None

  def check(self, patch_size: tuple[int, int], where: str) -> None:
    """ValueError naming what is wrong where the shapes do not fit a model of this patch."""
    shapes = tuple(tuple(getattr(a, 'shape', ())) for a in self[:4])
    b, n = shapes[0][:2] if len(shapes[0]) == 3 else (None, None)
    ph, pw = patch_size
    grid = shapes[3][:1] + shapes[3][2:] if self.packed and len(shapes[3]) == 3 else shapes[3]
    segments = tuple(getattr(self.segments, 'shape', ())) if self.packed else (b, n)
    if (len(shapes[0]) != 3 or shapes[0][2] != ph * pw * 3 or shapes[1] != (b, n, 2)
        or shapes[2] != (b, n) or grid != (b, 2) or segments != (b, n)):
      raise ValueError(
          f'{where} takes a PatchSequence of patches (batch, N, {ph * pw * 3}), coords '
          f'(batch, N, 2), mask (batch, N) and grid (batch, 2) (packed: segments (batch, N) '
          f'and grid (batch, images, 2)), got {shapes + ((segments,) if self.packed else ())}: '
          f'cut the images with the naflex op at patch_size={ph}.')

  def slots(self) -> tuple[Array, Array]:
    """Each patch's image slot (B, N) in its row (0 unpacked; padding's clipped to 0), and
    the slots' grids (B, K, 2) (K = 1 unpacked)."""
    if not self.packed:
      return jnp.zeros(self.mask.shape, jnp.int32), self.grid[:, None]
    return jnp.maximum(self.segments.astype(jnp.int32) - 1, 0), self.grid


def patch_size_of(model: Any) -> tuple[int, int] | None:
  """The (height, width) patch of a model that takes patch sequences (a ViT without a ResNet
  stem or a masked-patch head), else None: what a ``naflex`` pipeline is checked against."""
  if getattr(model, 'resnet_layers', None) is not None or getattr(model, 'mpp_outputs', 0):
    return None
  return pair(model.patch_size)


def inputs(batch: Mapping[str, Any]) -> Any:
  """The model's input of a loader batch: a ``PatchSequence`` where the batch holds patch
  sequences (a ``naflex`` pipeline, packed or not), else its images."""
  return PatchSequence.from_batch(batch) if 'patch_mask' in batch else batch['image']


def embed(conv: nn.Module, patches: Array, patch_size: tuple[int, int]) -> Array:
  """Each patch (B, N, p * p * 3) through the image path's patch embedding ``conv`` (a
  p x p convolution of stride p) as a one-patch image: (B, N, width), the same parameters
  and the same numbers as the image path's for the same pixels."""
  b, n, _ = patches.shape
  x = conv(patches.reshape(b * n, *patch_size, 3))
  return x.reshape(b, n, x.shape[-1])


def resize_weights(size: int, out: Array, length: int) -> Array:
  """The (length, size) matrix that resizes ``size`` samples to ``out`` (traced, one image's
  grid side), bilinear with antialias (``jax.image.resize``'s, torch's ``F.interpolate(...,
  mode='bilinear', align_corners=False, antialias=True)``); rows past ``out`` are unused."""
  scale = out.astype(jnp.float32) / size
  return jax.image.scale_and_translate(
      jnp.eye(size, dtype=jnp.float32), (length, size), (0,), scale[None],
      jnp.zeros((1,), jnp.float32), 'linear', antialias=True)


def resized_table(table: Array, coords: Array, grid: Array,
                  slots: Array | None = None) -> Array:
  """The (h0, w0, D) position-embedding table resized per image to its ``grid`` (B, 2),
  bilinear with antialias, at each patch's ``coords`` (B, N, 2): (B, N, D) float32. Packed:
  ``grid`` (B, K, 2) holds each row's K images' grids and ``slots`` (B, N) says whose each
  patch is.

  Under jit the grids are data, so the resize is one (N, h0) and one (N, w0) weight matrix
  per image (static shapes: no grid side exceeds N), gathered at each patch's row and column
  and combined with the table; the same numbers as ``jax.image.resize(table, (gh, gw, D),
  'bilinear', antialias=True)[row, col]``."""
  h0, w0, _ = table.shape
  b, n = coords.shape[:2]
  if slots is None:
    grid, slots = grid[:, None], jnp.zeros((b, n), jnp.int32)
  weights = lambda size, sides: jax.vmap(jax.vmap(lambda g: resize_weights(size, g, n)))(sides)
  rows, cols = weights(h0, grid[..., 0]), weights(w0, grid[..., 1])  # (B, K, N, h0 | w0)
  # Clipped: a padding patch's coordinates may be anything, never a NaN (jax's gathers fill
  # out-of-range indices with NaN).
  batch = jnp.arange(b)[:, None]
  take = lambda w, i: w[batch, slots, jnp.clip(i.astype(jnp.int32), 0, n - 1)]
  wr, wc = take(rows, coords[..., 0]), take(cols, coords[..., 1])
  hp = jax.lax.Precision.HIGHEST
  x = jnp.einsum('bni,ijd->bnjd', wr, table.astype(jnp.float32), precision=hp)
  return jnp.einsum('bnj,bnjd->bnd', wc, x, precision=hp)


def add_absolute(x: Array, seq: PatchSequence, kind: str, base_grid: tuple[int, int],
                 prefix: int, prefix_posemb: bool, param_dtype: Any) -> Array:
  """``x`` (B, prefix + N, width) with its absolute position embeddings added, as
  ``posemb.add_absolute`` adds them to an image's, inside the calling module.

  'learn': the model's own ``posembed_input`` table (built for ``base_grid``, the
  ``image_size`` grid, with the prefix tokens' rows in front where ``prefix_posemb``),
  its patch rows resized per image to that image's grid (``resized_table``); the prefix
  tokens' rows as they are. 'sincos2d': computed at each patch's (row, column). 'none':
  nothing."""
  width = x.shape[-1]
  if kind == 'learn':
    rows = (prefix if prefix_posemb else 0) + base_grid[0] * base_grid[1]
    table = posemb.AddPositionEmbs(param_dtype=param_dtype, name='posembed_input')(
        jax.ShapeDtypeStruct((1, rows, width), x.dtype))[0]
    head, table = table[:rows - base_grid[0] * base_grid[1]], table[-base_grid[0] * base_grid[1]:]
    slots, grids = seq.slots()
    pe = resized_table(table.reshape(*base_grid, width), seq.coords, grids, slots)
    pe = pe.astype(x.dtype)
    if prefix_posemb:
      return x + jnp.concatenate([jnp.broadcast_to(head, (x.shape[0], prefix, width)), pe], 1)
    return jnp.concatenate([x[:, :prefix], x[:, prefix:] + pe], axis=1)
  if kind == 'sincos2d':
    pe = posemb.sincos_2d_at(seq.coords[..., 0], seq.coords[..., 1], width, xp=jnp)
    return jnp.concatenate([x[:, :prefix], x[:, prefix:] + pe.astype(x.dtype)], axis=1)
  return x


def rope_positions(rope: str, seq: PatchSequence) -> Array:
  """Each patch's rotary coordinates (B, N, 2) in its own image's grid."""
  slots, grids = seq.slots()
  grid = jnp.take_along_axis(grids, slots[..., None], axis=1)  # (B, N, 2): each patch's image's.
  return posemb.coordinates(posemb.Rope.parse(rope), seq.coords[..., 0, None],
                            seq.coords[..., 1, None], grid)[..., 0, :]


def key_mask(seq: PatchSequence, prefix: int) -> Array:
  """What each attention may attend to: (B, prefix + N) bool, the keys any query may (the
  prefix tokens, class and registers, always); packed, (B, N, N), a query its own image's
  patches only (a padding query none: its output is never used)."""
  if seq.packed:
    if prefix:
      raise ValueError('A packed patch sequence takes a model without prefix tokens (class '
                       'token, registers): pool with gap or map, per image.')
    segments = seq.segments
    return (segments[:, :, None] == segments[:, None, :]) & (segments > 0)[:, None, :]
  mask = seq.mask.astype(bool)
  return jnp.concatenate([jnp.ones((mask.shape[0], prefix), bool), mask], axis=1)


def pool_mask(seq: PatchSequence, prefix: int) -> Array:
  """What each image's pool takes: (B, prefix + N) bool unpacked (``key_mask``); packed,
  (B, K, N), the patches of each of the row's K images."""
  if not seq.packed:
    return key_mask(seq, prefix)
  images = seq.grid.shape[1]
  return seq.segments[:, None, :] == jnp.arange(1, images + 1)[None, :, None]


def masked_mean(x: Array, mask: Array) -> Array:
  """The mean of the tokens of ``x`` (B, N, D) that ``mask`` (B, N), or per image (B, K, N),
  selects: (B, D) or (B, K, D); 0 where it selects none (an empty slot)."""
  valid = mask.astype(x.dtype)
  if mask.ndim == 2:
    return (x * valid[..., None]).sum(axis=1) / jnp.maximum(valid.sum(1), 1)[:, None]
  total = jnp.einsum('bkn,bnd->bkd', valid, x)
  return total / jnp.maximum(valid.sum(-1), 1)[..., None]
