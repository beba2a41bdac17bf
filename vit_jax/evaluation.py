"""What ``vit_jax.evaluate``, ``vit_jax.fewshot`` and ``vit_jax.tools.export --evaluate`` do
once their command lines are checked: a config's evaluators run on parameters, a checkpoint's
parameters in a config's model, a checkpoint's features few-shot, an export compared with its
checkpoint. It imports jax: those commands import it at one place each, after their checks."""

from __future__ import annotations

import math
from typing import Any

import jax
import ml_collections
import numpy as np

from vit_jax import checkpoints, evals
from vit_jax.base import errors, sharding
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import fit, layout, release
from vit_jax.checkpoints.formats.layout import Loaded
from vit_jax.checkpoints.run import workdir as workdir_lib
from vit_jax.evals import fewshot as fewshot_lib
from vit_jax.models import VisionTransformer
from vit_jax.training import plan as plan_lib


def for_evaluation(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A run's config to evaluate with: where it started from no longer matters (the files
  may be gone)."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.update(init_from='', init_step=None, init_ema=False, init_source_grid=None,
                init_source_pool=None)
  return config


def evaluate_params(config: ml_collections.ConfigDict, params: Any,
                    names: list[str] | None = None, progress_every: float | None = None,
                    what: str = '') -> list[tuple[Any, dict[str, float]]]:
  """[(evaluator, metrics)] of ``params`` (host or device arrays, model layout) for the
  evaluators of a run's ``config`` (those of ``names``, default all); ``progress_every``:
  seconds between progress lines on stderr, which name ``what`` is evaluated."""
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
  model = plan_lib.validate(for_evaluation(config)).model
  init = jax.eval_shape(model.init, jax.random.key(0),
                        jax.ShapeDtypeStruct((1, *model.image_size, 3), np.float32))['params']
  return workdir_lib.init_params_from(
      source, init, model, step=step, keep_head=True, source_grid=config.init_source_grid,
      source_pool=config.init_source_pool)


def checkpoint_params(config: ml_collections.ConfigDict, checkpoint: str, step: int | None,
                      *, source: bool, ema: bool = False, allow_nonfinite: bool = False
                      ) -> tuple[Any, str]:
  """(The parameters to evaluate, what they are): a run's checkpoint (``checkpoint`` its
  workdir; the latest unless ``step``; ``ema``: the weights' moving average), or, where
  ``source``, any other checkpoint's in ``config``'s model (``source_params``)."""
  if source:
    return source_params(config, checkpoint, step), checkpoint
  params, step = workdir_lib.restore_params(checkpoint, step, ema=ema,
                                            allow_nonfinite=allow_nonfinite)
  return params, f'{checkpoint} step {step}{" (EMA)" if ema else ""}'


def at_patch_sizes(config: ml_collections.ConfigDict, checkpoint: str, step: int | None,
                   patch_sizes: list[int], *, source: bool, ema: bool = False,
                   allow_nonfinite: bool = False, names: list[str] | None = None,
                   progress_every: float | None = None) -> list[dict[str, Any]]:
  """One checkpoint evaluated at each of ``patch_sizes`` (FlexiViT): per patch size, the model
  of ``config`` at that patch size and the same input size, the checkpoint's patch embedding
  resampled to it (``fit.resample_patchemb``) and its position embeddings resized to the
  grid, as ``checkpoints.load(..., patch_size=P)`` does. Rows of ``patch_size``, ``grid``,
  ``tokens``, ``flops`` (the model's ``forward_flops``, one image) and ``metrics``
  ({evaluator: its metrics}); ``checkpoint`` as ``checkpoint_params`` takes it."""
  if not source:
    params, step = workdir_lib.restore_params(checkpoint, step, ema=ema,
                                              allow_nonfinite=allow_nonfinite)
    run_model = workdir_lib.run_model(config, params)
    flat = layout.flatten(layout.to_release(params))
  rows = []
  for patch in patch_sizes:
    at = ml_collections.ConfigDict(config.to_dict())
    at.model.patch_size = patch
    try:
      model = plan_lib.validate(for_evaluation(at)).model
    except errors.UserError as e:
      raise type(e)(f'--patch_sizes={patch}: {e}') from None
    if source:
      params = source_params(at, checkpoint, step)
    else:
      init = jax.eval_shape(model.init, jax.random.key(0),
                            jax.ShapeDtypeStruct((1, *model.image_size, 3), np.float32))
      params = fit.adapt(flat, init['params'], model, keep_head=True,
                         source_grid=run_model.grid, origin=checkpoint, source_model=run_model)
    metrics = {evaluator.name: (evaluator, result) for evaluator, result in evaluate_params(
        at, params, names, progress_every, f'{patch}x{patch} patches')}
    rows.append(dict(patch_size=patch, grid=model.grid,
                     tokens=model.grid[0] * model.grid[1] + model.num_prefix_tokens,
                     flops=model.forward_flops(), metrics=metrics))
  return rows


