r"""Export a run's parameters (or any checkpoint's) as a release .npz file, a timm or a
transformers folder.

    python -m vit_jax.tools.export --workdir=DIR --out=model.npz [--step=N] [--ema] [--evaluate]
    python -m vit_jax.tools.export --workdir=DIR --format=timm --out=DIR/timm
    python -m vit_jax.tools.export --source=hf-hub:ORG/NAME --format=npz --out=model.npz

``--format=npz`` (the default): a release file, which loads with
``vit_jax.checkpoints.formats.release.load_npz``, in the google-research vision_transformer code
and in timm, and can be the ``init_from`` of a fine-tune. ``--format=timm`` / ``transformers``: a
folder (config.json with the architecture and the run's class names, model.safetensors) that
``timm.create_model('local-dir:DIR', pretrained=True)`` / ``ViTForImageClassification.
from_pretrained(DIR)`` loads; what a format cannot express is refused in one line naming the
option (docs/checkpoints.md). ``--source`` exports any other checkpoint instead of a run's.
``--ema`` exports the weights' moving average; ``--evaluate`` runs the run's classification
evaluators on the written export and on the (checksum-verified) checkpoint, to show the export
is faithful (for ``--source``: compares their logits on random images).
"""

from __future__ import annotations

from absl import flags, logging

from vit_jax import checkpoints, evaluate
from vit_jax.base import console, errors, paths

FORMATS = ('npz', 'timm', 'transformers')
_WORKDIR = paths.DEFINE_path('workdir', None, 'The workdir of a vit_jax.main run.')
_SOURCE = paths.DEFINE_path('source', None, evaluate.SOURCE_HELP)
_OUT = paths.DEFINE_path('out', None, 'The .npz file (--format=npz) or the folder to write.')
_FORMAT = flags.DEFINE_enum('format', 'npz', FORMATS, 'What to write: a release .npz file, or '
                            'a folder timm or transformers loads.')
_STEP = flags.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).')
_EMA = flags.DEFINE_bool('ema', False, 'The weights\' moving average (the run\'s '
                          'config.optimizer.ema_decay) instead of the weights.')
_EVALUATE = flags.DEFINE_bool('evaluate', False, 'Evaluate the checkpoint and the written '
                              'export on the run\'s evaluation split, and print both.')
_PROGRESS_EVERY = flags.DEFINE_float('progress_every', 10., 'Seconds between the progress '
                                     'lines (with an ETA) of --evaluate.')
_ALLOW_NONFINITE = flags.DEFINE_bool('allow_nonfinite', False,
                                     'Export ' + evaluate.NONFINITE_HELP)
flags.mark_flags_as_required(['out'])


def export(workdir: str, out: str, step: int | None = None, *, ema: bool = False,
           format: str = 'npz', allow_nonfinite: bool = False) -> int:
  """Writes the parameters of ``workdir``'s checkpoint (latest or ``step``) to ``out`` as
  ``format`` ('npz', 'timm', 'transformers'), with the run's class names; returns the step.

  ``ema``: their moving average instead; ``allow_nonfinite``: a diverged checkpoint with a
  warning, not refused (``workdir.restore_params``).
  """
  from vit_jax.checkpoints import formats  # These import jax: the command checks
  from vit_jax.checkpoints.run import workdir as workdir_lib  # its paths first (main).

  params, step = workdir_lib.restore_params(workdir, step, ema=ema,
                                            allow_nonfinite=allow_nonfinite)
  config = workdir_lib.load_config(workdir)
  model = workdir_lib.run_model(config, params)
  if format == 'npz' and not formats.release.npz_problem(model):
    formats.release.save_npz(out, params)  # Any run's layout, as the release files have it.
  else:  # With the run's classes, its pp_eval and the timm architecture it started from.
    checkpoints.export(model, params, out, format, workdir_lib.load_class_names(workdir),
                       workdir_lib.run_preprocessing(config),
                       formats.run_architecture(config) if format == 'timm' else None)
  return step


def main(argv: list[str]) -> None:
  workdir, source, fmt = _WORKDIR.value, _SOURCE.value, _FORMAT.value
  if bool(workdir) == bool(source):
    raise errors.ConfigError('Give one of --workdir (a run) and --source (another checkpoint).')
  if workdir:
    paths.run_dir(workdir)  # Before jax starts.
  elif not source.startswith('hf-hub:'):
    paths.input_path(source, 'source', 'checkpoint')
  if fmt == 'npz':
    paths.output_path(_OUT.value, 'out')
  else:
    paths.output_dir(_OUT.value, 'out')
  if not flags.FLAGS['verbosity'].present:  # absl's prefixes, Orbax's INFO lines: --verbosity.
    console.plain_console()
    console.quiet_third_party()
  if source and _EMA.value:
    raise errors.ConfigError('--ema is for --workdir: another checkpoint holds one set of '
                             'weights.')
  if source:
    loaded = checkpoints.load(source, step=_STEP.value, allow_nonfinite=_ALLOW_NONFINITE.value)
    checkpoints.export(loaded, _OUT.value, fmt)  # Its classes, preprocessing, architecture.
    print(f'Wrote {_OUT.value} ({fmt}): {loaded.model.model_name} from {loaded.source}.')
  else:
    step = export(workdir, _OUT.value, _STEP.value, ema=_EMA.value, format=fmt,
                  allow_nonfinite=_ALLOW_NONFINITE.value)
    what = 'the moving average of the parameters' if _EMA.value else 'the parameters'
    print(f'Wrote {_OUT.value}: {what} of {workdir} at step {step}.')
  if _EVALUATE.value:
    from vit_jax import evaluation  # The check of the export: its evaluators (jax, evals).

    if source:
      exported = evaluation.read_back(_OUT.value, fmt, loaded.model, loaded.params)
      difference = evaluation.compare_logits(loaded.model, loaded.params, exported)
      print(f'logits of the export vs the source, 8 random images: max relative difference '
            f'{difference:.1e}', flush=True)
    else:
      evaluation.compare_export(workdir, step, _OUT.value, fmt, ema=_EMA.value,
                                allow_nonfinite=_ALLOW_NONFINITE.value,
                                progress_every=_PROGRESS_EVERY.value)
  logging.flush()


if __name__ == '__main__':
  errors.run(main, arguments=False)
