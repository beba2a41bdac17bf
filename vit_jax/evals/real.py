"""ImageNet ReaL (Beyer et al., 2020): the 50,000 validation images with reassessed label sets.

TFDS ``imagenet2012_real``, split ``validation``, feature ``real_label``. A prediction is
correct if it is in the image's set; the images whose set is empty are left out, as in the
ReaL paper and big_vision's evaluator (about 3,160 of them). The paper's table 2 reports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.base import errors
from vit_jax.evals import base, classification

TFDS_NAME, SPLIT, LABELS = 'imagenet2012_real', 'validation', 'real_label'
IMAGENET_CLASSES = 1000


class Evaluator(classification.Evaluator):
  """The classifier's ReaL accuracy: is its top class in the image's label set?"""

  @classmethod
  def from_config(cls, name: str, entry: ml_collections.ConfigDict, ctx: base.Context) -> Evaluator:
    if ctx.model.mpp_outputs or ctx.model.num_classes != IMAGENET_CLASSES:
      raise errors.ConfigError(
          f"{base.where(name)}: ImageNet ReaL evaluates a 1000-class ImageNet classifier; this "
          f'model has {ctx.model.num_classes} classes. Remove it (--config.evals.{name}=None).')
    source = base.open_source(base.where(name), TFDS_NAME, SPLIT,
                              base.data_dir(entry.data_dir, ctx.config), label_key=LABELS)
    classification.check_classes(name, source, ctx)
    pp = base.pipeline(name, entry, ctx, source, f'the first example of {TFDS_NAME}')
    return cls(name, entry.every_steps, ctx, source, pp)

  def batches(self) -> Iterator[dict[str, Any]]:
    """The split's batches with every row whose label set is empty left out of the counts."""
    return map(_labelled_only, super().batches())

  def run(self, params: Any) -> dict[str, float]:
    result = super().run(params)
    # Softmax cross-entropy against a set of labels is not a loss anyone reports.
    result.pop('loss')
    return result


@jax.jit
def _labelled_only(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The batch with the rows that have no label masked out (sharded like the batch)."""
  return {**batch, 'mask': batch['mask'] * (jnp.max(batch['label'], -1) > 0)}
