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

  def check(self, patch_size: tuple[int, int], where: str) -> None:
    """ValueError naming what is wrong where the shapes do not fit a model of this patch."""
    shapes = tuple(tuple(getattr(a, 'shape', ())) for a in self)
    b, n = shapes[0][:2] if len(shapes[0]) == 3 else (None, None)
    ph, pw = patch_size
    if (len(shapes[0]) != 3 or shapes[0][2] != ph * pw * 3 or shapes[1] != (b, n, 2)
        or shapes[2] != (b, n) or shapes[3] != (b, 2)):
      raise ValueError(
          f'{where} takes a PatchSequence of patches (batch, N, {ph * pw * 3}), coords '
          f'(batch, N, 2), mask (batch, N) and grid (batch, 2), got {shapes}: cut the images '
          f'with the naflex op at patch_size={ph}.')


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


def resized_table(table: Array, coords: Array, grid: Array) -> Array:
  """The (h0, w0, D) position-embedding table resized per image to its ``grid`` (B, 2),
  bilinear with antialias, at each patch's ``coords`` (B, N, 2): (B, N, D) float32.

  Under jit the grids are data, so the resize is one (N, h0) and one (N, w0) weight matrix
  per image (static shapes: no grid side exceeds N), gathered at each patch's row and column
  and combined with the table; the same numbers as ``jax.image.resize(table, (gh, gw, D),
  'bilinear', antialias=True)[row, col]``."""
  h0, w0, _ = table.shape
  n = coords.shape[1]
  rows = jax.vmap(lambda g: resize_weights(h0, g, n))(grid[:, 0])  # (B, N, h0)
  cols = jax.vmap(lambda g: resize_weights(w0, g, n))(grid[:, 1])  # (B, N, w0)
  # Clipped: a padding patch's coordinates may be anything, never a NaN (jax's gathers fill
  # out-of-range indices with NaN).
  take = lambda w, i: jnp.take_along_axis(w, i[..., None].astype(jnp.int32), axis=1,
                                         mode='clip')
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
    pe = resized_table(table.reshape(*base_grid, width), seq.coords, seq.grid).astype(x.dtype)
    if prefix_posemb:
      return x + jnp.concatenate([jnp.broadcast_to(head, (x.shape[0], prefix, width)), pe], 1)
    return jnp.concatenate([x[:, :prefix], x[:, prefix:] + pe], axis=1)
  if kind == 'sincos2d':
    pe = posemb.sincos_2d_at(seq.coords[..., 0], seq.coords[..., 1], width, xp=jnp)
    return jnp.concatenate([x[:, :prefix], x[:, prefix:] + pe.astype(x.dtype)], axis=1)
  return x


def rope_positions(rope: str, seq: PatchSequence) -> Array:
  """Each patch's rotary coordinates (B, N, 2) in its own image's grid."""
  return posemb.coordinates(posemb.Rope.parse(rope), seq.coords[..., 0], seq.coords[..., 1],
                            seq.grid)


def key_mask(seq: PatchSequence, prefix: int) -> Array:
  """(B, prefix + N) bool: the tokens attention may attend to and pools may pool; the prefix
  tokens (class, registers) always."""
  mask = seq.mask.astype(bool)
  return jnp.concatenate([jnp.ones((mask.shape[0], prefix), bool), mask], axis=1)
