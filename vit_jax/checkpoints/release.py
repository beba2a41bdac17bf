"""Release .npz checkpoints: read them, write them, adapt them to a model.

The release layout is the flat key set of the published ViT files (float32 arrays, keys joined
by '/'): an unrolled model's params tree, or a scanned one's with its blocks unstacked.
``load_npz`` also reads big_vision's files into it (their names, prefixes and bfloat16 arrays:
docs/checkpoints.md); ``save_npz`` always writes it. The one difference beyond names: big_vision
adds its ``pos_embedding`` (h * w rows) before prepending the class token, the release h * w + 1
rows after; the two agree when the class token's row is zero, the row ``load_npz`` puts in.
big_vision's pool types ``0`` and ``none`` are not ours and store a ``gap`` file's arrays, so
such a file's classifier loads only where its pool type is said (``check_source_pool``).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import zipfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vit_jax.base import errors, paths
from vit_jax.models import VisionTransformer, get_model, registry
from vit_jax.models.vit import LN_EPSILON, pair

# Masked patch prediction's parameters (vit_jax.models.mpp): the learnable [mask] embedding and
# the per-patch prediction head, used only in pre-training; fine-tuning drops them.
PRETRAINING_ONLY = ('mask_token', 'mpp_head')

Params = dict[str, Any]

POSEMB_KEY = 'Transformer/posembed_input/pos_embedding'
_CHUNK = 64 << 20  # Bytes per write of a file built in memory (save_npz).
_BLOCK = re.compile(r'^Transformer/encoderblock_(\d+)/')
_SCANNED = 'Transformer/encoderblock/'
# big_vision names the block's children by Linen's automatic numbering.
_LINEN_BLOCK_NAMES = {'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
                      'LayerNorm_1': 'LayerNorm_2', 'MlpBlock_0': 'MlpBlock_3'}


def flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf}."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      flat.update({f'{key}/{k}': v for k, v in flatten(value).items()})
    else:
      flat[key] = value
  return flat


def unflatten(flat: Mapping[str, Any]) -> Params:
  """{'a/b/c': leaf} -> nested dict."""
  tree: Params = {}
  for key, value in flat.items():
    *parents, leaf = key.split('/')
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def unwrap(variables: Mapping[str, Any]) -> Params:
  """Accepts ``{'params': p}`` or ``p``; returns ``p`` as a plain dict."""
  if set(variables) == {'params'}:
    variables = variables['params']
  return dict(variables)


def is_scanned(params: Mapping[str, Any]) -> bool:
  return 'encoderblock' in params.get('Transformer', {})


def to_release(params: Mapping[str, Any]) -> Params:
  """Model params (scanned or unrolled) -> release layout (unrolled)."""
  params = unwrap(params)
  if not is_scanned(params):
    return params
  transformer = dict(params['Transformer'])
  stacked = transformer.pop('encoderblock')
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  for i in range(num_layers):
    transformer[f'encoderblock_{i}'] = jax.tree.map(lambda x, i=i: _layer(x, i), stacked)
  return {**params, 'Transformer': transformer}


def _layer(x: Any, i: int) -> Any:
  """Layer ``i`` of a stacked array, or of its shape (``jax.eval_shape``'s parameters)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
  return x[i]


def to_model_layout(params: Mapping[str, Any], scanned: bool) -> Params:
  """Release layout -> the layout of a model built with ``scan=scanned``."""
  params = unwrap(params)
  if not scanned or is_scanned(params):
    return params if scanned else to_release(params)
  transformer = dict(params['Transformer'])
  blocks = sorted((int(k.rsplit('_', 1)[1]), k) for k in transformer
                  if k.startswith('encoderblock_'))
  layers = [transformer.pop(k) for _, k in blocks]
  transformer['encoderblock'] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
  return {**params, 'Transformer': transformer}


def _canonicalise(flat: dict[str, np.ndarray], path: Any) -> dict[str, np.ndarray]:
  """Maps big_vision's names onto the release layout and checks it is a ViT file."""
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
    raise ValueError(
        f'{path} is not a ViT release checkpoint: expected keys such as "embedding/kernel" '
        f'and "Transformer/encoder_norm/scale", found {len(flat)} keys ({sample}).')
  return flatten(to_release(unflatten(renamed)))


def canonical(flat: dict[str, np.ndarray], origin: Any) -> dict[str, np.ndarray]:
  """A release or big_vision checkpoint's flat arrays in the release layout (unrolled)."""
  return _canonicalise(flat, origin)


def load_npz(path: str | os.PathLike) -> Params:
  """Reads a release (or big_vision) .npz file into the nested release layout.

  ``path`` is local or on any filesystem ``vit_jax.base.paths`` reads (``gs://vit_models/...``):
  it is read through epath, never ``open``. A missing or unreachable file is a
  ``errors.MissingFileError``.
  """
  if not paths.is_file(path):
    raise errors.MissingFileError(f'No checkpoint file at {path}: name a release .npz file (the '
                                  'docs/checkpoints.md says where to get them).')
  try:
    with paths.path(path).open('rb') as f:
      archive = np.load(f, allow_pickle=False)
      if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError('it holds a single array, not a named archive')
      flat = {k: archive[k] for k in archive.files}
  except (ValueError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f'{path} is not a .npz checkpoint that numpy can read ({e}). '
                     'Release checkpoints are numpy .npz archives of float32 arrays.') from e
  except Exception as e:
    if paths.filesystem_error(e):
      raise paths.unreachable(path, e) from None
    raise
  return unflatten(_canonicalise(flat, path))


def to_host(x: Any) -> np.ndarray:
  """A (possibly sharded, multi-host) array as one float32 numpy array on every host."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x), dtype=np.float32)


def save_npz(path: str | os.PathLike, params: Mapping[str, Any]) -> None:
  """Writes params (any layout, dtype or sharding) as a release-layout .npz file.

  ``path`` is local or remote (``gs://``: ``vit_jax.base.paths``). The file appears
  atomically: it is written beside the target, then renamed. A remote file is built in
  memory first, as numpy's zip writer needs a file it can ``tell`` in, which gfile's
  writers are not.
  """
  path = paths.path(path)
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f'.{path.name}.tmp-{os.getpid()}'
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
  tmp.replace(path)


def npz_problem(model: VisionTransformer) -> str:
  """What of ``model`` a release .npz file cannot record ('' if nothing): the file is read back
  by its arrays alone, as the release's ViT (tanh GELU, LayerNorm epsilon 1e-6)."""
  if model.layer_scale is not None:
    return f'layer_scale={model.layer_scale} (ls1, ls2: no such arrays in the release layout)'
  if model.num_registers:
    return f'num_registers={model.num_registers} (no register tokens in the release layout)'
  if model.fc_norm:
    return 'fc_norm=True (the release normalises before pooling)'
  if model.has_class_token != (model.pool == 'token'):
    return (f'class_token={model.has_class_token} with pool={model.pool!r} (a release file '
            "has a class token exactly where it pools it)")
  if model.activation != 'gelu_tanh':
    return f'activation={model.activation!r} (a release file is read with the tanh GELU)'
  if model.norm_epsilon != LN_EPSILON:
    return f'norm_epsilon={model.norm_epsilon:g} (a release file is read with 1e-6)'
  return ''


def save_model_npz(path: str | os.PathLike, model: VisionTransformer,
                   params: Mapping[str, Any]) -> None:
  """``save_npz`` of a model's parameters, refused where the layout cannot say what ``model``
  computes (``npz_problem``); a class token without a position embedding gets a zero row."""
  if problem := npz_problem(model):
    raise errors.CheckpointError(
        f'A release .npz file cannot hold {model.model_name or "this model"}: {problem}. '
        "Export it with format='timm' (python -m vit_jax.tools.export --format=timm).")
  params = to_release(params)
  if model.posemb == 'learn' and model.num_prefix_tokens and not model.prefix_posemb:
    flat = flatten(params)
    posemb = to_host(flat[POSEMB_KEY])
    flat[POSEMB_KEY] = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
    params = unflatten(flat)
  save_npz(path, params)


def _interpolation_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) linear interpolation with aligned corners (scipy.ndimage.zoom order=1)."""
  pos = np.arange(n_out) * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.)
  lo = np.clip(np.floor(pos).astype(int), 0, n_in - 1)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = pos - lo
  m = np.zeros((n_out, n_in))
  np.add.at(m, (np.arange(n_out), lo), 1. - frac)
  np.add.at(m, (np.arange(n_out), hi), frac)
  return m


def posemb_grid(n: int, grid: tuple[int, int] | None = None) -> tuple[int, int]:
  """The (rows, columns) of ``n`` patch positions: ``grid`` checked, or else the square."""
  if grid is None:
    side = math.isqrt(n)
    if side * side != n:
      raise errors.CheckpointMismatchError(
          f'The position embeddings hold {n} patch positions, not a square grid: pass the '
          'source grid as (rows, columns) (config.init_source_grid, or source_grid=).')
    return (side, side)
  grid = pair(grid)
  if grid[0] * grid[1] != n:
    raise errors.CheckpointMismatchError(
        f'The source grid {grid[0]}x{grid[1]} has {grid[0] * grid[1]} positions, the '
        f'position embeddings hold {n}: give the grid the checkpoint was trained at.')
  return grid


def resize_posemb(posemb: np.ndarray, new_grid: tuple[int, int],
                  old_grid: tuple[int, int] | None = None,
                  num_prefix_tokens: int = 1) -> np.ndarray:
  """Bilinearly resizes (1, prefix + h*w, D) position embeddings to ``new_grid``.

  The prefix (class-token) rows are kept as they are. ``old_grid`` defaults to
  the square grid of the patch rows; pass it for non-square sources.
  """
  posemb = np.asarray(posemb)
  prefix, patches = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
  n, width = patches.shape
  old_grid = posemb_grid(n, old_grid)
  grid = patches.reshape(*old_grid, width).astype(np.float64)
  rows = _interpolation_matrix(old_grid[0], new_grid[0])
  cols = _interpolation_matrix(old_grid[1], new_grid[1])
  grid = np.einsum('ih,jw,hwd->ijd', rows, cols, grid)
  resized = grid.reshape(1, new_grid[0] * new_grid[1], width).astype(posemb.dtype)
  return np.concatenate([prefix, resized], axis=1)


def _fit_posemb(posemb: np.ndarray, model: VisionTransformer,
                source_grid: tuple[int, int] | None, log: Any) -> np.ndarray:
  """Position embeddings resized from the source's grid to the model's, where they differ.

  The source grid is ``source_grid`` where known. Else it is inferred only where one
  grid is the convention: the model's when it is square and has as many positions;
  the square one of the positions when there are as many as a square has (release
  files are square). Anything else is refused, never guessed: the same number of
  positions as a non-square model's grid could be that grid, its transpose or another
  (4x6 into 6x4 is a different layout of the same 24 positions, resized when given).
  """
  n = posemb.shape[1] - model.posemb_prefix_rows
  h, w = model.grid
  grid = source_grid
  if grid is None and n == h * w and h != w:
    raise errors.CheckpointMismatchError(
        f'The position embeddings hold {n} patch positions, as many as the model\'s {h}x{w} '
        f'grid, but the checkpoint does not record its grid: {h}x{w}, the transposed {w}x{h} '
        'and others have as many. Pass the grid it was trained at as (rows, columns) '
        '(config.init_source_grid, or source_grid=).')
  if grid is None and n == h * w:
    grid = model.grid
  grid = posemb_grid(n, grid)
  if source_grid is None and grid != model.grid:
    log('%s taken as the square %dx%d grid of its %d positions (pass config.init_source_grid '
        'if it is another)', POSEMB_KEY, *grid, n)
  if grid == model.grid:
    return posemb
  resized = resize_posemb(posemb, model.grid, grid, model.posemb_prefix_rows)
  log('%s resized %s -> %s (bilinear, from the %dx%d grid to the %dx%d grid)', POSEMB_KEY,
      posemb.shape, resized.shape, *grid, *model.grid)
  return resized


def _as_model(model_config: Any) -> VisionTransformer:
  if isinstance(model_config, VisionTransformer):
    return model_config
  cfg = dict(model_config)
  if 'name' not in cfg:
    raise ValueError('model_config needs a "name" (e.g. "b16") or must be the model itself.')
  name = cfg.pop('name')
  return get_model(name, num_classes=cfg.pop('num_classes', None), **cfg)


def _index_ranges(indices: list[int]) -> str:
  """[0, 1, 2, 5] -> '0-2,5'."""
  runs: list[list[int]] = []
  for i in sorted(indices):
    if runs and i == runs[-1][-1] + 1:
      runs[-1].append(i)
    else:
      runs.append([i])
  return ','.join(f'{r[0]}-{r[-1]}' if len(r) > 1 else str(r[0]) for r in runs)


def _group_blocks(items: list[tuple[str, str]]) -> list[str]:
  """Collapses lines that differ only in the block index: encoderblock_{0-11}/..."""
  groups: dict[tuple[str, str], list[int]] = {}
  for key, detail in items:
    m = re.search(r'encoderblock_(\d+)', key)
    pattern = key[:m.start()] + 'encoderblock_%s' + key[m.end():] if m else key
    groups.setdefault((pattern, detail), []).extend([int(m.group(1))] if m else [])
  name = lambda idx: str(idx[0]) if len(idx) == 1 else '{' + _index_ranges(idx) + '}'
  return [(p % name(idx) if idx else p) + detail for (p, detail), idx in groups.items()]


def _mismatch_message(origin: Any, model: VisionTransformer, source: Mapping[str, Any],
                      missing: list[str], extra: list[str],
                      shapes: list[tuple[str, tuple, tuple]],
                      source_model: VisionTransformer | None = None) -> str:
  def listing(title: str, items: list[tuple[str, str]]) -> list[str]:
    if not items:
      return []
    lines = _group_blocks(items)
    more = [f'    ... and {len(lines) - 30} more'] if len(lines) > 30 else []
    return [f'  {title} ({len(items)}):'] + [f'    {line}' for line in lines[:30]] + more

  lines = [f'Checkpoint {origin} does not fit the model {model.model_name or ""} '
           f'(hidden_size={model.hidden_size}, num_layers={model.num_layers}, '
           f'patch_size={model.patch_size}):']
  lines += listing('missing from the checkpoint', [(k, '') for k in missing])
  lines += listing('in the checkpoint but not in the model', [(k, '') for k in extra])
  lines += listing('shape mismatch (checkpoint vs model)',
                   [(k, f': {a} vs {b}') for k, a, b in shapes])
  if source_model is not None:
    options = ', '.join(f'{k}={v!r}' for k, v in model_options(source_model).items())
    lines.append(f'The checkpoint is a model with config.model: {options}.')
  else:
    lines.append(_describe(source) + ' Pick the model variant the checkpoint was trained as.')
  return '\n'.join(lines)


# The options that make up a model's architecture (the rest: how it computes, dtypes, dropout).
ARCHITECTURE = ('image_size', 'patch_size', 'hidden_size', 'num_layers', 'mlp_dim', 'num_heads',
                'resnet_layers', 'resnet_width', 'pool', 'representation_size', 'posemb',
                'parallel_block', 'qk_norm', 'qkv_bias', 'norm', 'norm_epsilon', 'activation',
                'layer_scale', 'class_token', 'num_registers', 'prefix_posemb', 'fc_norm')


def model_options(model: VisionTransformer) -> dict[str, Any]:
  """The config.model fields that describe ``model``'s architecture, defaults left out."""
  defaults = {f.name: f.default for f in dataclasses.fields(VisionTransformer)}
  options = {'name': 'b16'}
  for key in ARCHITECTURE:
    value = getattr(model, key)
    if key in ('image_size', 'patch_size'):
      value = pair(value)
      value = value[0] if value[0] == value[1] else value
    if key in ('hidden_size', 'num_layers', 'mlp_dim', 'num_heads', 'patch_size') or (
        value != defaults.get(key)):
      options[key] = value
  return options


def _move_prefix_posemb(source: dict[str, Any], model: VisionTransformer,
                        source_model: VisionTransformer | None, log: Any
                        ) -> tuple[dict[str, Any], int]:
  """``source`` with its prefix tokens' position embeddings as ``model`` lays them out, and
  the number of prefix rows its position embeddings then have."""
  if POSEMB_KEY not in source or model.posemb != 'learn':
    return source, model.posemb_prefix_rows
  tokens = [k for k in ('cls', 'registers') if k in source]
  count = sum(int(np.shape(source[k])[1]) for k in tokens)
  rows = count if source_model is None else source_model.posemb_prefix_rows
  want = model.posemb_prefix_rows
  if rows == want or (rows and want) or count != model.num_prefix_tokens:
    return source, rows  # Nothing to move, or a mismatch that adapt names.
  posemb = np.asarray(source[POSEMB_KEY])
  if rows:  # Into the tokens: [cls + row_0; reg + rows_1..; x + pe] is the same sum.
    start = 0
    for key in tokens:
      n = int(np.shape(source[key])[1])
      source[key] = np.asarray(source[key]) + posemb[:, start:start + n].astype(
          np.asarray(source[key]).dtype)
      start += n
    source[POSEMB_KEY] = posemb[:, rows:]
    log('%s: the %d prefix rows added to %s (the model has none for them)', POSEMB_KEY, rows,
        ' and '.join(tokens))
  else:
    source[POSEMB_KEY] = np.concatenate([np.zeros_like(posemb[:, :want]), posemb], axis=1)
    log('%s: %d zero rows for the prefix tokens (the source has none)', POSEMB_KEY, want)
  return source, want


def _describe(flat: Mapping[str, Any]) -> str:
  """'The checkpoint holds width 768, 12 layers, 16x16 patches (ViT-B_16).'"""
  *patch, _, width = flat['embedding/kernel'].shape
  depth = len({k.split('/')[1] for k in flat if _BLOCK.match(k)})
  matches = [registry.release_name(n) for n in registry.list_models()
             if (kw := registry.model_kwargs(n))['hidden_size'] == width
             and kw['num_layers'] == depth and pair(kw['patch_size']) == tuple(patch)
             and (kw.get('resnet_layers') is not None) == ('conv_root/kernel' in flat)]
  if not matches and 'conv_root/kernel' not in flat:
    for size, kw in registry.SIZES.items():
      if kw['hidden_size'] == width and kw['num_layers'] == depth:
        matches.append(registry.release_name(f'{size}{patch[0]}'))
  name = f' ({", ".join(matches)})' if matches else ''
  return f'The checkpoint holds width {width}, {depth} layers, {patch[0]}x{patch[1]} patches{name}.'


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


def load_pretrained(path: str | os.PathLike, init_params: Mapping[str, Any], model_config: Any,
                    *, keep_head: bool = False, source_grid: tuple[int, int] | None = None,
                    source_pool: str | None = None) -> Params:
  """Adapts a release .npz file to a model, for fine-tuning: ``adapt`` on its contents.

  ``source_pool``: the pooling of the file's model where its arrays do not say it
  (``check_source_pool``).
  """
  source = flatten(load_npz(path))
  check_source_pool(path, source, source_pool, keep_head=keep_head)
  return adapt(source, init_params, model_config, keep_head=keep_head,
               source_grid=source_grid, origin=str(path))


def adapt(source: Mapping[str, Any], init_params: Mapping[str, Any], model_config: Any, *,
          keep_head: bool = False, source_grid: tuple[int, int] | None = None,
          origin: str = 'checkpoint', source_model: VisionTransformer | None = None) -> Params:
  """Adapts pre-trained parameters (flat, release layout) to a model, for fine-tuning.

  Args:
    source: {'Transformer/encoder_norm/scale': array, ...}, as ``flatten(load_npz(f))``.
    init_params: the model's freshly initialised params (they give the target
      shapes and layout, and the new head).
    model_config: the model (``get_model(...)``) or its config (``name`` plus
      ``get_model`` options); its ``image_size`` and ``patch_size`` give the grid.
    keep_head: keep the source's classifier (it must have the model's classes)
      instead of the fresh zero-initialised one.
    source_grid: (rows, columns) of the source's position embeddings. Without it,
      the model's grid when that is square with as many positions, else the square
      one; a source that is neither (a non-square one, or one as large as a non-square
      model's grid, which could be its transpose) is refused without it.
    origin: where the parameters come from, for the log and the errors.
    source_model: the model the parameters are of, where known (a workdir's, a timm or
      transformers folder's): its position embeddings' prefix rows, and the options to
      name where the model does not fit. None: the release layout (a row per prefix token).

  Returns:
    Params in ``init_params``' layout: pre-logits kept or dropped as the model
    has it, position embeddings resized to the model's grid, a fresh head. Prefix tokens'
    position embeddings are moved into the tokens where the model has none for them
    (``token + row``: the same function), or added as zero rows where it has them; a
    model with layer scale takes scales of one where the source has none.
  Raises:
    errors.CheckpointMismatchError: listing missing, extra and mis-shaped keys.
  """
  model = _as_model(model_config)
  init = unwrap(init_params)
  target = flatten(to_release(init))
  log = lambda msg, *args: logging.info('init from %s: ' + msg, origin, *args)
  source, prefix_rows = _move_prefix_posemb(dict(source), model, source_model, log)

  loaded, missing, shapes = {}, [], []
  for key, ref in target.items():
    if key.startswith('head/') and not keep_head:
      loaded[key] = ref
      continue
    if key not in source:
      # A pre-logits layer, or masked patch prediction's parameters (pre-training from a
      # classifier's checkpoint): new.
      if key.startswith('pre_logits/') or key.split('/')[0] in PRETRAINING_ONLY:
        log('%s not in the checkpoint: freshly initialised %s', key, ref.shape)
        loaded[key] = ref
      elif key.rsplit('/', 1)[-1] in ('ls1', 'ls2'):  # Layer scale 1: the source's function.
        loaded[key] = np.ones(ref.shape, ref.dtype)
      else:
        missing.append(key)
      continue
    value = source[key]
    if (key == POSEMB_KEY and value.shape[-1] == ref.shape[-1]
        and prefix_rows == model.posemb_prefix_rows):  # Else: another model, named below.
      value = _fit_posemb(value, model, source_grid, log)
    if value.shape != tuple(ref.shape):
      shapes.append((key, value.shape, tuple(ref.shape)))
      continue
    loaded[key] = np.asarray(value, dtype=ref.dtype)

  # A classifier the model lacks, or masked patch prediction's mask embedding and head.
  dropped = [k for k in source if k not in target
             and k.split('/')[0] in ('pre_logits', 'head', *PRETRAINING_ONLY)]
  extra = [k for k in source if k not in target and k not in dropped]
  if missing or extra or shapes:
    raise errors.CheckpointMismatchError(
        _mismatch_message(origin, model, source, missing, extra, shapes, source_model))
  if any(k.rsplit('/', 1)[-1] == 'ls1' for k in target if k not in source):
    log('layer scale not in the checkpoint: ls1, ls2 set to one (the same function)')
  for key in dropped:
    log('%s %s dropped (the model has no such layer)', key, source[key].shape)
  if not keep_head and 'head/kernel' in target:
    log('head: new zero-initialised classifier %s', target['head/kernel'].shape)
  log('%d arrays loaded', len(target))
  return to_model_layout(unflatten(loaded), scanned=is_scanned(init))


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A trained model, ready to apply: ``model.apply({'params': params}, images)``."""

  model: VisionTransformer
  params: dict[str, Any]
  class_names: tuple[str, ...]
  source: str  # 'DIR (step N)' or the .npz path.
  config: Any = None  # The run's config (a ConfigDict), for a workdir.


def npz_architecture(flat: dict[str, Any]) -> dict[str, Any]:
  """The ``VisionTransformer`` attributes a release file's shapes imply.

  ``flat`` is ``flatten(load_npz(path))``. Width, depth,
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
      posemb='learn' if POSEMB_KEY in flat else 'sincos2d')
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
    n = np.shape(flat[POSEMB_KEY])[1] - (arch['pool'] == 'token')
    side = math.isqrt(n)
    if side * side == n:
      size = side * stride * int(ph)
  arch['image_size'] = size
  return arch


