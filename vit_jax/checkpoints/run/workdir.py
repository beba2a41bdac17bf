"""A training run's workdir, read back: its config, its class names, its parameters.

``vit_jax.main`` writes ``config.json`` (the run's config, with the number of
classes resolved), ``classes.json`` (the class names, when the data has them) and
Orbax checkpoints under ``checkpoints/``. Fine-tuning, export, prediction and
inspection start from here, or from any other checkpoint a SOURCE names (``formats``).
A resume is the same run: ``check_resume`` (``record``, which a command reads before jax
starts) refuses a config that would train another trajectory.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from vit_jax import config as config_lib
from vit_jax.base import errors
from vit_jax.base.sizes import pair
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import big_vision, fit, layout, release
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.checkpoints.run.record import (  # noqa: F401 (read here, and by its callers)
  CHECKPOINTS,
  CLASSES_FILE,
  CONFIG_FILE,
  check_resume,
  is_workdir,
  load_config,
  resolve_step,
  step_dir,
  steps,
)
from vit_jax.data.preprocess import EvalSpec
from vit_jax.models import VisionTransformer, get_model, mpp


def write_run_info(workdir: str | os.PathLike, config: ml_collections.ConfigDict,
                   num_classes: int, class_names: tuple[str, ...]) -> None:
  """Writes config.json (num_classes resolved) and classes.json into ``workdir``, each
  whole or not at all (a kill while writing leaves the one before)."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset.num_classes = num_classes
  path = epath.Path(workdir)
  write_atomically(path / CONFIG_FILE, config.to_json_best_effort(indent=1))
  if class_names:
    write_atomically(path / CLASSES_FILE, json.dumps(list(class_names), indent=0))


def write_atomically(path: epath.Path, text: str) -> None:
  """``path.write_text(text)`` through a temporary file renamed into place."""
  if '://' in str(path):  # An object store writes an object whole.
    path.write_text(text)
    return
  tmp = path.parent / f'.{path.name}.tmp'
  tmp.write_text(text)
  tmp.replace(path)


def load_class_names(workdir: str | os.PathLike) -> tuple[str, ...]:
  """The class names of the run's data, or () when it had none."""
  path = epath.Path(workdir) / CLASSES_FILE
  return tuple(json.loads(path.read_text())) if path.exists() else ()


def model_from_config(config: ml_collections.ConfigDict,
                      num_classes: int | None = None) -> VisionTransformer:
  """The model a run's config describes (``num_classes`` defaults to the config's).

  A masked-patch-prediction run's (``config.objective='mpp'``): no classifier, its mask
  embedding and prediction head.
  """
  name, options = config_lib.model_options(config.model)
  if mpp.is_on(config):
    return mpp.pretraining_model(config, get_model(name, num_classes=0, **options))
  if num_classes is None:
    num_classes = int(config.dataset.num_classes)
  return get_model(name, num_classes=num_classes, **options)


def run_model(config: ml_collections.ConfigDict, params: Any) -> VisionTransformer:
  """The model of a run's ``config`` for its ``params`` (no head: a self-supervised run's
  encoder)."""
  head = params.get('head')
  return model_from_config(config, int(head['kernel'].shape[-1]) if head else None)


def newest_good_step(workdir: str | os.PathLike) -> int | None:
  """The newest checkpoint whose record says its state is finite (or, written by an older
  vit_jax without that record, whose parameters are); None where there is none."""
  for step in reversed(steps(workdir)):
    try:
      good = manager_lib.good(manager_lib.recorded(step_dir(workdir, step)))
    except errors.CheckpointError:
      continue
    if good is None:
      params, problem = manager_lib.restore_params(step_dir(workdir, step))
      good = not problem and all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    if good:
      return step
  return None


def _nonfinite(workdir: str | os.PathLike, step: int, params: Any) -> list[str]:
  """The arrays of checkpoint ``step`` that are not finite: as recorded, or (an older
  checkpoint) those of ``params``, which were read from it."""
  record = manager_lib.recorded(step_dir(workdir, step))
  if manager_lib.good(record) is not None:
    return manager_lib.nonfinite(record)
  return [k for k, x in layout.flatten(params).items() if not np.isfinite(x).all()]


