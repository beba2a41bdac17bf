r"""Export a run's parameters as a release .npz file (the layout the released models use).

    python -m vit_jax.tools.export --workdir=DIR --out=model.npz [--step=N] [--ema] [--evaluate]

The file loads with ``vit_jax.checkpoints.release.load_npz``, in the google-research
vision_transformer code and in timm, and can be the ``init_from`` of a fine-tune.
``--ema`` exports the weights' moving average (``config.optimizer.ema_decay``) instead
of the weights.
``--evaluate`` reads the file back and evaluates it and the checkpoint on the
run's evaluation split, to show the export is faithful; progress lines with an ETA
go to stderr every ``--progress_every`` seconds. The checkpoint is verified against the
checksums recorded when it was written: a damaged one is an error naming the other steps
(``vit_jax.workdir.restore_params``).
"""

from __future__ import annotations

from typing import Any

from absl import app, flags, logging

from vit_jax import errors

_WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir of a vit_jax.main run.')
_OUT = flags.DEFINE_string('out', None, 'The .npz file to write.')
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
  from vit_jax import workdir as workdir_lib
  from vit_jax.checkpoints import release

  params, step = workdir_lib.restore_params(workdir, step, ema=ema)
  release.save_npz(out, params)
  return step


def evaluate_params(config: Any, params: Any,
                    progress: str | None = None, progress_every: float = 10.) -> dict[str, float]:
  """Evaluates ``params`` (model layout) with a run's config, on its evaluation split.

  ``progress``: a name for progress lines on stderr (done, rate, ETA), one every
  ``progress_every`` seconds and a closing one.
  """
  import jax

  from vit_jax import console, evaluate, sharding, train
  from vit_jax.data import loader

  plan = train.validate(config)
  config = plan.config
  shardings = sharding.shardings_for(params, plan.mesh)
  batch_sharding = sharding.batch_sharding(plan.mesh)
  eval_step = evaluate.make_eval_step(plan.model, config.loss, shardings, batch_sharding,
                                      sharding.replicated(plan.mesh))
  batches = loader.eval_batches(
      plan.eval_source, plan.pp_eval, global_batch_size=config.eval_batch_size,
      sharding=batch_sharding, num_classes=plan.num_classes, num_workers=config.input_workers)
  metric = 'prec@1' if config.loss == 'sigmoid_xent' else 'accuracy'
  meter = progress and console.Progress(progress, len(plan.eval_source), every=progress_every)
  result = evaluate.evaluate(eval_step, jax.device_put(params, shardings), batches, metric,
                             on_batch=meter and meter.update)
  if meter:
    meter.finish(int(result['examples']))
  return result


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  from vit_jax import console
  from vit_jax import workdir as workdir_lib
  from vit_jax.checkpoints import release

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
    for name, tree in (('checkpoint', params), ('exported .npz', exported)):
      result = evaluate_params(config, tree, f'evaluating the {name}', _PROGRESS_EVERY.value)
      metric = next(iter(result))
      print(f'{name:>14}: {metric} {result[metric]:.4f}, loss {result["loss"]:.4f} '
            f'({int(result["examples"])} examples)')
  logging.flush()


if __name__ == '__main__':
  errors.run(main)
