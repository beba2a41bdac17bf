r"""Masked patch prediction: the paper's self-supervised objective (section 4.6, appendix B.1.2).

Half of each image's patch embeddings are corrupted (``corrupt``): 80% of those replaced by
a learnable [mask] embedding, 10% by a random other patch's, 10% left as they are; the model
predicts each corrupted patch's colour (``TARGETS``; the paper's: its 3-bit mean colour, 512
classes) from its final representation. No label is read. ``config.objective='mpp'`` trains
it (``vit_jax.training``), the 'mpp' evaluator scores it (``vit_jax.evals.mpp``), and a
fine-tune from it drops the mask embedding and the head (``vit_jax.checkpoints.formats.fit``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.base import errors
from vit_jax.base.sizes import pair

BITS = 3  # Per channel: 8 levels.
COLORS = 2**(3 * BITS)  # 512 classes: r * 64 + g * 8 + b.
OBJECTIVES = ('classification', 'mpp')


@dataclasses.dataclass(frozen=True)
class Target:
  """What each corrupted patch predicts: ``cells`` x ``cells`` means of its pixels
  (None: every pixel), as 512-way 3-bit colour classes ('xent') or RGB regressed ('l2')."""

  cells: int | None
  loss: str


TARGETS = {
    'mean_color': Target(1, 'xent'),  # The paper's reported choice: one 512-way prediction.
    'color_4x4': Target(4, 'xent'),  # A 4x4 downsized patch: 16 predictions of 512 colours.
    'l2_mean_color': Target(1, 'l2'),  # The mean colour's R, G, B, with an L2 loss.
    'l2_patch': Target(None, 'l2'),  # Every pixel's R, G, B, with an L2 loss.
}


@dataclasses.dataclass(frozen=True)
class Options:
  """``config.mpp``: the target and how patches are corrupted."""

  target: str = 'mean_color'
  corrupt_rate: float = 0.5
  mask_rate: float = 0.8
  random_rate: float = 0.1

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Options | None:
    """The options of a masked-patch-prediction run, None for any other."""
    return cls(**config.mpp) if is_on(config) else None


def is_on(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` trains by masked patch prediction; checks ``config.objective``."""
  if config.objective not in OBJECTIVES:
    raise errors.ConfigError(f'config.objective={config.objective!r} is not one of '
                             f'{OBJECTIVES}.')
  return config.objective == 'mpp'


def cells_of(target: Target, patch_size: Any) -> int:
  """Cells per patch side: the target's, or the patch's side for per-pixel targets."""
  return target.cells or pair(patch_size)[0]


def outputs(options: Options, patch_size: Any) -> int:
  """The prediction head's width per patch for ``options.target``."""
  target = TARGETS[options.target]
  return cells_of(target, patch_size)**2 * (COLORS if target.loss == 'xent' else 3)


def pretraining_model(config: ml_collections.ConfigDict, model: nn.Module) -> nn.Module:
  """``model`` (built without a classifier) with the mask embedding and the prediction
  head ``config.mpp.target`` needs; a ConfigError names a field that does not fit."""
  options = Options(**config.mpp)
  check(options, model)
  return model.clone(mpp_outputs=outputs(options, model.patch_size))


def check(mpp: Options, model: nn.Module) -> None:
  """Config errors of a masked-patch-prediction run, naming the field and the fix."""
  if mpp.target not in TARGETS:
    raise errors.ConfigError(f'config.mpp.target={mpp.target!r} is not one of '
                             f'{tuple(TARGETS)}.')
  for field in ('corrupt_rate', 'mask_rate', 'random_rate'):
    if not 0 <= getattr(mpp, field) <= 1:
      raise errors.ConfigError(f'config.mpp.{field}={getattr(mpp, field)} is not a share in '
                               '[0, 1].')
  if mpp.mask_rate + mpp.random_rate > 1:
    raise errors.ConfigError(
        f'config.mpp.mask_rate + random_rate = {mpp.mask_rate + mpp.random_rate:g} is above '
        '1: the rest of the corrupted patches are left unchanged (paper: 0.8, 0.1, 0.1).')
  if model.resnet_layers is not None:
    raise errors.ConfigError(
        f'config.objective=mpp needs a plain ViT: {model.model_name} has a BiT stem, whose '
        'patches are not pixel patches with a colour to predict. Pick a ViT (e.g. b16).')
  patches = model.grid[0] * model.grid[1]
  if round(mpp.corrupt_rate * patches) < 1:
    raise errors.ConfigError(f'config.mpp.corrupt_rate={mpp.corrupt_rate} corrupts no patch '
                             f'of the {patches}: raise it (paper: 0.5).')
  ph, pw = pair(model.patch_size)
  cells = cells_of(TARGETS[mpp.target], model.patch_size)
  if ph != pw or ph % cells:
    raise errors.ConfigError(
        f'config.mpp.target={mpp.target!r} cuts each patch into {cells}x{cells} cells, but '
        f'the patches are {ph}x{pw} px: use square patches with a side divisible by {cells} '
        "or target='mean_color'.")


