"""A training run's workdir, read back: its config, its class names, its parameters.

``vit_jax.main`` writes ``config.json`` (the run's config, with the number of
classes resolved), ``classes.json`` (the class names, when the data has them) and
Orbax checkpoints under ``checkpoints/``. Fine-tuning, export, prediction and
inspection start from here, or from a release .npz file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vit_jax import config_base, errors, mpp, sharding
from vit_jax.checkpoints import manager as manager_lib
from vit_jax.checkpoints import release
from vit_jax.models import VisionTransformer, get_model, registry
from vit_jax.models.vit import pair

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
  """The model a run's config describes (``num_classes`` defaults to the config's).

  A masked-patch-prediction run's (``config.objective='mpp'``): no classifier, its mask
  embedding and prediction head.
  """
  name, options = config_base.model_options(config.model)
  if mpp.is_on(config):
    return mpp.pretraining_model(config, get_model(name, num_classes=0, **options))
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
  step_dir = epath.Path(workdir) / CHECKPOINTS / str(step)
  try:
    arrays = manager_lib.recorded(step_dir)
    metadata = ocp.PyTreeCheckpointHandler().metadata(step_dir / 'default').tree['params']
    with ocp.PyTreeCheckpointer() as checkpointer:
      if mesh is None:
        abstract = jax.tree.map(lambda m: 0, metadata)
        restore_args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray),
                                    metadata)
      else:
        shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)
        shardings = sharding.shardings_for(shapes, mesh)
        abstract = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
      restored = checkpointer.restore(step_dir / 'default', args=ocp.args.PyTreeRestore(
          item={'params': abstract}, restore_args={'params': restore_args},
          partial_restore=True))
    problem = manager_lib.verify({'params': restored['params']}, arrays, step_dir)
  except manager_lib.READ_ERRORS as e:
    manager_lib.silence_abandoned_reads()
    problem = str(e) if isinstance(e, errors.CheckpointError) else manager_lib.short(e)
  if problem:
    others = [s for s in steps(workdir) if s != step]
    raise errors.CheckpointError(
        f'The checkpoint at step {step} in {workdir} is damaged: {problem}. Use another step'
        f'{f" (it has {others})" if others else ""}, or train again.')
  return restored['params'], step


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A trained model, ready to apply: ``model.apply({'params': params}, images)``."""

  model: VisionTransformer
  params: dict[str, Any]
  class_names: tuple[str, ...]
  source: str  # 'DIR (step N)' or the .npz path.
  config: ml_collections.ConfigDict | None = None


def load_run(workdir: str | os.PathLike, step: int | None = None) -> Loaded:
  """The model and parameters of a run's checkpoint (the latest unless ``step``)."""
  config = load_config(workdir)
  if config.objective == 'mpp':  # A CheckpointError: every tool's entry point prints it.
    raise errors.CheckpointError(
        f'{workdir} is a self-supervised run (masked patch prediction): it has no classifier '
        f'to predict or evaluate with. Fine-tune it first (--config.init_from={workdir}).')
  params, step = restore_params(workdir, step)
  num_classes = int(np.shape(params['head']['kernel'])[-1])
  model = model_from_config(config, num_classes)
  return Loaded(model, params, load_class_names(workdir), f'{workdir} (step {step})', config)


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
    head = params.get('head')  # None: a self-supervised run's (masked patch prediction).
    source_model = model_from_config(source_config,
                                     int(head['kernel'].shape[-1]) if head else None)
    return release.adapt(
        release.flatten(release.to_release(params)), init_params, model,
        keep_head=keep_head, source_grid=source_model.grid, origin=f'{source} (step {step})')
  if step is not None:
    raise ValueError(f'init_step={step} is given, but {source} is a .npz file, not a workdir.')
  return release.load_pretrained(source, init_params, model, keep_head=keep_head)


