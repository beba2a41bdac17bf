"""big_vision's tensorstore checkpoints (``big_vision.utils.save_checkpoint_ts``), read.

big_vision's trainer keeps ``WORKDIR/checkpoint.bv-LAST`` (the name of the current step's
folder) and ``WORKDIR/checkpoint.bv-{step:09d}/``, one zarr array per leaf of its train state,
named by the leaf's path with ``~`` for ``/`` (``params~embedding~kernel``, ``opt~...``).
Only the ``params~`` arrays are read, with tensorstore. Their names are those of big_vision's
.npz files too, which ``canonical`` maps onto the release layout: the ``params/`` prefix, Linen's
block names, and ``pos_embedding`` (h * w rows, added before the class token is prepended; the
release's h * w + 1 rows agree with it when the class token's row is zero, the row put in).
big_vision's pool types ``0`` and ``none`` are not ours and store a ``gap`` model's arrays, so
such a checkpoint's classifier loads only where its pool type is said (``check_source_pool``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from vit_jax.base import errors, paths
from vit_jax.checkpoints.formats import layout
from vit_jax.checkpoints.formats.layout import POSEMB_KEY, check_finite, flatten, to_release

PREFIX = 'checkpoint.bv'
LAST = '-LAST'


def step_folder(path: str | os.PathLike, step: int | None = None) -> str | None:
  """The step folder of a big_vision checkpoint: ``path`` a workdir holding
  ``checkpoint.bv-LAST``, the ``WORKDIR/checkpoint.bv`` prefix big_vision's own loader takes,
  or a step folder itself; None where ``path`` is none of them. ``step``: that step's folder
  instead of the last one."""
  root = paths.path(path)
  for prefix in (root / PREFIX, root):
    last = prefix.parent / (prefix.name + LAST)
    if paths.is_file(last):
      name = f'{step:09d}' if step is not None else last.read_text().strip()
      folder = prefix.parent / f'{prefix.name}-{name}'
      if not paths.is_dir(folder):
        raise errors.MissingFileError(f'{path}: the big_vision checkpoint folder {folder} is '
                                      'missing.')
      return str(folder)
  if paths.is_dir(root) and any(p.name.startswith('params~') for p in root.iterdir()):
    return str(root)
  return None


def _open(folder: Any) -> np.ndarray:
  import tensorstore as ts

  location = str(folder)
  kvstore = location if paths.is_remote(location) else {'driver': 'file', 'path': location}
  return ts.open({'driver': 'zarr', 'kvstore': kvstore}, open=True).result().read().result()


def _check_chunks(array: Any) -> None:
  """Every chunk that a zarr array's ``.zarray`` describes is there. Zarr reads a missing
  chunk as zeros, so a partly copied checkpoint would load wrong, not fail. Where the array
  has a ``fill_value``, tensorstore leaves a chunk equal to it unwritten: no check there
  (big_vision's, through jax's serialization, have none)."""
  try:
    meta = json.loads((array / '.zarray').read_text())
    grid = [math.ceil(size / chunk) for size, chunk in zip(meta['shape'], meta['chunks'],
                                                           strict=True)]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise errors.CheckpointError(f'{array}: its .zarray cannot be read ({e}).') from None
  if meta.get('fill_value') is not None:
    return
  separator = meta.get('dimension_separator') or '.'
  for index in itertools.product(*map(range, grid)):
    chunk = separator.join(map(str, index)) or '0'
    if not paths.is_file(array / chunk):
      raise errors.CheckpointError(
          f'{array}: its chunk {chunk} is missing (of {math.prod(grid)}), which zarr would read '
          'as zeros: a partial copy. Copy the checkpoint again.')


def params_arrays(path: str | os.PathLike,
                  step: int | None = None) -> tuple[str, dict[str, Any]]:
  """A big_vision tensorstore checkpoint's step folder, and its ``params~`` arrays' folders
  by their names (``/`` for ``~``), each checked to hold every chunk it describes (the data
  itself is not read: a cheap check before a run starts)."""
  folder = step_folder(path, step)
  if folder is None:
    raise errors.CheckpointError(f'{path} is not a big_vision tensorstore checkpoint (no '
                                 f'{PREFIX}{LAST} and no params~ arrays).')
  arrays = {entry.name.replace('~', '/'): entry for entry in paths.path(folder).iterdir()
            if entry.name.startswith('params~')}
  for array in arrays.values():
    _check_chunks(array)
  return folder, arrays


def read_params(path: str | os.PathLike, step: int | None = None) -> dict[str, np.ndarray]:
  """The ``params`` of a big_vision tensorstore checkpoint in the flat release layout."""
  folder, arrays = params_arrays(path, step)
  try:
    flat = {name: np.asarray(_open(array)) for name, array in arrays.items()}
  except ValueError as e:  # tensorstore's errors: a damaged or partial array.
    raise errors.CheckpointError(f'{folder}: an array cannot be read ({e}).') from None
  flat = canonical(flat, folder)
  check_finite(flat, folder)
  return flat


_BLOCK = re.compile(r'^Transformer/encoderblock_(\d+)/')
_SCANNED = 'Transformer/encoderblock/'
# big_vision names the block's children by Linen's automatic numbering.
_LINEN_BLOCK_NAMES = {'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
                      'LayerNorm_1': 'LayerNorm_2', 'MlpBlock_0': 'MlpBlock_3'}


def canonical(flat: dict[str, np.ndarray], path: Any) -> dict[str, np.ndarray]:
  """A release or big_vision checkpoint's flat arrays in the release layout (unrolled); a
  ``CheckpointError`` where they are not a ViT's."""
  for prefix in ('params/', 'opt/target/'):  # big_vision: params/..., opt/...
    if any(k.startswith(prefix) for k in flat):
      flat = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
      break
  # numpy stores bfloat16 as 2-byte voids.
  flat = {k: v.view(jnp.bfloat16) if v.dtype.kind == 'V' and v.dtype.itemsize == 2 else v
          for k, v in flat.items()}
  if 'pos_embedding' in flat:  # big_vision's: no class-token row, that row is zero.
    posemb = flat.pop('pos_embedding')
    if 'cls' in flat:
      posemb = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
    flat[POSEMB_KEY] = posemb
  renamed = {}
  for key, value in flat.items():
    if _BLOCK.match(key) or key.startswith(_SCANNED):
      parts = key.split('/')
      parts[2] = _LINEN_BLOCK_NAMES.get(parts[2], parts[2])
      key = '/'.join(parts)
    renamed[key] = value
  if 'embedding/kernel' not in renamed or not any(k.startswith('Transformer/') for k in renamed):
    sample = ', '.join(sorted(flat)[:8]) or 'none'
    raise errors.CheckpointError(
        f'{path} is not a ViT release checkpoint: expected keys such as "embedding/kernel" '
        f'and "Transformer/encoder_norm/scale", found {len(flat)} keys ({sample}).')
  return flatten(to_release(layout.unflatten(renamed)))


