"""Mixup and CutMix: each example blended with its neighbour in the global batch, labels alike."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections

Batch = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class MixOptions:
  """``config.mixup_alpha``, ``cutmix_alpha`` and ``mixup_switch_prob``; alphas of 0: off."""

  mixup_alpha: float = 0.
  cutmix_alpha: float = 0.
  switch_prob: float = 0.5

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> MixOptions:
    return cls(config.mixup_alpha, config.cutmix_alpha, config.mixup_switch_prob)


def mixup(batch: Batch, rng: jax.Array, alpha: float) -> Batch:
  """Mixes each example with its neighbour: p * x + (1 - p) * roll(x), p ~ Beta(a, a), p >= 0.5.

  Labels are mixed alike (one-hot or multi-hot). Zhang et al., 2018.
  """
  p = jax.random.beta(rng, alpha, alpha)
  p = jnp.maximum(p, 1. - p)
  blend = lambda x: (p * x + (1. - p) * jnp.roll(x, 1, axis=0)).astype(x.dtype)
  return {**batch, 'image': blend(batch['image']), 'label': blend(batch['label'])}


def cutmix(batch: Batch, rng: jax.Array, alpha: float) -> Batch:
  """Pastes a box of each example's neighbour (``roll(x)``) into it. Yun et al., 2019.

  p ~ Beta(a, a); the box (one for the batch, as timm's) has sides sqrt(1 - p) of the
  image's around a uniform centre, clipped to the image. Labels are weighted by the
  areas as pasted: (1 - box share) own, box share the neighbour's.
  """
  height, width = batch['image'].shape[1:3]
  k_p, k_y, k_x = jax.random.split(rng, 3)
  side = jnp.sqrt(1. - jax.random.beta(k_p, alpha, alpha))

  def span(key: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    centre, half = jax.random.uniform(key, (), maxval=size), side * size / 2
    return (jnp.clip(jnp.round(centre - half), 0, size).astype(jnp.int32),
            jnp.clip(jnp.round(centre + half), 0, size).astype(jnp.int32))

  (top, bottom), (left, right) = span(k_y, height), span(k_x, width)
  rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
  box = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
  share = (bottom - top) * (right - left) / (height * width)
  image = jnp.where(box[None, :, :, None], jnp.roll(batch['image'], 1, axis=0), batch['image'])
  label = ((1. - share) * batch['label']
           + share * jnp.roll(batch['label'], 1, axis=0)).astype(batch['label'].dtype)
  return {**batch, 'image': image, 'label': label}


def mix(batch: Batch, rng: jax.Array, options: MixOptions) -> Batch:
  """Mixup and/or CutMix as configured; with both, each batch takes CutMix with
  probability ``switch_prob``, else mixup (DeiT's switch)."""
  mixup_alpha, cutmix_alpha = options.mixup_alpha, options.cutmix_alpha
  if mixup_alpha and cutmix_alpha:
    k_switch, k_mix = jax.random.split(rng)
    return jax.lax.cond(jax.random.bernoulli(k_switch, options.switch_prob),
                        lambda b: cutmix(b, k_mix, cutmix_alpha),
                        lambda b: mixup(b, k_mix, mixup_alpha), batch)
  if cutmix_alpha:
    return cutmix(batch, rng, cutmix_alpha)
  return mixup(batch, rng, mixup_alpha) if mixup_alpha else batch


def mix_global_batch(batch: Batch, step_rng: jax.Array, options: MixOptions) -> Batch:
  """``mix`` of the whole global batch with the step's key: one lambda (or box) a step, each
  example mixed with its neighbour in the global batch, whatever the mesh or step."""
  return mix(batch, jax.random.fold_in(step_rng, 0x6D697875), options)  # 'mixu'
