"""Evaluation: top-1 accuracy (precision@1 for multi-label data) and loss, every example once.

Batches come padded with a 0/1 ``mask`` (see ``vit_jax.data.loader.eval_batches``);
the step returns masked sums, so padding never counts and the result does not
depend on the batch size or the number of processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import optim, sharding


def make_eval_step(model: nn.Module, loss_name: str, param_shardings: Any,
                   batch_sharding: Any, replicated: Any) -> Callable:
  """A jitted (params, batch) -> {'correct', 'loss', 'count'} of masked sums."""

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    with jax.sharding.use_abstract_mesh(batch_sharding.mesh.abstract_mesh):
      logits = model.apply({'params': params}, batch['image'], train=False)  # Constrained.
    labels, mask = batch['label'], batch['mask']
    # Precision@1: is the top-scoring class among the labels? For one-hot labels
    # this is top-1 accuracy.
    top1 = jnp.take_along_axis(labels, jnp.argmax(logits, -1)[:, None], axis=-1)[:, 0]
    loss = optim.loss_fn(loss_name, logits, labels)
    return {'correct': jnp.sum((top1 > 0) * mask), 'loss': jnp.sum(loss * mask),
            'count': jnp.sum(mask)}

  return jax.jit(eval_step, in_shardings=(param_shardings, batch_sharding),
                 out_shardings=replicated)


def evaluate(eval_step: Callable, params: Any, batches: Iterable[dict[str, Any]],
             metric_name: str = 'accuracy',
             on_batch: Callable[[int], None] | None = None) -> dict[str, float]:
  """Runs ``eval_step`` over all batches; returns the metric and the mean loss.

  ``on_batch``: called after each batch with the number of examples counted so far.
  """
  totals = {'correct': 0., 'loss': 0., 'count': 0.}
  for batch in batches:
    for k, v in jax.device_get(eval_step(*sharding.inputs_ready((params, batch)))).items():
      totals[k] += float(np.asarray(v))
    if on_batch:
      on_batch(int(totals['count']))
  count = max(totals['count'], 1.)
  return {metric_name: totals['correct'] / count, 'loss': totals['loss'] / count,
          'examples': totals['count']}