def load_npz_model(path: str | os.PathLike, model_name: str | None = None,
                   image_size: int | tuple[int, int] | None = None,
                   class_names: tuple[str, ...] = (), pool: str | None = None,
                   source_grid: tuple[int, int] | None = None) -> Loaded:
  """A release (or exported) .npz file as a model with its parameters.

  The architecture is read from the file's shapes (``npz_architecture``) and
  named after the registry's model of that shape; ``model_name`` picks a
  registry model instead (the file must fit it). ``image_size`` defaults to the
  file's own resolution; another size gets bilinearly resized position
  embeddings. ``pool``: the pool type of a big_vision file without a class token or
  MAP head ('gap', '0' or 'none': the same arrays; ``check_source_pool``), which is
  refused without it; ``source_grid`` the file's patch grid where it is not square
  (``adapt``). Mismatches raise ``errors.CheckpointMismatchError``, which says what the
  file holds.
  """
  flat = flatten(load_npz(path))
  check_source_pool(path, flat, pool, keep_head=True)
  return model_of(flat, str(path), model_name, image_size, class_names, source_grid)


def model_of(flat: dict[str, Any], origin: str, model_name: str | None = None,
             image_size: int | tuple[int, int] | None = None,
             class_names: tuple[str, ...] = (),
             source_grid: tuple[int, int] | None = None) -> Loaded:
  """Release-layout arrays as a model with its parameters (``load_npz_model``)."""
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
  params = adapt(flat, init, model, keep_head=True, source_grid=source_grid, origin=origin)
  return Loaded(model, params, tuple(class_names), origin)
