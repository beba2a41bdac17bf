"""transformers' ViT checkpoints (``ViTModel``, ``ViTForImageClassification``): a config.json,
which holds every field (``ViTConfig``'s defaults where absent), and model.safetensors.
``TABLE`` names every tensor, for loading and for export. The backbones' (``BACKBONES``: CLIP's
and SigLIP's vision towers, DINOv2, distilled DeiT) load by their own tables."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vit_jax.base import errors
from vit_jax.base.sizes import pair
from vit_jax.checkpoints import hf_hub
from vit_jax.checkpoints.formats import hub
from vit_jax.checkpoints.formats.hub import CONV, SAME
from vit_jax.checkpoints.formats.layout import POSEMB_KEY, flatten, to_host, to_release
from vit_jax.data.preprocess import EvalSpec
from vit_jax.models import VisionTransformer

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


# ViTModel's and ViTForImageClassification's names, the encoder's under ``vit.`` in a classifier
# (ViT has no distillation token: a ViT folder holding one has it named as a stray tensor).
TABLE: tuple[hub.Rule, ...] = (
    *(rule for rule in _vit_like(('intermediate.dense', 'output.dense')) if rule[0] != 'dist'),
    *hub.dense('pre_logits', 'pooler.dense'))  # ViTModel's pooler (Dense + tanh).
# The classifier of ViTForImageClassification, outside ``vit.``.
CLASSIFIER: tuple[hub.Rule, ...] = hub.dense('head', 'classifier')
_DINOV2_SCALES = ('layer_scale1.lambda1', 'layer_scale2.lambda1')
# model_type -> (config defaults, the table, the tables of a classifier head, the prefix of the
# rest in a classifier). Classifiers that pool otherwise (Dinov2ForImageClassification: the
# class token and the patches' mean; DeiTForImageClassification: the class token only, beside
# a distillation token) are refused: they hold tensors these tables do not name.
BACKBONES: dict[str, tuple[dict[str, Any], tuple[hub.Rule, ...], tuple[hub.Rule, ...], str]] = {
    'clip_vision_model': (dict(hidden_act='quick_gelu', layer_norm_eps=1e-5), CLIP, (),
                          'vision_model.'),
    'siglip_vision_model': (dict(hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6), CLIP, (),
                            'vision_model.'),
    'dinov2': (dict(hidden_act='gelu', layer_norm_eps=1e-6, layerscale_value=1.),
               _vit_like(('mlp.fc1', 'mlp.fc2'), ('norm1', 'norm2'), _DINOV2_SCALES)
               + hub.dense(_B + 'MlpBlock_3/Dense_0', _L + 'mlp.weights_in')  # use_swiglu_ffn's.
               + hub.dense(_B + 'MlpBlock_3/Dense_1', _L + 'mlp.weights_out'), (), 'dinov2.'),
    'deit': (dict(hidden_act='gelu', layer_norm_eps=1e-12),
             _vit_like(('intermediate.dense', 'output.dense')),
             (*hub.dense('head', 'cls_classifier'),
              *hub.dense('head_dist', 'distillation_classifier')),
             'deit.'),
}


def _canonical(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The tensors that the release layout shapes otherwise, as the tables name them: CLIP's class
  embedding (D,) and position embeddings (N, D) with the release's leading axes, SigLIP head's
  packed ``in_proj`` split into q, k, v; DINOv2's ``mask_token`` (masked image modelling only:
  no output reads it) dropped."""
  out = {}
  for key, value in tensors.items():
    if key.endswith('embeddings.class_embedding'):
      value = value.reshape(1, 1, -1)
    elif key.endswith('embeddings.position_embedding.weight'):
      value = value[None]
    elif key.endswith('embeddings.mask_token'):
      continue
    elif m := re.fullmatch(r'(.*head\.attention\.)in_proj_(weight|bias)', key):
      for name, part in zip('qkv', np.split(value, 3), strict=True):
        out[f'{m.group(1)}{name}_proj.{m.group(2)}'] = part
      continue
    out[key] = value
  return out