def patch_size_table(rows: list[dict[str, Any]]) -> str:
  """``at_patch_sizes``' rows as a table: the headline metric of each evaluator against the
  forward pass's GFLOPs per image."""
  evaluators = list(rows[0]['metrics'])
  head = ['patch', 'grid', 'tokens', 'GFLOPs/image'] + [
      f'{name}/{rows[0]["metrics"][name][0].metric}' for name in evaluators]
  lines = [head]
  for row in rows:
    flops = row['flops']
    lines.append([str(row['patch_size']), '{}x{}'.format(*row['grid']), str(row['tokens']),
                  'n/a' if flops is None else f'{flops / 1e9:.4g}'] + [
        f'{row["metrics"][n][1][row["metrics"][n][0].metric]:.4f}' for n in evaluators])
  widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
  return '\n'.join('  '.join(c.rjust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                   for line in lines)


def load_features(directory: str | None, source: str | None, step: int | None = None,
                  allow_nonfinite: bool = False, model_name: str | None = None,
                  image_size: int | None = None) -> Loaded:
  """A checkpoint for its features: a run's ``directory`` (a self-supervised run's encoder
  too: no head), or any other ``source`` (``model_name``, ``image_size``: a .npz file's)."""
  directory = directory or (source if formats.origin(source) == formats.WORKDIR else None)
  if not directory:
    return formats.load(source, model_name=model_name, image_size=image_size)
  config = workdir_lib.load_config(directory)
  params, _ = workdir_lib.restore_params(directory, step, allow_nonfinite=allow_nonfinite)
  return Loaded(workdir_lib.run_model(config, params), params, (), directory, config)


def read_back(out: str, format: str, model: VisionTransformer, params: Any) -> Any:
  """A written export (``vit_jax.tools.export``), read back into ``model``'s layout
  (``params`` gives its shapes)."""
  if format == 'npz' and model.prefix_posemb:  # The release layout is the model's.
    return layout.to_model_layout(release.load_npz(out), scanned=layout.is_scanned(params))
  if format == 'npz':  # A zero class-token row to fold back.
    return fit.adapt(layout.flatten(release.load_npz(out)), params, model, keep_head=True,
                     source_grid=model.grid, origin=out)
  loaded = checkpoints.load(out)
  return fit.adapt(layout.flatten(layout.to_release(loaded.params)), params, model,
                   keep_head=True, source_grid=loaded.model.grid, origin=out,
                   source_model=loaded.model)


def compare_logits(model: VisionTransformer, params: Any, exported: Any, count: int = 8
                   ) -> float:
  """The largest relative difference of two parameter sets' logits on random images."""
  images = np.random.default_rng(0).uniform(-1, 1, (count, *model.image_size, 3))
  images = images.astype(np.float32)
  model = model.clone(attention_impl='einsum') if model.attention_impl == 'cudnn' else model
  a, b = (np.asarray(jax.jit(model.apply)({'params': p}, images)) for p in (params, exported))
  return float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))


def compare_export(workdir: str, step: int, out: str, format: str, *, ema: bool,
                   allow_nonfinite: bool, progress_every: float) -> None:
  """Prints what the run's classification evaluators measure of its checkpoint at ``step``
  and of the export written from it to ``out``: the same, for a faithful export."""
  config = workdir_lib.load_config(workdir)
  params, _ = workdir_lib.restore_params(workdir, step, ema=ema, allow_nonfinite=allow_nonfinite)
  exported = read_back(out, format, workdir_lib.run_model(config, params), params)
  classifiers = [n for n, e in config.evals.items() if e.type == 'classification']
  name_of_export = 'exported .npz' if format == 'npz' else f'exported {format}'
  for name, tree in (('checkpoint', params), (name_of_export, exported)):
    for evaluator, metrics in evaluate_params(config, tree, classifiers, progress_every,
                                              f'the {name}'):
      print(f'{name:>14}, {evaluator.name}: {evaluator.describe(metrics)}', flush=True)


def fewshot(loaded: Loaded, config: ml_collections.ConfigDict, data_dir: str,
            pp: str | None) -> tuple[Any, str]:
  """The few-shot evaluator of ``config`` (its one entry, ``fewshot``) for ``loaded``'s
  features, built, checked and run ((evaluator, its table: mean ± sample std of the seeds));
  ``pp``: its preprocessing (default: the checkpoint's)."""
  ctx = evals.Context.from_loaded(loaded, config, data_dir=data_dir)
  config.evals.fewshot.pp = pp or ctx.pp_eval.spec
  devices = math.prod(ctx.mesh.shape[a] for a in sharding.BATCH_AXES)
  if config.eval_batch_size % devices:
    raise errors.ConfigError(f'--batch_size={config.eval_batch_size} is not a multiple of '
                             f'the {devices} devices.')
  (evaluator,) = evals.from_config(ctx)
  evaluator.run(jax.device_put(loaded.params, sharding.replicated(ctx.mesh)))
  return evaluator, fewshot_lib.table(evaluator.per_seed, evaluator.shots)
