r"""Evaluate a finished run with any of its evaluators (``config.evals``), or any checkpoint.

    python -m vit_jax.evaluate --workdir=DIR [--step=N] [--ema] [--evals=eval,fewshot] \
        [--split=SPLIT]
    python -m vit_jax.evaluate --source=SOURCE --config=configs/FILE.py [--config.FIELD=...]
    python -m vit_jax.evaluate --workdir=DIR --patch_sizes=8,16,32   # or with --source

``--patch_sizes`` evaluates the checkpoint at each patch size (FlexiViT: its patch embedding
resampled, its position embeddings resized to the grid; the same input size) and prints a
table of the evaluators' headline metrics against the forward pass's GFLOPs per image.

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

from absl import flags

from vit_jax.base import console, errors, paths
from vit_jax.checkpoints.run import record
from vit_jax.config import cli as config_cli

# Help of the flags that name a checkpoint, shared with vit_jax.fewshot and vit_jax.tools.export.
SOURCE_HELP = ('Any other checkpoint (instead of --workdir): a .npz file, a timm or transformers '
               'folder, hf-hub:ORG/NAME, a big_vision tensorstore folder.')
NONFINITE_HELP = ('a checkpoint that holds NaN or infinity (its run diverged), with a warning, '
                  'instead of refusing it.')


def _define_flags() -> dict[str, Any]:
  """The command line's flags (defined when run as a program, not when imported)."""
  f = flags
  defined = dict(
      workdir=paths.DEFINE_path('workdir', None, 'The workdir of a vit_jax.main run.'),
      source=paths.DEFINE_path('source', None, SOURCE_HELP + ' Evaluated with --config.'),
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
      allow_nonfinite=f.DEFINE_bool('allow_nonfinite', False, 'Evaluate ' + NONFINITE_HELP),
      patch_sizes=f.DEFINE_list('patch_sizes', None, 'Evaluate at each of these patch sizes '
                                '(FlexiViT: the patch embedding resampled; e.g. 8,16,32), a '
                                'table of the metrics against the GFLOPs per image.'),
  )
  return defined


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  directory, source = flags_['workdir'].value, flags_['source'].value
  patch_sizes = _patch_sizes(flags_['patch_sizes'].value)
  if not directory and not source:
    raise errors.ConfigError('--workdir is required: a run\'s workdir (or --source=SOURCE '
                             'with --config=FILE: another checkpoint).')
  if directory and source:
    raise errors.ConfigError('Give one of --workdir (a run) and --source (another checkpoint).')
  if source:
    config = _source_config(source, flags_)
  elif flags_['config'].file.value:
    raise errors.ConfigError('--config is for --source; a workdir\'s config.json is its own.')
  else:
    paths.run_dir(directory)  # Before the model and the data pipeline start.
    config = record.load_config(directory)
  if flags_['split'].value:
    config.dataset.eval_split = flags_['split'].value
  _check_names(flags_['evals'].value, config,
               'the config\'s evals' if source else 'the run\'s config.evals')
  _evaluate(config, source or directory, flags_, patch_sizes)


def _patch_sizes(values: list[str] | None) -> list[int] | None:
  """``--patch_sizes``: positive integers, each once."""
  if values is None:
    return None
  given = ','.join(values)
  if not values or not all(v.strip().isdigit() and int(v) > 0 for v in values):
    raise errors.ConfigError(f'--patch_sizes={given}: give positive integers, e.g. '
                             '--patch_sizes=8,16,32.')
  sizes = [int(v) for v in values]
  if len(set(sizes)) != len(sizes):
    raise errors.ConfigError(f'--patch_sizes={given} names a patch size twice: give each once.')
  return sizes


def _source_config(source: str, flags_: dict[str, Any]) -> Any:
  """``--source`` with ``--config``: the config whose model holds the checkpoint, and whose
  evaluators measure it."""
  if flags_['ema'].value:
    raise errors.ConfigError('--ema is for --workdir: another checkpoint holds one set of '
                             'weights.')
  config = flags_['config'].value  # Its errors first (a ConfigError names the field).
  if not source.startswith('hf-hub:'):
    paths.input_path(source, 'source', 'checkpoint')
  return config


def _check_names(names: list[str] | None, config: Any, what: str) -> None:
  if names and (unknown := sorted(set(names) - set(config.evals))):
    raise errors.ConfigError(f'--evals: {", ".join(unknown)} not in {what} '
                             f'({", ".join(config.evals) or "none"}).')


def _evaluate(config: Any, checkpoint: str, flags_: dict[str, Any],
              patch_sizes: list[int] | None = None) -> None:
  """Prints the metrics of the evaluators of ``config`` on ``checkpoint``: a run's workdir
  (``--workdir``) or another checkpoint (``--source``); at each of ``patch_sizes``, a table."""
  if not flags.FLAGS['verbosity'].present:  # absl's prefixes, Orbax's INFO lines: --verbosity.
    console.plain_console()
    console.quiet_third_party()
  from vit_jax import evaluation  # The work: jax from here on (the command line is checked).

  if patch_sizes:
    rows = evaluation.at_patch_sizes(
        config, checkpoint, flags_['step'].value, patch_sizes,
        source=bool(flags_['source'].value), ema=flags_['ema'].value,
        allow_nonfinite=flags_['allow_nonfinite'].value, names=flags_['evals'].value,
        progress_every=flags_['progress_every'].value)
    print(f'{checkpoint} at {len(rows)} patch sizes:')
    print(evaluation.patch_size_table(rows), flush=True)
    return

  params, name = evaluation.checkpoint_params(
      config, checkpoint, flags_['step'].value, source=bool(flags_['source'].value),
      ema=flags_['ema'].value, allow_nonfinite=flags_['allow_nonfinite'].value)
  for evaluator, metrics in evaluation.evaluate_params(config, params, flags_['evals'].value,
                                                       flags_['progress_every'].value):
    print(f'{name}, {evaluator.name}: {evaluator.describe(metrics)}', flush=True)


if __name__ == '__main__':
  config_cli.run(functools.partial(main, flags_=_define_flags()), arguments=False)
