"""ImageNet ReaL and ImageNet-v2: extra evaluations of an ImageNet model, beside its top-1.

- ReaL (Beyer et al., 2020, "Are we done with ImageNet?"; the paper's table 2): the 50,000
  validation images with reassessed labels, a set of classes per image (TFDS
  ``imagenet2012_real``, split ``validation``, feature ``real_label``). A prediction is
  correct if it is in the image's set; the images whose set is empty are left out, as in
  the ReaL paper and big_vision's classification evaluator (about 3,160 of them).
- ImageNet-v2 (Recht et al., 2019): 10,000 new test images of the same 1,000 classes
  (TFDS ``imagenet_v2``, split ``test``; its default config, matched-frequency).

``config.evals.real`` / ``config.evals.v2`` turn them on; they run with every
evaluation, through the run's own eval step and ``dataset.pp_eval``, and are logged as
``eval/real/accuracy``, ``eval/v2/accuracy`` (and ``loss``, ``examples``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath

from vit_jax import evaluate
from vit_jax.base import errors, sharding
from vit_jax.data import loader, local, sources

# name in the metrics -> (TFDS name, split, label feature, examples without labels left out)
DATASETS = {'real': ('imagenet2012_real', 'validation', 'real_label', True),
            'v2': ('imagenet_v2', 'test', 'label', False)}
IMAGENET_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class ExtraEval:
  """One extra evaluation: its metric prefix, its source, and whether unlabelled rows count."""

  name: str
  source: Any
  labelled_only: bool


def from_config(config: ml_collections.ConfigDict, num_classes: int,
                class_names: tuple[str, ...], image_size: Any, pp_eval: Callable
                ) -> list[ExtraEval]:
  """The evaluations ``config.evals.real`` / ``.v2`` ask for, opened and checked.

  Raises UserErrors before anything compiles: a model that is not a 1,000-class ImageNet
  one, a dataset that is not prepared, a class order that differs from the run's data
  (the predictions would be compared with the wrong classes), a pipeline that does not
  make the model's input.
  """
  wanted = [name for name in DATASETS if config.evals[name]]
  if not wanted:
    return []
  fields = ' and '.join(f'config.evals.{n}' for n in wanted)
  if num_classes != IMAGENET_CLASSES:
    raise errors.ConfigError(f'{fields}: ImageNet ReaL and v2 evaluate a 1000-class ImageNet '
                             f'model; this one has {num_classes} classes. Turn them off.')
  data_dir = config.evals.data_dir or config.dataset.data_dir or None
  if data_dir and not config.evals.data_dir and (epath.Path(data_dir) / local.METADATA).exists():
    data_dir = None  # The run's data is in the local format: TFDS's default directory then.
  out = []
  for name in wanted:
    tfds_name, split, label_key, labelled_only = DATASETS[name]
    try:
      source = sources.TFDSSource(tfds_name, split, data_dir, label_key=label_key)
    except FileNotFoundError as e:
      raise errors.MissingFileError(f'config.evals.{name}: {e} (or set config.evals.{name}'
                                    '=False)') from None
    except ValueError as e:
      raise errors.ConfigError(f'config.evals.{name}: {e}') from None
    if class_names and tuple(class_names) != tuple(source.class_names):
      raise errors.ConfigError(
          f'config.evals.{name}: the run\'s classes are not in the order of {tfds_name}\'s '
          f'(first: {class_names[:2]} against {source.class_names[:2]}), so its predictions '
          'cannot be scored on it. Train on imagenet2012\'s class order.')
    _check_pipeline(pp_eval, source, image_size, name)
    out.append(ExtraEval(name, source, labelled_only))
  return out


def _check_pipeline(pp: Callable, source: Any, image_size: Any, name: str) -> None:
  from vit_jax.models.vit import pair

  expected = (*pair(image_size), 3)
  try:
    shape = tuple(pp(source[0]['image'], np.random.default_rng(0)).shape)
  except Exception as e:  # Any failure of the user's pipeline on the data.
    raise errors.ConfigError(f'config.dataset.pp_eval={pp.spec!r} fails on the first example '
                             f'of config.evals.{name}: {type(e).__name__}: {e}') from None
  if shape != expected:
    raise errors.ConfigError(f'config.dataset.pp_eval={pp.spec!r} makes {shape} images from '
                             f'config.evals.{name}\'s data; the model takes {expected}.')


@jax.jit
def _labelled_only(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The batch with the rows that have no label masked out (sharded like the batch)."""
  return {**batch, 'mask': batch['mask'] * (jnp.max(batch['label'], -1) > 0)}


def labelled_only(batches: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
  """``batches`` with every row whose label set is empty left out of the counts."""
  for batch in batches:
    yield _labelled_only(batch)


def evaluate_all(evals: list[ExtraEval], evaluator: evaluate.Evaluator,
                 params: Any) -> tuple[dict[str, float], str]:
  """({'real/accuracy': ..., 'v2/accuracy': ..., ...}, a text for the log line), through the
  run's own eval step and preprocessing (``evaluator``)."""
  plan, metric_name = evaluator.plan, evaluator.metric
  metrics, text = {}, ''
  for extra in evals:
    batches = loader.eval_batches(extra.source, plan.pp_eval,
                                  global_batch_size=plan.config.eval_batch_size,
                                  sharding=sharding.batch_sharding(plan.mesh),
                                  num_classes=IMAGENET_CLASSES,
                                  num_workers=plan.config.input_workers)
    if extra.labelled_only:
      batches = labelled_only(batches)
    result = evaluate.evaluate(evaluator.step, params, batches, metric_name)
    if extra.labelled_only:
      # Softmax cross-entropy against a set of labels is not a loss anyone reports.
      result.pop('loss')
    metrics.update({f'{extra.name}/{k}': v for k, v in result.items()})
    text += f'; {extra.name} {metric_name} {result[metric_name]:.4f}'
  return metrics, text
