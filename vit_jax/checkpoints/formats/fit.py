"""Release-layout arrays fitted to a model: the architecture they imply, position embeddings
resized between grids, prefix tokens' rows moved, a fresh head, and every mismatch named."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging

from vit_jax.base import errors
from vit_jax.base.sizes import pair
from vit_jax.checkpoints.formats import layout
from vit_jax.checkpoints.formats.layout import POSEMB_KEY, PRETRAINING_ONLY, Loaded, Params, flatten
from vit_jax.models import VisionTransformer, flexi, get_model, registry

_BLOCK = re.compile(r'^Transformer/encoderblock_(\d+)/')
PATCHEMB_KEY = 'embedding/kernel'


def resample_patchemb(kernel: np.ndarray, new_patch: int | tuple[int, int]) -> np.ndarray:
  """A (h, w, in, out) patch-embedding kernel resampled to ``new_patch`` pixels (FlexiViT's
  pseudo-inverse resize, Beyer et al. 2023; big_vision's ``resample_patchemb``).

  With B the bilinear resize of an (h, w) patch to ``new_patch`` (as tf.image.resize), the
  new kernel is pinv(B^T) k: the least-squares solution of <B x, k'> = <x, k> for every patch
  x. A patch resized up, embedded with the new kernel, gives the original token exactly;
  resized down, as nearly as least squares can. The matrix is ``flexi.pinv_resize_matrix``,
  the one a FlexiViT model's forward pass applies (``vit_jax.models.flexi``), here in float64.
  """
  kernel = np.asarray(kernel)
  (h, w), (nh, nw) = kernel.shape[:2], pair(new_patch)
  if (h, w) == (nh, nw):
    return kernel
  flat = kernel.reshape(h * w, -1).astype(np.float64)
  resampled = flexi.pinv_resize_matrix((h, w), (nh, nw)) @ flat
  return resampled.reshape(nh, nw, *kernel.shape[2:]).astype(kernel.dtype)


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
  rows = flexi.interpolation_matrix(old_grid[0], new_grid[0])  # FlexiViT's forward pass's.
  cols = flexi.interpolation_matrix(old_grid[1], new_grid[1])
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


def _fit_patchemb(kernel: np.ndarray, model: VisionTransformer, log: Any) -> np.ndarray:
  """The patch embedding resampled to the model's patch size where only that differs
  (FlexiViT's ``resample_patchemb``); a hybrid's, whose patches are on the ResNet's features,
  and any other mismatch are left for ``adapt`` to name."""
  patch = pair(model.patch_size)
  if (model.resnet_layers is not None or np.ndim(kernel) != 4
      or tuple(np.shape(kernel)[:2]) == patch
      or tuple(np.shape(kernel)[2:]) != (3, model.hidden_size)):
    return kernel
  resampled = resample_patchemb(kernel, patch)
  log('%s resampled %s -> %s (FlexiViT\'s pseudo-inverse of the bilinear patch resize, from '
      '%dx%d to %dx%d patches)', PATCHEMB_KEY, np.shape(kernel), resampled.shape,
      *np.shape(kernel)[:2], *patch)
  return resampled


def _as_model(model_config: Any) -> VisionTransformer:
  if isinstance(model_config, VisionTransformer):
    return model_config
  cfg = dict(model_config)
  if 'name' not in cfg:
    raise ValueError('model_config needs a "name" (e.g. "b16") or must be the model itself.')
  return get_model(cfg.pop('name'), num_classes=cfg.pop('num_classes', None), **cfg)


def _index_ranges(indices: list[int]) -> str:
  """[0, 1, 2, 5] -> '0-2,5'."""
  runs = [[i for _, i in run] for _, run in  # A run: the same index minus its position.
          itertools.groupby(enumerate(sorted(indices)), lambda p: p[1] - p[0])]
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
# The classifiers (a distilled DeiT's second one too): new ones where the head is not kept.
HEADS = ('head', 'head_dist')
ARCHITECTURE = ('image_size', 'patch_size', 'hidden_size', 'num_layers', 'mlp_dim', 'num_heads',
                'resnet_layers', 'resnet_width', 'pool', 'representation_size', 'posemb',
                'parallel_block', 'qk_norm', 'qkv_bias', 'norm', 'norm_epsilon', 'activation',
                'layer_scale', 'class_token', 'num_registers', 'prefix_posemb', 'fc_norm',
                'pre_norm', 'gated_mlp', 'distill_token', 'rope', 'key_bias', 'mlp_norm',
                'attention_norm', 'map_heads')


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


def adapt(source: Mapping[str, Any], init_params: Mapping[str, Any], model_config: Any, *,
          keep_head: bool = False, source_grid: tuple[int, int] | None = None,
          origin: str = 'checkpoint', source_model: VisionTransformer | None = None,
          count: bool = True) -> Params:
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
    count: log how many arrays were loaded (not for a checkpoint read into its own model,
      ``fitted``, which a fine-tune then adapts, and logs, again).

  Returns:
    Params in ``init_params``' layout: pre-logits kept or dropped as the model
    has it, position embeddings resized to the model's grid, the patch embedding
    resampled to the model's patch size (``resample_patchemb``), a fresh head. Prefix tokens'
    position embeddings are moved into the tokens where the model has none for them
    (``token + row``: the same function), or added as zero rows where it has them; a
    model with layer scale takes scales of one where the source has none.
  Raises:
    errors.CheckpointMismatchError: listing missing, extra and mis-shaped keys.
  """
  model = _as_model(model_config)
  init = layout.unwrap(init_params)
  target = flatten(layout.to_release(init))
  log = lambda msg, *args: logging.info('init from %s: ' + msg, origin, *args)
  source, prefix_rows = _move_prefix_posemb(dict(source), model, source_model, log)

  loaded, missing, shapes = {}, [], []
  for key, ref in target.items():
    if key.split('/')[0] in HEADS and not keep_head:
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
    if key == PATCHEMB_KEY:
      value = _fit_patchemb(value, model, log)
    if value.shape != tuple(ref.shape):
      shapes.append((key, value.shape, tuple(ref.shape)))
      continue
    loaded[key] = np.asarray(value, dtype=ref.dtype)

  # A classifier the model lacks, or masked patch prediction's mask embedding and head.
  dropped = [k for k in source if k not in target
             and k.split('/')[0] in ('pre_logits', *HEADS, *PRETRAINING_ONLY)]
  extra = [k for k in source if k not in target and k not in dropped]
  if missing or extra or shapes:
    raise errors.CheckpointMismatchError(
        _mismatch_message(origin, model, source, missing, extra, shapes, source_model))
  if any(k.rsplit('/', 1)[-1] == 'ls1' for k in target if k not in source):
    log('layer scale not in the checkpoint: ls1, ls2 set to one (the same function)')
  for key in dropped:
    log('%s %s dropped (the model has no such layer)', key, source[key].shape)
  for head in HEADS if not keep_head else ():
    if f'{head}/kernel' in target:
      log('%s: new zero-initialised classifier %s', head, target[f'{head}/kernel'].shape)
  if count:
    log('%d arrays loaded', len(target))
  return layout.to_model_layout(layout.unflatten(loaded), scanned=layout.is_scanned(init))


def npz_architecture(flat: dict[str, Any]) -> dict[str, Any]:
  """The ``VisionTransformer`` attributes a release file's arrays imply.

  ``flat`` is ``flatten(load_npz(path))``. Width, depth, MLP width, heads, patch size, BiT
  stem, pooling, pre-logits, position embeddings, classes, and the options that have arrays
  of their own (a LayerNorm before the blocks, a gated MLP, a distillation token, layer
  scale, registers, fc_norm, q/k norms, qkv and key biases, the norms inside the attention and
  the MLP, the MAP head's heads) all follow from them; ``image_size`` is
  the one the position embeddings were trained at (square grids; 224 when unknown).
  """
  ph, pw, _, width = np.shape(flat['embedding/kernel'])
  blocks = sorted({int(k.split('/')[1].rsplit('_', 1)[1]) for k in flat
                   if k.startswith('Transformer/encoderblock_')})
  if not blocks:
    raise ValueError('The checkpoint has no Transformer/encoderblock_{i}: not a ViT file.')
  block = 'Transformer/encoderblock_0/'
  attention = block + 'MultiHeadDotProductAttention_1/'
  mlp_dim = int(np.shape(flat[block + 'MlpBlock_3/Dense_1/kernel'])[0])
  arch: dict[str, Any] = dict(
      hidden_size=int(width), num_layers=len(blocks), patch_size=(int(ph), int(pw)),
      mlp_dim=mlp_dim, num_heads=int(np.shape(flat[attention + 'query/kernel'])[1]),
      pool='token' if 'cls' in flat else
      'map' if any(k.startswith('MAPHead_0/') for k in flat) else 'gap',
      representation_size=(int(np.shape(flat['pre_logits/kernel'])[-1])
                           if 'pre_logits/kernel' in flat else None),
      posemb='learn' if POSEMB_KEY in flat else 'sincos2d',
      pre_norm='Transformer/pre_norm/scale' in flat,
      gated_mlp=np.shape(flat[block + 'MlpBlock_3/Dense_0/kernel'])[-1] == 2 * mlp_dim,
      distill_token='dist' in flat, layer_scale=1. if block + 'ls1' in flat else None,
      num_registers=int(np.shape(flat['registers'])[1]) if 'registers' in flat else 0,
      fc_norm='fc_norm/scale' in flat, qk_norm=attention + 'query_ln/scale' in flat,
      qkv_bias=attention + 'query/bias' in flat,
      key_bias=attention + 'key/bias' in flat or attention + 'query/bias' not in flat,
      mlp_norm=block + 'MlpBlock_3/hidden_norm/scale' in flat,
      attention_norm=attention + 'out_norm/scale' in flat)
  if 'MAPHead_0/probe' in flat:  # Its own heads, where they are not the blocks' (PE's pool).
    pool_heads = int(np.shape(flat['MAPHead_0/MultiHeadDotProductAttention_0/query/kernel'])[1])
    arch['map_heads'] = None if pool_heads == arch['num_heads'] else pool_heads
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
    n = np.shape(flat[POSEMB_KEY])[1] - ('cls' in flat) - arch['distill_token'] - arch[
        'num_registers']
    side = math.isqrt(max(n, 0))  # A timm ViT's can have fewer rows than prefix tokens.
    if side * side == n:
      size = side * stride * int(ph)
  arch['image_size'] = size
  return arch


_SHAPE = ('hidden_size', 'num_layers', 'mlp_dim', 'num_heads', 'patch_size')


def model_of(flat: dict[str, Any], origin: str, model_name: str | None = None,
             image_size: int | tuple[int, int] | None = None,
             class_names: tuple[str, ...] = (),
             source_grid: tuple[int, int] | None = None,
             options: dict[str, Any] | None = None,
             patch_size: int | tuple[int, int] | None = None) -> Loaded:
  """Release-layout arrays as a model with its parameters (``load_npz_model``); ``options``:
  the config.model options an exported file records beside them (its activation, ...);
  ``patch_size``: another patch size (the patch embedding resampled, ``resample_patchemb``,
  and the position embeddings resized to the new grid)."""
  arch = {**npz_architecture(flat), **{k: tuple(v) if isinstance(v, list) else v
                                       for k, v in (options or {}).items() if k != 'name'}}
  size = arch.pop('image_size') if image_size is None else image_size
  arch.pop('image_size', None)
  num_classes = int(np.shape(flat['head/kernel'])[-1]) if 'head/kernel' in flat else None
  file_options = {k: v for k, v in arch.items() if k not in (*_SHAPE, 'resnet_layers')}
  if patch_size is not None:
    file_options['patch_size'] = pair(patch_size)
  if model_name:
    model = get_model(model_name, num_classes=num_classes, image_size=size, **file_options)
  else:
    matches = [n for n in registry.list_models()
               if all(pair(v) == pair(arch[k]) if k == 'patch_size' else v == arch[k]
                      for k, v in registry.model_kwargs(n).items() if k in _SHAPE)
               and registry.model_kwargs(n).get('resnet_layers') == arch.get('resnet_layers')]
    if matches:
      model = get_model(matches[0], num_classes=num_classes, image_size=size, **file_options)
    else:
      p = pair(file_options.get('patch_size', arch['patch_size']))
      description = (f'ViT (width {arch["hidden_size"]}, {arch["num_layers"]} layers, '
                     f'{p[0]}x{p[1]} patches{", hybrid" if "resnet_layers" in arch else ""})')
      model = get_model('b16', num_classes=num_classes, image_size=size,
                        **{'model_name': description, **arch, **file_options})
  return Loaded(model, fitted(flat, model, origin, source_grid), tuple(class_names), origin)


def fitted(flat: Mapping[str, Any], model: VisionTransformer, origin: str,
           source_grid: tuple[int, int] | None = None,
           source_model: VisionTransformer | None = None) -> Params:
  """``adapt`` of ``flat`` to ``model``'s own shapes, its classifier kept."""
  init = jax.eval_shape(model.init, jax.random.key(0),
                        jax.ShapeDtypeStruct((1, *pair(model.image_size), 3), np.float32))
  return adapt(flat, init['params'], model, keep_head=True, source_grid=source_grid,
               origin=origin, source_model=source_model, count=False)
