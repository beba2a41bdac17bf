"""transformers' ViT checkpoints (``ViTModel``, ``ViTForImageClassification``): a config.json,
which holds every field (``ViTConfig``'s defaults where absent), and model.safetensors.
``TABLE`` names every tensor, for loading and for export. The backbones' (``BACKBONES``: CLIP's
and SigLIP's vision towers, DINOv2, DINOv3, distilled DeiT) load by their own tables; SigLIP 2's
NaFlex ones (``Siglip2VisionModel``, ``Siglip2ForImageClassification``: ``SIGLIP2``) with their
``Siglip2ImageProcessor`` as a ``naflex`` preprocessing (patch sequences, each image at its own
aspect ratio)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from vit_jax.base import errors
from vit_jax.base.sizes import pair
from vit_jax.checkpoints.formats import hub
from vit_jax.checkpoints.formats.fit import npz_architecture
from vit_jax.checkpoints.formats.hub import CONV, SAME
from vit_jax.checkpoints.formats.layout import POSEMB_KEY, flatten, to_host, to_release
from vit_jax.data.preprocess import EvalSpec
from vit_jax.models import VisionTransformer
from vit_jax.models.posemb import Rope

_B = 'Transformer/encoderblock_{i}/'
_A = _B + 'MultiHeadDotProductAttention_1/'
_L = 'encoder.layer.{i}.'
_PREFIX = 'vit.'

DEFAULTS: dict[str, Any] = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act='gelu', layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
    qkv_bias=True, pooler_act='tanh')
_ACTIVATIONS = {'gelu': 'gelu', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu_new': 'gelu_tanh',
                'gelu_fast': 'gelu_tanh', 'quick_gelu': 'quick_gelu'}


def _block(layer: str, norm1: str, attention: Sequence[str], norm2: str, mlp: Sequence[str],
           scales: Sequence[str] = ()) -> tuple[hub.Rule, ...]:
  """One encoder block by the library's module names (under ``layer``, '{i}' its index)."""
  rules = (*hub.norm(_B + 'LayerNorm_0', layer + norm1),
           *hub.attention(_A, [layer + n for n in attention]),
           *hub.norm(_B + 'LayerNorm_2', layer + norm2),
           *hub.dense(_B + 'MlpBlock_3/Dense_0', layer + mlp[0]),
           *hub.dense(_B + 'MlpBlock_3/Dense_1', layer + mlp[1]))
  return rules + tuple((_B + ours, layer + theirs, SAME)
                       for ours, theirs in zip(('ls1', 'ls2'), scales, strict=False))


_CLIP_ATTENTION = [f'self_attn.{n}_proj' for n in ('q', 'k', 'v', 'out')]
# CLIPVisionModel and SiglipVisionModel (their class embedding and position embeddings as the
# release's (1, 1, D) and (1, N, D), SigLIP head's packed in_proj as q, k, v: ``_canonical``).
CLIP = (
    *hub.dense('embedding', 'embeddings.patch_embedding', CONV),  # SigLIP's; CLIP has no bias.
    ('cls', 'embeddings.class_embedding', SAME),
    (POSEMB_KEY, 'embeddings.position_embedding.weight', SAME),
    *hub.norm('Transformer/pre_norm', 'pre_layrnorm'),
    *_block('encoder.layers.{i}.', 'layer_norm1', _CLIP_ATTENTION, 'layer_norm2',
            ('mlp.fc1', 'mlp.fc2')),
    *hub.norm('Transformer/encoder_norm', 'post_layernorm'),
    ('MAPHead_0/probe', 'head.probe', SAME),
    *hub.attention('MAPHead_0/MultiHeadDotProductAttention_0/',
                [f'head.attention.{n}_proj' for n in ('q', 'k', 'v', 'out')]),
    *hub.norm('MAPHead_0/LayerNorm_0', 'head.layernorm'),
    *hub.dense('MAPHead_0/MlpBlock_0/Dense_0', 'head.mlp.fc1'),
    *hub.dense('MAPHead_0/MlpBlock_0/Dense_1', 'head.mlp.fc2'),
)


def _vit_like(mlp: Sequence[str], norms: Sequence[str] = ('layernorm_before', 'layernorm_after'),
              scales: Sequence[str] = ()) -> tuple[hub.Rule, ...]:
  """ViTModel's names (DINOv2 and DeiT keep them but the blocks' norms, MLP and scales)."""
  return (
      *hub.dense('embedding', 'embeddings.patch_embeddings.projection', CONV),
      ('cls', 'embeddings.cls_token', SAME),
      ('dist', 'embeddings.distillation_token', SAME),
      (POSEMB_KEY, 'embeddings.position_embeddings', SAME),
      *_block(_L, norms[0], ('attention.attention.query', 'attention.attention.key',
                             'attention.attention.value', 'attention.output.dense'),
              norms[1], mlp, scales),
      *hub.norm('Transformer/encoder_norm', 'layernorm'))


# Siglip2VisionModel: SigLIP's vision tower, its patch embedding a Linear of each patch's
# (row, column, channel) pixels (``_canonical`` makes it the Conv2d kernel it equals), its
# position embeddings a square table resized to each image's grid (the model's ``naflex`` path).
SIGLIP2 = tuple(r for r in CLIP if not r[1].startswith(('embeddings.class', 'pre_layrnorm')))
_SIGLIP2_TYPES = ('siglip2', 'siglip2_vision_model')