# big_vision's pool types (big_vision/models/vit.py) -> ours; '0' (the output of the first
# patch token: there is no class token) and 'none' (no pooling: the head is applied to every
# token, logits of shape (batch, tokens, classes)) have no counterpart here.
SOURCE_POOLS = {'tok': 'token', 'token': 'token', 'gap': 'gap', 'map': 'map',
                '0': None, 'none': None}


def is_big_vision_layout(path: str | os.PathLike) -> bool:
  """Whether a .npz file was written by big_vision (its prefixes or Linen's block names)."""
  with paths.path(path).open('rb') as f:
    keys = np.load(f, allow_pickle=False).files
  return any(k.startswith(('params/', 'opt/target/')) or k == 'pos_embedding'
             or re.search(r'^Transformer/encoderblock(_\d+)?/MlpBlock_0/', k) for k in keys)


def check_source_pool(path: str | os.PathLike, source: Mapping[str, Any],
                      source_pool: str | None, *, keep_head: bool,
                      big_vision: bool | None = None) -> None:
  """Refuses a .npz file whose classifier would be used under another pooling than its own.

  ``source`` is the file's flat release-layout arrays; ``source_pool`` the pooling its
  model had, in big_vision's words (``tok``, ``gap``, ``map``, ``0``, ``none``) or ours,
  or None. The arrays say ``token`` (a class token) and ``map`` (a MAP head); the others
  store the same arrays, and only a big_vision file can be ``0`` or ``none``. With
  ``keep_head`` the file's classifier is used, so its pooling must be one of ours and,
  for a big_vision file, known. Without, only the encoder is taken and the model's own
  pooling feeds a new head: any source pooling is fine. ``big_vision``: whether the source
  was written by big_vision (None: read from the .npz file at ``path``).
  """
  seen = 'token' if 'cls' in source else 'map' if any(
      k.startswith('MAPHead_0/') for k in source) else None
  if source_pool is not None:
    if source_pool not in SOURCE_POOLS:
      raise errors.ConfigError(
          f'The source pool type {source_pool!r} is not one of big_vision\'s '
          f'({", ".join(repr(p) for p in SOURCE_POOLS if p != "token")}).')
    said = SOURCE_POOLS[source_pool]
    if (said if said in ('token', 'map') else None) != seen:
      holds = {'token': 'a class token', 'map': 'a MAP head'}.get(seen,
                                                                  'no class token, no MAP head')
      raise errors.CheckpointMismatchError(
          f'{path} holds {holds}: its pool type is not {source_pool!r}.')
  if not keep_head:
    return
  if source_pool in ('0', 'none'):
    what = ('the output of the first patch token (no class token)' if source_pool == '0' else
            'no pooling (the head applied to every token)')
    raise errors.CheckpointMismatchError(
        f"{path} is a big_vision model with pool type {source_pool!r}: {what}, which this "
        "ViT does not compute (it pools by 'token', 'gap' or 'map'), so its classifier "
        'cannot be used. Fine-tune it with a new head (config.init_keep_head=False).')
  if big_vision is None:
    big_vision = is_big_vision_layout(path)
  if seen is None and source_pool is None and big_vision:
    raise errors.CheckpointMismatchError(
        f"{path} is a big_vision file with neither a class token nor a MAP head: its pool "
        "type 'gap', '0' or 'none' stores the same arrays, and the classifier means "
        "something else under each. Say which (config.init_source_pool, predict's --pool, "
        "or source_pool=); only 'gap' is this ViT's.")