def patch_colors(images: jax.Array, patch_size: Any, cells: int = 1) -> jax.Array:
  """Each patch's colour on a ``cells`` x ``cells`` grid: (batch, patches, cells**2, 3).

  ``images``: NHWC in [-1, 1], as the model sees them. Each cell is the mean of its
  pixels, mapped to [0, 1]; patches in the model's order (row-major), cells likewise.
  """
  n, height, width, channels = images.shape
  ph, pw = pair(patch_size)
  gh, gw = height // ph, width // pw
  x = images[:, :gh * ph, :gw * pw].astype(jnp.float32)
  x = x.reshape(n, gh, cells, ph // cells, gw, cells, pw // cells, channels).mean(axis=(3, 6))
  x = x.transpose(0, 1, 3, 2, 4, 5).reshape(n, gh * gw, cells * cells, channels)
  return (x + 1.) / 2.


def quantise(colors: jax.Array) -> jax.Array:
  """RGB in [0, 1] (last axis) -> its 3-bit colour class in [0, 512), red most significant."""
  levels = 2**BITS
  bins = jnp.clip(jnp.floor(colors * levels), 0, levels - 1).astype(jnp.int32)
  return (bins[..., 0] * levels + bins[..., 1]) * levels + bins[..., 2]


def color_targets(images: jax.Array, patch_size: int | tuple[int, int]) -> jax.Array:
  """Each patch's 3-bit mean colour class in [0, 512): (batch, patches) int32.

  ``images`` NHWC in [-1, 1]: the mean of each channel over the patch, mapped to [0, 1]
  and cut into 8 equal bins; class r * 64 + g * 8 + b.
  """
  return quantise(patch_colors(images, patch_size, 1))[..., 0]


def corrupt(rng: jax.Array, batch: int, patches: int, *, corrupt_rate: float = 0.5,
            mask_rate: float = 0.8,
            random_rate: float = 0.1) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Which patches to corrupt and how: ``(corrupted, mask, source)``, each (batch, patches).

  ``round(corrupt_rate * patches)`` patches of each image, drawn uniformly, are corrupted;
  each of them independently takes the mask embedding (``mask_rate``), a random other
  patch's embedding of the same image (``random_rate``; ``source`` names it, uniform over
  the image's other patches), or stays as it is. ``source`` is each patch's own index
  elsewhere: the model's ``corruption=(mask, source)``.
  """
  k_pick, k_kind, k_other = jax.random.split(rng, 3)
  count = round(corrupt_rate * patches)
  ranks = jnp.argsort(jnp.argsort(jax.random.uniform(k_pick, (batch, patches)), axis=1), axis=1)
  corrupted = ranks < count
  u = jax.random.uniform(k_kind, (batch, patches))
  mask = corrupted & (u < mask_rate)
  replace = corrupted & (u >= mask_rate) & (u < mask_rate + random_rate)
  own = jnp.broadcast_to(jnp.arange(patches), (batch, patches))
  # Uniform over the other patches: draw from patches - 1 and skip one's own index.
  other = jax.random.randint(k_other, (batch, patches), 0, max(patches - 1, 1))
  other = other + (other >= own)
  source = jnp.where(replace, other, own).astype(jnp.int32)
  return corrupted, mask, source


def scores(predictions: jax.Array, images: jax.Array, target: Target,
           patch_size: Any) -> tuple[jax.Array, jax.Array]:
  """Each patch's loss and number of correct colour classes, over its cells: both
  (batch, patches). L2 predictions are scored by the colour class they fall in."""
  cells = cells_of(target, patch_size)
  colors = patch_colors(images, patch_size, cells)  # (b, n, k, 3)
  classes = quantise(colors)
  b, n = predictions.shape[:2]
  if target.loss == 'xent':
    logits = predictions.reshape(b, n, cells * cells, COLORS)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, classes).mean(-1)
    predicted = jnp.argmax(logits, -1)
  else:
    rgb = predictions.reshape(b, n, cells * cells, 3)
    loss = jnp.sum(jnp.square(rgb - colors), -1).mean(-1)
    predicted = quantise(rgb)
  return loss, jnp.mean(predicted == classes, -1)


def corruption(rng: jax.Array, images: jax.Array, model: nn.Module,
               options: Options) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``corrupt`` for a batch of ``images`` and ``model``'s patch grid."""
  grid = model.grid
  return corrupt(rng, images.shape[0], grid[0] * grid[1], corrupt_rate=options.corrupt_rate,
                 mask_rate=options.mask_rate, random_rate=options.random_rate)


def loss(model: nn.Module, options: Options, params: Any, images: jax.Array,
         rng: jax.Array) -> jax.Array:
  """The training loss: the mean over the batch's corrupted patches only.

  ``rng`` gives the corruption (folded) and the model's dropout.
  """
  corrupted, mask, source = corruption(jax.random.fold_in(rng, 0x6D7070), images, model,
                                       options)  # 'mpp'
  predictions = model.apply({'params': params}, images, train=True,
                            corruption=(mask, source), rngs={'dropout': rng})
  return masked_loss(predictions, images, corrupted, TARGETS[options.target], model.patch_size)


def masked_loss(predictions: jax.Array, images: jax.Array, corrupted: jax.Array,
                target: Target, patch_size: Any) -> jax.Array:
  """The mean loss of the ``corrupted`` patches' predictions; the others do not count.

  ``predictions``: the model's (batch, patches, outputs); ``images`` the uncorrupted
  input, whose patch colours are the targets.
  """
  per_patch, _ = scores(predictions, images, target, patch_size)
  weights = corrupted.astype(jnp.float32)
  return jnp.sum(per_patch * weights) / jnp.maximum(jnp.sum(weights), 1.)
