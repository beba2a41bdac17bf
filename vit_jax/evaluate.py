r"""Evaluation: top-1 accuracy (precision@1 for multi-label data) and loss, every example once.

    python -m vit_jax.evaluate --workdir=DIR [--step=N] [--split=SPLIT] [--ema]

The one evaluation path: ``Evaluator`` holds a run's eval step, its batches and its
metric's name, and training, ``python -m vit_jax.tools.export --evaluate`` and this
command all evaluate through it. Batches come padded with a 0/1 ``mask``
(``vit_jax.data.loader.eval_batches``); the step returns masked sums, so padding never
counts and the result does not depend on the batch size or the number of processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags

from vit_jax.base import console, errors, sharding
from vit_jax.data import loader
from vit_jax.training import optim

if TYPE_CHECKING:
  from vit_jax.training.train import Plan


def metric_name(loss: str) -> str:
  """'prec@1' for multi-label data (a sigmoid loss), else 'accuracy'."""
  return 'prec@1' if loss == 'sigmoid_xent' else 'accuracy'


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


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """A run's evaluation, built once from its plan: the step, the batches, the metric."""

  plan: Plan
  step: Callable
  param_shardings: Any
  metric: str

  def batches(self) -> Iterator[dict[str, Any]]:
    """The evaluation split, every example once, in padded global batches."""
    plan = self.plan
    return loader.eval_batches(
        plan.eval_source, plan.pp_eval, global_batch_size=plan.config.eval_batch_size,
        sharding=sharding.batch_sharding(plan.mesh), num_classes=plan.num_classes,
        num_workers=plan.config.input_workers)

  def __call__(self, params: Any, progress: str | None = None,
               progress_every: float = 10.) -> dict[str, float]:
    """{metric, 'loss', 'examples'} of ``params`` (placed on ``param_shardings``).

    ``progress``: a name for progress lines on stderr (done, rate, ETA), one every
    ``progress_every`` seconds and a closing one.
    """
    meter = progress and console.Progress(progress, len(self.plan.eval_source),
                                          every=progress_every)
    result = evaluate(self.step, params, self.batches(), self.metric,
                      on_batch=meter and meter.update)
    if meter:
      meter.finish(int(result['examples']))
    return result


def make_evaluator(plan: Plan, param_shardings: Any) -> Evaluator:
  """The evaluation of ``plan`` (``train.validate``'s) for parameters on ``param_shardings``:
  the classifier's, or for masked patch prediction the corrupted patches' colours
  (``vit_jax.models.mpp``; metric 'color_accuracy')."""
  shardings = (param_shardings, sharding.batch_sharding(plan.mesh),
               sharding.replicated(plan.mesh))
  if plan.config.objective == 'mpp':
    from vit_jax.models import mpp

    return Evaluator(plan, mpp.make_eval_step(plan.model, plan.config, *shardings),
                     param_shardings, mpp.METRIC)
  step = make_eval_step(plan.model, plan.config.loss, *shardings)
  return Evaluator(plan, step, param_shardings, metric_name(plan.config.loss))


def evaluate_params(config: ml_collections.ConfigDict, params: Any, progress: str | None = None,
                    progress_every: float = 10.) -> dict[str, float]:
  """Evaluates ``params`` (host arrays, model layout) with a run's config, on its eval split."""
  from vit_jax.training import train

  plan = train.validate(config)
  shardings = sharding.shardings_for(params, plan.mesh)
  evaluator = make_evaluator(plan, shardings)
  return evaluator(jax.device_put(params, shardings), progress, progress_every)


def format_result(name: str, result: dict[str, float]) -> str:
  """'{name}: accuracy 0.9861, loss 0.0512 (360 examples)'."""
  metric = next(iter(result))
  return (f'{name}: {metric} {result[metric]:.4f}, loss {result["loss"]:.4f} '
          f'({int(result["examples"])} examples)')


def _define_flags() -> dict[str, Any]:
  """The command line's flags (defined when run as a program: training imports this module)."""
  flags.DEFINE_string('workdir', None, 'The workdir of a vit_jax.main run.')
  flags.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).')
  flags.DEFINE_string('split', None, 'The split to evaluate (default: the run\'s '
                      'config.dataset.eval_split).')
  flags.DEFINE_bool('ema', False, 'Evaluate the weights\' moving average (a run with '
                    'config.optimizer.ema_decay) instead of the weights.')
  flags.DEFINE_float('progress_every', 10., 'Seconds between the progress lines.')
  flags.mark_flags_as_required(['workdir'])
  return flags.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  from vit_jax.base import paths
  from vit_jax.checkpoints import workdir as workdir_lib

  paths.run_dir(flags.FLAGS.workdir)  # Before the model and the data pipeline start.

  if not flags.FLAGS['verbosity'].present:  # Orbax's INFO lines only with --verbosity.
    console.quiet_third_party()
  directory = flags.FLAGS.workdir
  config = workdir_lib.load_config(directory)
  if flags.FLAGS.split:
    config.dataset.eval_split = flags.FLAGS.split
  ema = flags.FLAGS.ema
  params, step = workdir_lib.restore_params(directory, flags.FLAGS.step, ema=ema)
  name = f'step {step}{" (EMA)" if ema else ""}'
  result = evaluate_params(config, params, f'evaluating {name}', flags.FLAGS.progress_every)
  print(format_result(f'{directory} {name}, split {config.dataset.eval_split}', result))


if __name__ == '__main__':
  _define_flags()
  errors.run(main)
