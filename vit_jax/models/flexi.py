"""FlexiViT (Beyer et al., CVPR 2023): one set of parameters run at any patch size.

The parameters stay at one base patch size and its position-embedding grid (the model's
``patch_size`` and ``grid``: the release layout, so a FlexiViT run's checkpoint loads, exports
and evaluates as any other). ``at_patch_size(model, P)`` runs them at P: the patch-embedding
kernel resampled with the pseudo-inverse resize (``resample_patchemb``) and the position
embeddings resized bilinearly to the grid of the image at P (``resize_posemb``), both linear
maps of the base parameters inside the forward pass, so gradients flow back to them (as
big_vision's ``flexi/vit.py`` sits over its ``vit.py``: no copy of the encoder).

The resize matrices here are the only ones: ``checkpoints.formats.fit`` resamples a loaded
checkpoint's arrays with the same, so a model trained at P through ``at_patch_size`` gives the
same numbers through ``checkpoints.load(..., patch_size=P)`` and ``evaluate --patch_sizes``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from vit_jax.base.sizes import pair

Array = jax.Array
PATCHEMB = ('embedding', 'kernel')
POSEMB = ('Transformer', 'posembed_input', 'pos_embedding')


def interpolation_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) linear interpolation with aligned corners (scipy.ndimage.zoom order=1):
  the position embeddings' resize."""
  pos = np.arange(n_out) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.)
  lo = np.clip(np.floor(pos).astype(int), 0, n_in - 1)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = pos - lo
  m = np.zeros((n_out, n_in))
  np.add.at(m, (np.arange(n_out), lo), 1. - frac)
  np.add.at(m, (np.arange(n_out), hi), frac)
  return m


