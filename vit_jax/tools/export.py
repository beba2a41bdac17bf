r"""Export a run's parameters as a release .npz file (the layout the released models use).

    python -m vit_jax.tools.export --workdir=DIR --out=model.npz [--step=N] [--ema] [--evaluate]

The file loads with ``vit_jax.checkpoints.release.load_npz``, in the google-research
vision_transformer code and in timm, and can be the ``init_from`` of a fine-tune. ``--ema``
exports the weights' moving average; ``--evaluate`` runs the run's classification evaluators on
the written file and on the (checksum-verified) checkpoint, to show the export is faithful.
"""

from __future__ import annotations

from absl import app, flags, logging

from vit_jax.base import errors, paths

_WORKDIR = paths.DEFINE_path('workdir', None, 'The workdir of a vit_jax.main run.')
_OUT = paths.DEFINE_path('out', None, 'The .npz file to write.')
_STEP = flags.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).')
_EMA = flags.DEFINE_bool('ema', False, 'The weights\' moving average (the run\'s '
                          'config.optimizer.ema_decay) instead of the weights.')
_EVALUATE = flags.DEFINE_bool('evaluate', False, 'Evaluate the checkpoint and the written '
                              'file on the run\'s evaluation split, and print both.')
_PROGRESS_EVERY = flags.DEFINE_float('progress_every', 10., 'Seconds between the progress '
                                     'lines (with an ETA) of --evaluate.')
flags.mark_flags_as_required(['workdir', 'out'])


def export(workdir: str, out: str, step: int | None = None, *, ema: bool = False) -> int:
  """Writes the parameters of ``workdir``'s checkpoint (latest or ``step``) to ``out``.

  ``ema``: their moving average instead (``workdir.restore_params``).
  """
  from vit_jax.checkpoints import release
  from vit_jax.checkpoints import workdir as workdir_lib

  params, step = workdir_lib.restore_params(workdir, step, ema=ema)
  release.save_npz(out, params)
  return step


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  paths.run_dir(_WORKDIR.value)  # Before jax starts.
  paths.output_path(_OUT.value, 'out')
  from vit_jax import evaluate
  from vit_jax.base import console
  from vit_jax.checkpoints import release
  from vit_jax.checkpoints import workdir as workdir_lib

  if not flags.FLAGS['verbosity'].present:  # Orbax's INFO lines only with --verbosity.
    console.quiet_third_party()
  step = export(_WORKDIR.value, _OUT.value, _STEP.value, ema=_EMA.value)
  what = 'the moving average of the parameters' if _EMA.value else 'the parameters'
  print(f'Wrote {_OUT.value}: {what} of {_WORKDIR.value} at step {step}.')
  if _EVALUATE.value:
    config = workdir_lib.load_config(_WORKDIR.value)
    params, _ = workdir_lib.restore_params(_WORKDIR.value, step, ema=_EMA.value)
    exported = release.to_model_layout(release.load_npz(_OUT.value),
                                          scanned=release.is_scanned(params))
    classifiers = [n for n, e in config.evals.items() if e.type == 'classification']
    for name, tree in (('checkpoint', params), ('exported .npz', exported)):
      for evaluator, metrics in evaluate.evaluate_params(config, tree, classifiers,
                                                         _PROGRESS_EVERY.value, f'the {name}'):
        print(f'{name:>14}, {evaluator.name}: {evaluator.describe(metrics)}', flush=True)
  logging.flush()


if __name__ == '__main__':
  errors.run(main)
