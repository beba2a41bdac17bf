"""Classification: top-1 accuracy (precision@1 for multi-label data) and loss, every example once.

By default on the run's own eval split; ``dataset``/``split`` name any other with the same
classes (ImageNet-v2: ``dict(type='classification', dataset='imagenet_v2', split='test')``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.base import errors, sharding
from vit_jax.evals import base
from vit_jax.models import naflex
from vit_jax.training import optim


def metric_name(loss: str) -> str:
  """'prec@1' for multi-label data (a sigmoid loss), else 'accuracy'."""
  return 'prec@1' if loss == 'sigmoid_xent' else 'accuracy'


def make_eval_step(model: nn.Module, loss_name: str, mesh: jax.sharding.Mesh) -> Callable:
  """A jitted (params, batch) -> {'correct', 'loss', 'count'} of masked sums."""

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      logits = model.apply({'params': params}, naflex.inputs(batch), train=False)  # Constrained.
    labels, mask = batch['label'], batch['mask']
    # Precision@1: is the top-scoring class among the labels? For one-hot labels this is
    # top-1 accuracy.
    top1 = jnp.take_along_axis(labels, jnp.argmax(logits, -1)[:, None], axis=-1)[:, 0]
    loss = optim.loss_fn(loss_name, logits, labels)
    return {'correct': jnp.sum((top1 > 0) * mask), 'loss': jnp.sum(loss * mask),
            'count': jnp.sum(mask)}

  return jax.jit(eval_step, out_shardings=sharding.replicated(mesh))


class Evaluator(base.Evaluator):
  """The classifier's metric and mean loss on one split."""

  def __init__(self, name: str, every_steps: int, ctx: base.Context, source: Any, pp: Callable):
    super().__init__(name, every_steps)
    self.ctx, self.source, self.pp = ctx, source, pp
    self.metric = metric_name(ctx.config.loss)
    self.step = make_eval_step(ctx.model, ctx.config.loss, ctx.mesh)

  @classmethod
  def headline(cls, entry: ml_collections.ConfigDict, config: ml_collections.ConfigDict) -> str:
    return metric_name(config.loss)

  @classmethod
  def from_config(cls, name: str, entry: ml_collections.ConfigDict, ctx: base.Context) -> Evaluator:
    config = ctx.config
    if ctx.model.mpp_outputs:
      raise errors.ConfigError(
          f"{base.where(name)} has type 'classification', but config.objective='mpp' trains "
          f"no classifier: use --config.evals.{name}.type=mpp (the corrupted patches' colour "
          f'accuracy) or --config.evals.{name}=None.')
    dataset = entry.dataset or config.dataset.name
    split = entry.split or config.dataset.eval_split
    if dataset == config.dataset.name and (entry.data_dir in ('', config.dataset.data_dir)):
      source = (split == config.dataset.eval_split and ctx.eval_source) or base.open_source(
          base.where(name), dataset, split, config.dataset.data_dir or None)
    else:
      source = base.open_source(base.where(name), dataset, split,
                                base.data_dir(entry.data_dir, config))
    check_classes(name, source, ctx)
    pp = base.pipeline(name, entry, ctx, source, f'the first example of {dataset} {split!r}')
    return cls(name, entry.every_steps, ctx, source, pp)

  def batches(self) -> Any:
    return base.batches(self.source, self.pp, self.ctx, self.ctx.model.num_classes)

  def run(self, params: Any) -> dict[str, float]:
    """{metric, 'loss', 'examples'}."""
    totals = base.sums(self.step, params, self.batches(), base.meter(self, len(self.source)))
    return metrics(totals, self.metric)

  def describe(self, metrics: dict[str, float]) -> str:
    text = f'{self.metric} {metrics[self.metric]:.4f}'
    if 'loss' in metrics:
      text += f', loss {metrics["loss"]:.4f}'
    return text + f' ({int(metrics["examples"])} examples)'


def metrics(totals: dict[str, float], metric: str) -> dict[str, float]:
  """{metric, 'loss', 'examples'} from the eval step's summed 'correct', 'loss', 'count'."""
  count = max(totals['count'], 1.)
  return {metric: totals['correct'] / count, 'loss': totals['loss'] / count,
          'examples': totals['count']}


def check_classes(name: str, source: Any, ctx: base.Context) -> None:
  """Another split's classes are the run's: as many, and in the same order where both
  name them (else the predictions would be scored against the wrong classes)."""
  if source is ctx.eval_source:
    return
  if source.num_classes != ctx.model.num_classes:
    raise errors.ConfigError(f'{base.where(name)}: its data has {source.num_classes} classes, '
                             f'the model {ctx.model.num_classes}: evaluate on data of the run\'s '
                             'classes.')
  ours, theirs = ctx.class_names, tuple(getattr(source, 'class_names', ()))
  if ours and theirs and ours != theirs:
    raise errors.ConfigError(
        f'{base.where(name)}: the run\'s classes are not in the order of its data\'s (first: '
        f'{ours[:2]} against {theirs[:2]}), so its predictions cannot be scored on it. Train '
        'on data in that class order.')
