"""Masked patch prediction's own measure: the corrupted patches' colours predicted right.

The held-out images are corrupted as in training (``vit_jax.models.mpp``), with one fixed
key, so the number is the same whatever the step or the run; 'color_accuracy' counts the
colour classes right over the corrupted patches, 'loss' is the training loss on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.base import errors, sharding
from vit_jax.evals import base, classification
from vit_jax.models import mpp


def make_eval_step(model: nn.Module, options: mpp.Options, mesh: jax.sharding.Mesh,
                   seed: int = 0) -> Callable:
  """(params, batch) -> masked sums over the corrupted patches: 'correct' (colour classes
  right), 'loss', 'count' (corrupted patches), and 'images'."""
  target = mpp.TARGETS[options.target]

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    images = batch['image']
    corrupted, mask, source = mpp.corruption(jax.random.key(seed), images, model, options)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      predictions = model.apply({'params': params}, images, train=False,
                                corruption=(mask, source))
    per_patch, correct = mpp.scores(predictions, images, target, model.patch_size)
    weights = corrupted * batch['mask'][:, None]
    return {'correct': jnp.sum(correct * weights), 'loss': jnp.sum(per_patch * weights),
            'count': jnp.sum(weights), 'images': jnp.sum(batch['mask'])}

  return jax.jit(eval_step, out_shardings=sharding.replicated(mesh))


class Evaluator(base.Evaluator):
  """'color_accuracy' and 'loss' over the corrupted patches of a split's images."""

  metric = 'color_accuracy'

  def __init__(self, name: str, every_steps: int, ctx: base.Context, source: Any, pp: Callable):
    super().__init__(name, every_steps)
    self.ctx, self.source, self.pp = ctx, source, pp
    options = mpp.Options.from_config(ctx.config)
    self.step = make_eval_step(ctx.model, options, ctx.mesh)

  @classmethod
  def from_config(cls, name: str, entry: ml_collections.ConfigDict, ctx: base.Context) -> Evaluator:
    config = ctx.config
    if not ctx.model.mpp_outputs:
      raise errors.ConfigError(
          f"{base.where(name)} has type 'mpp', which scores masked patch prediction, but "
          f"config.objective={config.objective!r}: use type 'classification'.")
    split = entry.split or config.dataset.eval_split
    source = (split == config.dataset.eval_split and ctx.eval_source) or base.open_source(
        base.where(name), config.dataset.name, split, config.dataset.data_dir or None)
    pp = base.pipeline(name, entry, ctx, source, f'the first {split!r} example')
    return cls(name, entry.every_steps, ctx, source, pp)

  def run(self, params: Any) -> dict[str, float]:
    """{'color_accuracy', 'loss', 'examples' (images), 'patches' (corrupted, scored)}."""
    batches = base.batches(self.source, self.pp, self.ctx, 0)  # No label is read.
    totals = base.sums(self.step, params, batches, base.meter(self, len(self.source)), 'images')
    return classification.metrics(totals, self.metric) | {'examples': totals['images'],
                                                           'patches': totals['count']}

  def describe(self, metrics: dict[str, float]) -> str:
    return (f'{self.metric} {metrics[self.metric]:.4f} (masked-patch colour accuracy), loss '
            f'{metrics["loss"]:.4f} ({int(metrics["examples"]):,} images, '
            f'{int(metrics["patches"]):,} masked patches scored)')