def restore_params(workdir: str | os.PathLike, step: int | None = None,
                   mesh: jax.sharding.Mesh | None = None, *, ema: bool = False,
                   allow_nonfinite: bool = False, use: str = '--step={}',
                   allow: str = '--allow_nonfinite') -> tuple[dict[str, Any], int]:
  """Only the parameters of a checkpoint (not the optimizer state), and its step.

  ``ema``: the weights' moving average instead (``config.optimizer.ema_decay``; kept
  in float32 in the optimizer state), in the parameters' layout; a run that kept none
  is a ``errors.CheckpointMismatchError``. With ``mesh``, they are restored straight
  onto it (sharded by the rules of ``vit_jax.base.sharding``, whatever mesh they were saved
  from); without, as numpy arrays on the host. They are verified against the checksums
  the checkpoint recorded; a damaged one raises ``errors.CheckpointError`` naming the
  other steps. A non-finite one (its run diverged) raises ``errors.NonFiniteCheckpointError``
  naming the newest good step (``use``: how to ask for it) and the option that reads it
  anyway (``allow``; '' for none), or with ``allow_nonfinite`` is read with a warning.
  """
  step = resolve_step(workdir, step)
  params, problem = manager_lib.restore_params(step_dir(workdir, step), mesh, ema=ema)
  if problem:
    others = [s for s in steps(workdir) if s != step]
    raise errors.CheckpointError(
        f'The checkpoint at step {step} in {workdir} is damaged: {problem}. Use another step'
        f'{f" (it has {others})" if others else ""}, or train again.')
  if bad := _nonfinite(workdir, step, params):
    good = newest_good_step(workdir)
    what = (f'The checkpoint at step {step} in {workdir} is not finite ({len(bad)} arrays hold '
            f'NaN or infinity, e.g. {bad[0]}: its run diverged)')
    if allow_nonfinite:
      logging.warning('%s; read as asked (%s).', what, allow)
    else:
      raise errors.NonFiniteCheckpointError(
          f'{what}. ' + (f'The newest good one is step {good}: use {use.format(good)}'
                         if good is not None else 'It has no good checkpoint: train again')
          + (f', or pass {allow} to read it anyway.' if allow else '.'))
  return params, step


def load_run(workdir: str | os.PathLike, step: int | None = None, *, ema: bool = False,
             allow_nonfinite: bool = False) -> layout.Loaded:
  """The model and parameters of a run's checkpoint (the latest unless ``step``).

  ``ema``: the weights' moving average instead of the weights; ``allow_nonfinite``: a
  diverged checkpoint read with a warning, not refused (``restore_params``).
  """
  config = load_config(workdir)
  if config.objective == 'mpp':  # A CheckpointError: every tool's entry point prints it.
    raise errors.CheckpointError(
        f'{workdir} is a self-supervised run (masked patch prediction): it has no classifier '
        f'to predict or evaluate with. Fine-tune it first (--config.init_from={workdir}).')
  params, step = restore_params(workdir, step, ema=ema, allow_nonfinite=allow_nonfinite)
  model = run_model(config, params)
  source = f'{workdir} (step {step}{", EMA" if ema else ""})'
  return layout.Loaded(model, params, load_class_names(workdir), source, config,
                       preprocessing=run_preprocessing(config))


def run_preprocessing(config: ml_collections.ConfigDict) -> EvalSpec | None:
  """A run's evaluation preprocessing (its ``dataset.pp_eval``, as run) as an EvalSpec, which
  its timm and transformers exports say; None where no EvalSpec says it."""
  return EvalSpec.of_pipeline(config.dataset.pp_eval)


