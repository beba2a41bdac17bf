"""A training run's workdir, read back: its config, its class names, its parameters.

``vit_jax.main`` writes ``config.json`` (the run's config, with the number of
classes resolved), ``classes.json`` (the class names, when the data has them) and
Orbax checkpoints under ``checkpoints/``. Fine-tuning, export, prediction and
inspection start from here, or from a release .npz file.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from etils import epath

from vit_jax import config_base, errors
from vit_jax.checkpoints import manager as manager_lib
from vit_jax.checkpoints import release
from vit_jax.models import VisionTransformer, get_model

CONFIG_FILE = 'config.json'
CLASSES_FILE = 'classes.json'
CHECKPOINTS = 'checkpoints'


def is_workdir(path: str | os.PathLike) -> bool:
  """True for a directory with a ``checkpoints/`` folder (a run's workdir)."""
  return (epath.Path(path) / CHECKPOINTS).is_dir()


def steps(workdir: str | os.PathLike) -> list[int]:
  """The steps of the complete checkpoints in ``workdir``, ascending."""
  root = epath.Path(workdir) / CHECKPOINTS
  if not root.is_dir():
    return []
  # Orbax renames a checkpoint's temporary directory to its step when it is complete.
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def resolve_step(workdir: str | os.PathLike, step: int | None = None) -> int:
  """``step`` if ``workdir`` has it (the latest if None); an error naming the choices."""
  available = steps(workdir)
  if not available:
    raise errors.MissingFileError(f'{workdir} holds no complete checkpoint (nothing in '
                                  f'{epath.Path(workdir) / CHECKPOINTS}). Train there first.')
  if step is None:
    return available[-1]
  if step not in available:
    raise errors.MissingFileError(f'{workdir} has no checkpoint at step {step}; it has steps '
                                  f'{available}.')
  return step


def write_run_info(workdir: str | os.PathLike, config: ml_collections.ConfigDict,
                   num_classes: int, class_names: tuple[str, ...]) -> None:
  """Writes config.json (num_classes resolved) and classes.json into ``workdir``."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset.num_classes = num_classes
  path = epath.Path(workdir)
  (path / CONFIG_FILE).write_text(config.to_json_best_effort(indent=1))
  if class_names:
    (path / CLASSES_FILE).write_text(json.dumps(list(class_names), indent=0))


def load_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config the run in ``workdir`` was started with."""
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    raise errors.MissingFileError(f'{path} does not exist: {workdir} is not the workdir of a '
                                  'vit_jax.main run.')
  return config_base.complete(json.loads(path.read_text()))


def load_class_names(workdir: str | os.PathLike) -> tuple[str, ...]:
  """The class names of the run's data, or () when it had none."""
  path = epath.Path(workdir) / CLASSES_FILE
  return tuple(json.loads(path.read_text())) if path.exists() else ()


def model_from_config(config: ml_collections.ConfigDict,
                      num_classes: int | None = None) -> VisionTransformer:
  """The model a run's config describes (``num_classes`` defaults to the config's)."""
  name, options = config_base.model_options(config.model)
  if num_classes is None:
    num_classes = int(config.dataset.num_classes)
  return get_model(name, num_classes=num_classes, **options)


def restore_params(workdir: str | os.PathLike, step: int | None = None,
                   mesh: jax.sharding.Mesh | None = None) -> tuple[dict[str, Any], int]:
  """Only the parameters of a checkpoint (not the optimizer state), and its step.

  With ``mesh``, they are restored straight onto it (sharded by the rules of
  ``vit_jax.sharding``, whatever mesh they were saved from); without, as numpy
  arrays on the host. They are verified against the checksums the checkpoint
  recorded; a damaged one raises ``errors.CheckpointError`` naming the other steps.
  """
  step = resolve_step(workdir, step)
  params, problem = manager_lib.restore_params(epath.Path(workdir) / CHECKPOINTS / str(step),
                                               mesh)
  if problem:
    others = [s for s in steps(workdir) if s != step]
    raise errors.CheckpointError(
        f'The checkpoint at step {step} in {workdir} is damaged: {problem}. Use another step'
        f'{f" (it has {others})" if others else ""}, or train again.')
  return params, step


def load_run(workdir: str | os.PathLike, step: int | None = None) -> release.Loaded:
  """The model and parameters of a run's checkpoint (the latest unless ``step``)."""
  config = load_config(workdir)
  params, step = restore_params(workdir, step)
  num_classes = int(np.shape(params['head']['kernel'])[-1])
  model = model_from_config(config, num_classes)
  return release.Loaded(model, params, load_class_names(workdir), f'{workdir} (step {step})',
                        config)


def init_params_from(source: str, init_params: dict[str, Any], model: VisionTransformer, *,
                     step: int | None = None, keep_head: bool = False) -> dict[str, Any]:
  """A fine-tune's starting parameters from a run's workdir or a release .npz.

  Only the parameters are taken. They are adapted to ``model`` as
  ``release.adapt`` does (position embeddings resized to the new grid, a new
  zero head, pre-logits kept or dropped, scanned or unrolled layout), each change
  logged. The result is in ``init_params``' layout, as host arrays.
  """
  if is_workdir(source):
    source_config = load_config(source)
    params, step = restore_params(source, step)
    source_model = model_from_config(source_config, int(params['head']['kernel'].shape[-1]))
    return release.adapt(
        release.flatten(release.to_release(params)), init_params, model,
        keep_head=keep_head, source_grid=source_model.grid, origin=f'{source} (step {step})')
  if step is not None:
    raise ValueError(f'init_step={step} is given, but {source} is a .npz file, not a workdir.')
  return release.load_pretrained(source, init_params, model, keep_head=keep_head)
