"""Foreign weight formats, one module each, and what a SOURCE string names.

The modules: ``layout`` (the release layout every format converts to) and ``fit`` (fitting it
to a model); ``release`` (.npz files), ``big_vision`` (its names, and its tensorstore folders),
``hub`` (the Hugging Face Hub's folders and how a name table is read), ``timm`` and
``transformers`` (each with one name table, read both ways).

A SOURCE is one of:

* a release or big_vision ``.npz`` file (``release``);
* a timm folder (``config.json`` with an ``architecture``, and ``model.safetensors``) or a
  transformers one (``config.json`` with a ``model_type`` or ``architectures``) (``timm``,
  ``transformers``);
* ``hf-hub:ORG/NAME[@REVISION]``: such a folder on the Hugging Face Hub
  (``vit_jax.checkpoints.hf_hub``);
* a big_vision tensorstore checkpoint: a workdir with ``checkpoint.bv-LAST``, its
  ``checkpoint.bv`` prefix or a step folder (``big_vision``);
* a vit_jax run's workdir (a folder with ``checkpoints/``), which ``vit_jax.checkpoints.load``
  and ``workdir`` read.

Anything else, or a folder that is two of these at once, is refused in one line that lists
what is accepted. Written formats: ``npz`` (the release layout), ``timm`` and
``transformers`` (folders those libraries load).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from vit_jax.base import errors, paths
from vit_jax.base.sizes import pair
from vit_jax.checkpoints import hf_hub
from vit_jax.checkpoints.formats import big_vision, hub, release, timm, transformers
from vit_jax.checkpoints.formats.fit import fitted, model_of
from vit_jax.checkpoints.formats.layout import Loaded, flatten, to_release
from vit_jax.checkpoints.run import record
from vit_jax.data.preprocess import EvalSpec
from vit_jax.models import VisionTransformer, get_model

NPZ = 'npz'
TIMM = hub.TIMM
TRANSFORMERS = hub.TRANSFORMERS
HF_HUB = 'hf-hub'
BIG_VISION = 'big_vision'
WORKDIR = 'workdir'
EXPORT_FORMATS = (NPZ, TIMM, TRANSFORMERS)
ACCEPTED = ('a release or big_vision .npz file, a timm or transformers folder (config.json and '
            'model.safetensors), hf-hub:ORG/NAME, a big_vision tensorstore checkpoint folder '
            '(checkpoint.bv-LAST) or a vit_jax workdir (checkpoints/)')
_READERS = {TIMM: timm.read, TRANSFORMERS: transformers.read}


def origin(source: str) -> str:
  """What ``source`` names: ``NPZ``, ``TIMM``, ``TRANSFORMERS``, ``HF_HUB``, ``BIG_VISION`` or
  ``WORKDIR``; a ``UserError`` naming what is accepted where it is none or several of them."""
  source = str(source)
  if hf_hub.is_hub_id(source):
    return HF_HUB
  if not source:
    raise errors.ConfigError(f'No checkpoint named: give {ACCEPTED}.')
  if not paths.exists(source):
    raise errors.MissingFileError(f'{source} does not exist: name {ACCEPTED}.')
  if paths.is_file(source):
    if source.endswith('.npz'):
      return NPZ
    hint = (' (name the folder that holds it and its config.json)'
            if source.endswith(('.safetensors', '.json')) else '')
    raise errors.CheckpointError(f'{source} is a file but not a .npz checkpoint{hint}: name '
                                 f'{ACCEPTED}.')
  found = []
  if record.is_workdir(source):
    found.append(WORKDIR)
  if kind := hub.folder_format(source):
    found.append(kind)
  if big_vision.step_folder(source) is not None:
    found.append(BIG_VISION)
  if len(found) == 1:
    return found[0]
  if not found:
    raise errors.CheckpointError(f'{source} is not a checkpoint vit_jax reads: name {ACCEPTED}.')
  raise errors.CheckpointError(f'{source} is both a {found[0]} and a {found[1]} checkpoint: '
                               'name a folder that holds one of them.')


def local_folder(source: str) -> str:
  """The folder of a timm or transformers SOURCE: itself, or its Hub snapshot (cached)."""
  return hf_hub.resolve(source) if hf_hub.is_hub_id(source) else source


def load(source: str, *, model_name: str | None = None,
         image_size: int | tuple[int, int] | None = None, pool: str | None = None,
         source_grid: tuple[int, int] | None = None, step: int | None = None,
         keep_head: bool = True) -> Loaded:
  """A SOURCE other than a workdir as a model with its parameters and class names.

  The architecture is the checkpoint's own (read from its config.json and arrays, or a .npz
  file's arrays); ``model_name`` names a registry model instead (.npz only). ``image_size``:
  another input size (position embeddings resized). ``pool`` and ``source_grid`` are what a
  big_vision checkpoint does not record: its pool type where the arrays do not tell (a
  classifier's, ``keep_head``) and a non-square patch grid. ``step``: a big_vision
  checkpoint's step (default: the last).
  """
  kind = origin(source)
  if kind == WORKDIR:
    raise errors.ConfigError(f'{source} is a vit_jax workdir: load it with '
                             'vit_jax.checkpoints.load (or workdir.load_run).')
  if step is not None and kind != BIG_VISION:
    raise errors.ConfigError(f'A step is given, but {source} ({kind}) holds one set of '
                             'parameters: leave it unset.')
  if kind in (TIMM, TRANSFORMERS, HF_HUB):
    for name, value in (('model_name', model_name), ('pool', pool),
                        ('source_grid', source_grid)):
      if value is not None:
        raise errors.ConfigError(f'{name}={value!r} is given, but {source}\'s config.json says '
                                 'its architecture: leave it unset.')
    loaded = load_folder(local_folder(source), origin=source)
    return loaded if image_size is None else resized(loaded, image_size)
  if kind == NPZ:
    return release.load_npz_model(source, model_name, image_size, pool=pool,
                                  source_grid=source_grid)
  flat = big_vision.read_params(source, step)
  big_vision.check_source_pool(source, flat, pool, keep_head=keep_head, big_vision=True)
  return model_of(flat, f'{source} (big_vision)', model_name, image_size,
                          source_grid=source_grid)


def load_folder(folder: str | os.PathLike, origin: str | None = None) -> Loaded:
  """A timm or transformers folder as a model with its parameters and class names."""
  origin = origin or str(folder)
  kind = hub.folder_format(folder)
  if kind is None:
    raise errors.CheckpointError(f'{origin} has no {hf_hub.CONFIG} of timm ("architecture") or '
                                 'transformers ("model_type"): not a Hub checkpoint folder.')
  config = hub.read_json(paths.path(folder) / hf_hub.CONFIG)
  tensors = hub.read_weights(folder)
  hub.check_tensors(tensors, origin)  # Floating point and finite, by the file's names.
  kwargs, flat, class_names = _READERS[kind](config, tensors, origin)
  num_classes = kwargs.pop('num_classes')
  model = get_model('b16', num_classes=num_classes, **kwargs)
  params = fitted(flat, model, origin, model.grid, source_model=model)
  names = tuple(class_names) if len(class_names) == (num_classes or 0) else ()
  return Loaded(model, params, names, f'{origin} ({kind})', preprocessing=preprocessing(folder))


def preprocessing(folder: str | os.PathLike) -> EvalSpec:
  """A timm or transformers folder's own evaluation preprocessing (``Loaded.preprocessing``):
  timm's config.json ``pretrained_cfg``, transformers' preprocessor_config.json."""
  if hub.folder_format(folder) == TIMM:
    return timm.preprocessing(hub.read_json(paths.path(folder) / hf_hub.CONFIG))
  processor = paths.path(folder) / hf_hub.PREPROCESSOR
  return transformers.preprocessing(hub.read_json(processor) if paths.is_file(processor) else None)


def resized(loaded: Loaded, image_size: int | tuple[int, int]) -> Loaded:
  """``loaded`` at another input size: its position embeddings resized to the new grid."""
  model = loaded.model
  if pair(image_size) == pair(model.image_size):
    return loaded
  new = model.clone(image_size=pair(image_size))
  params = fitted(flatten(to_release(loaded.params)), new, loaded.source, model.grid, model)
  return dataclasses.replace(loaded, model=new, params=params)


def export(model: VisionTransformer, params: Mapping[str, Any], out: str | os.PathLike,
           format: str = NPZ, class_names: Sequence[str] = (),
           preprocessing: EvalSpec | None = None) -> str:
  """Writes ``model``'s ``params`` as ``format``: 'npz' (``out`` is the file), 'timm' or
  'transformers' (``out`` is a folder of config.json and model.safetensors, which say
  ``preprocessing``, ``Loaded.preprocessing``: timm's pretrained_cfg, transformers' image
  processor). Returns ``out``.

  A model the format cannot express (registers in a .npz file, a pre-logits layer in timm,
  a CLIP tower with a classifier in transformers, ...) is refused in one line that names the
  option and a format that can."""
  if format not in EXPORT_FORMATS:
    raise errors.ConfigError(f'format={format!r} is not one of {", ".join(EXPORT_FORMATS)}.')
  if format == NPZ:
    release.save_model_npz(out, model, params)
  elif format == TIMM:  # As timm's save_for_hf writes it.
    hub.write_folder(out, *timm.write(model, params, class_names, preprocessing))
  else:  # As save_pretrained writes it, with its image processor's preprocessor_config.json.
    processor = {hf_hub.PREPROCESSOR: transformers.preprocessor_config(model, preprocessing)}
    hub.write_folder(out, *transformers.write(model, params, class_names), processor,
                     metadata={'format': 'pt'})
  return str(out)
