r"""Few-shot linear accuracy of a run's or a checkpoint file's features, as a table.

    python -m vit_jax.fewshot --workdir=/tmp/q --dataset=digits
    python -m vit_jax.fewshot --npz=ViT-B_16.npz --model=b16 --dataset=cifar100 \
        --pp='decode|resize(224)|value_range(-1, 1)'
    python -m vit_jax.fewshot --source=hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k \
        --dataset=cifar100

``--source`` (or ``--npz``) takes any checkpoint other than a workdir: a .npz file, a timm or
transformers folder, ``hf-hub:ORG/NAME`` or a big_vision tensorstore folder
(docs/checkpoints.md); its features are those its classifier reads.

The evaluator is the one training runs (``vit_jax.evals.fewshot``: big_vision's
``fewshot_lsr``); here every seed's accuracy is kept and printed as mean ± sample std. A
self-supervised run's encoder is measured by its pooled features, as the paper does.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from absl import flags

from vit_jax import config as config_lib
from vit_jax import evaluate
from vit_jax.base import console, errors, paths


def _define_flags() -> dict[str, Any]:
  """The command line's flags (defined when run as a program, not when imported)."""
  f = flags
  return dict(
      workdir=paths.DEFINE_path('workdir', None, 'A vit_jax.main run directory (or --npz).'),
      npz=paths.DEFINE_path('npz', None, 'A release or exported .npz checkpoint (or --workdir); '
                            'any SOURCE as --source.'),
      source=paths.DEFINE_path('source', None, evaluate.SOURCE_HELP),
      step=f.DEFINE_integer('step', None, '--workdir: the checkpoint step (default: latest).'),
      model=f.DEFINE_string('model', None, '--npz: the registry model (e.g. b16).'),
      image_size=f.DEFINE_integer('image_size', None, '--npz: input size in pixels.'),
      dataset=f.DEFINE_multi_string('dataset', None, 'NAME or NAME,TRAIN_SPLIT,TEST_SPLIT'
                                    '[,DATA_DIR]; repeat for more.'),
      data_dir=paths.DEFINE_path('data_dir', '', 'The data_dir of datasets that name none.'),
      pp=f.DEFINE_string('pp', None, 'Preprocessing (default: the run\'s dataset.pp_eval; '
                         'a timm or transformers checkpoint\'s own; for --npz '
                         '"decode|resize(SIZE)|value_range(-1, 1)").'),
      shots=f.DEFINE_list('shots', ['1', '5', '10', '25'], 'Shot counts.'),
      seeds=f.DEFINE_integer('seeds', 3, 'Draws of the few-shot sets.'),
      l2_reg=f.DEFINE_float('l2_reg', 2.0**10, 'The regression\'s L2 regularisation.'),
      batch_size=f.DEFINE_integer('batch_size', 256, 'Images a forward pass (a multiple of '
                                  'the devices).'),
      json=paths.DEFINE_path('json', None, 'Also write the per-seed results here.'),
      allow_nonfinite=f.DEFINE_bool('allow_nonfinite', False,
                                    '--workdir: use ' + evaluate.NONFINITE_HELP),
  )


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  """Prints the few-shot table of a run or a .npz file."""
  directory, npz = flags_['workdir'].value, flags_['npz'].value or flags_['source'].value
  if flags_['npz'].value and flags_['source'].value:
    raise errors.ConfigError('Give one of --npz and --source (the same: any checkpoint).')
  if bool(directory) == bool(npz):
    raise errors.ConfigError('Give one of --workdir (a run) and --npz or --source (another '
                             'checkpoint).')
  if directory and (flags_['model'].value or flags_['image_size'].value):
    raise errors.ConfigError('--model and --image_size are for --npz; a workdir\'s config '
                             'fixes them.')
  if npz and flags_['step'].value is not None:
    raise errors.ConfigError('--step is for --workdir; a .npz file holds one set of parameters.')
  if not flags_['dataset'].value:
    raise errors.ConfigError('--dataset is required: e.g. --dataset=digits.')
  try:
    shots = tuple(int(k) for k in flags_['shots'].value)
  except ValueError:
    raise errors.ConfigError(f'--shots={",".join(flags_["shots"].value)} must be '
                             'comma-separated ints, e.g. 1,5,10,25.') from None
  if directory:
    paths.run_dir(directory)
  elif not npz.startswith('hf-hub:'):
    paths.input_path(npz, 'source' if flags_['source'].value else 'npz', 'checkpoint')
  if flags_['json'].value:
    paths.output_path(flags_['json'].value, 'json')
  entry = dict(type='fewshot', datasets=tuple(flags_['dataset'].value), shots=shots,
               seeds=flags_['seeds'].value, l2_reg=flags_['l2_reg'].value)
  if not flags.FLAGS['verbosity'].present:  # absl's prefixes, Orbax's INFO lines: --verbosity.
    console.plain_console()
    console.quiet_third_party()
  try:  # The one evaluator of a config: its errors name the flags (below).
    config = config_lib.complete({'eval_batch_size': flags_['batch_size'].value,
                                  'evals': {'fewshot': entry}})
    config_lib.check(config)
    from vit_jax import evaluation  # The work: jax from here on (flags and paths checked above).

    loaded = evaluation.load_features(directory, npz, flags_['step'].value,
                                      flags_['allow_nonfinite'].value, flags_['model'].value,
                                      flags_['image_size'].value)
    evaluator, table = evaluation.fewshot(loaded, config, flags_['data_dir'].value,
                                          flags_['pp'].value)
  except errors.UserError as e:  # config.evals.fewshot.FIELD is the flag --FIELD.
    where = 'config.evals.fewshot.'
    raise type(e)(str(e).replace(f'{where}datasets', '--dataset').replace(where, '--')) from None
  print(f'# {loaded.model.model_name}: {evaluator.width}-d features, l2 {evaluator.l2_reg:g}, '
        f'{evaluator.seeds} seeds; accuracy % (mean ± sample std over the seeds; -: a class '
        'has fewer examples)')
  print(table, flush=True)
  if flags_['json'].value:
    paths.path(flags_['json'].value).write_text(json.dumps(
        [{'dataset': n, 'shots': k, 'accuracies': v, 'mean': sum(v) / len(v)}
         for (n, k), v in evaluator.per_seed.items()], indent=1))


if __name__ == '__main__':
  errors.run(functools.partial(main, flags_=_define_flags()), arguments=False)
