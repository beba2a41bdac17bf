"""Release .npz checkpoints: read them, write them, adapt them to a model.

The release layout is the flat key set of the published ViT files (numpy
archives of float32 arrays, keys joined by '/'). An unrolled model's params
tree equals it; a scanned model differs only in stacking
``Transformer/encoderblock_{i}`` into one ``Transformer/encoderblock`` with a
leading layer axis. ``load_npz`` also reads big_vision's files and returns
them in the release layout; ``save_npz`` always writes the release layout.

big_vision's ViT (``big_vision/models/vit.py``) differs in names only, except for
one thing: it adds its top-level ``pos_embedding`` (h * w rows) to the patches
*before* it prepends the class token, where the release adds h * w + 1 rows after.
The two are the same function when the class token's row is zero, so that is the
row ``load_npz`` puts in. Its other differences: a ``params/`` (or Flax optimizer
``opt/target/``) prefix, Linen's automatic block names (``LayerNorm_1``,
``MultiHeadDotProductAttention_0``, ``MlpBlock_0``), bfloat16 arrays stored as
2-byte voids; its pool types ``tok``, ``gap`` and ``map`` are ours ``token``,
``gap`` and ``map`` (``MAPHead_0``, the same names), scanned or not.
"""

from __future__ import annotations

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
from etils import epath

from vit_jax import errors
from vit_jax.models import VisionTransformer, get_model, registry
from vit_jax.models.vit import pair

# Masked patch prediction's parameters (vit_jax.mpp): the learnable [mask] embedding and
# the per-patch prediction head, used only in pre-training; fine-tuning drops them.
PRETRAINING_ONLY = ('mask_token', 'mpp_head')

Params = dict[str, Any]

POSEMB_KEY = 'Transformer/posembed_input/pos_embedding'
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
    transformer[f'encoderblock_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, 'Transformer': transformer}


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


def load_npz(path: str | os.PathLike) -> Params:
  """Reads a release (or big_vision) .npz file into the nested release layout."""
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f'No checkpoint file at {path}.')
  try:
    with path.open('rb') as f:
      archive = np.load(f, allow_pickle=False)
      if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError('it holds a single array, not a named archive')
      flat = {k: archive[k] for k in archive.files}
  except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f'{path} is not a .npz checkpoint that numpy can read ({e}). '
                     'Release checkpoints are numpy .npz archives of float32 arrays.') from e
  return unflatten(_canonicalise(flat, path))


def to_host(x: Any) -> np.ndarray:
  """A (possibly sharded, multi-host) array as one float32 numpy array on every host."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x), dtype=np.float32)


def save_npz(path: str | os.PathLike, params: Mapping[str, Any]) -> None:
  """Writes params (any layout, dtype or sharding) as a release-layout .npz file.

  The file appears atomically: it is written beside the target, then renamed.
  """
  path = epath.Path(path)
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f'.{path.name}.tmp-{os.getpid()}'
  with tmp.open('wb') as f:
    np.savez(f, **flat)
  tmp.replace(path)


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
      raise ValueError(f'The position embeddings hold {n} patch positions, not a square grid: '
                       'pass the source grid as (rows, columns).')
    return (side, side)
  grid = pair(grid)
  if grid[0] * grid[1] != n:
    raise ValueError(f'A {grid[0]}x{grid[1]} grid has {grid[0] * grid[1]} '
                     f'positions, the embeddings hold {n}.')
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


def _fit_posemb(posemb: np.ndarray, shape: tuple[int, ...], model: VisionTransformer,
                source_grid: tuple[int, int] | None, log: Any) -> np.ndarray:
  """Position embeddings resized from the source's grid to the model's, where they differ.

  The source grid is ``source_grid`` where known; else the model's when the number of
  positions is the same, else the square one. Same-sized grids are resized too (4x6
  into 6x4 is a different layout of the same 24 positions).
  """
  n = posemb.shape[1] - model.num_prefix_tokens
  grid = source_grid
  if grid is None and posemb.shape == tuple(shape):
    grid = model.grid
    if grid[0] != grid[1]:
      log('%s taken as the model\'s %dx%d grid (pass source_grid=(rows, columns) if the '
          'checkpoint\'s is another, e.g. the transposed one)', POSEMB_KEY, *grid)
  grid = posemb_grid(n, grid)
  if grid == model.grid:
    return posemb
  resized = resize_posemb(posemb, model.grid, grid, model.num_prefix_tokens)
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
                      shapes: list[tuple[str, tuple, tuple]]) -> str:
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
  lines.append(_describe(source) + ' Pick the model variant the checkpoint was trained as.')
  return '\n'.join(lines)


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


def load_pretrained(path: str | os.PathLike, init_params: Mapping[str, Any], model_config: Any,
                    *, keep_head: bool = False,
                    source_grid: tuple[int, int] | None = None) -> Params:
  """Adapts a release .npz file to a model, for fine-tuning: ``adapt`` on its contents."""
  return adapt(flatten(load_npz(path)), init_params, model_config, keep_head=keep_head,
               source_grid=source_grid, origin=str(path))


def adapt(source: Mapping[str, Any], init_params: Mapping[str, Any], model_config: Any, *,
          keep_head: bool = False, source_grid: tuple[int, int] | None = None,
          origin: str = 'checkpoint') -> Params:
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
      the model's grid when the number of positions is the same, else the square
      one; give it for a non-square source (a transposed one, 4x6 into 6x4, is
      resized only when it is given).
    origin: where the parameters come from, for the log and the errors.

  Returns:
    Params in ``init_params``' layout: pre-logits kept or dropped as the model
    has it, position embeddings resized to the model's grid, a fresh head.
  Raises:
    errors.CheckpointMismatchError: listing missing, extra and mis-shaped keys.
  """
  model = _as_model(model_config)
  init = unwrap(init_params)
  target = flatten(to_release(init))
  source = dict(source)
  log = lambda msg, *args: logging.info('init from %s: ' + msg, origin, *args)

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
      else:
        missing.append(key)
      continue
    value = source[key]
    if key == POSEMB_KEY and value.shape[-1] == ref.shape[-1]:
      value = _fit_posemb(value, ref.shape, model, source_grid, log)
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
        _mismatch_message(origin, model, source, missing, extra, shapes))
  for key in dropped:
    log('%s %s dropped (the model has no such layer)', key, source[key].shape)
  if not keep_head and 'head/kernel' in target:
    log('head: new zero-initialised classifier %s', target['head/kernel'].shape)
  log('%d arrays loaded', len(target))
  return to_model_layout(unflatten(loaded), scanned=is_scanned(init))