# ViTModel's and ViTForImageClassification's names, the encoder's under ``vit.`` in a classifier
# (ViT has no distillation token: a ViT folder holding one has it named as a stray tensor).
TABLE: tuple[hub.Rule, ...] = (
    *(rule for rule in _vit_like(('intermediate.dense', 'output.dense')) if rule[0] != 'dist'),
    *hub.dense('pre_logits', 'pooler.dense'))  # ViTModel's pooler (Dense + tanh).
# The classifier of ViTForImageClassification, outside ``vit.``.
CLASSIFIER: tuple[hub.Rule, ...] = hub.dense('head', 'classifier')
_DINOV2_SCALES = ('layer_scale1.lambda1', 'layer_scale2.lambda1')
# DINOv3ViTModel: registers, rotary positions (no position embeddings), layer scale, separate
# query/key/value projections (``key_bias``), a plain or a gated MLP (``_canonical`` packs its
# gate_proj and up_proj as ``gate_up_proj``, gate first).
DINOV3 = (
    *hub.dense('embedding', 'embeddings.patch_embeddings', CONV),
    ('cls', 'embeddings.cls_token', SAME),
    ('registers', 'embeddings.register_tokens', SAME),
    *_block('layer.{i}.', 'norm1', [f'attention.{n}_proj' for n in ('q', 'k', 'v', 'o')],
            'norm2', ('mlp.up_proj', 'mlp.down_proj'), _DINOV2_SCALES),
    *hub.dense(_B + 'MlpBlock_3/Dense_0', 'layer.{i}.mlp.gate_up_proj'),
    *hub.norm('Transformer/encoder_norm', 'norm'))
# model_type -> (config defaults, the table, the tables of a classifier head, the prefix of the
# rest in a classifier). Classifiers that pool otherwise are refused: DeiTForImageClassification
# (the class token only, beside a distillation token: tensors these tables do not name) and
# Dinov2ForImageClassification (the class token and the patches' mean) where the mean's weights
# are not zero.
BACKBONES: dict[str, tuple[dict[str, Any], tuple[hub.Rule, ...], tuple[hub.Rule, ...], str]] = {
    'vit': ({}, TABLE, CLASSIFIER, _PREFIX),
    'clip_vision_model': (dict(hidden_act='quick_gelu', layer_norm_eps=1e-5), CLIP, (),
                          'vision_model.'),
    'siglip_vision_model': (dict(hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6), CLIP, (),
                            'vision_model.'),
    # Siglip2VisionModel, and Siglip2ForImageClassification (the mean of the image's own
    # patches, then ``classifier``; its tower's MAP head is not read: ``_siglip2``).
    'siglip2_vision_model': (dict(hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6,
                                  num_patches=256), SIGLIP2, (), 'vision_model.'),
    'siglip2': (dict(hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6, num_patches=256),
                SIGLIP2, hub.dense('head', 'classifier'), 'vision_model.'),
    'dinov2': (dict(hidden_act='gelu', layer_norm_eps=1e-6, layerscale_value=1.),
               _vit_like(('mlp.fc1', 'mlp.fc2'), ('norm1', 'norm2'), _DINOV2_SCALES)
               + hub.dense(_B + 'MlpBlock_3/Dense_0', _L + 'mlp.weights_in')  # use_swiglu_ffn's.
               + hub.dense(_B + 'MlpBlock_3/Dense_1', _L + 'mlp.weights_out'),
               hub.dense('head', 'classifier'), 'dinov2.'),
    'deit': (dict(hidden_act='gelu', layer_norm_eps=1e-12),
             _vit_like(('intermediate.dense', 'output.dense')),
             (*hub.dense('head', 'cls_classifier'),
              *hub.dense('head_dist', 'distillation_classifier')),
             'deit.'),
    'dinov3_vit': (dict(hidden_act='gelu', layer_norm_eps=1e-5, layerscale_value=1.,
                        rope_theta=100., query_bias=True, key_bias=False, value_bias=True,
                        proj_bias=True, mlp_bias=True, use_gated_mlp=False,
                        num_register_tokens=0, image_size=224), DINOV3, (), ''),
}


def _canonical(tensors: Mapping[str, np.ndarray], patch: int = 0) -> dict[str, np.ndarray]:
  """The tensors that the release layout shapes otherwise, as the tables name them: CLIP's class
  embedding (D,) and position embeddings (N, D) with the release's leading axes, SigLIP head's
  packed ``in_proj`` split into q, k, v; DINOv3's gated MLP's ``gate_proj`` and ``up_proj``
  packed; DINOv2's and DINOv3's ``mask_token`` (masked image modelling only: no output reads
  it) dropped; SigLIP 2's Linear patch embedding (D, ``patch``**2 * 3), of (row, column,
  channel) pixels, as the Conv2d kernel (D, 3, patch, patch) that computes the same."""
  out = {}
  for key, value in tensors.items():
    if key.endswith('embeddings.patch_embedding.weight') and value.ndim == 2 and patch:
      value = hub.conv_of_linear_patches(value, (patch, patch))
    if key.endswith('embeddings.class_embedding'):
      value = value.reshape(1, 1, -1)
    elif key.endswith('embeddings.position_embedding.weight'):
      value = value[None]
    elif key.endswith('embeddings.mask_token'):
      continue
    elif m := re.fullmatch(r'(layer\.\d+\.mlp\.)gate_proj\.(weight|bias)', key):
      out[f'{m.group(1)}gate_up_proj.{m.group(2)}'] = np.concatenate(
          [value, tensors[f'{m.group(1)}up_proj.{m.group(2)}']])
      continue
    elif (m := re.fullmatch(r'(layer\.\d+\.mlp\.)up_proj\.(weight|bias)', key)) and (
        f'{m.group(1)}gate_proj.{m.group(2)}' in tensors):
      continue
    elif m := re.fullmatch(r'(.*head\.attention\.)in_proj_(weight|bias)', key):
      for name, part in zip('qkv', np.split(value, 3), strict=True):
        out[f'{m.group(1)}{name}_proj.{m.group(2)}'] = part
      continue
    out[key] = value
  return out


