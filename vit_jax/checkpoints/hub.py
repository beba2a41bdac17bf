"""The Hugging Face Hub's ViT checkpoints: timm's and transformers' folders, read and written.

Both libraries write a folder of ``config.json`` and ``model.safetensors`` (timm's
``save_for_hf`` / ``push_to_hf_hub``, transformers' ``save_pretrained``); ``hf-hub:ORG/NAME``
is such a folder on the Hub, fetched into (or found in, with ``HF_HUB_OFFLINE=1``) the
``huggingface_hub`` cache. The tensors are read with the ``safetensors`` package, without
torch, and converted to this ViT's parameters (the release layout plus ``registers``,
``ls1``/``ls2``, ``fc_norm``).

The architecture is read, never guessed: timm's config.json records only the arguments given
to ``create_model`` (``model_args``), so the named architecture's own defaults come from
``timm_architectures`` (timm's registry, tabled), and the arrays say the rest (class token,
registers, layer scale, position embeddings of the prefix tokens, fc_norm, qkv biases).
transformers' config.json holds every field (``ViTConfig``'s defaults where absent). What the
model has no option for is refused in one line that names it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from vit_jax.base import errors, paths
from vit_jax.checkpoints import release
from vit_jax.checkpoints.timm_architectures import ARCHITECTURES
from vit_jax.models import VisionTransformer, get_model
from vit_jax.models.vit import LN_EPSILON, pair

TIMM = 'timm'
TRANSFORMERS = 'transformers'
HUB_PREFIX = 'hf-hub:'
CONFIG = 'config.json'
WEIGHTS = 'model.safetensors'
WEIGHTS_INDEX = 'model.safetensors.index.json'
PICKLES = ('pytorch_model.bin', 'open_clip_pytorch_model.bin')
_HUB_FILES = [CONFIG, '*.safetensors', WEIGHTS_INDEX, 'preprocessor_config.json']
_REPO_ID = re.compile(r'^[\w.-]+/[\w.-]+$')
# vit_jax's pipelines scale pixels to [-1, 1]: mean and std 0.5 in timm's and transformers' terms.
_MEAN_STD = [0.5, 0.5, 0.5]
_Q, _K, _V = 'query', 'key', 'value'
_ATTN = 'MultiHeadDotProductAttention_1'


def _safetensors_dtypes() -> dict[str, Any]:
  import ml_dtypes

  return {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'BF16': ml_dtypes.bfloat16}


# ---------------------------------------------------------------------------
# Files.


def read_json(path: str | os.PathLike) -> dict[str, Any]:
  """A JSON file (local or remote); a ``CheckpointError`` where it is not a JSON object."""
  text = paths.read_bytes(path, 'JSON file')
  try:
    value = json.loads(text)
  except ValueError as e:
    raise errors.CheckpointError(f'{path} is not a JSON file ({e}).') from None
  if not isinstance(value, dict):
    raise errors.CheckpointError(f'{path} holds a JSON {type(value).__name__}, not an object.')
  return value


def folder_format(folder: str | os.PathLike) -> str | None:
  """``TIMM`` or ``TRANSFORMERS`` for a folder whose config.json says which, None for a folder
  without config.json or whose config.json is neither (a vit_jax run's)."""
  path = paths.path(folder) / CONFIG
  if not paths.is_file(path):
    return None
  config = read_json(path)
  timm, transformers = 'architecture' in config, ('model_type' in config
                                                 or 'architectures' in config)
  if timm and transformers:
    raise errors.CheckpointError(
        f'{path} has both timm\'s "architecture" and transformers\' "model_type"/'
        '"architectures": remove the one that is not its library\'s.')
  return TIMM if timm else TRANSFORMERS if transformers else None


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """The tensors of a .safetensors file (local or remote) as numpy arrays."""
  import safetensors

  data = paths.read_bytes(path, 'safetensors file')
  try:
    tensors = safetensors.deserialize(data)
  except Exception as e:  # safetensors' SafetensorError: not a file it can read.
    raise errors.CheckpointError(f'{path} is not a safetensors file ({e}).') from None
  dtypes = _safetensors_dtypes()
  out = {}
  for name, t in tensors:
    if t['dtype'] not in dtypes:
      raise errors.CheckpointError(f'{path}: {name} is of dtype {t["dtype"]}, not a float '
                                   f'type ({", ".join(dtypes)}).')
    out[name] = np.frombuffer(t['data'], dtypes[t['dtype']]).reshape(t['shape'])
  return out


def read_weights(folder: str | os.PathLike) -> dict[str, np.ndarray]:
  """The tensors of a folder's model.safetensors (or its shards, by the index)."""
  root = paths.path(folder)
  if paths.is_file(root / WEIGHTS):
    return read_safetensors(root / WEIGHTS)
  if paths.is_file(root / WEIGHTS_INDEX):
    files = sorted(set(read_json(root / WEIGHTS_INDEX).get('weight_map', {}).values()))
    out = {}
    for name in files:
      out.update(read_safetensors(root / name))
    return out
  pickles = [n for n in PICKLES if paths.is_file(root / n)]
  if pickles:
    raise errors.CheckpointError(
        f'{folder} holds {pickles[0]} (a torch pickle) and no {WEIGHTS}: vit_jax reads '
        'safetensors only. Save it again with safe serialisation (timm: save_for_hf(..., '
        'safe_serialization=True); transformers: save_pretrained), or use a Hub revision that '
        'has model.safetensors.')
  raise errors.MissingFileError(f'{folder} has a {CONFIG} but no {WEIGHTS}: the weights are '
                                'missing.')


def write_folder(folder: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                 config: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> None:
  """Writes ``config.json`` and ``model.safetensors`` (and ``extra`` JSON files) into ``folder``."""
  import safetensors.numpy

  root = paths.path(folder)
  root.mkdir(parents=True, exist_ok=True)
  arrays = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
  (root / WEIGHTS).write_bytes(safetensors.numpy.save(arrays))
  for name, content in {CONFIG: config, **(extra or {})}.items():
    (root / name).write_text(json.dumps(content, indent=2) + '\n')


def is_hub_id(source: str) -> bool:
  return str(source).startswith(HUB_PREFIX)


def resolve(source: str) -> str:
  """The local folder of ``hf-hub:ORG/NAME[@REVISION]`` in the ``huggingface_hub`` cache,
  downloaded there first unless it is cached and ``HF_HUB_OFFLINE=1`` (or no network): the
  client's own cache, ``HF_HOME`` / ``HF_HUB_CACHE`` and token apply."""
  repo, _, revision = str(source)[len(HUB_PREFIX):].partition('@')
  if not _REPO_ID.match(repo):
    raise errors.ConfigError(f'{source} is not a Hub id: write hf-hub:ORG/NAME (e.g. '
                             'hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k), '
                             'optionally @REVISION.')
  import huggingface_hub
  from huggingface_hub import errors as hub_errors

  try:
    return huggingface_hub.snapshot_download(repo, revision=revision or None,
                                             allow_patterns=_HUB_FILES)
  except hub_errors.LocalEntryNotFoundError:
    from huggingface_hub import constants

    raise errors.MissingFileError(
        f'{source} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and cannot be '
        'downloaded (offline: HF_HUB_OFFLINE=1 or no network). Download it where there is a '
        'network (hf download ' + repo + '), or set HF_HOME to its cache.'
    ) from None
  except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError,
          hub_errors.GatedRepoError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.MissingFileError(f'{source}: {first} (a private or gated repository needs a '
                                  'token: hf auth login, or HF_TOKEN).') from None


# ---------------------------------------------------------------------------
# Reading.


def load_folder(folder: str | os.PathLike, origin: str | None = None) -> release.Loaded:
  """A timm or transformers folder as a model with its parameters and class names."""
  origin = origin or str(folder)
  kind = folder_format(folder)
  if kind is None:
    raise errors.CheckpointError(f'{origin} has no {CONFIG} of timm ("architecture") or '
                                 'transformers ("model_type"): not a Hub checkpoint folder.')
  config = read_json(paths.path(folder) / CONFIG)
  tensors = read_weights(folder)
  read = from_timm if kind == TIMM else from_transformers
  kwargs, flat, class_names = read(config, tensors, origin)
  num_classes = kwargs.pop('num_classes')
  model = get_model('b16', num_classes=num_classes, **kwargs)
  init = jax.eval_shape(model.init, jax.random.key(0),
                        jax.ShapeDtypeStruct((1, *pair(model.image_size), 3), np.float32))
  params = release.adapt(flat, init['params'], model, keep_head=True, source_grid=model.grid,
                         origin=origin, source_model=model)
  names = tuple(class_names) if len(class_names) == (num_classes or 0) else ()
  return release.Loaded(model, params, names, f'{origin} ({kind})')


class _Tensors:
  """A state dict read key by key, so that what was not read can be refused by name."""

  def __init__(self, tensors: Mapping[str, np.ndarray], origin: str, prefix: str = ''):
    self.tensors, self.origin, self.prefix = dict(tensors), origin, prefix
    self.used: set[str] = set()

  def __contains__(self, key: str) -> bool:
    return self.prefix + key in self.tensors

  def __call__(self, key: str) -> np.ndarray:
    key = self.prefix + key
    if key not in self.tensors:
      raise errors.CheckpointError(f'{self.origin}: {key} is missing from the weights.')
    self.used.add(key)
    return np.asarray(self.tensors[key], np.float32)

  def blocks(self, stem: str) -> int:
    found = {int(m.group(1)) for k in self.tensors
             if (m := re.match(re.escape(self.prefix + stem) + r'(\d+)\.', k))}
    if not found or found != set(range(len(found))):
      raise errors.CheckpointError(f'{self.origin}: the weights have no blocks '
                                   f'{self.prefix}{stem}0, 1, ...: not a ViT.')
    return len(found)

  def check_all_used(self, library: str) -> None:
    left = sorted(set(self.tensors) - self.used)
    if left:
      more = f' and {len(left) - 3} more' if len(left) > 3 else ''
      raise errors.CheckpointMismatchError(
          f'{self.origin}: the {library} weights {", ".join(left[:3])}{more} have no '
          'counterpart in vit_jax\'s ViT (no model option holds them).')


def _refuse(origin: str, what: str, hint: str = '') -> errors.CheckpointMismatchError:
  return errors.CheckpointMismatchError(
      f'{origin}: {what}, which vit_jax\'s ViT has no model option for{hint}.')


# timm's VisionTransformer defaults (timm 1.0.31), for what neither the registry nor
# model_args sets.
TIMM_DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, in_chans=3, global_pool='token', embed_dim=768, depth=12,
    num_heads=12, mlp_ratio=4., qkv_bias=True, qk_norm=False, scale_attn_norm=False,
    scale_mlp_norm=False, proj_bias=True, init_values=None, class_token=True, pos_embed='learn',
    no_embed_class=False, reg_tokens=0, pre_norm=False, final_norm=True, fc_norm=None,
    pool_include_prefix=False, act_layer=None, norm_layer=None, embed_norm_layer=None,
    block_fn=None, mlp_layer=None, attn_layer=None, embed_layer=None, distilled=False)
# Arguments that change nothing of a trained model's function (dropout, init, input padding).
_TIMM_INERT = ('num_classes', 'drop_rate', 'pos_drop_rate', 'patch_drop_rate', 'proj_drop_rate',
               'attn_drop_rate', 'drop_path_rate', 'weight_init', 'fix_init', 'dynamic_img_size',
               'dynamic_img_pad', 'device', 'dtype')
_TIMM_ACTIVATIONS = {None: 'gelu', 'gelu': 'gelu', 'gelu_tanh': 'gelu_tanh'}
_LAYER_NORM = re.compile(r'^<LayerNorm\(eps=([0-9.e+-]+)\)>$')


def timm_arguments(config: Mapping[str, Any], origin: str) -> dict[str, Any]:
  """The arguments timm builds a config.json's model with: its defaults, the named
  architecture's, then ``model_args``; ``img_size`` as timm resolves it."""
  name = config.get('architecture')
  if not isinstance(name, str):
    raise errors.CheckpointError(f'{origin}: config.json has no "architecture" string.')
  model_args = dict(config.get('model_args') or {})
  if name not in ARCHITECTURES and not model_args.get('num_heads'):
    raise errors.CheckpointMismatchError(
        f'{origin}: timm architecture {name!r} is not one of timm\'s VisionTransformer or DeiT '
        'models that vit_jax knows, and config.json\'s model_args do not give num_heads.')
  known = dict(ARCHITECTURES.get(name, {}))
  arguments = {**TIMM_DEFAULTS, **known, **model_args}
  pretrained = config.get('pretrained_cfg') or {}
  if ('img_size' not in known and 'img_size' not in model_args
      and pretrained.get('fixed_input_size') and pretrained.get('input_size')):
    arguments['img_size'] = list(pretrained['input_size'])[-2:]  # timm's own rule.
  unknown = sorted(set(arguments) - set(TIMM_DEFAULTS) - set(_TIMM_INERT))
  if unknown:
    raise _refuse(origin, f'timm argument {unknown[0]}={arguments[unknown[0]]!r}')
  return arguments


def from_timm(config: Mapping[str, Any], tensors: Mapping[str, np.ndarray], origin: str
              ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """(model kwargs, flat parameters, class names) of a timm ViT's config.json and tensors."""
  a = timm_arguments(config, origin)
  t = _Tensors(tensors, origin)
  for key, what in (('distilled', "a distilled DeiT's distillation token and head"),
                    ('pre_norm', 'pre_norm (a LayerNorm before the blocks, as in CLIP)'),
                    ('scale_attn_norm', 'scale_attn_norm (a LayerNorm inside the attention)'),
                    ('scale_mlp_norm', 'scale_mlp_norm (a LayerNorm inside the MLP)'),
                    ('block_fn', f'block_fn={a["block_fn"]}'),
                    ('mlp_layer', f'mlp_layer={a["mlp_layer"]}'),
                    ('attn_layer', f'attn_layer={a["attn_layer"]}'),
                    ('embed_layer', f'embed_layer={a["embed_layer"]}'),
                    ('embed_norm_layer', f'embed_norm_layer={a["embed_norm_layer"]}'),
                    ('pool_include_prefix', 'pool_include_prefix (the prefix tokens pooled)')):
    if a[key]:
      raise _refuse(origin, f'timm\'s {what}')
  if not a['proj_bias']:
    raise _refuse(origin, 'proj_bias=False (no bias in the attention output)')
  if a['pos_embed'] != 'learn':
    raise _refuse(origin, f'pos_embed={a["pos_embed"]!r} (no position embeddings)')
  if not a['final_norm']:
    raise _refuse(origin, 'final_norm=False (no LayerNorm after the blocks)')
  if a['global_pool'] not in ('token', 'avg'):
    raise _refuse(origin, f'global_pool={a["global_pool"]!r}', " ('token' and 'avg' load)")
  if a['act_layer'] not in _TIMM_ACTIVATIONS:
    raise _refuse(origin, f'act_layer={a["act_layer"]!r}', " (activation: 'gelu', 'gelu_tanh')")
  epsilon = LN_EPSILON
  if a['norm_layer'] not in (None, 'layernorm'):
    m = _LAYER_NORM.match(str(a['norm_layer']))
    if not m:
      raise _refuse(origin, f'norm_layer={a["norm_layer"]!r}', ' (LayerNorms load)')
    epsilon = float(m.group(1))

  kernel = t('patch_embed.proj.weight')  # (D, C, ph, pw)
  width, channels, ph, pw = kernel.shape
  if channels != 3:
    raise _refuse(origin, f'{channels} input channels', ' (RGB: 3)')
  heads = int(a['num_heads'])
  if width % heads:
    raise errors.CheckpointError(f'{origin}: width {width} is not divisible by num_heads={heads}.')
  depth = t.blocks('blocks.')
  class_token = 'cls_token' in t
  registers = int(tensors['reg_token'].shape[1]) if 'reg_token' in t else 0
  if 'blocks.0.attn.q_norm.weight' in t:
    biases = [k for k in sorted(tensors) if re.search(r'\.attn\.[qk]_norm\.bias$', k)
              and np.any(tensors[k])]
    if biases:
      raise _refuse(origin, f'qk_norm with biases ({biases[0]} is not zero)',
                    ' (vit_jax\'s qk_norm, ViT-22B\'s, has scales only)')
  flat: dict[str, np.ndarray] = {'embedding/kernel': kernel.transpose(2, 3, 1, 0),
                                 'embedding/bias': t('patch_embed.proj.bias')}
  if class_token:
    flat['cls'] = t('cls_token')
  if registers:
    flat['registers'] = t('reg_token')
  posemb = t('pos_embed')
  image_size, prefix_posemb = _timm_grid(a, posemb.shape[1], (ph, pw),
                                         int(class_token) + registers, origin)
  flat[release.POSEMB_KEY] = posemb
  dh = width // heads
  layer_scale = 'blocks.0.ls1.gamma' in t
  qk_norm = 'blocks.0.attn.q_norm.weight' in t
  qkv_bias = 'blocks.0.attn.qkv.bias' in t
  for i in range(depth):
    b, o = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
    flat[o + 'LayerNorm_0/scale'], flat[o + 'LayerNorm_0/bias'] = (
        t(b + 'norm1.weight'), t(b + 'norm1.bias'))
    qkv = t(b + 'attn.qkv.weight').reshape(3, heads, dh, width)
    bias = t(b + 'attn.qkv.bias').reshape(3, heads, dh) if qkv_bias else None
    for j, name in enumerate((_Q, _K, _V)):
      flat[o + f'{_ATTN}/{name}/kernel'] = qkv[j].transpose(2, 0, 1)
      if bias is not None:
        flat[o + f'{_ATTN}/{name}/bias'] = bias[j]
    if qk_norm:
      flat[o + f'{_ATTN}/query_ln/scale'] = t(b + 'attn.q_norm.weight')
      flat[o + f'{_ATTN}/key_ln/scale'] = t(b + 'attn.k_norm.weight')
      t(b + 'attn.q_norm.bias'), t(b + 'attn.k_norm.bias')  # Zero: checked above.
    flat[o + f'{_ATTN}/out/kernel'] = t(b + 'attn.proj.weight').T.reshape(heads, dh, width)
    flat[o + f'{_ATTN}/out/bias'] = t(b + 'attn.proj.bias')
    flat[o + 'LayerNorm_2/scale'], flat[o + 'LayerNorm_2/bias'] = (
        t(b + 'norm2.weight'), t(b + 'norm2.bias'))
    flat[o + 'MlpBlock_3/Dense_0/kernel'] = t(b + 'mlp.fc1.weight').T
    flat[o + 'MlpBlock_3/Dense_0/bias'] = t(b + 'mlp.fc1.bias')
    flat[o + 'MlpBlock_3/Dense_1/kernel'] = t(b + 'mlp.fc2.weight').T
    flat[o + 'MlpBlock_3/Dense_1/bias'] = t(b + 'mlp.fc2.bias')
    if layer_scale:
      flat[o + 'ls1'], flat[o + 'ls2'] = t(b + 'ls1.gamma'), t(b + 'ls2.gamma')
  fc_norm = 'fc_norm.weight' in t
  norm = 'fc_norm' if fc_norm else 'Transformer/encoder_norm'
  source = 'fc_norm' if fc_norm else 'norm'
  flat[f'{norm}/scale'], flat[f'{norm}/bias'] = t(f'{source}.weight'), t(f'{source}.bias')
  num_classes = None
  if 'head.weight' in t:
    flat['head/kernel'], flat['head/bias'] = t('head.weight').T, t('head.bias')
    num_classes = int(flat['head/kernel'].shape[1])
  t.check_all_used('timm')
  pool = 'token' if a['global_pool'] == 'token' else 'gap'
  if pool == 'token' and not class_token:
    raise errors.CheckpointError(f"{origin}: global_pool='token' without a cls_token.")
  kwargs = dict(
      num_classes=num_classes, image_size=image_size, patch_size=(int(ph), int(pw)),
      hidden_size=int(width), num_layers=depth, num_heads=heads,
      mlp_dim=int(flat['Transformer/encoderblock_0/MlpBlock_3/Dense_0/bias'].shape[0]),
      pool=pool, class_token=class_token, num_registers=registers, prefix_posemb=prefix_posemb,
      fc_norm=fc_norm, layer_scale=(float(a['init_values'] or 1e-6) if layer_scale else None),
      qkv_bias=qkv_bias, qk_norm=qk_norm, norm_epsilon=epsilon,
      activation=_TIMM_ACTIVATIONS[a['act_layer']])
  pretrained = config.get('pretrained_cfg') or {}
  names = config.get('label_names') or pretrained.get('label_names') or []
  return kwargs, flat, [str(n) for n in names]


def _timm_grid(arguments: Mapping[str, Any], rows: int, patch: tuple[int, int], prefix: int,
               origin: str) -> tuple[tuple[int, int], bool]:
  """(image size, whether the prefix tokens have position embeddings) of a timm ViT: its
  img_size where the position embeddings fit it, else the square grid they hold."""
  size = pair(arguments['img_size'])
  grid = (size[0] // patch[0], size[1] // patch[1])
  n = grid[0] * grid[1]
  if rows in (n, n + prefix):
    return size, rows == n + prefix and prefix > 0
  for extra in (prefix, 0):
    side = int(round((rows - extra) ** 0.5))
    if rows - extra > 0 and side * side == rows - extra:
      return (side * patch[0], side * patch[1]), extra > 0
  raise errors.CheckpointMismatchError(
      f'{origin}: pos_embed has {rows} rows, which fit neither img_size {size[0]}x{size[1]} '
      f'({n} patches, {prefix} prefix tokens) nor a square grid.')


_HF_DEFAULTS: dict[str, Any] = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act='gelu', layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
    qkv_bias=True, pooler_act='tanh')
_HF_ACTIVATIONS = {'gelu': 'gelu', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu_new': 'gelu_tanh',
                   'gelu_fast': 'gelu_tanh'}


def from_transformers(config: Mapping[str, Any], tensors: Mapping[str, np.ndarray], origin: str
                      ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """(model kwargs, flat parameters, class names) of a transformers ViT folder."""
  model_type = config.get('model_type', 'vit')
  if model_type != 'vit':
    raise _refuse(origin, f'transformers model_type {model_type!r}',
                  " (transformers' ViTModel and ViTForImageClassification: model_type 'vit')")
  c = {**_HF_DEFAULTS, **config}
  if c['hidden_act'] not in _HF_ACTIVATIONS:
    raise _refuse(origin, f'hidden_act={c["hidden_act"]!r}',
                  " ('gelu', 'gelu_pytorch_tanh' and 'gelu_new' load)")
  if c['num_channels'] != 3:
    raise _refuse(origin, f'{c["num_channels"]} input channels', ' (RGB: 3)')
  prefix = 'vit.' if any(k.startswith('vit.') for k in tensors) else ''
  t = _Tensors(tensors, origin, prefix)
  width, heads = int(c['hidden_size']), int(c['num_attention_heads'])
  dh = width // heads
  kernel = t('embeddings.patch_embeddings.projection.weight')
  ph, pw = kernel.shape[2:]
  flat = {'embedding/kernel': kernel.transpose(2, 3, 1, 0),
          'embedding/bias': t('embeddings.patch_embeddings.projection.bias'),
          'cls': t('embeddings.cls_token'),
          release.POSEMB_KEY: t('embeddings.position_embeddings'),
          'Transformer/encoder_norm/scale': t('layernorm.weight'),
          'Transformer/encoder_norm/bias': t('layernorm.bias')}
  depth = t.blocks('encoder.layer.')
  qkv_bias = 'encoder.layer.0.attention.attention.query.bias' in t
  for i in range(depth):
    b, o = f'encoder.layer.{i}.', f'Transformer/encoderblock_{i}/'
    flat[o + 'LayerNorm_0/scale'] = t(b + 'layernorm_before.weight')
    flat[o + 'LayerNorm_0/bias'] = t(b + 'layernorm_before.bias')
    for name in (_Q, _K, _V):
      w = t(b + f'attention.attention.{name}.weight')
      flat[o + f'{_ATTN}/{name}/kernel'] = w.T.reshape(width, heads, dh)
      if qkv_bias:
        flat[o + f'{_ATTN}/{name}/bias'] = t(b + f'attention.attention.{name}.bias').reshape(
            heads, dh)
    flat[o + f'{_ATTN}/out/kernel'] = t(b + 'attention.output.dense.weight').T.reshape(
        heads, dh, width)
    flat[o + f'{_ATTN}/out/bias'] = t(b + 'attention.output.dense.bias')
    flat[o + 'LayerNorm_2/scale'] = t(b + 'layernorm_after.weight')
    flat[o + 'LayerNorm_2/bias'] = t(b + 'layernorm_after.bias')
    flat[o + 'MlpBlock_3/Dense_0/kernel'] = t(b + 'intermediate.dense.weight').T
    flat[o + 'MlpBlock_3/Dense_0/bias'] = t(b + 'intermediate.dense.bias')
    flat[o + 'MlpBlock_3/Dense_1/kernel'] = t(b + 'output.dense.weight').T
    flat[o + 'MlpBlock_3/Dense_1/bias'] = t(b + 'output.dense.bias')
  representation_size = None
  t.prefix = ''  # The classifier and the pooler sit outside ``vit.``.
  if 'pooler.dense.weight' in t:
    if c['pooler_act'] != 'tanh':
      raise _refuse(origin, f'pooler_act={c["pooler_act"]!r}', ' (the pre-logits layer: tanh)')
    flat['pre_logits/kernel'], flat['pre_logits/bias'] = (t('pooler.dense.weight').T,
                                                           t('pooler.dense.bias'))
    representation_size = int(flat['pre_logits/bias'].shape[0])
  num_classes = None
  if 'classifier.weight' in t:
    flat['head/kernel'], flat['head/bias'] = t('classifier.weight').T, t('classifier.bias')
    num_classes = int(flat['head/kernel'].shape[1])
  t.check_all_used('transformers')
  image_size = pair(c['image_size'])
  grid = (image_size[0] // ph, image_size[1] // pw)
  if flat[release.POSEMB_KEY].shape[1] != grid[0] * grid[1] + 1:
    raise errors.CheckpointMismatchError(
        f'{origin}: position_embeddings has {flat[release.POSEMB_KEY].shape[1]} rows; '
        f'image_size {image_size} with {ph}x{pw} patches needs {grid[0] * grid[1] + 1}.')
  kwargs = dict(
      num_classes=num_classes, image_size=image_size, patch_size=(int(ph), int(pw)),
      hidden_size=width, num_layers=depth, num_heads=heads,
      mlp_dim=int(c['intermediate_size']), pool='token', qkv_bias=qkv_bias,
      representation_size=representation_size, norm_epsilon=float(c['layer_norm_eps']),
      activation=_HF_ACTIVATIONS[c['hidden_act']])
  labels = config.get('id2label') or {}
  names = [labels[k] for k in sorted(labels, key=int)] if num_classes else []
  return kwargs, flat, [str(n) for n in names]


# ---------------------------------------------------------------------------
# Writing.


def _export_refusal(model: VisionTransformer, library: str, what: str,
                    other: str = 'npz') -> errors.CheckpointError:
  return errors.CheckpointError(
      f'{library} cannot hold {model.model_name or "this model"}: {what}. Export it as '
      f"format='{other}' (--format={other}), or fine-tune a model without it.")


def _common_refusals(model: VisionTransformer, library: str) -> None:
  """What neither library's ViT computes."""
  checks = (
      (model.resnet_layers is not None, 'a hybrid (BiT stem)'),
      (model.posemb != 'learn', f'posemb={model.posemb!r} (fixed position embeddings)'),
      (model.pool == 'map', "pool='map' (attention pooling)"),
      (model.parallel_block, 'parallel_block=True'),
      (model.norm != 'layernorm', f'norm={model.norm!r}'),
      (bool(model.mpp_outputs), 'mpp_outputs (masked patch prediction)'),
  )
  for bad, what in checks:
    if bad:
      raise _export_refusal(model, library, what)


def _config_label_maps(class_names: Sequence[str]) -> tuple[dict[str, str], dict[str, int]]:
  return ({str(i): n for i, n in enumerate(class_names)},
          {n: i for i, n in enumerate(class_names)})


def _block_tensors(flat: Mapping[str, np.ndarray], i: int, heads: int) -> dict[str, np.ndarray]:
  """Block ``i``'s arrays by role: q/k/v kernels (D, H*Dh), out (H*Dh, D), ..."""
  o = f'Transformer/encoderblock_{i}/'
  get = lambda k: flat.get(o + k)
  out = {}
  for name in (_Q, _K, _V):
    kernel = get(f'{_ATTN}/{name}/kernel')
    out[name] = kernel.reshape(kernel.shape[0], -1)
    bias = get(f'{_ATTN}/{name}/bias')
    out[name + '_bias'] = None if bias is None else bias.reshape(-1)
  kernel = get(f'{_ATTN}/out/kernel')
  out['out'] = kernel.reshape(-1, kernel.shape[-1])
  return out


def to_timm(model: VisionTransformer, params: Mapping[str, Any],
            class_names: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(state dict, config.json) of ``model`` for timm's VisionTransformer: ``timm.create_model(
  'local-dir:DIR', pretrained=True)`` rebuilds it with the same logits."""
  _common_refusals(model, 'timm')
  if model.representation_size is not None:
    raise _export_refusal(model, 'timm', 'representation_size (a pre-logits layer)')
  if model.norm_epsilon != LN_EPSILON:
    raise _export_refusal(model, 'timm', f'norm_epsilon={model.norm_epsilon:g} (timm\'s '
                          'LayerNorms: 1e-6)', 'transformers')
  width, mlp = model.hidden_size, model.mlp_dim
  if int(width * (mlp / width)) != mlp:
    raise _export_refusal(model, 'timm', f'mlp_dim={mlp} (timm makes int(width * mlp_ratio))')
  flat = {k: release.to_host(v) for k, v in release.flatten(release.to_release(params)).items()}
  heads = model.num_heads
  sd = {'patch_embed.proj.weight': flat['embedding/kernel'].transpose(3, 2, 0, 1),
        'patch_embed.proj.bias': flat['embedding/bias']}
  if model.has_class_token:
    sd['cls_token'] = flat['cls']
  if model.num_registers:
    sd['reg_token'] = flat['registers']
  sd['pos_embed'] = flat[release.POSEMB_KEY]
  for i in range(model.num_layers):
    b, o = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
    r = _block_tensors(flat, i, heads)
    sd[b + 'norm1.weight'], sd[b + 'norm1.bias'] = (flat[o + 'LayerNorm_0/scale'],
                                                    flat[o + 'LayerNorm_0/bias'])
    sd[b + 'attn.qkv.weight'] = np.concatenate([r[_Q].T, r[_K].T, r[_V].T])
    if model.qkv_bias:
      sd[b + 'attn.qkv.bias'] = np.concatenate([r[_Q + '_bias'], r[_K + '_bias'],
                                                r[_V + '_bias']])
    if model.qk_norm:  # vit_jax's scale-only norms: timm's with zero biases.
      for ours, theirs in (('query_ln', 'q_norm'), ('key_ln', 'k_norm')):
        scale = flat[o + f'{_ATTN}/{ours}/scale']
        sd[b + f'attn.{theirs}.weight'], sd[b + f'attn.{theirs}.bias'] = (scale,
                                                                          np.zeros_like(scale))
    sd[b + 'attn.proj.weight'] = r['out'].T
    sd[b + 'attn.proj.bias'] = flat[o + f'{_ATTN}/out/bias']
    sd[b + 'norm2.weight'], sd[b + 'norm2.bias'] = (flat[o + 'LayerNorm_2/scale'],
                                                    flat[o + 'LayerNorm_2/bias'])
    sd[b + 'mlp.fc1.weight'] = flat[o + 'MlpBlock_3/Dense_0/kernel'].T
    sd[b + 'mlp.fc1.bias'] = flat[o + 'MlpBlock_3/Dense_0/bias']
    sd[b + 'mlp.fc2.weight'] = flat[o + 'MlpBlock_3/Dense_1/kernel'].T
    sd[b + 'mlp.fc2.bias'] = flat[o + 'MlpBlock_3/Dense_1/bias']
    if model.layer_scale is not None:
      sd[b + 'ls1.gamma'], sd[b + 'ls2.gamma'] = flat[o + 'ls1'], flat[o + 'ls2']
  norm = 'fc_norm' if model.fc_norm else 'Transformer/encoder_norm'
  theirs = 'fc_norm' if model.fc_norm else 'norm'
  sd[f'{theirs}.weight'], sd[f'{theirs}.bias'] = flat[f'{norm}/scale'], flat[f'{norm}/bias']
  num_classes = model.num_classes or 0
  if num_classes:
    sd['head.weight'], sd['head.bias'] = flat['head/kernel'].T, flat['head/bias']

  size, patch = pair(model.image_size), pair(model.patch_size)
  global_pool = 'token' if model.pool == 'token' else 'avg'
  model_args = dict(
      num_classes=num_classes, img_size=list(size),
      patch_size=patch[0] if patch[0] == patch[1] else list(patch), in_chans=3,
      global_pool=global_pool, embed_dim=width, depth=model.num_layers, num_heads=heads,
      mlp_ratio=mlp / width, qkv_bias=model.qkv_bias, qk_norm=model.qk_norm,
      init_values=model.layer_scale, class_token=model.has_class_token,
      no_embed_class=not model.prefix_posemb, reg_tokens=model.num_registers,
      fc_norm=model.fc_norm, act_layer=model.activation)
  config: dict[str, Any] = dict(architecture=timm_architecture(model), num_classes=num_classes,
                                num_features=width, global_pool=global_pool)
  if class_names:
    config['label_names'] = list(class_names)
  config['model_args'] = model_args
  config['pretrained_cfg'] = dict(
      input_size=[3, *size], fixed_input_size=True, interpolation='bilinear', crop_pct=1.0,
      crop_mode='center', mean=_MEAN_STD, std=_MEAN_STD, num_classes=num_classes,
      pool_size=None, first_conv='patch_embed.proj', classifier='head')
  return sd, config


_TIMM_SIZES = {(192, 12, 3): 'tiny', (384, 12, 6): 'small', (512, 12, 8): 'medium',
               (768, 12, 12): 'base', (1024, 24, 16): 'large', (1280, 32, 16): 'huge'}


def timm_architecture(model: VisionTransformer) -> str:
  """The timm architecture a model is one of: the registry's name where timm has one of this
  family, size, patch and resolution, else the family's base name (config.json's model_args
  give every size either way)."""
  size = _TIMM_SIZES.get((model.hidden_size, model.num_layers, model.num_heads), 'base')
  (h, w), (ph, pw) = pair(model.image_size), pair(model.patch_size)
  if model.num_registers:
    registers = f'_reg{model.num_registers}_gap_'
    family = 'vit_{}_patch{}' + registers + '{}', 'vit_base_patch16_reg4_gap_256'
  elif model.layer_scale is not None and not model.prefix_posemb:
    family = 'deit3_{}_patch{}_{}', 'deit3_base_patch16_224'
  elif model.pool == 'gap' and not model.has_class_token and not model.fc_norm:
    family = 'vit_{}_patch{}_gap_{}', 'vit_base_patch16_gap_224'
  else:
    family = 'vit_{}_patch{}_{}', 'vit_base_patch16_224'
  name = family[0].format(size, ph, h)
  return name if name in ARCHITECTURES and h == w and ph == pw else family[1]


def to_transformers(model: VisionTransformer, params: Mapping[str, Any],
                    class_names: Sequence[str] = ()
                    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(state dict, config.json) of ``model`` for transformers' ViTForImageClassification (a
  model without classes: ViTModel, its pre-logits layer as the pooler)."""
  _common_refusals(model, 'transformers')
  for bad, what in (
      (model.num_registers > 0, f'num_registers={model.num_registers}'),
      (model.layer_scale is not None, 'layer_scale'),
      (not model.has_class_token, 'no class token'),
      (model.pool != 'token', f'pool={model.pool!r} (its classifier reads the class token)'),
      (model.qk_norm, 'qk_norm'),
      (model.representation_size is not None and bool(model.num_classes),
       'a pre-logits layer before the classifier (ViTForImageClassification has none)')):
    if bad:
      raise _export_refusal(model, 'transformers', what,
                            'npz' if 'pre-logits' in what else 'timm')
  flat = {k: release.to_host(v) for k, v in release.flatten(release.to_release(params)).items()}
  classifier = bool(model.num_classes)
  pre = 'vit.' if classifier else ''
  width, heads = model.hidden_size, model.num_heads
  posemb = flat[release.POSEMB_KEY]
  if not model.prefix_posemb:  # [cls; x + pe] is [cls + 0; x + pe].
    posemb = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
  sd = {pre + 'embeddings.cls_token': flat['cls'],
        pre + 'embeddings.position_embeddings': posemb,
        pre + 'embeddings.patch_embeddings.projection.weight':
            flat['embedding/kernel'].transpose(3, 2, 0, 1),
        pre + 'embeddings.patch_embeddings.projection.bias': flat['embedding/bias']}
  for i in range(model.num_layers):
    b, o = f'{pre}encoder.layer.{i}.', f'Transformer/encoderblock_{i}/'
    r = _block_tensors(flat, i, heads)
    sd[b + 'layernorm_before.weight'] = flat[o + 'LayerNorm_0/scale']
    sd[b + 'layernorm_before.bias'] = flat[o + 'LayerNorm_0/bias']
    for name in (_Q, _K, _V):
      sd[b + f'attention.attention.{name}.weight'] = r[name].T
      if model.qkv_bias:
        sd[b + f'attention.attention.{name}.bias'] = r[name + '_bias']
    sd[b + 'attention.output.dense.weight'] = r['out'].T
    sd[b + 'attention.output.dense.bias'] = flat[o + f'{_ATTN}/out/bias']
    sd[b + 'layernorm_after.weight'] = flat[o + 'LayerNorm_2/scale']
    sd[b + 'layernorm_after.bias'] = flat[o + 'LayerNorm_2/bias']
    sd[b + 'intermediate.dense.weight'] = flat[o + 'MlpBlock_3/Dense_0/kernel'].T
    sd[b + 'intermediate.dense.bias'] = flat[o + 'MlpBlock_3/Dense_0/bias']
    sd[b + 'output.dense.weight'] = flat[o + 'MlpBlock_3/Dense_1/kernel'].T
    sd[b + 'output.dense.bias'] = flat[o + 'MlpBlock_3/Dense_1/bias']
  norm = 'fc_norm' if model.fc_norm else 'Transformer/encoder_norm'  # Per token: the same.
  sd[pre + 'layernorm.weight'], sd[pre + 'layernorm.bias'] = (flat[f'{norm}/scale'],
                                                              flat[f'{norm}/bias'])
  if model.representation_size is not None:
    sd['pooler.dense.weight'] = flat['pre_logits/kernel'].T
    sd['pooler.dense.bias'] = flat['pre_logits/bias']
  if classifier:
    sd['classifier.weight'], sd['classifier.bias'] = flat['head/kernel'].T, flat['head/bias']

  size, patch = pair(model.image_size), pair(model.patch_size)
  config: dict[str, Any] = dict(
      architectures=['ViTForImageClassification' if classifier else 'ViTModel'],
      model_type='vit', hidden_size=width, num_hidden_layers=model.num_layers,
      num_attention_heads=heads, intermediate_size=model.mlp_dim,
      hidden_act='gelu' if model.activation == 'gelu' else 'gelu_pytorch_tanh',
      layer_norm_eps=model.norm_epsilon,
      image_size=size[0] if size[0] == size[1] else list(size),
      patch_size=patch[0] if patch[0] == patch[1] else list(patch), num_channels=3,
      qkv_bias=model.qkv_bias, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      initializer_range=0.02, encoder_stride=patch[0], pooler_act='tanh',
      pooler_output_size=model.representation_size or width, dtype='float32')
  if classifier:
    names = list(class_names) or [f'LABEL_{i}' for i in range(model.num_classes)]
    config['id2label'], config['label2id'] = _config_label_maps(names)
  return sd, config


def preprocessor_config(model: VisionTransformer) -> dict[str, Any]:
  """transformers' ViTImageProcessor settings for a vit_jax model: resize, scale to [-1, 1]."""
  h, w = pair(model.image_size)
  return dict(image_processor_type='ViTImageProcessor', do_resize=True,
              size=dict(height=h, width=w), resample=2, do_rescale=True,
              rescale_factor=1 / 255, do_normalize=True, image_mean=_MEAN_STD, image_std=_MEAN_STD)


def export(model: VisionTransformer, params: Mapping[str, Any], folder: str | os.PathLike,
           library: str, class_names: Sequence[str] = ()) -> None:
  """Writes ``model`` into ``folder`` as ``library`` ('timm' or 'transformers') writes it."""
  if library == TIMM:
    sd, config = to_timm(model, params, class_names)
    write_folder(folder, sd, config)
  else:
    sd, config = to_transformers(model, params, class_names)
    write_folder(folder, sd, config, {'preprocessor_config.json': preprocessor_config(model)})
