"""The release layout: the flat key set of the published ViT files, which every format converts to.

Keys joined by '/' (``Transformer/encoderblock_3/MlpBlock_3/Dense_0/kernel``), float32 arrays:
an unrolled model's params tree, or a scanned one's with its blocks unstacked. Each foreign
format (``release``, ``big_vision``, ``timm``, ``transformers``) maps its names onto it, and
``adapt`` fits it to a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from vit_jax.base import errors
from vit_jax.data.preprocess import EvalSpec
from vit_jax.models import VisionTransformer

# Masked patch prediction's parameters (vit_jax.models.mpp): the learnable [mask] embedding and
# the per-patch prediction head, used only in pre-training; fine-tuning drops them.
PRETRAINING_ONLY = ('mask_token', 'mpp_head')
Params = dict[str, Any]
POSEMB_KEY = 'Transformer/posembed_input/pos_embedding'


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


def to_host(x: Any) -> np.ndarray:
  """A (possibly sharded, multi-host) array as one float32 numpy array on every host."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x), dtype=np.float32)


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A trained model, ready to apply: ``model.apply({'params': params}, images)``."""

  model: VisionTransformer
  params: dict[str, Any]
  class_names: tuple[str, ...]
  source: str  # 'DIR (step N)' or the .npz path.
  config: Any = None  # The run's config (a ConfigDict), for a workdir.
  # The evaluation preprocessing the checkpoint says it was trained with (timm's pretrained_cfg,
  # transformers' image processor, a run's pp_eval); a .npz file says none: the releases'
  # [-1, 1]. None: a run's pp_eval that no EvalSpec says (its config has the pipeline).
  preprocessing: EvalSpec | None = EvalSpec()
  # The timm architecture the checkpoint is, as a timm config.json names it ({'architecture':
  # NAME, 'model_args': {...}}): a timm folder's own (a run's: None here, its init_from's is
  # read when it is exported, formats.run_architecture); a timm export keeps it where the
  # model still is that architecture (timm.write).
  architecture: Mapping[str, Any] | None = None


def check_finite(flat: Mapping[str, Any], origin: Any) -> None:
  """Refuses weights that hold NaN or Inf (a diverged run's, a damaged conversion's): such a
  model's outputs, and a fine-tune from it, are NaN from the first step."""
  bad = [k for k, v in flat.items() if not np.isfinite(np.asarray(v, np.float32)).all()]
  if bad:
    more = f' and {len(bad) - 1} more arrays' if len(bad) > 1 else ''
    raise errors.NonFiniteCheckpointError(
        f'{origin}: {bad[0]}{more} hold NaN or Inf: these are not weights a model can use. '
        'Take an earlier checkpoint of the run it comes from.')