def read(config: Mapping[str, Any], tensors: Mapping[str, np.ndarray], origin: str
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """(model kwargs, flat parameters, class names) of a transformers folder: ViT's, or a
  backbone's (``BACKBONES``)."""
  model_type = config.get('model_type', 'vit')
  if model_type not in BACKBONES:
    raise hub.refuse(origin, f'transformers model_type {model_type!r}',
                     " (model_type 'vit', 'deit' (with teacher), 'dinov2', 'dinov3_vit', "
                     "'clip_vision_model', 'siglip_vision_model', 'siglip2_vision_model' and "
                     "'siglip2' (Siglip2ForImageClassification) load)")
  defaults, table, classifier, prefix = BACKBONES[model_type]
  c = {**DEFAULTS, **defaults, **config}
  if model_type in _SIGLIP2_TYPES:
    c, tensors = _siglip2(model_type, config, defaults, tensors, origin)
  if c['num_channels'] != 3:
    raise hub.refuse(origin, f'{c["num_channels"]} input channels', ' (RGB: 3)')
  swiglu = bool(c.get('use_swiglu_ffn') or c.get('use_gated_mlp'))
  if c['hidden_act'] not in _ACTIVATIONS and not swiglu:
    raise hub.refuse(origin, f'hidden_act={c["hidden_act"]!r}',
                     f" ({', '.join(repr(a) for a in _ACTIVATIONS)} load)")
  tensors = _canonical(tensors, int(c['patch_size'])) if model_type != 'vit' else tensors
  t = hub.Tensors(tensors, origin, prefix if any(k.startswith(prefix) for k in tensors) else '')
  width, heads = int(c['hidden_size']), int(c['num_attention_heads'])
  ph, pw = t(next(k for _, k, layout in table if layout == CONV)).shape[2:]
  depth = t.blocks({id(CLIP): 'encoder.layers.', id(SIGLIP2): 'encoder.layers.',
                    id(DINOV3): 'layer.'}.get(id(table), 'encoder.layer.'))
  flat = hub.read_table(hub.expand(table, depth), t, heads)
  t.prefix = ''
  flat.update(hub.read_table(classifier, t, heads))
  t.check_all_used('transformers')
  if 'pre_logits/kernel' in flat and c['pooler_act'] != 'tanh':
    raise hub.refuse(origin, f'pooler_act={c["pooler_act"]!r}', ' (the pre-logits layer: tanh)')
  if model_type == 'deit' and 'head_dist/kernel' not in flat:
    raise hub.refuse(origin, 'a DeiT without its distillation classifier (DeiTModel, '
                     'DeiTForImageClassification: the class token read beside a distillation '
                     'token)', ' (DeiTForImageClassificationWithTeacher loads)')
  if (model_type in ('siglip_vision_model', 'siglip2_vision_model') or (
      model_type == 'siglip2' and 'head/kernel' not in flat)) and 'MAPHead_0/probe' not in flat:
    raise hub.refuse(origin, 'a SigLIP vision tower without its head (vision_use_head=False)')
  if model_type == 'dinov2' and 'head/kernel' in flat:  # Dinov2ForImageClassification's.
    if np.any(flat['head/kernel'][width:]):
      raise hub.refuse(origin, "Dinov2ForImageClassification's classifier of the patch tokens' "
                       'mean beside the class token', ' (one with zero weights for the mean, '
                       'as vit_jax exports it, loads)')
    flat['head/kernel'] = flat['head/kernel'][:width]
  flat.setdefault('embedding/bias', np.zeros(width, np.float32))  # CLIP embeds without one.
  image_size = pair(c['image_size'])
  if model_type == 'dinov3_vit':
    return _dinov3(c, flat, image_size, origin), flat, []
  patches = (image_size[0] // ph) * (image_size[1] // pw)
  rows, prefix_tokens = flat[POSEMB_KEY].shape[1], ('cls' in flat) + ('dist' in flat)
  if rows != patches + prefix_tokens:
    raise errors.CheckpointMismatchError(
        f'{origin}: the position embeddings have {rows} rows; image_size {image_size} with '
        f'{ph}x{pw} patches needs {patches + prefix_tokens}.')
  kwargs = dict(  # What the arrays say (as a .npz file's), then what config.json says.
      npz_architecture(flat),
      num_classes=int(flat['head/kernel'].shape[1]) if 'head/kernel' in flat else None,
      image_size=image_size, hidden_size=width, gated_mlp=swiglu, class_token='cls' in flat,
      pool='map' if 'MAPHead_0/probe' in flat else 'gap' if model_type == 'siglip2' else 'token',
      norm_epsilon=float(c['layer_norm_eps']),
      layer_scale=float(c['layerscale_value']) if _B.format(i=0) + 'ls1' in flat else None,
      activation='silu' if swiglu else _ACTIVATIONS[c['hidden_act']])
  labels = config.get('id2label') or {}
  names = [labels[k] for k in sorted(labels, key=int)] if kwargs['num_classes'] else []
  return kwargs, flat, [str(n) for n in names]


def _siglip2(model_type: str, config: Mapping[str, Any], defaults: Mapping[str, Any],
             tensors: Mapping[str, np.ndarray], origin: str
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """A SigLIP 2 config's vision fields (Siglip2ForImageClassification's or Siglip2Model's
  ``vision_config``, the labels beside) with the input size its square table of
  ``num_patches`` position embeddings stands for; the tensors without the classifier's unused
  MAP head (it pools the patches' mean: the head's weights change no output), or Siglip2Model's
  image tower alone (``get_image_features``: its text tower and logit scale left, one log line)."""
  vision = dict(config.get('vision_config') or {}) if model_type == 'siglip2' else dict(config)
  c = {**DEFAULTS, **defaults, **vision}
  patch, side = int(c['patch_size']), math.isqrt(int(c['num_patches']))
  if side * side != int(c['num_patches']):
    raise errors.CheckpointError(f'{origin}: num_patches={c["num_patches"]} is not a square: '
                                 "SigLIP 2's position embeddings are a square table.")
  c['image_size'] = side * patch
  if model_type == 'siglip2' and 'classifier.weight' in tensors:
    tensors = {k: v for k, v in tensors.items() if not k.startswith('vision_model.head.')}
  elif model_type == 'siglip2':
    logging.info('%s: a Siglip2Model (image and text towers): its image tower loads, whose '
                 'pooled output is get_image_features\'; the text tower is left.', origin)
    tensors = {k: v for k, v in tensors.items() if k.startswith('vision_model.')}
  return c, dict(tensors)


def _dinov3(c: Mapping[str, Any], flat: dict[str, np.ndarray], image_size: tuple[int, int],
            origin: str) -> dict[str, Any]:
  """The model kwargs of a DINOv3ViTModel's config and arrays (its biases that config.json
  turns off: zeros, which compute the same)."""
  if c['query_bias'] != c['value_bias']:
    raise hub.refuse(origin, f'query_bias={c["query_bias"]} beside value_bias={c["value_bias"]}',
                     ' (both, or neither)')
  heads, width = int(c['num_attention_heads']), int(c['hidden_size'])
  for i in range(int(c['num_hidden_layers'])):
    for key, shape in ((_A + 'out/bias', (width,)), (_B + 'MlpBlock_3/Dense_0/bias', None),
                       (_B + 'MlpBlock_3/Dense_1/bias', (width,))):
      key = key.format(i=i)
      if key not in flat:
        kernel = flat[key.replace('/bias', '/kernel')]
        flat[key] = np.zeros(shape or kernel.shape[-1:], np.float32)
  gated = bool(c['use_gated_mlp'])
  return dict(
      npz_architecture(flat), num_classes=None, image_size=image_size, hidden_size=width,
      num_heads=heads, gated_mlp=gated, pool='token', class_token=True, posemb='none',
      rope=str(Rope('dinov3', temperature=float(c['rope_theta']), layout='half')),
      key_bias=bool(c['key_bias']), norm_epsilon=float(c['layer_norm_eps']),
      layer_scale=float(c['layerscale_value']), prefix_posemb=False,
      activation='silu' if gated and c['hidden_act'] == 'silu' else _ACTIVATIONS.get(
          c['hidden_act'], c['hidden_act']))


# PIL's resampling filters by the number transformers' image processors store.
_RESAMPLE = {0: 'pil_nearest', 1: 'pil_lanczos', 2: 'pil_bilinear', 3: 'pil_bicubic',
             4: 'pil_box', 5: 'pil_hamming'}


# Siglip2ImageProcessor's defaults (transformers 5.23).
_SIGLIP2_PROCESSOR = dict(patch_size=16, max_num_patches=256, resample=2, do_resize=True,
                          do_rescale=True, rescale_factor=1 / 255, do_normalize=True)


def preprocessing(processor: Mapping[str, Any] | None,
                  config: Mapping[str, Any] | None = None, origin: str = '') -> EvalSpec:
  """The evaluation preprocessing of a preprocessor_config.json (ViTImageProcessor's defaults
  without one: a bilinear resize to the input size, mean and std 0.5), of the model of
  ``config`` (a config.json). A SigLIP 2 model's (``Siglip2ImageProcessor``'s, the default
  for one): NaFlex patch sequences at its patch size and ``max_num_patches``."""
  model_type = (config or {}).get('model_type')
  kind = (processor or {}).get('image_processor_type', '')
  if model_type in _SIGLIP2_TYPES or kind.startswith('Siglip2'):
    return _siglip2_preprocessing(processor, config or {}, origin)
  p = {'size': {'height': 224, 'width': 224}, 'resample': 2, **(processor or {})}
  size = p['size'] if isinstance(p['size'], Mapping) else {'shortest_edge': p['size']}
  crop = p.get('crop_size') if p.get('do_center_crop') else None
  crop = crop if isinstance(crop, Mapping) or crop is None else {'height': crop}
  if 'shortest_edge' in size:
    resize, edge = 'shorter', size['shortest_edge']
  else:
    resize, edge = 'exact', size['height']
  normalize = p.get('do_normalize', True)
  return EvalSpec(resize=resize, crop_pct=crop['height'] / edge if crop else 1.,
                  method=_RESAMPLE.get(p['resample'], f'resample={p["resample"]}'),
                  mean=tuple(p.get('image_mean', (0.5,) * 3)) if normalize else (0.,) * 3,
                  std=tuple(p.get('image_std', (0.5,) * 3)) if normalize else (1.,) * 3)


def _siglip2_preprocessing(processor: Mapping[str, Any] | None, config: Mapping[str, Any],
                           origin: str) -> EvalSpec:
  """The NaFlex preprocessing of a Siglip2ImageProcessor's settings; a ``CheckpointError``
  where they are not what the model takes (another patch size, no resize or rescale)."""
  p = {**_SIGLIP2_PROCESSOR, **(processor or {})}
  where = f'{origin}/preprocessor_config.json' if origin else 'preprocessor_config.json'
  vision = config.get('vision_config') if config.get('model_type') == 'siglip2' else config
  patch = (vision or {}).get('patch_size')
  if patch is not None and int(p['patch_size']) != int(patch):
    raise errors.CheckpointError(
        f'{where}: patch_size={p["patch_size"]}, but the model\'s patches are {patch} px: '
        'the processor would cut patches the model cannot embed. Set its patch_size to the '
        "model's.")
  for flag in ('do_resize', 'do_rescale'):
    if not p[flag]:
      raise errors.CheckpointError(f'{where}: {flag}=false, which vit_jax\'s naflex op always '
                                   'does: give the preprocessing (--pp) yourself.')
  if abs(float(p['rescale_factor']) * 255 - 1) > 1e-6:
    raise errors.CheckpointError(f'{where}: rescale_factor={p["rescale_factor"]} (not 1/255): '
                                 'give the preprocessing (--pp) yourself.')
  normalize = p['do_normalize']
  return EvalSpec(resize='naflex', method=_RESAMPLE.get(p['resample'], f'resample={p["resample"]}'),
                  mean=tuple(p.get('image_mean', (0.5,) * 3)) if normalize else (0.,) * 3,
                  std=tuple(p.get('image_std', (0.5,) * 3)) if normalize else (1.,) * 3,
                  patch_size=int(p['patch_size']), max_num_patches=int(p['max_num_patches']))


# What vit_jax's options are written as: the class of each model_type (a classifier's, a
# features-only model's; None: the class has no such form), its image processor, and the
# option that routes a model to it (``model_type``).
_CLASSES = {'vit': ('ViTForImageClassification', 'ViTModel', 'ViTImageProcessor'),
            'deit': ('DeiTForImageClassificationWithTeacher', None, 'DeiTImageProcessor'),
            'siglip_vision_model': (None, 'SiglipVisionModel', 'SiglipImageProcessor'),
            'clip_vision_model': (None, 'CLIPVisionModel', 'CLIPImageProcessor'),
            'dinov2': ('Dinov2ForImageClassification', 'Dinov2Model', 'BitImageProcessor'),
            'dinov3_vit': (None, 'DINOv3ViTModel', 'DINOv3ViTImageProcessor')}
_HIDDEN_ACT = {'gelu': 'gelu', 'gelu_tanh': 'gelu_pytorch_tanh', 'quick_gelu': 'quick_gelu',
               'silu': 'silu'}


def model_type(model: VisionTransformer) -> str:
  """The transformers model_type that computes ``model``: DINOv3 for a rotary encoding, DeiT
  for a distillation token, SigLIP's vision tower for a MAP head, CLIP's for a LayerNorm before
  the blocks, DINOv2 for layer scale or a gated MLP, else ViT."""
  for kind, option in (('dinov3_vit', model.rope), ('deit', model.distill_token),
                       ('siglip_vision_model', model.pool == 'map'),
                       ('clip_vision_model', model.pre_norm),
                       ('dinov2', model.gated_mlp or model.layer_scale is not None)):
    if option:
      return kind
  return 'vit'


def _refusals(model: VisionTransformer, kind: str) -> list[tuple[bool, str, str]]:
  """(whether ``model`` has it, what the class of ``kind`` cannot hold, the format that can)."""
  classifier, features, _ = _CLASSES[kind]
  cls = classifier if model.num_classes else features
  size, patch = pair(model.image_size), pair(model.patch_size)
  others = {'pre_norm (a LayerNorm before the blocks)': model.pre_norm,
            'layer_scale': model.layer_scale is not None, 'gated_mlp': model.gated_mlp}
  allowed = {'clip_vision_model': ('pre_norm',), 'dinov2': ('layer_scale', 'gated_mlp'),
             'dinov3_vit': ('layer_scale', 'gated_mlp')}
  rope = Rope.parse(model.rope) if model.rope else None
  dinov3 = Rope('dinov3', temperature=rope.resolved('temperature'), layout='half') if rope else None
  checks = (
      (kind == 'dinov3_vit' and rope != dinov3, f'rope={model.rope!r} (DINOv3ViTModel\'s: '
       "'dinov3' with the half layout)"),
      (kind == 'dinov3_vit' and model.posemb != 'none', f'posemb={model.posemb!r} beside a '
       'rotary encoding (DINOv3ViTModel has no position embeddings)'),
      (kind == 'dinov3_vit' and (model.mlp_norm or model.attention_norm),
       'a norm inside the attention or the MLP (DINOv3ViTModel has none)'),
      (kind == 'dinov3_vit' and model.gated_mlp and model.activation != 'silu',
       f'gated_mlp with activation={model.activation!r} (DINOv3\'s gated MLP: silu)'),
      (kind != 'dinov3_vit' and model.num_registers > 0, f'num_registers={model.num_registers}'),
      (model.qk_norm, 'qk_norm'),
      (model.activation not in _HIDDEN_ACT, f'activation={model.activation!r}'),
      (kind != 'vit' and (size[0] != size[1] or patch[0] != patch[1]),
       f'a non-square image_size {size} or patch_size {patch} ({kind} is square)'),
      (kind != 'vit' and model.representation_size is not None,
       f'representation_size (a pre-logits layer: {kind} has none)'),
      (model.representation_size is not None and bool(model.num_classes),
       'a pre-logits layer before the classifier (ViTForImageClassification has none)'),
      (model.fc_norm and (model.pool != 'token' or model.distill_token),
       f'fc_norm with pool={model.pool!r}'),
      (kind == 'siglip_vision_model' and model.has_class_token,
       'a class token beside the MAP head (SigLIP has none)'),
      (kind != 'siglip_vision_model' and (not model.has_class_token or model.pool != 'token'),
       f'pool={model.pool!r} (its classifier reads the class token)'),
      (kind == 'dinov2' and model.gated_mlp and model.activation != 'silu',
       f'gated_mlp with activation={model.activation!r} (DINOv2\'s SwiGLU gates with silu)'),
      (cls is None, f'a classifier on {kind} ({features} has none; '
                    f'{features.replace("VisionModel", "ForImageClassification")} pools the '
                    "patches' mean)" if features else
                    'a distillation token without classifiers (DeiTModel pools the class '
                    'token alone)'),
      *((on, f'{what} with {kind}') for what, on in others.items()
        if what.split()[0] not in allowed.get(kind, ())))
  return [(bad, what, 'npz' if 'pre-logits layer before' in what else 'timm')
          for bad, what in checks]


def _canonical_inverse(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The inverse of ``_canonical``: CLIP's class and position embeddings without the leading
  axes, SigLIP head's q, k, v packed into ``in_proj``, DINOv3's gate_proj and up_proj apart."""
  for key in list(sd):
    if m := re.fullmatch(r'(.*\.mlp\.)gate_up_proj\.(weight|bias)', key):
      sd[f'{m.group(1)}gate_proj.{m.group(2)}'], sd[f'{m.group(1)}up_proj.{m.group(2)}'] = (
          np.split(sd.pop(key), 2))
    if key.endswith('embeddings.class_embedding'):
      sd[key] = sd[key].reshape(-1)
    elif key.endswith('embeddings.position_embedding.weight'):
      sd[key] = sd[key][0]
    elif m := re.fullmatch(r'(.*head\.attention\.)q_proj\.(weight|bias)', key):
      sd[f'{m.group(1)}in_proj_{m.group(2)}'] = np.concatenate(
          [sd.pop(f'{m.group(1)}{n}_proj.{m.group(2)}') for n in 'qkv'])
  return sd


def _config(kind: str, model: VisionTransformer) -> dict[str, Any]:
  """The config.json fields of ``kind`` that say ``model`` (the rest: the class' defaults)."""
  size, patch = pair(model.image_size), pair(model.patch_size)
  config: dict[str, Any] = dict(
      model_type=kind, hidden_size=model.hidden_size, num_hidden_layers=model.num_layers,
      num_attention_heads=model.num_heads, intermediate_size=model.mlp_dim,
      hidden_act=_HIDDEN_ACT[model.activation], layer_norm_eps=model.norm_epsilon,
      image_size=size[0] if size[0] == size[1] else list(size),
      patch_size=patch[0] if patch[0] == patch[1] else list(patch), num_channels=3,
      dtype='float32')
  if kind == 'dinov3_vit':
    rope = Rope.parse(model.rope)
    return {**config, 'rope_theta': rope.resolved('temperature'), 'query_bias': model.qkv_bias,
            'key_bias': model.qkv_bias and model.key_bias, 'value_bias': model.qkv_bias,
            'proj_bias': True, 'mlp_bias': True, 'layerscale_value': model.layer_scale or 1.0,
            'use_gated_mlp': model.gated_mlp, 'num_register_tokens': model.num_registers,
            'apply_layernorm': True, 'attention_dropout': 0.0, 'drop_path_rate': 0.0}
  if kind in ('clip_vision_model', 'siglip_vision_model'):
    return {**config, 'attention_dropout': 0.0,
            **({'vision_use_head': True} if kind == 'siglip_vision_model' else {})}
  config.update(qkv_bias=model.qkv_bias or kind != 'vit', hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, initializer_range=0.02)
  if kind == 'dinov2':  # Its MLP's width: width * mlp_ratio (an int), gated x 2/3 to 8s.
    del config['intermediate_size']
    width = lambda r: (int(r * model.hidden_size * 2 / 3) + 7) // 8 * 8 if model.gated_mlp else (
        r * model.hidden_size)
    ratio = next((r for r in range(1, 17) if width(r) == model.mlp_dim), None)
    if ratio is None:
      raise hub.export_refusal(model, 'transformers', f'mlp_dim={model.mlp_dim} (Dinov2\'s is '
                               'width * mlp_ratio, an int; gated: x 2/3, rounded up to 8s)',
                               'timm')
    return {**config, 'mlp_ratio': ratio, 'use_swiglu_ffn': model.gated_mlp,
            'layerscale_value': model.layer_scale or 1.0, 'use_mask_token': False,
            'drop_path_rate': 0.0, 'apply_layernorm': True}
  return {**config, 'encoder_stride': patch[0], 'pooler_act': 'tanh',
          'pooler_output_size': model.representation_size or model.hidden_size}


def write(model: VisionTransformer, params: Mapping[str, Any], class_names: Sequence[str] = (),
          naflex: bool = False) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(state dict, config.json) of ``model`` as the transformers class that computes it
  (``model_type``): ViTForImageClassification or ViTModel (its pre-logits layer the pooler),
  DeiTForImageClassificationWithTeacher, SiglipVisionModel, CLIPVisionModel,
  Dinov2ForImageClassification (the patches' mean read with zero weights) or Dinov2Model.
  ``naflex`` (its preprocessing makes patch sequences): SigLIP 2's ``_write_siglip2``."""
  if naflex:
    return _write_siglip2(model, params, class_names)
  kind = model_type(model)
  hub.check_export(model, 'transformers', _refusals(model, kind), eva=kind == 'dinov3_vit')
  config = _config(kind, model)
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  if kind == 'clip_vision_model':  # CLIP embeds the patches without a bias.
    hub.fold_patch_bias(model, flat)
  if kind != 'dinov3_vit':  # DINOv3 has no position embeddings.
    hub.embed_prefix(model, flat)
  if model.fc_norm:  # Norm then the class token, or the class token then norm: the same.
    for name in ('scale', 'bias'):
      flat[f'Transformer/encoder_norm/{name}'] = flat.pop(f'fc_norm/{name}')
  classifier = bool(model.num_classes)
  _, table, heads, prefix = BACKBONES[kind]
  if kind != 'vit':
    bias = np.zeros((model.num_heads, model.hidden_size // model.num_heads), np.float32)
    for i in range(model.num_layers):  # Biases of zero, layer scales of one: the same.
      for n in ('query', 'key', 'value') if kind != 'dinov3_vit' else ():  # Its config says.
        flat.setdefault(_A.format(i=i) + n + '/bias', bias)
      for n in ('ls1', 'ls2') if kind in ('dinov2', 'dinov3_vit') else ():
        flat.setdefault(_B.format(i=i) + n, np.ones(model.hidden_size, np.float32))
    table = [r for r in table if '.mlp.' not in r[1] or ('.mlp.weights_' in r[1]) == (
        model.gated_mlp and kind == 'dinov2') and (  # DINOv3's: gate_up_proj where gated.
            kind != 'dinov3_vit' or 'Dense_1' in r[0] or ('gate_up' in r[1]) == model.gated_mlp)]
    if kind == 'dinov2' and classifier:  # Its classifier reads [class token; patches' mean].
      flat['head/kernel'] = np.pad(flat['head/kernel'], ((0, model.hidden_size), (0, 0)))
  sd = hub.write_table(hub.expand(table, model.num_layers, prefix if classifier else ''), flat)
  sd = _canonical_inverse({**sd, **hub.write_table(heads, flat)})
  config['architectures'] = [_CLASSES[kind][0 if classifier else 1]]
  if classifier:
    names = list(class_names) or [f'LABEL_{i}' for i in range(model.num_classes)]
    config['id2label'] = {str(i): n for i, n in enumerate(names)}
    config['label2id'] = {n: i for i, n in enumerate(names)}
  return sd, config


def _write_siglip2(model: VisionTransformer, params: Mapping[str, Any],
                   class_names: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """A NaFlex model as SigLIP 2's classes: Siglip2ForImageClassification (classes: the mean of
  the image's own patches) or Siglip2VisionModel (features: its MAP head); what they cannot
  hold refused, naming timm's NaFlexVit, which holds more."""
  classifier = bool(model.num_classes)
  (gh, gw), (ph, pw) = model.grid, pair(model.patch_size)
  hub.check_export(model, 'transformers', [(bad, what, 'timm') for bad, what in (
      (model.num_prefix_tokens > 0, f'{model.num_prefix_tokens} prefix tokens (class token, '
       'registers): SigLIP 2 has none'),
      (classifier and model.pool != 'gap', f"pool={model.pool!r} with a classifier "
       "(Siglip2ForImageClassification pools the patches' mean)"),
      (not classifier and model.pool != 'map', f"pool={model.pool!r} without a classifier "
       '(Siglip2VisionModel pools with its MAP head)'),
      (gh != gw or ph != pw, f'a non-square position table {gh}x{gw} or patch {ph}x{pw} '
       "(SigLIP 2's are square)"),
      (model.pre_norm, 'pre_norm (a LayerNorm before the blocks)'),
      (model.layer_scale is not None, 'layer_scale'), (model.gated_mlp, 'gated_mlp'),
      (model.fc_norm, 'fc_norm (the final LayerNorm after pooling)'),
      (model.qk_norm, 'qk_norm'),
      (model.representation_size is not None, 'representation_size (a pre-logits layer)'),
      (model.activation not in _HIDDEN_ACT, f'activation={model.activation!r}'))])
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  prefix = 'vision_model.' if classifier else ''
  sd = hub.write_table(hub.expand(SIGLIP2, model.num_layers, prefix), flat)
  if classifier:
    sd.update(hub.write_table(BACKBONES['siglip2'][2], flat))
  sd = _canonical_inverse(sd)
  kernel = prefix + 'embeddings.patch_embedding.weight'  # The Conv2d's: a Linear of its pixels.
  sd[kernel] = hub.linear_of_conv_patches(sd[kernel])
  vision = dict(
      model_type='siglip2_vision_model', hidden_size=model.hidden_size,
      intermediate_size=model.mlp_dim, num_hidden_layers=model.num_layers,
      num_attention_heads=model.num_heads, num_channels=3, patch_size=ph, num_patches=gh * gw,
      hidden_act=_HIDDEN_ACT[model.activation], layer_norm_eps=model.norm_epsilon,
      attention_dropout=0.0, vision_use_head=not classifier)
  if not classifier:
    return sd, dict(vision, architectures=['Siglip2VisionModel'], dtype='float32')
  names = list(class_names) or [f'LABEL_{i}' for i in range(model.num_classes)]
  return sd, dict(model_type='siglip2', architectures=['Siglip2ForImageClassification'],
                  vision_config=vision, dtype='float32',
                  id2label={str(i): n for i, n in enumerate(names)},
                  label2id={n: i for i, n in enumerate(names)})


_RESAMPLE_NUMBER = {method.removeprefix('pil_'): n for n, method in _RESAMPLE.items()}


def preprocessor_config(model: VisionTransformer, spec: EvalSpec | None = None
                        ) -> dict[str, Any]:
  """The image processor's settings for ``model`` that do ``spec`` (the checkpoint's own
  preprocessing; default: the releases', a resize to the input, [-1, 1]): its family's
  processor, or one that has the resize and crop ``spec`` needs (CLIP's and Bit's resize the
  shorter side, those and DeiT's crop)."""
  spec = spec or EvalSpec()
  if spec.naflex:  # Siglip2ImageProcessor: patch sequences, as the naflex op makes them.
    if pair(spec.patch_size) != pair(model.patch_size):
      raise errors.CheckpointError(
          f"The preprocessing cuts {spec.patch_size} px patches, but the model's are "
          f'{pair(model.patch_size)[0]} px: give a naflex preprocessing at its patch size.')
    return dict(sorted(dict(
        image_processor_type='Siglip2ImageProcessor', patch_size=spec.patch_size,
        max_num_patches=spec.max_num_patches, do_resize=True, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, do_convert_rgb=True,
        resample=_RESAMPLE_NUMBER.get(spec.method.removeprefix('pil_'), 2),
        image_mean=list(spec.mean), image_std=list(spec.std)).items()))
  h, w = pair(model.image_size)
  scaled = [math.floor(s / spec.crop_pct + 1e-6) for s in (h, w)]
  shorter, crop = spec.resize == 'shorter', scaled != [h, w]
  if shorter and h != w:  # Their shortest_edge resize would crop another part of the image.
    raise errors.CheckpointError(
        f"transformers' image processors cannot resize as this checkpoint's preprocessing does "
        f'at {h}x{w} (keep the aspect ratio, cover {scaled[0]}x{scaled[1]}, then crop: '
        "timm's rule): export it as format='timm' (--format=timm), or as format='npz' and give the "
        'preprocessing (--pp) where it is used.')
  processor = _CLASSES[model_type(model)][2]
  if shorter and processor not in ('CLIPImageProcessor', 'BitImageProcessor'):
    processor = 'BitImageProcessor'
  elif crop and processor in ('ViTImageProcessor', 'SiglipImageProcessor'):
    processor = 'DeiTImageProcessor'
  config: dict[str, Any] = {}
  if processor != 'ViTImageProcessor' and processor != 'SiglipImageProcessor':
    config.update(crop_size=dict(height=h, width=w), do_center_crop=crop or shorter)
  if processor != 'ViTImageProcessor' and processor != 'DeiTImageProcessor':
    config['do_convert_rgb'] = True
  method = spec.method.removeprefix('pil_')
  return dict(sorted(dict(
      config, do_normalize=True, do_rescale=True, do_resize=True, image_mean=list(spec.mean),
      image_processor_type=processor, image_std=list(spec.std),
      resample=_RESAMPLE_NUMBER.get(method, 2), rescale_factor=1 / 255,
      size=dict(shortest_edge=scaled[0]) if shorter else dict(height=scaled[0],
                                                              width=scaled[1])).items()))