def npz_architecture(flat: dict[str, Any]) -> dict[str, Any]:
  """The ``VisionTransformer`` attributes a release file's shapes imply.

  ``flat`` is ``release.flatten(release.load_npz(path))``. Width, depth,
  MLP width, heads, patch size, BiT stem, pooling, pre-logits, position
  embeddings and classes all follow from the arrays; ``image_size`` is the one
  the position embeddings were trained at (square grids; 224 when unknown).
  """
  ph, pw, _, width = np.shape(flat['embedding/kernel'])
  blocks = sorted({int(k.split('/')[1].rsplit('_', 1)[1]) for k in flat
                   if k.startswith('Transformer/encoderblock_')})
  if not blocks:
    raise ValueError('The checkpoint has no Transformer/encoderblock_{i}: not a ViT file.')
  block = 'Transformer/encoderblock_0/'
  arch: dict[str, Any] = dict(
      hidden_size=int(width), num_layers=len(blocks), patch_size=(int(ph), int(pw)),
      mlp_dim=int(np.shape(flat[block + 'MlpBlock_3/Dense_0/kernel'])[-1]),
      num_heads=int(np.shape(flat[block + 'MultiHeadDotProductAttention_1/query/kernel'])[1]),
      pool='token' if 'cls' in flat else
      'map' if any(k.startswith('MAPHead_0/') for k in flat) else 'gap',
      representation_size=(int(np.shape(flat['pre_logits/kernel'])[-1])
                           if 'pre_logits/kernel' in flat else None),
      posemb='learn' if release.POSEMB_KEY in flat else 'sincos2d')
  stride = 1
  if 'conv_root/kernel' in flat:
    units = {}
    for key in flat:
      parts = key.split('/')
      if parts[0].startswith('block') and parts[0][5:].isdigit() and len(parts) > 1:
        units.setdefault(int(parts[0][5:]), set()).add(parts[1])
    arch['resnet_layers'] = tuple(len(units[i]) for i in sorted(units))
    arch['resnet_width'] = int(np.shape(flat['conv_root/kernel'])[-1]) // 64
    stride = 4 * 2**max(len(arch['resnet_layers']) - 1, 0)
  size = 224
  if arch['posemb'] == 'learn':
    n = np.shape(flat[release.POSEMB_KEY])[1] - (arch['pool'] == 'token')
    side = math.isqrt(n)
    if side * side == n:
      size = side * stride * int(ph)
  arch['image_size'] = size
  return arch


def load_npz_model(path: str | os.PathLike, model_name: str | None = None,
                   image_size: int | tuple[int, int] | None = None,
                   class_names: tuple[str, ...] = ()) -> Loaded:
  """A release (or exported) .npz file as a model with its parameters.

  The architecture is read from the file's shapes (``npz_architecture``) and
  named after the registry's model of that shape; ``model_name`` picks a
  registry model instead (the file must fit it). ``image_size`` defaults to the
  file's own resolution; another size gets bilinearly resized position
  embeddings. Mismatches raise ``errors.CheckpointMismatchError``, which
  says what the file holds.
  """
  flat = release.flatten(release.load_npz(path))
  arch = npz_architecture(flat)
  size = arch.pop('image_size') if image_size is None else image_size
  arch.pop('image_size', None)
  num_classes = int(np.shape(flat['head/kernel'])[-1]) if 'head/kernel' in flat else None
  file_options = {k: arch[k] for k in ('pool', 'representation_size', 'posemb')}
  if model_name:
    model = get_model(model_name, num_classes=num_classes, image_size=size, **file_options)
  else:
    shape_keys = ('hidden_size', 'num_layers', 'mlp_dim', 'num_heads', 'patch_size')
    matches = [n for n in registry.list_models()
               if all(pair(v) == pair(arch[k]) if k == 'patch_size' else v == arch[k]
                      for k, v in registry.model_kwargs(n).items() if k in shape_keys)
               and registry.model_kwargs(n).get('resnet_layers') == arch.get('resnet_layers')]
    if matches:
      model = get_model(matches[0], num_classes=num_classes, image_size=size, **file_options)
    else:
      p = pair(arch['patch_size'])
      description = (f'ViT (width {arch["hidden_size"]}, {arch["num_layers"]} layers, '
                     f'{p[0]}x{p[1]} patches{", hybrid" if "resnet_layers" in arch else ""})')
      model = get_model('b16', num_classes=num_classes, image_size=size,
                        model_name=description, **arch)
  init = jax.eval_shape(model.init, jax.random.key(0),
                        jax.ShapeDtypeStruct((1, *pair(size), 3), np.float32))['params']
  params = release.adapt(flat, init, model, keep_head=True, origin=str(path))
  return Loaded(model, params, tuple(class_names), str(path))
