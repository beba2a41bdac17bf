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

from absl import logging

from vit_jax.base import errors, paths
from vit_jax.base.sizes import pair
from vit_jax.checkpoints import hf_hub
from vit_jax.checkpoints.formats import big_vision, hub, release, timm, transformers
from vit_jax.checkpoints.formats.fit import fitted, model_of
from vit_jax.checkpoints.formats.layout import Loaded, flatten, to_release
from vit_jax.checkpoints.run import record
from vit_jax.data.preprocess import EvalSpec
from vit_jax.models import VisionTransformer, get_model, registry

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
         keep_head: bool = True, patch_size: int | tuple[int, int] | None = None) -> Loaded:
  """A SOURCE other than a workdir as a model with its parameters and class names.

  The architecture is the checkpoint's own (read from its config.json and arrays, or a .npz
  file's arrays); ``model_name`` names a registry model instead (.npz only). ``image_size``:
  another input size (position embeddings resized). ``pool`` and ``source_grid`` are what a
  big_vision checkpoint does not record: its pool type where the arrays do not tell (a
  classifier's, ``keep_head``) and a non-square patch grid. ``step``: a big_vision
  checkpoint's step (default: the last). ``patch_size``: another patch size (FlexiViT: the
  patch embedding resampled, the position embeddings resized to the new grid).
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
    return resized(load_folder(local_folder(source), origin=source), image_size, patch_size)
  if kind == NPZ:
    loaded = release.load_npz_model(source, model_name, image_size, pool=pool,
                                    source_grid=source_grid, patch_size=patch_size)
  else:
    flat = big_vision.read_params(source, step)
    big_vision.check_source_pool(source, flat, pool, keep_head=keep_head, big_vision=True)
    loaded = model_of(flat, f'{source} (big_vision)', model_name, image_size,
                      source_grid=source_grid, patch_size=patch_size)
  check_patch_size(loaded.model, patch_size)
  return loaded


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
  return Loaded(model, params, names, f'{origin} ({kind})', preprocessing=preprocessing(folder),
                architecture=timm.source_architecture(config) if kind == TIMM else None)


def run_architecture(config: Any) -> dict[str, Any] | None:
  """The timm architecture a run started from (``Loaded.architecture``, which a workdir's
  ``Loaded`` leaves to this, read when it is exported to timm): its ``config.init_from``'s, a
  timm folder's (through runs that fine-tuned runs); None where it started from none, or
  the source cannot be read now (one log line)."""
  seen: list[str] = []
  source = config.get('init_from') or ''
  while source and source not in seen and len(seen) < 16:
    seen.append(source)
    try:
      kind = origin(source)
      if kind == WORKDIR:
        source = record.load_config(source).get('init_from') or ''
        continue
      if kind not in (TIMM, HF_HUB):
        return None
      folder = local_folder(source)
      if hub.folder_format(folder) != TIMM:
        return None
      return timm.source_architecture(hub.read_json(paths.path(folder) / hf_hub.CONFIG))
    except (errors.UserError, OSError) as e:
      logging.info('The run started from %s, which cannot be read now (%s): its timm '
                   'architecture is not known.', source, e)
      return None
  return None


def preprocessing(folder: str | os.PathLike) -> EvalSpec:
  """A timm or transformers folder's own evaluation preprocessing (``Loaded.preprocessing``):
  timm's config.json ``pretrained_cfg``, transformers' preprocessor_config.json."""
  if hub.folder_format(folder) == TIMM:
    return timm.preprocessing(hub.read_json(paths.path(folder) / hf_hub.CONFIG))
  processor = paths.path(folder) / hf_hub.PREPROCESSOR
  return transformers.preprocessing(hub.read_json(processor) if paths.is_file(processor) else None,
                                    hub.read_json(paths.path(folder) / hf_hub.CONFIG), str(folder))


def resized(loaded: Loaded, image_size: int | tuple[int, int] | None = None,
            patch_size: int | tuple[int, int] | None = None) -> Loaded:
  """``loaded`` at another input size or patch size (None: its own): its position embeddings
  resized to the new grid, its patch embedding resampled to the new patch size (FlexiViT's
  ``fit.resample_patchemb``)."""
  model = loaded.model
  changes = {}
  if image_size is not None and pair(image_size) != pair(model.image_size):
    changes['image_size'] = pair(image_size)
  if patch_size is not None and pair(patch_size) != pair(model.patch_size):
    changes['patch_size'] = pair(patch_size)
    options = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)
               if f.name not in ('parent', 'name')}
    changes['model_name'] = registry.shape_name({**options, **changes})
  new = model.clone(**changes)
  check_patch_size(new, patch_size)
  if not changes:
    return loaded
  params = fitted(flatten(to_release(loaded.params)), new, loaded.source, model.grid, model)
  config = loaded.config
  if config is not None:  # A run's config.json: its model as it now is.
    fields = config.to_dict()
    for key, value in changes.items():
      if key != 'model_name':
        fields['model'][key] = value[0] if value[0] == value[1] else value
    config = type(config)(fields)
  return dataclasses.replace(loaded, model=new, params=params, config=config)


def check_patch_size(model: VisionTransformer, patch_size: int | tuple[int, int] | None) -> None:
  """Refuses a ``patch_size`` asked for that does not tile ``model``'s input: its last pixels
  would be dropped without a word."""
  if patch_size is None:
    return
  (h, w), (ph, pw) = pair(model.image_size), pair(patch_size)
  if h % ph or w % pw:
    raise errors.ConfigError(
        f'patch_size={patch_size} does not tile the {h}x{w} input: give a patch size that '
        f'divides it, or an image_size that is a multiple of it.')


def export(model: VisionTransformer | Loaded, params: Mapping[str, Any] | str | os.PathLike |
           None = None, out: str | os.PathLike | None = None, format: str | None = None,
           class_names: Sequence[str] | None = None, preprocessing: EvalSpec | None = None,
           architecture: Mapping[str, Any] | None = None) -> str:
  """Writes a model's parameters as ``format``: 'npz' (the default; ``out`` is the file),
  'timm' or 'transformers' (``out`` is a folder of config.json and model.safetensors, which say
  ``preprocessing``: timm's pretrained_cfg, transformers' image processor). Returns ``out``.

  ``export(loaded, OUT, format)``: what ``load`` returned, with its class names, its own
  preprocessing and (timm) its architecture's name (``Loaded.architecture``, kept where the
  model is that architecture; else the nearest of timm's registry, ``timm.architecture``).
  ``export(model, params, OUT, format, class_names, preprocessing, architecture)``: a model
  and its parameters, and what is known of them; a timm or transformers folder written
  without a preprocessing says the releases' (a resize to the input, [-1, 1]), in one
  warning line.

  A model the format cannot express (registers in a .npz file, a pre-logits layer in timm,
  a CLIP tower with a classifier in transformers, ...) is refused in one line that names the
  option and a format that can."""
  if isinstance(model, Loaded):
    if isinstance(params, Mapping):
      raise errors.ConfigError('export(loaded, OUT, format): a Loaded holds its parameters; '
                               'give the folder or file to write after it.')
    if params is not None:  # export(loaded, OUT[, FORMAT]): the arguments after it shift.
      if out is not None and format is not None:
        raise errors.ConfigError(f'export(loaded, {params!r}, {out!r}, format={format!r}): '
                                 'two formats given; write export(loaded, OUT, format=...).')
      params, out, format = None, params, format if out is None else str(out)
    loaded = model
    model, params = loaded.model, loaded.params
    class_names = loaded.class_names if class_names is None else class_names
    preprocessing = preprocessing or loaded.preprocessing
    architecture = architecture or loaded.architecture or (
        run_architecture(loaded.config) if loaded.config is not None and format == TIMM
        else None)
  if params is None or out is None:
    raise errors.ConfigError('export needs the parameters and where to write them: '
                             'export(model, params, OUT, format) or export(loaded, OUT, format).')
  format = format or NPZ
  class_names = class_names or ()
  if format not in EXPORT_FORMATS:
    raise errors.ConfigError(f'format={format!r} is not one of {", ".join(EXPORT_FORMATS)}.')
  if format == NPZ:
    release.save_model_npz(out, model, params)
  elif format == TIMM:  # As timm's save_for_hf writes it.
    hub.write_folder(out, *timm.write(model, params, class_names, preprocessing, architecture))
  else:  # As save_pretrained writes it, with its image processor's preprocessor_config.json.
    processor = {hf_hub.PREPROCESSOR: transformers.preprocessor_config(model, preprocessing)}
    naflex = preprocessing is not None and preprocessing.naflex
    hub.write_folder(out, *transformers.write(model, params, class_names, naflex), processor,
                     metadata={'format': 'pt'})
  if format != NPZ and preprocessing is None:
    logging.warning(
        '%s: no preprocessing known for this %s export: it says the releases\' (a resize to '
        'the input, mean and std 0.5). Give preprocessing= (an EvalSpec), or export what '
        'checkpoints.load returned, which carries its own.', out, format)
  return str(out)
