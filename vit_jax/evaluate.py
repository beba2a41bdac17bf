r"""Evaluate a finished run with any of its evaluators (``config.evals``), or any checkpoint.

    python -m vit_jax.evaluate --workdir=DIR [--step=N] [--ema] [--evals=eval,fewshot] \
        [--split=SPLIT]
    python -m vit_jax.evaluate --source=SOURCE --config=configs/FILE.py [--config.FIELD=...]

The run's own evaluators, built from its ``config.json`` as training builds them
(``vit_jax.evals``), on a checkpoint's parameters (the latest, or ``--step``; ``--ema``: their
moving average), verified against the checksums recorded when it was written.

``--source`` evaluates any other checkpoint (a .npz file, a timm or transformers folder,
``hf-hub:ORG/NAME``, a big_vision tensorstore folder: docs/checkpoints.md) with the data and
evaluators of ``--config``, whose ``config.model`` must describe the checkpoint (its classifier
is kept: ``init_keep_head``): the parameters are those a fine-tune from it
(``config.init_from``) would start with.
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
  evaluators = evals.from_config(evals.Context.from_plan(plan), names)
  params = jax.device_put(params, sharding.shardings_for(params, plan.mesh))
  out = []
  for evaluator in evaluators:
    evaluator.progress = progress_every
    if what:
      evaluator.progress_label = f'evaluating {what} ({evaluator.name})'
    out.append((evaluator, evaluator.run(params)))
  return out


def source_params(config: ml_collections.ConfigDict, source: str, step: int | None = None
                  ) -> Any:
  """The parameters of any checkpoint in ``config``'s model, its classifier kept (as a
  fine-tune from it with ``init_keep_head`` starts)."""
  import jax
  import numpy as np

  from vit_jax.checkpoints.run import workdir as workdir_lib
  from vit_jax.training import plan as plan_lib

  plan = plan_lib.validate(for_evaluation(config))
  model = plan.model
  init = jax.eval_shape(model.init, jax.random.key(0),
                        jax.ShapeDtypeStruct((1, *model.image_size, 3), np.float32))['params']
  return workdir_lib.init_params_from(
      source, init, model, step=step, keep_head=True, source_grid=config.init_source_grid,
      source_pool=config.init_source_pool)


def _define_flags() -> dict[str, Any]:
  """The command line's flags (defined when run as a program, not when imported)."""
  from vit_jax.config import cli as config_cli

  f = flags
  defined = dict(
      workdir=paths.DEFINE_path('workdir', None, 'The workdir of a vit_jax.main run.'),
      source=paths.DEFINE_path('source', None, 'Another checkpoint (instead of --workdir), '
                               'evaluated with --config: a .npz file, a timm or transformers '
                               'folder, hf-hub:ORG/NAME, a big_vision tensorstore folder.'),
      config=config_cli.DEFINE_config('config', '--source: the config whose model, data and '
                                      'evaluators to use.'),
      step=f.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).'),
      evals=f.DEFINE_list('evals', None, 'Names in the run\'s config.evals (default: all).'),
      split=f.DEFINE_string('split', None, 'The split to evaluate (default: the run\'s '
                            'config.dataset.eval_split).'),
      ema=f.DEFINE_bool('ema', False, 'Evaluate the weights\' moving average (a run with '
                        'config.optimizer.ema_decay) instead of the weights.'),
      progress_every=f.DEFINE_float('progress_every', 10., 'Seconds between the progress '
                                    'lines.'),
      allow_nonfinite=f.DEFINE_bool('allow_nonfinite', False, 'Evaluate a checkpoint that '
                                    'holds NaN or infinity (its run diverged), with a warning, '
                                    'instead of refusing it.'),
  )
  return defined


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  directory, source = flags_['workdir'].value, flags_['source'].value
  if not directory and not source:
    raise errors.ConfigError('--workdir is required: a run\'s workdir (or --source=SOURCE '
                             'with --config=FILE: another checkpoint).')
  if directory and source:
    raise errors.ConfigError('Give one of --workdir (a run) and --source (another checkpoint).')
  if source:
    return _evaluate_source(source, flags_)
  if flags_['config'].file.value:
    raise errors.ConfigError('--config is for --source; a workdir\'s config.json is its own.')
  paths.run_dir(directory)  # Before the model and the data pipeline start.
  from vit_jax.checkpoints.run import workdir as workdir_lib

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
  params, step = workdir_lib.restore_params(directory, flags_['step'].value, ema=ema,
                                            allow_nonfinite=flags_['allow_nonfinite'].value)
  name = f'step {step}{" (EMA)" if ema else ""}'
  for evaluator, metrics in evaluate_params(config, params, names,
                                            flags_['progress_every'].value):
    print(f'{directory} {name}, {evaluator.name}: {evaluator.describe(metrics)}', flush=True)


def _evaluate_source(source: str, flags_: dict[str, Any]) -> None:
  """``--source`` with ``--config``: the checkpoint in the config's model, its evaluators."""
  if flags_['ema'].value:
    raise errors.ConfigError('--ema is for --workdir: another checkpoint holds one set of '
                             'weights.')
  config = flags_['config'].value  # Its errors first (a ConfigError names the field).
  if not source.startswith('hf-hub:'):
    paths.input_path(source, 'source', 'checkpoint')
  if not flags.FLAGS['verbosity'].present:
    console.quiet_third_party()
  if flags_['split'].value:
    config.dataset.eval_split = flags_['split'].value
  names = flags_['evals'].value
  if names and (unknown := sorted(set(names) - set(config.evals))):
    raise errors.ConfigError(f'--evals: {", ".join(unknown)} not in the config\'s evals '
                             f'({", ".join(config.evals) or "none"}).')
  params = source_params(config, source, flags_['step'].value)
  for evaluator, metrics in evaluate_params(config, params, names,
                                            flags_['progress_every'].value):
    print(f'{source}, {evaluator.name}: {evaluator.describe(metrics)}', flush=True)


if __name__ == '__main__':
  from vit_jax.config import cli as config_cli

  config_cli.run(functools.partial(main, flags_=_define_flags()))
