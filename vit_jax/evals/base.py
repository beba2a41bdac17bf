"""The evaluator interface, and what the evaluators of one split of images share.

An evaluator has a name (its entry in ``config.evals``, the prefix of its metrics), knows
when it is due, and ``run(params)`` returns named metrics; ``from_config(name, entry, ctx)``
builds it from what it takes of a run (a ``Context``: a training plan's, a loaded checkpoint's)
and refuses, before anything compiles, what it cannot evaluate.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from etils import epath

from vit_jax.base import console, errors, sharding
from vit_jax.base.sizes import pair
from vit_jax.data import loader, local, preprocess, sources
from vit_jax.models import naflex

if TYPE_CHECKING:
  from vit_jax.checkpoints.formats.layout import Loaded
  from vit_jax.training.plan import Plan


@dataclasses.dataclass(frozen=True)
class Context:
  """What evaluators take of a run: the model (applied to a batch by ``model.apply``, each
  evaluator to its own output: logits, features, masked patches), the device mesh, the
  default preprocessing, and the config (its ``evals``, the data they read, the batch)."""

  config: ml_collections.ConfigDict  # Complete, with eval_batch_size set.
  model: nn.Module
  mesh: jax.sharding.Mesh
  pp_eval: preprocess.Pipeline
  eval_source: Any = None  # The run's eval split where it is open (None: opened if needed).
  class_names: tuple[str, ...] = ()  # The model's classes, where known.
  data_dir: str = ''  # Where the few-shot datasets that name none are read ('': TFDS's).

  @classmethod
  def from_plan(cls, plan: Plan) -> Context:
    """A training run's."""
    return cls(plan.config, plan.model, plan.mesh, plan.pp_eval, plan.eval_source,
               plan.class_names)

  @classmethod
  def from_loaded(cls, loaded: Loaded, config: ml_collections.ConfigDict, **fields: Any) -> Context:
    """A loaded checkpoint's (``vit_jax.checkpoints.load``) on all devices, with ``config``;
    its preprocessing the run's (a workdir's), else the checkpoint's own (``EvalSpec``: timm's,
    transformers', or the releases' resize into [-1, 1])."""
    pp = (loaded.config.dataset.pp_eval if loaded.config else
          loaded.preprocessing.spec(pair(loaded.model.image_size)))
    return cls(config, loaded.model, sharding.make_mesh(), preprocess.parse(pp),
               class_names=tuple(loaded.class_names), **fields)


class Evaluator(abc.ABC):
  """One evaluation of a run's parameters (the weights, or their moving average)."""

  metric: str  # The headline metric: its key in ``run``'s result.

  def __init__(self, name: str, every_steps: int = 0):
    self.name = name
    self.every_steps = every_steps  # 0: with config.eval_every_steps.
    self.progress: float | None = None  # Seconds between progress lines on stderr; None: off.
    self.progress_label = f'evaluating {name}'  # What the progress lines say.

  @classmethod
  @abc.abstractmethod
  def from_config(cls, name: str, entry: ml_collections.ConfigDict, ctx: Context) -> Evaluator:
    """The evaluator of ``config.evals.<name>`` for a run, checked (a ConfigError if not)."""

  @classmethod
  def headline(cls, entry: ml_collections.ConfigDict, config: ml_collections.ConfigDict) -> str:
    """``metric`` of the evaluator ``entry`` of ``config``, unbuilt (for its metrics.jsonl)."""
    return cls.metric

  @abc.abstractmethod
  def run(self, params: Any) -> dict[str, float]:
    """Named metrics of ``params`` (in the model's layout, on the run's devices)."""

  def due(self, step: int, total_steps: int, eval_every_steps: int) -> bool:
    """At every ``every_steps`` (0: ``eval_every_steps``) and at the last step."""
    every = self.every_steps or eval_every_steps
    return step == total_steps or bool(every and step % every == 0)

  def describe(self, metrics: dict[str, float]) -> str:
    """``metrics`` for a log line."""
    return ', '.join(f'{k} {v:.4f}' for k, v in metrics.items())


def where(name: str, field: str = '') -> str:
  """``config.evals.NAME[.FIELD]``: how errors name an entry."""
  return f'config.evals.{name}' + (f'.{field}' if field else '')


def pipeline(name: str, entry: ml_collections.ConfigDict, ctx: Context, source: Any,
             what: str) -> preprocess.Pipeline:
  """The entry's ``pp`` (or the run's ``dataset.pp_eval``), checked to make the model's input
  from ``source``'s first example (``what`` names it in the error)."""
  pp, field = ctx.pp_eval, 'config.dataset.pp_eval'
  if entry.pp:
    field = where(name, 'pp')
    try:
      pp = preprocess.parse(entry.pp)
    except ValueError as e:
      raise errors.ConfigError(f'{field}: {e}') from None
  preprocess.check_output(pp, source[0]['image'], pair(ctx.model.image_size), field, what,
                          naflex.patch_size_of(ctx.model))
  return pp


def data_dir(entry_dir: str, config: ml_collections.ConfigDict) -> str | None:
  """Where another dataset than the run's is read: the entry's ``data_dir``, else the run's
  TFDS data_dir (TFDS's default where the run's data is in the local format)."""
  if entry_dir:
    return entry_dir
  run_dir = config.dataset.data_dir
  if not run_dir or (epath.Path(run_dir) / local.METADATA).exists():
    return None
  return run_dir


def open_source(what: str, dataset: str, split: str, directory: str | None,
                label_key: str | None = None) -> Any:
  """A split of any dataset as a source (TFDS's with another ``label_key``); its errors
  begin with ``what`` (e.g. ``config.evals.NAME``)."""
  spec = ml_collections.ConfigDict(dict(name=dataset, data_dir=directory or '',
                                        manual_dir='', prepare=False))
  try:
    if label_key:
      return sources.TFDSSource(dataset, split, directory, label_key=label_key)
    return sources.get_source(spec, split)
  except FileNotFoundError as e:
    raise errors.MissingFileError(f'{what}: {e}') from None
  except ValueError as e:
    raise errors.ConfigError(f'{what}: {e}') from None


def batches(source: Any, pp: Callable, ctx: Context, num_classes: int) -> Iterable[dict[str, Any]]:
  """Every example of ``source`` once, in padded global batches with a 0/1 'mask'."""
  return loader.eval_batches(source, pp, global_batch_size=ctx.config.eval_batch_size,
                             sharding=sharding.batch_sharding(ctx.mesh),
                             num_classes=num_classes, num_workers=ctx.config.input_workers)


def sums(step: Callable, params: Any, batches: Iterable[dict[str, Any]],
         progress: console.Progress | None = None, count: str = 'count') -> dict[str, float]:
  """The totals of ``step``'s masked sums over ``batches`` (padding never counts, so the
  result does not depend on the batch size or the number of processes); ``progress`` follows
  the ``count`` total to its end."""
  totals: dict[str, float] = {}
  for batch in batches:
    for k, v in jax.device_get(step(*sharding.inputs_ready((params, batch)))).items():
      totals[k] = totals.get(k, 0.) + float(np.asarray(v))
    if progress:
      progress.update(int(totals[count]))
  if progress:
    progress.finish(int(totals[count]))
  return totals


def meter(evaluator: Evaluator, total: int) -> console.Progress | None:
  """Progress lines for ``total`` examples where the evaluator was asked for them."""
  if evaluator.progress is None:
    return None
  return console.Progress(evaluator.progress_label, total, every=evaluator.progress)