def resize_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) bilinear resize as ``tf.image.resize(method='bilinear')`` does it: half-pixel
  centres, edges clamped, no antialiasing (the resize of big_vision's input pipelines)."""
  pos = np.maximum((np.arange(n_out) + .5) * (n_in / n_out) - .5, 0.)
  lo = np.minimum(np.floor(pos).astype(int), n_in - 1)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = pos - np.floor(pos)
  m = np.zeros((n_out, n_in))
  np.add.at(m, (np.arange(n_out), lo), 1. - frac)
  np.add.at(m, (np.arange(n_out), hi), frac)
  return m


@functools.lru_cache(maxsize=64)
def pinv_resize_matrix(old: tuple[int, int], new: tuple[int, int]) -> np.ndarray:
  """(new_h * new_w, old_h * old_w) float64: pinv(B^T), with B the bilinear resize of an
  ``old`` patch to ``new`` (``resize_matrix``, row-major pixels). The resampled kernel is this
  times the flattened kernel: the least-squares solution of <B x, k'> = <x, k> for every patch
  x (FlexiViT's PI-resize; big_vision's ``resample_patchemb``)."""
  resize = np.kron(resize_matrix(old[0], new[0]), resize_matrix(old[1], new[1]))
  matrix = np.linalg.pinv(resize.T)
  matrix.setflags(write=False)  # Cached: shared by every caller.
  return matrix


def resample_patchemb(kernel: Array, new_patch: int | tuple[int, int]) -> Array:
  """A (h, w, in, out) patch-embedding kernel at ``new_patch`` pixels (jax, differentiable: a
  fixed linear map of ``kernel``, computed in its dtype)."""
  (h, w), (nh, nw) = kernel.shape[:2], pair(new_patch)
  if (h, w) == (nh, nw):
    return kernel
  matrix = jnp.asarray(pinv_resize_matrix((h, w), (nh, nw)), kernel.dtype)
  flat = kernel.reshape(h * w, -1)
  return (matrix @ flat).reshape(nh, nw, *kernel.shape[2:])


def resize_posemb(posemb: Array, old_grid: tuple[int, int], new_grid: tuple[int, int],
                  prefix_rows: int) -> Array:
  """(1, prefix + h*w, D) position embeddings at ``new_grid`` (jax, differentiable): the
  patches' rows resized bilinearly with aligned corners (``interpolation_matrix``), the
  ``prefix_rows`` (class token, ...) kept as they are."""
  if tuple(old_grid) == tuple(new_grid):
    return posemb
  prefix, patches = posemb[:, :prefix_rows], posemb[0, prefix_rows:]
  grid = patches.reshape(*old_grid, patches.shape[-1])
  rows = jnp.asarray(interpolation_matrix(old_grid[0], new_grid[0]), posemb.dtype)
  cols = jnp.asarray(interpolation_matrix(old_grid[1], new_grid[1]), posemb.dtype)
  grid = jnp.einsum('ih,jw,hwd->ijd', rows, cols, grid)
  return jnp.concatenate([prefix, grid.reshape(1, -1, grid.shape[-1])], axis=1)


def check(model: nn.Module, patch_sizes: tuple[int, ...]) -> str:
  """'' where ``model`` can run at each of ``patch_sizes``, else what is wrong: a hybrid or
  a masked-patch-prediction model, or a patch size that does not tile its ``image_size``."""
  if model.resnet_layers is not None:
    return 'a hybrid embeds patches of the ResNet stem\'s features: FlexiViT needs a plain ViT'
  if model.mpp_outputs:
    return 'masked patch prediction predicts patches of the model\'s own patch size'
  size = pair(model.image_size)
  bad = [p for p in patch_sizes if size[0] % p or size[1] % p]
  if bad:
    return (f'{", ".join(map(str, bad))} do{"es" if len(bad) == 1 else ""} not tile the '
            f'{size[0]}x{size[1]} images (config.model.image_size): give divisors of its sides')
  return ''


@dataclasses.dataclass(frozen=True)
class AtPatchSize:
  """``base`` (a ``VisionTransformer``) run at ``patch_size`` on its own parameters: ``apply``
  takes the base's variables, as ``base.apply`` does, and resamples them inside the forward
  pass (``params``); the same images (``base.image_size``), another grid."""

  base: nn.Module
  patch_size: int

  @property
  def module(self) -> nn.Module:
    """The plain model at ``patch_size``: what ``params`` are the parameters of."""
    return self.base.clone(patch_size=self.patch_size)

  def params(self, params: Any) -> Any:
    """The base's parameters at ``patch_size``: the patch embedding resampled, learned
    position embeddings resized to the new grid; the rest as they are."""
    flat = traverse_util.flatten_dict(params)
    flat[PATCHEMB] = resample_patchemb(flat[PATCHEMB], self.patch_size)
    if POSEMB in flat:
      flat[POSEMB] = resize_posemb(flat[POSEMB], self.base.grid, self.module.grid,
                                   self.base.posemb_prefix_rows)
    return traverse_util.unflatten_dict(flat)

  def apply(self, variables: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    return self.module.apply({**variables, 'params': self.params(variables['params'])},
                             *args, **kwargs)


def at_patch_size(model: nn.Module, patch_size: int | None) -> Any:
  """``model`` at ``patch_size`` on its own parameters (``AtPatchSize``); itself where that
  is its own patch size or None."""
  if patch_size is None or pair(patch_size) == pair(model.patch_size):
    return model
  return AtPatchSize(model, int(patch_size))


def draw(seed: int, step: int, patch_sizes: tuple[int, ...],
         probabilities: tuple[float, ...] = ()) -> int:
  """The patch size of training step ``step`` (1-based): drawn from ``patch_sizes`` (uniformly,
  or with ``probabilities``) by a generator of (seed, step) alone, so a resumed or rewound run
  draws the same sizes as one that never stopped."""
  rng = np.random.default_rng([seed % 2**64, step, 0xF1E])  # 0xF1E: this draw's stream.
  p = np.asarray(probabilities, np.float64) if probabilities else None
  return int(patch_sizes[rng.choice(len(patch_sizes), p=None if p is None else p / p.sum())])