def _read_backbone(model_type: str, config: Mapping[str, Any],
                   tensors: Mapping[str, np.ndarray], origin: str
                   ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """``read`` of a ``BACKBONES`` model type."""
  defaults, table, classifier, prefix = BACKBONES[model_type]
  c = {**DEFAULTS, **defaults, **config}
  if c['num_channels'] != 3:
    raise hub.refuse(origin, f'{c["num_channels"]} input channels', ' (RGB: 3)')
  swiglu = bool(c.get('use_swiglu_ffn'))
  if c['hidden_act'] not in _ACTIVATIONS and not swiglu:
    raise hub.refuse(origin, f'hidden_act={c["hidden_act"]!r}',
                     f" ({', '.join(repr(a) for a in _ACTIVATIONS)} load)")
  tensors = _canonical(tensors)
  t = hub.Tensors(tensors, origin, prefix if any(k.startswith(prefix) for k in tensors) else '')
  width, heads = int(c['hidden_size']), int(c['num_attention_heads'])
  ph, pw = t(next(k for _, k, layout in table if layout == CONV)).shape[2:]
  depth = t.blocks('encoder.layers.' if table is CLIP else 'encoder.layer.')
  flat = hub.read_table(hub.expand(table, depth), t, heads)
  t.prefix = ''
  flat.update(hub.read_table(classifier, t, heads))
  t.check_all_used('transformers')
  if model_type == 'deit' and 'head_dist/kernel' not in flat:
    raise hub.refuse(origin, 'a DeiT without its distillation classifier (DeiTModel, '
                     'DeiTForImageClassification: the class token read beside a distillation '
                     'token)', ' (DeiTForImageClassificationWithTeacher loads)')
  if model_type == 'siglip_vision_model' and 'MAPHead_0/probe' not in flat:
    raise hub.refuse(origin, 'a SigLIP vision tower without its head (vision_use_head=False)')
  flat.setdefault('embedding/bias', np.zeros(width, np.float32))  # CLIP embeds without one.
  b = _B.format(i=0)
  kwargs = dict(
      num_classes=int(flat['head/kernel'].shape[1]) if 'head/kernel' in flat else None,
      image_size=pair(c['image_size']), patch_size=(int(ph), int(pw)), hidden_size=width,
      num_layers=depth, num_heads=heads,
      mlp_dim=int(flat[b + 'MlpBlock_3/Dense_1/kernel'].shape[0]), gated_mlp=swiglu,
      pool='map' if 'MAPHead_0/probe' in flat else 'token', class_token='cls' in flat,
      distill_token='dist' in flat, pre_norm='Transformer/pre_norm/scale' in flat,
      layer_scale=float(c['layerscale_value']) if b + 'ls1' in flat else None,
      norm_epsilon=float(c['layer_norm_eps']),
      activation='silu' if swiglu else _ACTIVATIONS[c['hidden_act']])
  labels = config.get('id2label') or {}
  names = [labels[k] for k in sorted(labels, key=int)] if kwargs['num_classes'] else []
  return kwargs, flat, [str(n) for n in names]


def read(config: Mapping[str, Any], tensors: Mapping[str, np.ndarray], origin: str
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """(model kwargs, flat parameters, class names) of a transformers ViT folder."""
  model_type = config.get('model_type', 'vit')
  if model_type in BACKBONES:
    return _read_backbone(model_type, config, tensors, origin)
  if model_type != 'vit':
    raise hub.refuse(origin, f'transformers model_type {model_type!r}',
                     " (model_type 'vit', 'deit' (with teacher), 'dinov2', 'clip_vision_model' "
                     "and 'siglip_vision_model' load)")
  c = {**DEFAULTS, **config}
  if c['hidden_act'] not in _ACTIVATIONS:
    raise hub.refuse(origin, f'hidden_act={c["hidden_act"]!r}',
                     " ('gelu', 'gelu_pytorch_tanh' and 'gelu_new' load)")
  if c['num_channels'] != 3:
    raise hub.refuse(origin, f'{c["num_channels"]} input channels', ' (RGB: 3)')
  prefix = _PREFIX if any(k.startswith(_PREFIX) for k in tensors) else ''
  t = hub.Tensors(tensors, origin, prefix)
  width, heads = int(c['hidden_size']), int(c['num_attention_heads'])
  ph, pw = t('embeddings.patch_embeddings.projection.weight').shape[2:]
  depth = t.blocks('encoder.layer.')
  flat = hub.read_table(hub.expand(TABLE, depth), t, heads)
  t.prefix = ''
  flat.update(hub.read_table(CLASSIFIER, t, heads))
  t.check_all_used('transformers')
  if 'pre_logits/kernel' in flat and c['pooler_act'] != 'tanh':
    raise hub.refuse(origin, f'pooler_act={c["pooler_act"]!r}', ' (the pre-logits layer: tanh)')
  image_size = pair(c['image_size'])
  grid = (image_size[0] // ph, image_size[1] // pw)
  rows = t.tensors[prefix + 'embeddings.position_embeddings'].shape[1]
  if rows != grid[0] * grid[1] + 1:
    raise errors.CheckpointMismatchError(
        f'{origin}: position_embeddings has {rows} rows; image_size {image_size} with '
        f'{ph}x{pw} patches needs {grid[0] * grid[1] + 1}.')
  num_classes = int(flat['head/kernel'].shape[1]) if 'head/kernel' in flat else None
  kwargs = dict(
      num_classes=num_classes, image_size=image_size, patch_size=(int(ph), int(pw)),
      hidden_size=width, num_layers=depth, num_heads=heads,
      mlp_dim=int(c['intermediate_size']), pool='token',
      qkv_bias=_A.format(i=0) + 'query/bias' in flat,
      representation_size=(int(flat['pre_logits/bias'].shape[0])
                           if 'pre_logits/bias' in flat else None),
      norm_epsilon=float(c['layer_norm_eps']), activation=_ACTIVATIONS[c['hidden_act']])
  labels = config.get('id2label') or {}
  names = [labels[k] for k in sorted(labels, key=int)] if num_classes else []
  return kwargs, flat, [str(n) for n in names]


# PIL's resampling filters by the number transformers' image processors store.
_RESAMPLE = {0: 'pil_nearest', 1: 'pil_lanczos', 2: 'pil_bilinear', 3: 'pil_bicubic',
             4: 'pil_box', 5: 'pil_hamming'}


def preprocessing(processor: Mapping[str, Any] | None) -> EvalSpec:
  """The evaluation preprocessing of a preprocessor_config.json (ViTImageProcessor's defaults
  without one: a bilinear resize to the input size, mean and std 0.5)."""
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


def write(model: VisionTransformer, params: Mapping[str, Any], class_names: Sequence[str] = ()
          ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(state dict, config.json) of ``model`` for transformers' ViTForImageClassification (a
  model without classes: ViTModel, its pre-logits layer as the pooler)."""
  hub.common_refusals(model, 'transformers')
  for bad, what in (
      (model.num_registers > 0, f'num_registers={model.num_registers}'),
      (model.layer_scale is not None, 'layer_scale'),
      (not model.has_class_token, 'no class token'),
      (model.pool != 'token', f'pool={model.pool!r} (its classifier reads the class token)'),
      (model.qk_norm, 'qk_norm'),
      (model.pre_norm, 'pre_norm (a LayerNorm before the blocks)'),
      (model.gated_mlp, 'gated_mlp'),
      (model.distill_token, 'distill_token (ViT has no distillation token)'),
      (model.activation not in ('gelu', 'gelu_tanh'), f'activation={model.activation!r}'),
      (model.representation_size is not None and bool(model.num_classes),
       'a pre-logits layer before the classifier (ViTForImageClassification has none)')):
    if bad:
      raise hub.export_refusal(model, 'transformers', what,
                               'npz' if 'pre-logits' in what else 'timm')
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  if not model.prefix_posemb:  # [cls; x + pe] is [cls + 0; x + pe].
    posemb = flat[POSEMB_KEY]
    flat[POSEMB_KEY] = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
  if model.fc_norm:  # Norm then the class token, or the class token then norm: the same.
    for name in ('scale', 'bias'):
      flat[f'Transformer/encoder_norm/{name}'] = flat.pop(f'fc_norm/{name}')
  classifier = bool(model.num_classes)
  sd = hub.write_table(hub.expand(TABLE, model.num_layers, _PREFIX if classifier else ''), flat)
  sd.update(hub.write_table(CLASSIFIER, flat))

  size, patch = pair(model.image_size), pair(model.patch_size)
  config: dict[str, Any] = dict(
      architectures=['ViTForImageClassification' if classifier else 'ViTModel'],
      model_type='vit', hidden_size=model.hidden_size, num_hidden_layers=model.num_layers,
      num_attention_heads=model.num_heads, intermediate_size=model.mlp_dim,
      hidden_act='gelu' if model.activation == 'gelu' else 'gelu_pytorch_tanh',
      layer_norm_eps=model.norm_epsilon,
      image_size=size[0] if size[0] == size[1] else list(size),
      patch_size=patch[0] if patch[0] == patch[1] else list(patch), num_channels=3,
      qkv_bias=model.qkv_bias, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      initializer_range=0.02, encoder_stride=patch[0], pooler_act='tanh',
      pooler_output_size=model.representation_size or model.hidden_size, dtype='float32')
  if classifier:
    names = list(class_names) or [f'LABEL_{i}' for i in range(model.num_classes)]
    config['id2label'] = {str(i): n for i, n in enumerate(names)}
    config['label2id'] = {n: i for i, n in enumerate(names)}
  return sd, config


def preprocessor_config(model: VisionTransformer) -> dict[str, Any]:
  """transformers' ViTImageProcessor settings for a vit_jax model: resize, scale to [-1, 1]."""
  h, w = pair(model.image_size)
  return dict(image_processor_type='ViTImageProcessor', do_resize=True,
              size=dict(height=h, width=w), resample=2, do_rescale=True,
              rescale_factor=1 / 255, do_normalize=True, image_mean=hub.MEAN_STD,
              image_std=hub.MEAN_STD)


def export(model: VisionTransformer, params: Mapping[str, Any], folder: Any,
           class_names: Sequence[str] = ()) -> None:
  """Writes ``model`` into ``folder`` as ``save_pretrained`` does, with its image processor's
  preprocessor_config.json."""
  sd, config = write(model, params, class_names)
  hub.write_folder(folder, sd, config, {hf_hub.PREPROCESSOR: preprocessor_config(model)})
