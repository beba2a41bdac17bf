r"""Evaluate a finished run with any of its evaluators (``config.evals``).

    python -m vit_jax.evaluate --workdir=DIR [--step=N] [--ema] [--evals=eval,fewshot] \
        [--split=SPLIT]

The run's own evaluators, built from its ``config.json`` as training builds them
(``vit_jax.evals``), on a checkpoint's parameters (the latest, or ``--step``; ``--ema``: their
moving average), verified against the checksums recorded when it was written.
"""

from __future__ import annotations

import functools
from typing import Any

import ml_collections
from absl import app, flags

from vit_jax.base import console, errors, paths


def for_evaluation(config: ml_collections.ConfigDict, split: str | None = None
                   ) -> ml_collections.ConfigDict:
  """A run's config to evaluate with: where it started from no longer matters (the files
  may be gone), and ``split`` (if given) replaces its eval split."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.update(init_from='', init_step=None, init_ema=False, init_source_grid=None,
                init_source_pool=None)
  if split:
    config.dataset.eval_split = split
  return config


def evaluate_params(config: ml_collections.ConfigDict, params: Any,
                    names: list[str] | None = None, progress_every: float | None = None,
                    what: str = '') -> list[tuple[Any, dict[str, float]]]:
  """[(evaluator, metrics)] of ``params`` (host or device arrays, model layout) for the
  evaluators of a run's ``config`` (those of ``names``, default all); ``progress_every``:
  seconds between progress lines on stderr, which name ``what`` is evaluated."""
  import jax

  from vit_jax import evals
  from vit_jax.base import sharding
  from vit_jax.training import plan as plan_lib

  plan = plan_lib.validate(for_evaluation(config))
  evaluators = evals.from_config(plan, names)
  params = jax.device_put(params, sharding.shardings_for(params, plan.mesh))
  out = []
  for evaluator in evaluators:
    evaluator.progress = progress_every
    if what:
      evaluator.progress_label = f'evaluating {what} ({evaluator.name})'
    out.append((evaluator, evaluator.run(params)))
  return out


def _define_flags() -> dict[str, Any]:
  """The command line's flags (defined when run as a program, not when imported)."""
  f = flags
  defined = dict(
      workdir=paths.DEFINE_path('workdir', None, 'The workdir of a vit_jax.main run.'),
      step=f.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).'),
      evals=f.DEFINE_list('evals', None, 'Names in the run\'s config.evals (default: all).'),
      split=f.DEFINE_string('split', None, 'The split to evaluate (default: the run\'s '
                            'config.dataset.eval_split).'),
      ema=f.DEFINE_bool('ema', False, 'Evaluate the weights\' moving average (a run with '
                        'config.optimizer.ema_decay) instead of the weights.'),
      progress_every=f.DEFINE_float('progress_every', 10., 'Seconds between the progress '
                                    'lines.'),
  )
  f.mark_flags_as_required(['workdir'])
  return defined


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  directory = flags_['workdir'].value
  paths.run_dir(directory)  # Before the model and the data pipeline start.
  from vit_jax.checkpoints import workdir as workdir_lib

  if not flags.FLAGS['verbosity'].present:  # Orbax's INFO lines only with --verbosity.
    console.quiet_third_party()
  config = for_evaluation(workdir_lib.load_config(directory), flags_['split'].value)
  names = flags_['evals'].value
  if names:
    unknown = sorted(set(names) - set(config.evals))
    if unknown:
      raise errors.ConfigError(f'--evals: {", ".join(unknown)} not in the run\'s config.evals '
                               f'({", ".join(config.evals) or "none"}).')
  ema = flags_['ema'].value
  params, step = workdir_lib.restore_params(directory, flags_['step'].value, ema=ema)
  name = f'step {step}{" (EMA)" if ema else ""}'
  for evaluator, metrics in evaluate_params(config, params, names,
                                            flags_['progress_every'].value):
    print(f'{directory} {name}, {evaluator.name}: {evaluator.describe(metrics)}', flush=True)


if __name__ == '__main__':
  errors.run(functools.partial(main, flags_=_define_flags()))