def init_params_from(source: str, init_params: dict[str, Any], model: VisionTransformer, *,
                     step: int | None = None, keep_head: bool = False, ema: bool = False,
                     source_grid: tuple[int, int] | None = None,
                     source_pool: str | None = None) -> dict[str, Any]:
  """A fine-tune's starting parameters from a run's workdir or any other SOURCE (``formats``).

  Only the parameters are taken (``ema``: the run's moving average of them instead).
  They are adapted to ``model`` as ``fit.adapt`` does (position embeddings resized
  to the new grid, a new zero head, pre-logits kept or dropped, scanned or unrolled
  layout), each change logged. A workdir's grid is its recorded config's, a timm or
  transformers folder's its config.json's; a .npz file's or big_vision checkpoint's is
  ``source_grid`` where it is not square (``fit.adapt``), and ``source_pool`` its
  pool type where its arrays do not tell (``big_vision.check_source_pool``). The result is
  in ``init_params``' layout, as host arrays.
  """
  if is_workdir(source):
    source_config = load_config(source)
    params, step = restore_params(source, step, ema=ema, use='config.init_step={}', allow='')
    source_model = run_model(source_config, params)
    _check_grid(source_grid, source, source_model.grid, ' for a workdir')
    return fit.adapt(
        layout.flatten(layout.to_release(params)), init_params, model,
        keep_head=keep_head, source_grid=source_model.grid,
        origin=f'{source} (step {step}{", EMA" if ema else ""})')
  kind = formats.origin(source)
  what = 'a .npz file' if kind == formats.NPZ else f'a {kind} checkpoint'
  if step is not None and kind != formats.BIG_VISION:
    raise errors.ConfigError(f'config.init_step={step} is given, but {source} is {what}, not a '
                             'workdir: leave init_step unset.')
  if ema:
    raise errors.ConfigError(
        f'config.init_ema is true, but {source} is {what}: it holds one set of weights '
        '(export a run\'s moving average with python -m vit_jax.tools.export --ema).')
  if kind == formats.NPZ:
    return release.load_pretrained(source, init_params, model, keep_head=keep_head,
                                   source_grid=source_grid, source_pool=source_pool)
  if kind == formats.BIG_VISION:
    flat = big_vision.read_params(source, step)
    big_vision.check_source_pool(source, flat, source_pool, keep_head=keep_head, big_vision=True)
    return fit.adapt(flat, init_params, model, keep_head=keep_head,
                         source_grid=source_grid, origin=f'{source} (big_vision)')
  loaded = formats.load(source)  # timm, transformers, hf-hub: the architecture is recorded.
  _check_grid(source_grid, source, loaded.model.grid)
  for option in ('activation', 'norm_epsilon'):  # Not in the arrays: the config's is taken.
    theirs, ours = getattr(loaded.model, option), getattr(model, option)
    if theirs != ours:
      logging.warning('init from %s: it computes with %s=%r, the model with %r (set '
                      'config.model.%s=%r to keep its function)', source, option, theirs, ours,
                      option, theirs)
  return fit.adapt(layout.flatten(layout.to_release(loaded.params)), init_params, model,
                       keep_head=keep_head, source_grid=loaded.model.grid, origin=loaded.source,
                       source_model=loaded.model)


def _check_grid(source_grid: Any, source: str, grid: tuple[int, int], hint: str = '') -> None:
  """Refuses a ``config.init_source_grid`` that is not the grid ``source`` records."""
  if source_grid is not None and pair(source_grid) != grid:
    raise errors.ConfigError(
        f'config.init_source_grid={tuple(source_grid)}, but {source} was trained at the '
        f'{grid[0]}x{grid[1]} grid (its config.json): leave init_source_grid unset{hint}.')


def check_init_from(config: ml_collections.ConfigDict) -> None:
  """The ``init_*`` fields that cannot work with ``config.init_from``, refused before compiling.

  ``init_ema``, ``init_source_grid`` and ``init_source_pool`` need an ``init_from``;
  ``init_ema`` a workdir whose checkpoint keeps a moving average, ``init_source_pool``
  a .npz file or a big_vision checkpoint (the others record their model),
  ``init_source_grid`` a (rows, columns) pair of positive ints.
  """
  source = config.init_from
  options = {k: config.get(k) for k in ('init_ema', 'init_source_grid', 'init_source_pool')}
  given = [f'config.{k}' for k, v in options.items() if v not in (None, False)]
  if given and not source:
    raise errors.ConfigError(f'{", ".join(given)} given without config.init_from: set '
                             'init_from to the checkpoint it describes, or leave them unset.')
  grid = options['init_source_grid']
  if grid is not None and not (isinstance(grid, (tuple, list)) and len(grid) == 2 and all(
      isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in grid)):
    raise errors.ConfigError(f'config.init_source_grid={grid!r} is not a (rows, columns) pair '
                             'of positive ints, e.g. (14, 20).')
  pool = options['init_source_pool']
  if pool is not None and pool not in big_vision.SOURCE_POOLS:
    raise errors.ConfigError(f'config.init_source_pool={pool!r} is not one of big_vision\'s '
                             'pool types: tok, gap, map, 0, none.')
  if not source:
    return
  kind = formats.origin(source)
  if pool is not None and kind not in (formats.NPZ, formats.BIG_VISION):
    raise errors.ConfigError(f'config.init_source_pool={pool!r}, but {source} is a {kind} '
                             'checkpoint: it records its model; leave init_source_pool unset.')
  if kind != formats.WORKDIR:
    return
  if options['init_ema'] and not manager_lib.has_ema(
      step_dir(source, resolve_step(source, config.get('init_step')))):
    raise errors.ConfigError(
        f'config.init_ema is true, but the checkpoint of {source} keeps no moving average of '
        'the weights (its run had config.optimizer.ema_decay=0): set init_ema=false.')
