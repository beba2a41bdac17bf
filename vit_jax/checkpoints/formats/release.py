"""The release .npz format: the published ViT files, read and written.

Flat numpy archives of float32 arrays in the release layout (``layout``). ``load_npz`` also
reads big_vision's .npz files (their names mapped by ``big_vision.canonical``); ``save_npz``
always writes the release layout, which the release code and timm read, with a model's
options beside it where the release's readers would not compute what it does
(``save_model_npz``).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from vit_jax.base import errors, paths
from vit_jax.checkpoints import headers
from vit_jax.checkpoints.formats import big_vision, hub, layout
from vit_jax.checkpoints.formats.fit import adapt, model_of, model_options
from vit_jax.checkpoints.formats.layout import Loaded, Params, check_finite, flatten, to_host
from vit_jax.models import VisionTransformer
from vit_jax.models.vit import LN_EPSILON

_CHUNK = 64 << 20  # Bytes per write of a file built in memory (save_npz).
# An exported model's config.model options (``fit.model_options``), as a JSON string, where the
# release's reader would not compute what it does from the arrays alone (``npz_problem``).
OPTIONS_KEY = 'config.model'


def load_npz(path: str | os.PathLike) -> Params:
  """Reads a release (or big_vision) .npz file into the nested release layout.

  ``path`` is local or on any filesystem ``vit_jax.base.paths`` reads (``gs://vit_models/...``):
  it is read through epath, never ``open``. A missing or unreachable file is a
  ``errors.MissingFileError``.
  """
  return layout.unflatten(read_npz(path)[0])


def read_npz(path: str | os.PathLike,
             arrays: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
  """(the flat release-layout arrays, the config.model options recorded beside them) of a
  .npz file (``load_npz``). ``arrays=False``: only its first bytes and its zip directory are
  read, for their errors (a damaged or partial file), before a run writes anything: None."""
  if not paths.is_file(path):
    raise errors.MissingFileError(f'No checkpoint file at {path}: name a release .npz file (the '
                                  'docs/checkpoints.md says where to get them).')
  headers.check_npz(path)  # Its first bytes and zip directory: damaged, partial, a .npy file?
  if not arrays:
    return None
  try:
    with paths.path(path).open('rb') as f, np.load(f, allow_pickle=False) as archive:
      flat = {k: archive[k] for k in archive.files}
  except (ValueError, zipfile.BadZipFile, EOFError, zlib.error) as e:
    raise headers.unreadable_npz(path, e) from None
  except Exception as e:
    if paths.filesystem_error(e):
      raise paths.unreachable(path, e) from None
    raise
  options = json.loads(str(flat.pop(OPTIONS_KEY))) if OPTIONS_KEY in flat else {}
  flat = big_vision.canonical(flat, path)
  check_finite(flat, path)
  return flat, options


def save_npz(path: str | os.PathLike, params: Mapping[str, Any],
             options: Mapping[str, Any] | None = None) -> None:
  """Writes params (any layout, dtype or sharding) as a release-layout .npz file.

  ``path`` is local or remote (``gs://``: ``vit_jax.base.paths``). The file appears
  atomically: it is written beside the target, then renamed; a write that fails (a full
  disk) leaves nothing behind and is one ``errors.WriteError`` (``paths.atomic_files``). A
  remote file is built in memory first, as numpy's zip writer needs a file it can ``tell``
  in, which gfile's writers are not.
  """
  path = paths.path(path)
  flat: dict[str, Any] = {k: to_host(v) for k, v in flatten(layout.to_release(params)).items()}
  if options:
    flat[OPTIONS_KEY] = np.array(json.dumps(options))
  with paths.atomic_files(path) as (tmp,):
    if paths.is_remote(path):
      buffer = io.BytesIO()
      np.savez(buffer, **flat)
      view = buffer.getbuffer()
      with tmp.open('wb') as f:  # gfile takes bytes only: copied a chunk at a time.
        for start in range(0, len(view), _CHUNK):
          f.write(bytes(view[start:start + _CHUNK]))
      del view
    else:
      with tmp.open('wb') as f:
        np.savez(f, **flat)


def npz_problem(model: VisionTransformer) -> str:
  """What of ``model`` the release's readers (its code, timm's) would not compute from a .npz
  file's arrays ('' if nothing): they read the release's ViT (tanh GELU, LayerNorm epsilon
  1e-6). vit_jax's own reader reads such an export by the options written beside them."""
  problems = (
      (model.layer_scale is not None,
       f'layer_scale={model.layer_scale} (ls1, ls2: no such arrays in the release layout)'),
      (model.num_registers,
       f'num_registers={model.num_registers} (no register tokens in the release layout)'),
      (model.fc_norm, 'fc_norm=True (the release normalises before pooling)'),
      (model.has_class_token != (model.pool == 'token'),
       f'class_token={model.has_class_token} with pool={model.pool!r} (a release file has a '
       'class token exactly where it pools it)'),
      (model.activation != 'gelu_tanh',
       f'activation={model.activation!r} (a release file is read with the tanh GELU)'),
      (model.norm_epsilon != LN_EPSILON,
       f'norm_epsilon={model.norm_epsilon:g} (a release file is read with 1e-6)'),
      (model.norm != 'layernorm', f'norm={model.norm!r} (a release file is read with LayerNorms)'),
      (model.rope, f'rope={model.rope!r} (the release\'s ViT has no rotary encoding)'),
      (model.posemb == 'none', "posemb='none' (a release file without position embeddings is "
       'read as sincos2d)'),
      (model.map_heads, f'map_heads={model.map_heads} (the release\'s MAP head has the '
       "blocks' heads)"),
      *((not model.key_bias and model.qkv_bias, 'key_bias=False'),
        (model.mlp_norm, 'mlp_norm=True'), (model.attention_norm, 'attention_norm=True')),
      *((getattr(model, option), f'{option}=True (a release file is read as the release\'s ViT)')
        for option in ('pre_norm', 'gated_mlp', 'distill_token', 'parallel_block', 'qk_norm')))
  return next((what for bad, what in problems if bad), '')


def save_model_npz(path: str | os.PathLike, model: VisionTransformer,
                   params: Mapping[str, Any]) -> None:
  """``save_npz`` of a model's parameters; prefix tokens without position embeddings get zero
  rows. Where the release's reader would not compute what ``model`` does (``npz_problem``),
  its config.model options go beside the arrays (``OPTIONS_KEY``): ``load`` reads them."""
  flat = {k: to_host(v) for k, v in flatten(layout.to_release(params)).items()}
  if model.posemb == 'learn':
    hub.embed_prefix(model, flat)
  save_npz(path, flat, model_options(model) if npz_problem(model) else None)


def load_pretrained(path: str | os.PathLike, init_params: Mapping[str, Any], model_config: Any,
                    *, keep_head: bool = False, source_grid: tuple[int, int] | None = None,
                    source_pool: str | None = None) -> Params:
  """Adapts a release .npz file to a model, for fine-tuning: ``adapt`` on its contents.

  ``source_pool``: the pooling of the file's model where its arrays do not say it
  (``check_source_pool``).
  """
  source = flatten(load_npz(path))
  big_vision.check_source_pool(path, source, source_pool, keep_head=keep_head)
  return adapt(source, init_params, model_config, keep_head=keep_head,
               source_grid=source_grid, origin=str(path))


def load_npz_model(path: str | os.PathLike, model_name: str | None = None,
                   image_size: int | tuple[int, int] | None = None,
                   class_names: tuple[str, ...] = (), pool: str | None = None,
                   source_grid: tuple[int, int] | None = None,
                   patch_size: int | tuple[int, int] | None = None) -> Loaded:
  """A release (or exported) .npz file as a model with its parameters.

  The architecture is read from the file's shapes (``npz_architecture``) and
  named after the registry's model of that shape; ``model_name`` picks a
  registry model instead (the file must fit it). ``image_size`` defaults to the
  file's own resolution; another size gets bilinearly resized position
  embeddings. ``pool``: the pool type of a big_vision file without a class token or
  MAP head ('gap', '0' or 'none': the same arrays; ``check_source_pool``), which is
  refused without it; ``source_grid`` the file's patch grid where it is not square
  (``adapt``); ``patch_size`` another patch size (FlexiViT's resample, ``model_of``).
  Mismatches raise ``errors.CheckpointMismatchError``, which says what the file holds.
  """
  flat, options = read_npz(path)
  big_vision.check_source_pool(path, flat, pool, keep_head=True)
  return model_of(flat, str(path), model_name, image_size, class_names, source_grid, options,
                  patch_size)
