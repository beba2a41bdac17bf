"""timm's ViT checkpoints (``VisionTransformer``, DeiT, ``Eva``: EVA-02, DINOv3, PE, the
rotary ViTs, and ``NaFlexVit``: SigLIP 2's NaFlex towers): a config.json and model.safetensors.

The architecture is read, never guessed: timm's config.json records only the arguments given
to ``create_model`` (``model_args``), so the named architecture's own defaults come from
``timm_architectures.json`` (timm's registry, tabled), and the arrays say the rest (class token,
registers, layer scale, position embeddings of the prefix tokens, fc_norm, qkv biases). What
the model has no option for is refused in one line that names it. ``TABLE`` names every tensor,
for loading and for export; ``EVA_NAMES`` the few an ``Eva`` names otherwise, ``NAFLEX_NAMES``
a ``NaFlexVit``'s. A NaFlexVit loads as the ViT it is, with a ``naflex`` preprocessing (patch
sequences at each image's aspect ratio: timm's ``ResizeToSequence`` and ``Patchify``); its
position embeddings, resized to each image's grid, must be resized as vit_jax's ``naflex`` path
resizes them (bilinear, antialiased: SigLIP 2's), or it is refused naming the mode.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vit_jax.base import errors
from vit_jax.base.sizes import pair
from vit_jax.checkpoints.formats import hub
from vit_jax.checkpoints.formats.fit import npz_architecture
from vit_jax.checkpoints.formats.hub import CONV, SAME
from vit_jax.checkpoints.formats.layout import POSEMB_KEY, flatten, to_host, to_release
from vit_jax.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, EvalSpec
from vit_jax.models import VisionTransformer
from vit_jax.models.posemb import Rope
from vit_jax.models.vit import LN_EPSILON

# timm's ViT architectures (timm 1.0.31) and the keyword arguments each passes to its model,
# read from timm's registry by tests/data/hub/make_timm_architectures.py. Values that are layers
# (norm, activation, block and MLP types) are strings in angle brackets.
_REGISTRY = json.loads((pathlib.Path(__file__).parent / 'timm_architectures.json').read_text())
ARCHITECTURES: dict[str, dict[str, Any]] = _REGISTRY['architectures']
EVA_ARCHITECTURES: dict[str, dict[str, Any]] = _REGISTRY['eva_architectures']
NAFLEX_ARCHITECTURES: dict[str, dict[str, Any]] = _REGISTRY['naflex_architectures']
NAFLEX_DEFAULTS: dict[str, Any] = _REGISTRY['naflex_defaults']  # NaFlexVitCfg's.
_B = 'Transformer/encoderblock_{i}/'
_A = _B + 'MultiHeadDotProductAttention_1/'
_M = 'MAPHead_0/'
_MA = _M + 'MultiHeadDotProductAttention_0/'
# timm's names for the release layout's arrays. timm fuses the attention's query, key and value
# into one ``attn.qkv``, and the attention pool's key and value into ``attn_pool.kv``
# (``_split_qkv``, ``_join_qkv``): the table names the parts.
TABLE: tuple[hub.Rule, ...] = (
    *hub.dense('embedding', 'patch_embed.proj', CONV),
    ('cls', 'cls_token', SAME),
    ('dist', 'dist_token', SAME),
    ('registers', 'reg_token', SAME),
    (POSEMB_KEY, 'pos_embed', SAME),
    *hub.norm('Transformer/pre_norm', 'norm_pre'),
    *hub.norm(_B + 'LayerNorm_0', 'blocks.{i}.norm1'),
    *hub.attention(_A, [f'blocks.{{i}}.attn.{n}' for n in ('q', 'k', 'v', 'proj')]),
    (_A + 'query_ln/scale', 'blocks.{i}.attn.q_norm.weight', SAME),
    (_A + 'key_ln/scale', 'blocks.{i}.attn.k_norm.weight', SAME),
    *hub.norm(_A + 'out_norm', 'blocks.{i}.attn.norm'),
    (_A + 'rope_freqs', 'blocks.{i}.attn.rope_freqs', SAME),  # Eva's rope.freqs, per block.
    (_B + 'ls1', 'blocks.{i}.ls1.gamma', SAME),
    *hub.norm(_B + 'LayerNorm_2', 'blocks.{i}.norm2'),
    *hub.dense(_B + 'MlpBlock_3/Dense_0', 'blocks.{i}.mlp.fc1'),
    *hub.norm(_B + 'MlpBlock_3/hidden_norm', 'blocks.{i}.mlp.norm'),
    *hub.dense(_B + 'MlpBlock_3/Dense_1', 'blocks.{i}.mlp.fc2'),
    (_B + 'ls2', 'blocks.{i}.ls2.gamma', SAME),
    *hub.norm('Transformer/encoder_norm', 'norm'),
    (_M + 'probe', 'attn_pool.latent', SAME),
    *hub.attention(_MA, [f'attn_pool.{n}' for n in ('q', 'k', 'v', 'proj')]),
    *hub.norm(_M + 'LayerNorm_0', 'attn_pool.norm'),
    *hub.dense(_M + 'MlpBlock_0/Dense_0', 'attn_pool.mlp.fc1'),
    *hub.dense(_M + 'MlpBlock_0/Dense_1', 'attn_pool.mlp.fc2'),
    *hub.norm('fc_norm', 'fc_norm'),
    *hub.dense('head', 'head'),
    *hub.dense('head_dist', 'head_dist'),
)
# The tensors only some architectures have, as their arguments say: (key prefix, whether the
# arguments ask for them, what they are, the tensor that must then be there).
_OPTIONAL = (
    ('norm_pre.', lambda a: bool(a['pre_norm']), 'pre_norm=True', 'norm_pre.weight'),
    ('dist_token', lambda a: bool(a['distilled']), 'a distilled DeiT (a distillation token)',
     'dist_token'),
    ('head_dist.', lambda a: bool(a['distilled']), '', ''),  # None without classes.
    ('attn_pool.', lambda a: a['global_pool'] == 'map', "global_pool='map'", 'attn_pool.latent'),
)
# The fused projections: (timm's stem, its parts).
_FUSED = ((r'blocks\.\d+\.attn\.', 'qkv', ('q', 'k', 'v')), (r'attn_pool\.', 'kv', ('k', 'v')))
# An Eva's names for the table's tensors, where they differ ('{i}': the block): its layer scales,
# its unfused attention, and the query and value biases of its fused one (EvaAttention: no key
# bias). Its SwiGLU's two first projections and its per-block rotary frequencies are joined and
# split by ``_eva_to_table`` and ``_table_to_eva``.
EVA_NAMES = (('blocks.{i}.ls1.gamma', 'blocks.{i}.gamma_1'),
             ('blocks.{i}.ls2.gamma', 'blocks.{i}.gamma_2'),
             *((f'blocks.{{i}}.attn.{n}.{w}', f'blocks.{{i}}.attn.{n}_proj.{w}')
               for n in 'qkv' for w in ('weight', 'bias')),
             ('blocks.{i}.attn.q.bias', 'blocks.{i}.attn.q_bias'),
             ('blocks.{i}.attn.v.bias', 'blocks.{i}.attn.v_bias'))

# timm's VisionTransformer defaults (timm 1.0.31), for what neither the registry nor
# model_args sets.
DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, in_chans=3, global_pool='token', embed_dim=768, depth=12,
    num_heads=12, mlp_ratio=4., qkv_bias=True, qk_norm=False, scale_attn_norm=False,
    scale_mlp_norm=False, proj_bias=True, init_values=None, class_token=True, pos_embed='learn',
    no_embed_class=False, reg_tokens=0, pre_norm=False, final_norm=True, fc_norm=None,
    pool_include_prefix=False, act_layer=None, norm_layer=None, embed_norm_layer=None,
    block_fn=None, mlp_layer=None, attn_layer=None, embed_layer=None, distilled=False)
# timm's Eva defaults (timm 1.0.31), likewise.
EVA_DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, in_chans=3, global_pool='avg', embed_dim=768, depth=12,
    num_heads=12, num_kv_heads=None, qkv_bias=True, qkv_fused=True, qk_norm=False, mlp_ratio=4.,
    swiglu_mlp=False, swiglu_align_to=0, scale_mlp=False, scale_attn_inner=False,
    attn_type='eva', norm_layer=None, init_values=None, attn_only_layer_scale=False,
    class_token=True, num_reg_tokens=0, no_embed_class=False, use_abs_pos_emb=True,
    use_rot_pos_emb=False, rope_type='cat', rope_grid_offset=0., rope_grid_indexing='ij',
    rope_temperature=10000., rope_rotate_half=False, rope_mrope_section=None,
    use_post_norm=False, use_pre_transformer_norm=False, use_post_transformer_norm=None,
    use_fc_norm=None, attn_pool_num_heads=None, attn_pool_mlp_ratio=None, ref_feat_shape=None)
# Arguments that change nothing of a trained model's function (dropout, init, input padding;
# an Eva's training-time jitter of its rotary coordinates).
_INERT = ('num_classes', 'drop_rate', 'pos_drop_rate', 'patch_drop_rate', 'proj_drop_rate',
          'attn_drop_rate', 'drop_path_rate', 'weight_init', 'fix_init', 'dynamic_img_size',
          'dynamic_img_pad', 'device', 'dtype', 'head_init_scale', 'rope_shift_coords',
          'rope_jitter_coords', 'rope_rescale_coords')
_ROPE_TYPES = {'cat': 'axial', 'dinov3': 'dinov3', 'mixed': 'mixed'}  # timm's -> posemb.KINDS.
_ACTIVATIONS = {None: 'gelu', 'gelu': 'gelu', 'gelu_tanh': 'gelu_tanh',
                'quick_gelu': 'quick_gelu', 'silu': 'silu', '<SiLU>': 'silu'}
_LAYER_NORM = re.compile(r'^<LayerNorm\(eps=([0-9.e+-]+)\)>$')
CLIP_EPSILON = 1e-5  # The LayerNorms of timm's CLIP architectures.
# timm's SwiGLUPacked (DINOv2-g), as ARCHITECTURES records it: vit_jax's gated_mlp.
SWIGLU_PACKED = "<GluMlp(act_layer=<class 'torch.nn.modules.activation.SiLU'>, gate_last=False)>"
# What the model has no option for: refused by name where the arguments ask for it.
_NO_OPTION = (('scale_attn_norm', 'scale_attn_norm (a LayerNorm inside the attention)'),
              ('scale_mlp_norm', 'scale_mlp_norm (a LayerNorm inside the MLP)'),
              ('block_fn', 'block_fn={}'), ('mlp_layer', 'mlp_layer={}'),
              ('attn_layer', 'attn_layer={}'), ('embed_layer', 'embed_layer={}'),
              ('embed_norm_layer', 'embed_norm_layer={}'),
              ('pool_include_prefix', 'pool_include_prefix (the prefix tokens pooled)'))


# timm's ViT-family architectures of other classes, by name (the config.json names its
# architecture; their tensors can look like a VisionTransformer's), and their blocks and
# attention that vit_jax has no option for: refused naming the architecture.
_OTHER_CLASSES = (
    (('vit_*_r_s*', 'vit_*_r26_*', 'vit_*_r50_*'), "a hybrid with a ResNet stem (vit_jax's "
     "R+ViT-Ti_16, R26+ViT-S_32 and R50+ViT-B_16 load from the release's .npz files)"),
    (('vit_*_resnet*', 'vit_*_mci_*'), 'a hybrid with a ResNet-D or MobileCLIP stem'),
    (('beit_*', 'beitv2_*'), "a BEiT model (a relative position bias in each block's "
     'attention, no absolute position embeddings)'),
    (('vit_relpos_*', 'vit_srelpos_*', 'test_vit_relpos'), 'a VisionTransformerRelPos model (a '
     'relative position bias in the attention, no absolute position embeddings)'),
    (('naflexvit_*',), "a NaFlexVit model vit_jax does not know (its NaFlexVitCfg: "
     f'{", ".join(sorted(NAFLEX_ARCHITECTURES)[:2])}, ... load)'))
_BLOCKS = {
    '<ParallelScalingBlock>': 'parallel blocks (ParallelScalingBlock: attention and MLP side by '
                              'side from one fused projection)',
    '<ParallelThingsBlock>': 'parallel blocks (ParallelThingsBlock: two attention and two MLP '
                             'branches side by side)',
    '<DiffParallelScalingBlock>': 'parallel blocks with differential attention '
                                  '(DiffParallelScalingBlock)',
    '<ResPostBlock>': 'ResPost blocks (ResPostBlock: each branch normalised after it, not '
                      'before)',
    'diff': 'differential attention (attn_layer=\'diff\': two softmax maps, one subtracted)'}


# A NaFlexVit's names for the table's tensors (its embedding module ``embeds``).
NAFLEX_NAMES = (('patch_embed.proj.weight', 'embeds.proj.weight'),
                ('patch_embed.proj.bias', 'embeds.proj.bias'),
                ('pos_embed', 'embeds.pos_embed'), ('cls_token', 'embeds.cls_token'),
                ('reg_token', 'embeds.reg_token'))
# NaFlexVitCfg fields that change nothing of a trained model's outputs on patch sequences
# (dropout, init, the image path's padding, the patch-size interpolator, how padding queries
# are masked), and constructor arguments beside the cfg.
_NAFLEX_INERT = ('drop_rate', 'pos_drop_rate', 'patch_drop_rate', 'proj_drop_rate',
                 'attn_drop_rate', 'drop_path_rate', 'weight_init', 'fix_init', 'dynamic_img_pad',
                 'enable_patch_interpolator', 'use_key_only_attn_mask', 'rope_shift_coords',
                 'rope_jitter_coords', 'rope_rescale_coords', 'rope_temperature',
                 'rope_ref_feat_shape', 'rope_grid_offset', 'rope_grid_indexing',
                 'rope_rotate_half', 'rope_mrope_section', 'qkv_fused', 'swiglu_align_to',
                 'pos_embed_grid_size', 'num_classes', 'in_chans', 'img_size', 'device', 'dtype')
# What vit_jax's naflex path computes: the position embeddings resized to each image's grid as
# SigLIP 2 resizes them (F.interpolate bilinear, antialias, align_corners=False, to the grid).
_NAFLEX_POSEMB = dict(pos_embed='learned', pos_embed_interp_mode='bilinear',
                      pos_embed_antialias=True, pos_embed_align_corners=False,
                      pos_embed_ar_preserving=False, pos_embed_use_grid_sample=False)


def is_naflex(config: Mapping[str, Any]) -> bool:
  """Whether a timm config.json names one of timm's ``NaFlexVit`` architectures."""
  return config.get('architecture') in NAFLEX_ARCHITECTURES


def _from_naflex(config: Mapping[str, Any], tensors: Mapping[str, np.ndarray], origin: str
                 ) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
  """A NaFlexVit's arguments as the VisionTransformer arguments of the same model (checked as
  theirs), its model options (the attention pool's heads) and its tensors under the table's
  names (``NAFLEX_NAMES``: its Linear patch embedding as the Conv2d kernel it equals, its
  (1, H, W, D) position table as (1, H * W, D)); refuses what computes otherwise."""
  name = config['architecture']
  n = {**NAFLEX_DEFAULTS, **NAFLEX_ARCHITECTURES[name], **(config.get('model_args') or {})}
  unknown = sorted(set(n) - set(NAFLEX_DEFAULTS) - set(_NAFLEX_INERT))
  if unknown:
    raise hub.refuse(origin, f'timm argument {unknown[0]}={n[unknown[0]]!r}')
  for key, want in _NAFLEX_POSEMB.items():
    if n[key] != want:
      raise hub.refuse(origin, f"timm's {name} with {key}={n[key]!r}", " (vit_jax resizes the "
                       "position embeddings to each image's grid bilinearly with antialias, as "
                       "SigLIP 2 does: pos_embed_interp_mode='bilinear', pos_embed_antialias="
                       "True, no align_corners, aspect-ratio preserving or grid_sample)")
  for bad, what in (
      (n['rope_type'] not in ('', 'none'), f"rope_type={n['rope_type']!r} (NaFlex rotary "
       'positions)'),
      (n['attn_type'] != 'standard', f"attn_type={n['attn_type']!r}"),
      (n['attn_gated'], 'attn_gated (a sigmoid gate on the attention output)'),
      (n['num_kv_heads'] is not None, f"num_kv_heads={n['num_kv_heads']!r} (grouped-query "
       'attention)'),
      (n['swiglu_mlp'], 'swiglu_mlp'), (n['attn_only_layer_scale'], 'attn_only_layer_scale'),
      (n['input_norm_layer'], f"input_norm_layer={n['input_norm_layer']!r}"),
      (n['global_pool'] == 'map' and n['attn_pool_mlp_ratio'] not in (None, n['mlp_ratio']),
       f"attn_pool_mlp_ratio={n['attn_pool_mlp_ratio']} beside mlp_ratio={n['mlp_ratio']}")):
    if bad:
      raise hub.refuse(origin, f"timm's {name} with {what}")
  fc_norm = n['global_pool'] == 'avg' if n['fc_norm'] is None else bool(n['fc_norm'])
  vit = dict(
      DEFAULTS, patch_size=n['patch_size'], global_pool=n['global_pool'],
      embed_dim=n['embed_dim'], depth=n['depth'], num_heads=n['num_heads'],
      mlp_ratio=n['mlp_ratio'], qkv_bias=n['qkv_bias'], qk_norm=n['qk_norm'],
      scale_attn_norm=n['scale_attn_inner_norm'], scale_mlp_norm=n['scale_mlp_norm'],
      proj_bias=n['proj_bias'], init_values=n['init_values'], class_token=n['class_token'],
      no_embed_class=True, reg_tokens=n['reg_tokens'], pre_norm=n['pre_norm'],
      final_norm=n['final_norm'], fc_norm=fc_norm, pool_include_prefix=n['pool_include_prefix'],
      act_layer=n['act_layer'], norm_layer=n['norm_layer'],
      embed_norm_layer=n['embed_norm_layer'], block_fn=n['block_fn'],
      mlp_layer=n['mlp_layer'], attn_layer=n['attn_layer'])
  patch = pair(n['patch_size'])
  renames = {theirs: ours for ours, theirs in NAFLEX_NAMES}
  out = {renames.get(k, k): np.asarray(v) for k, v in tensors.items()}
  kernel = out.get('patch_embed.proj.weight')
  if kernel is not None and kernel.ndim == 2:  # A Linear of each flattened patch.
    if n['patchify_channels_last']:  # (row, column, channel) pixels.
      kernel = hub.conv_of_linear_patches(kernel, patch)
    else:  # (channel, row, column).
      kernel = kernel.reshape(-1, 3, *patch)
    out['patch_embed.proj.weight'] = kernel
  if 'pos_embed' in out:
    table = out['pos_embed']
    vit['img_size'] = [table.shape[1] * patch[0], table.shape[2] * patch[1]]
    out['pos_embed'] = table.reshape(1, -1, table.shape[-1])
  options = dict(model_name=name,
                 map_heads=n['attn_pool_num_heads'] if n['global_pool'] == 'map' else None)
  return vit, options, out


def naflex_preprocessing(config: Mapping[str, Any]) -> EvalSpec:
  """A NaFlexVit's NaFlex preprocessing (timm's ``create_transform(naflex=True)``): each image
  resized keeping its aspect ratio (pretrained_cfg's interpolation; timm's bicubic default) to
  at most ``max_seq_len`` patches, then normalised. timm's config.json does not record the
  budget: it is its input size's patches (384 px / 16 = 576, timm's own default for NaFlex
  evaluation), which vit_jax's exports write it as."""
  cfg = config.get('pretrained_cfg') or {}
  patch = pair({**NAFLEX_DEFAULTS, **NAFLEX_ARCHITECTURES.get(config['architecture'], {}),
                **(config.get('model_args') or {})}['patch_size'])
  if patch[0] != patch[1]:
    raise errors.CheckpointError(f"{config['architecture']}: non-square patches {patch}: "
                                 "vit_jax's naflex op cuts square ones.")
  h, w = list(cfg.get('input_size') or (3, 384, 384))[-2:]
  return EvalSpec(resize='naflex', method=f'pil_{cfg.get("interpolation") or "bicubic"}',
                  mean=tuple(cfg.get('mean') or IMAGENET_MEAN),
                  std=tuple(cfg.get('std') or IMAGENET_STD), patch_size=patch[0],
                  max_num_patches=(h // patch[0]) * (w // patch[1]))


def is_eva(config: Mapping[str, Any]) -> bool:
  """Whether a timm config.json names one of timm's ``Eva`` architectures."""
  return config.get('architecture') in EVA_ARCHITECTURES


def arguments(config: Mapping[str, Any], origin: str) -> dict[str, Any]:
  """The arguments timm builds a config.json's model with: its class's defaults, the named
  architecture's, then ``model_args``; ``img_size`` as timm resolves it."""
  name = config.get('architecture')
  if not isinstance(name, str):
    raise errors.CheckpointError(f'{origin}: config.json has no "architecture" string.')
  registry = EVA_ARCHITECTURES if is_eva(config) else ARCHITECTURES
  for patterns, what in _OTHER_CLASSES if name not in registry else ():
    if any(fnmatch.fnmatchcase(name, p) for p in patterns):
      raise hub.refuse(origin, f"timm's {name}, {what}")
  model_args = dict(config.get('model_args') or {})
  if name not in registry and not model_args.get('num_heads'):
    raise errors.CheckpointMismatchError(
        f'{origin}: timm architecture {name!r} is not one of timm\'s VisionTransformer, DeiT '
        'or Eva models that vit_jax knows, and config.json\'s model_args do not give num_heads.')
  known = dict(registry.get(name, {}))
  defaults = EVA_DEFAULTS if is_eva(config) else DEFAULTS
  args = {**defaults, **known, **model_args}
  pretrained = config.get('pretrained_cfg') or {}
  if ('img_size' not in known and 'img_size' not in model_args
      and pretrained.get('fixed_input_size') and pretrained.get('input_size')):
    args['img_size'] = list(pretrained['input_size'])[-2:]  # timm's own rule.
  unknown = sorted(set(args) - set(defaults) - set(_INERT))
  if unknown:
    raise hub.refuse(origin, f'timm argument {unknown[0]}={args[unknown[0]]!r}')
  return args


def _from_eva(e: Mapping[str, Any], origin: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """An Eva's arguments as the VisionTransformer arguments of the same model (checked as
  theirs), and the model options only an Eva has: its rotary encoding, no absolute one, the
  norms inside its attention and MLP, its attention pool's heads. Refuses what has none."""
  fc_norm = e['global_pool'] == 'avg' if e['use_fc_norm'] is None else bool(e['use_fc_norm'])
  post_norm = (not fc_norm if e['use_post_transformer_norm'] is None
               else bool(e['use_post_transformer_norm']))
  mlp_ratio = float(e['mlp_ratio'])
  for bad, what in (
      (e['use_post_norm'], 'use_post_norm (EvaBlockPostNorm: each branch normalised after it)'),
      (e['num_kv_heads'] is not None, f'num_kv_heads={e["num_kv_heads"]!r} (grouped-query '
       'attention)'),
      (e['attn_type'] not in ('eva', 'rope'), f'attn_type={e["attn_type"]!r}'),
      (e['attn_only_layer_scale'], 'attn_only_layer_scale (layer scale on the attention alone)'),
      (e['use_rot_pos_emb'] and e['rope_type'] not in _ROPE_TYPES,
       f'rope_type={e["rope_type"]!r} (rotary types that load: {", ".join(_ROPE_TYPES)})'),
      (e['rope_grid_indexing'] not in ('ij', 'xy'),
       f'rope_grid_indexing={e["rope_grid_indexing"]!r}'),
      (fc_norm == post_norm, f'use_fc_norm={fc_norm} with use_post_transformer_norm={post_norm}'
       ' (one final LayerNorm, before or after pooling)'),
      (e['global_pool'] == 'map' and e['attn_pool_mlp_ratio'] not in (None, e['mlp_ratio']),
       f'attn_pool_mlp_ratio={e["attn_pool_mlp_ratio"]} beside mlp_ratio={e["mlp_ratio"]}')):
    if bad:
      raise hub.refuse(origin, f"timm's Eva with {what}")
  vit = dict(
      DEFAULTS, img_size=e['img_size'], patch_size=e['patch_size'], in_chans=e['in_chans'],
      global_pool=e['global_pool'], embed_dim=e['embed_dim'], depth=e['depth'],
      num_heads=e['num_heads'], mlp_ratio=mlp_ratio, qkv_bias=e['qkv_bias'],
      qk_norm=e['qk_norm'], init_values=e['init_values'], class_token=e['class_token'],
      no_embed_class=e['no_embed_class'], reg_tokens=e['num_reg_tokens'],
      pre_norm=e['use_pre_transformer_norm'], fc_norm=fc_norm, norm_layer=e['norm_layer'],
      act_layer='silu' if e['swiglu_mlp'] else None,
      mlp_layer=SWIGLU_PACKED if e['swiglu_mlp'] else None)
  rope = None
  if e['use_rot_pos_emb']:
    kind = _ROPE_TYPES[e['rope_type']]
    ref = e['ref_feat_shape'] if kind == 'axial' else None
    rope = str(Rope(kind, temperature=float(e['rope_temperature']),
                    layout='half' if e['rope_rotate_half'] else 'interleaved',
                    xy=e['rope_grid_indexing'] == 'xy',
                    offset=0. if kind == 'mixed' else float(e['rope_grid_offset']),
                    ref_grid=None if ref is None else pair(ref)))
  options = dict(rope=rope, posemb='learn' if e['use_abs_pos_emb'] else 'none',
                 key_bias=e['attn_type'] == 'rope' or not e['qkv_bias'],
                 model_name=e.get('architecture'),
                 map_heads=e['attn_pool_num_heads'] if e['global_pool'] == 'map' else None)
  return vit, options


def _eva_to_table(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """An Eva's tensors under the table's names (``EVA_NAMES``); its SwiGLU's ``fc1_g`` and
  ``fc1_x`` as one ``fc1`` (gate first, as SwiGLUPacked's), its ``rope.freqs`` (2, depth,
  heads, head_dim // 2) as each block's ``attn.rope_freqs``."""
  renames = {theirs: ours for ours, theirs in EVA_NAMES}
  out = {}
  for key, value in tensors.items():
    pattern = re.sub(r'blocks\.\d+\.', 'blocks.{i}.', key)
    i = re.match(r'blocks\.(\d+)\.', key)
    out[renames[pattern].format(i=i.group(1)) if pattern in renames else key] = value
  for key in [k for k in out if re.fullmatch(r'blocks\.\d+\.mlp\.fc1_g\.(weight|bias)', k)]:
    stem, kind = key.rsplit('.fc1_g.', 1)
    out[f'{stem}.fc1.{kind}'] = np.concatenate([out.pop(key), out.pop(f'{stem}.fc1_x.{kind}')])
  if 'rope.freqs' in out:
    for i, freqs in enumerate(np.moveaxis(np.asarray(out.pop('rope.freqs')), 1, 0)):
      out[f'blocks.{i}.attn.rope_freqs'] = freqs
  return out


def _table_to_eva(sd: dict[str, np.ndarray], model: VisionTransformer) -> dict[str, np.ndarray]:
  """The inverse of ``_eva_to_table`` for ``model`` (before ``_join_qkv``): the layer scales'
  names, the fused attention's query and value biases (EvaAttention: no key bias), the SwiGLU's
  two first projections where it has a norm inside (timm's SwiGLU, else SwiGLUPacked's one)."""
  names = {ours: theirs for ours, theirs in EVA_NAMES if '_proj' not in theirs}
  out = {}
  for key, value in sd.items():
    pattern = re.sub(r'blocks\.\d+\.', 'blocks.{i}.', key)
    i = re.match(r'blocks\.(\d+)\.', key)
    fused_bias = pattern.endswith(('q.bias', 'v.bias')) and not model.key_bias
    rename = pattern in names and (fused_bias or 'gamma' in names[pattern])
    out[names[pattern].format(i=i.group(1)) if rename else key] = value
  if model.gated_mlp and model.mlp_norm:
    for key in [k for k in out if re.fullmatch(r'blocks\.\d+\.mlp\.fc1\.(weight|bias)', k)]:
      stem, kind = key.rsplit('.fc1.', 1)
      out[f'{stem}.fc1_g.{kind}'], out[f'{stem}.fc1_x.{kind}'] = np.split(out.pop(key), 2)
  freqs = [out.pop(f'blocks.{i}.attn.rope_freqs') for i in range(model.num_layers)
           if f'blocks.{i}.attn.rope_freqs' in out]
  if freqs:
    out['rope.freqs'] = np.stack(freqs, axis=1)
  return out


def _check_arguments(a: Mapping[str, Any], origin: str) -> float:
  """Refuses the arguments the model has no option for; the LayerNorms' epsilon."""
  for key, what in _NO_OPTION:
    if a[key] and not (key == 'mlp_layer' and a[key] == SWIGLU_PACKED):
      raise hub.refuse(origin, f'timm\'s {_BLOCKS.get(a[key]) or what.format(a[key])}')
  for bad, what, *hint in (
      (a['mlp_layer'] and a['global_pool'] == 'map',  # Its attn_pool's MLP is not gated.
       "SwiGLUPacked with global_pool='map'"),
      (not a['proj_bias'], 'proj_bias=False (no bias in the attention output)'),
      (a['pos_embed'] != 'learn', f'pos_embed={a["pos_embed"]!r} (no position embeddings)'),
      (not a['final_norm'], "timm's final_norm=False (no LayerNorm after the blocks)"),
      (a['global_pool'] not in ('token', 'avg', 'map'), f'global_pool={a["global_pool"]!r}',
       " ('token', 'avg' and 'map' load)"),
      (a['act_layer'] not in _ACTIVATIONS, f'act_layer={a["act_layer"]!r}',
       " (activation: 'gelu', 'gelu_tanh', 'quick_gelu', 'silu')")):
    if bad:
      raise hub.refuse(origin, what, *hint)
  if a['norm_layer'] in (None, 'layernorm'):
    return LN_EPSILON
  m = _LAYER_NORM.match(str(a['norm_layer']))
  if not m:
    raise hub.refuse(origin, f'norm_layer={a["norm_layer"]!r}', ' (LayerNorms load)')
  return float(m.group(1))


def _split_qkv(tensors: Mapping[str, np.ndarray], origin: str) -> dict[str, np.ndarray]:
  """timm's fused ``attn.qkv`` (``attn_pool.kv``) as the table's ``attn.q``, ``attn.k`` and
  ``attn.v`` (``attn_pool.k``, ``attn_pool.v``); the q/k norms' biases, which vit_jax's
  scale-only norms lack, checked to be zero and dropped."""
  out = {}
  for key, value in sorted(tensors.items()):
    if fused := next(((m, parts) for stem, name, parts in _FUSED
                      if (m := re.fullmatch(f'({stem}){name}\\.(weight|bias)', key))), None):
      m, parts = fused
      for name, part in zip(parts, np.split(value, len(parts)), strict=True):
        out[f'{m.group(1)}{name}.{m.group(2)}'] = part
    elif re.fullmatch(r'blocks\.\d+\.attn\.[qk]_norm\.bias', key):
      if np.any(value):
        raise hub.refuse(origin, f'qk_norm with biases ({key} is not zero)',
                         ' (vit_jax\'s qk_norm, ViT-22B\'s, has scales only)')
    else:
      out[key] = value
  return out


def _join_qkv(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The inverse of ``_split_qkv``: one ``attn.qkv`` per block (``attn_pool.kv``), zero q/k
  norm biases."""
  for stem, name, parts in _FUSED:
    for key in [k for k in sd if re.fullmatch(f'{stem}{parts[0]}\\.(weight|bias)', k)]:
      head, kind = key.rsplit(f'.{parts[0]}.', 1)
      sd[f'{head}.{name}.{kind}'] = np.concatenate([sd.pop(f'{head}.{n}.{kind}') for n in parts])
  for key in [k for k in sd if re.fullmatch(r'blocks\.\d+\.attn\.[qk]_norm\.weight', k)]:
    sd[key.removesuffix('weight') + 'bias'] = np.zeros_like(sd[key])
  return sd


def read(config: Mapping[str, Any], tensors: Mapping[str, np.ndarray], origin: str
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """(model kwargs, flat parameters, class names) of a timm ViT's (or Eva's) config.json and
  tensors."""
  if is_naflex(config):
    a, options, tensors = _from_naflex(config, tensors, origin)
  else:
    a, options = arguments(config, origin), {}
  if is_eva(config):
    a, options = _from_eva(dict(a, architecture=config['architecture']), origin)
    tensors = _eva_to_table(tensors)
  epsilon = _check_arguments(a, origin)
  t = hub.Tensors(_split_qkv(tensors, origin), origin)
  width, channels, ph, pw = t('patch_embed.proj.weight').shape
  if channels != 3:
    raise hub.refuse(origin, f'{channels} input channels', ' (RGB: 3)')
  heads = int(a['num_heads'])
  if width % heads:
    raise errors.CheckpointError(f'{origin}: width {width} is not divisible by num_heads={heads}.')
  depth = t.blocks('blocks.')
  for _, wanted, what, key in _OPTIONAL:
    if key and wanted(a) and key not in t:
      raise errors.CheckpointMismatchError(f'{origin}: timm\'s {what} (its architecture\'s '
                                           f'arguments), but {key} is not in the weights.')
  table = [rule for rule in TABLE  # Where the arguments say no, such a tensor is a stray.
           if not any(rule[1].startswith(p) and not wanted(a) for p, wanted, *_ in _OPTIONAL)]
  flat = hub.read_table(hub.expand(table, depth), t, heads)
  if 'attn_pool.latent' in t:  # The pool's own heads (an Eva's attn_pool_num_heads).
    flat.update(hub.read_table(hub.expand([r for r in table if r[0].startswith(_MA)], 1), t,
                               int(options.get('map_heads') or heads)))
  t.check_all_used('timm')
  flat.setdefault('embedding/bias', np.zeros(width, np.float32))  # pre_norm ViTs (CLIP): none.
  class_token, distill_token = 'cls' in flat, 'dist' in flat
  registers = int(flat['registers'].shape[1]) if 'registers' in flat else 0
  prefix = int(class_token) + int(distill_token) + registers
  image_size, prefix_posemb = pair(a['img_size']), False
  if 'pos_embed' in t:
    image_size, prefix_posemb = _grid(a, t('pos_embed').shape[1], (ph, pw), prefix, origin)
  elif input_size := (config.get('pretrained_cfg') or {}).get('input_size'):
    image_size = pair(list(input_size)[-2:])  # Any size computes alike: the one timm feeds.
  pool = {'token': 'token', 'avg': 'gap', 'map': 'map'}[a['global_pool']]
  if pool == 'map' and prefix and not is_eva(config):
    raise hub.refuse(origin, f"global_pool='map' over the patches alone, beside "
                     f'{prefix} prefix tokens', " (vit_jax's MAP head pools every token)")
  if pool == 'token' and not class_token:
    raise errors.CheckpointError(f"{origin}: global_pool='token' without a cls_token.")
  kwargs = dict(  # What the arrays say (as a .npz file's), then what the arguments say.
      npz_architecture(flat),
      num_classes=int(flat['head/kernel'].shape[1]) if 'head/kernel' in flat else None,
      image_size=image_size, gated_mlp=bool(a['mlp_layer']), pool=pool, class_token=class_token,
      prefix_posemb=prefix_posemb, norm_epsilon=epsilon, activation=_ACTIVATIONS[a['act_layer']],
      layer_scale=float(a['init_values'] or 1e-6) if _B.format(i=0) + 'ls1' in flat else None,
      **{k: v for k, v in options.items() if v is not None})
  names = config.get('label_names') or (config.get('pretrained_cfg') or {}).get('label_names')
  return kwargs, flat, [str(n) for n in names or []]


def _grid(args: Mapping[str, Any], rows: int, patch: tuple[int, int], prefix: int,
          origin: str) -> tuple[tuple[int, int], bool]:
  """(image size, whether the prefix tokens have position embeddings) of a timm ViT: its
  img_size where the position embeddings fit it, else the square grid they hold."""
  size = pair(args['img_size'])
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


def preprocessing(config: Mapping[str, Any]) -> EvalSpec:
  """The evaluation preprocessing of a timm config.json's ``pretrained_cfg``, with timm's
  defaults where it is silent (``transforms_imagenet_eval``: crop_pct 0.875, bicubic, ImageNet's
  mean and std)."""
  if is_naflex(config):
    return naflex_preprocessing(config)
  cfg = config.get('pretrained_cfg') or {}
  mode = cfg.get('crop_mode') or 'center'
  return EvalSpec(resize={'center': 'shorter'}.get(mode, mode),
                  crop_pct=float(cfg.get('crop_pct') or 0.875),
                  method=f'pil_{cfg.get("interpolation") or "bicubic"}',
                  mean=tuple(cfg.get('mean') or IMAGENET_MEAN),
                  std=tuple(cfg.get('std') or IMAGENET_STD), crop_offset='round')


def is_eva_model(model: VisionTransformer) -> bool:
  """Whether ``model`` is written as a timm ``Eva`` (what timm's VisionTransformer lacks: a
  rotary encoding, no absolute one, no key bias, norms inside its attention or MLP, a MAP head
  of its own heads)."""
  return bool(model.rope or model.posemb == 'none' or (model.qkv_bias and not model.key_bias)
              or model.mlp_norm or model.attention_norm or model.map_heads)


def source_architecture(config: Mapping[str, Any]) -> dict[str, Any]:
  """What a timm config.json names its model (``Loaded.architecture``): its architecture and
  the ``model_args`` it was created with."""
  return dict(architecture=config.get('architecture'),
              model_args=dict(config.get('model_args') or {}))


def write(model: VisionTransformer, params: Mapping[str, Any],
          class_names: Sequence[str] = (), preprocessing: EvalSpec | None = None,
          source: Mapping[str, Any] | None = None
          ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(state dict, config.json) of ``model`` for timm's VisionTransformer (or Eva:
  ``is_eva_model``): ``timm.create_model('local-dir:DIR', pretrained=True)`` rebuilds it with
  the same logits; its pretrained_cfg says ``preprocessing`` (the checkpoint's own; default:
  the releases', [-1, 1]). ``source``: the timm architecture the checkpoint came from
  (``Loaded.architecture``), named with its model_args where timm builds ``model`` from them,
  its classes and input size given. A ``naflex`` preprocessing: timm's NaFlexVit
  (``_write_naflex``)."""
  if preprocessing is not None and preprocessing.naflex:
    return _write_naflex(model, params, class_names, preprocessing, source)
  eva = is_eva_model(model)
  width, hidden = model.hidden_size, model.mlp_dim * (1 + model.gated_mlp)  # fc1's outputs.
  if eva:  # Eva's SwiGLU is sized by its hidden units, SwiGLUPacked's by twice them.
    hidden = model.mlp_dim
  hub.check_export(model, 'timm', (
      (model.representation_size is not None, 'representation_size (a pre-logits layer)'),
      (model.norm_epsilon not in (LN_EPSILON, *((CLIP_EPSILON,) if model.pre_norm or eva else ())),
       f'norm_epsilon={model.norm_epsilon:g} (timm\'s LayerNorms: 1e-6)', 'transformers'),
      (model.pool == 'map' and model.num_prefix_tokens and not eva, f"pool='map' beside "
       f"{model.num_prefix_tokens} prefix tokens (timm's attention pool leaves them out)"),
      (model.gated_mlp and model.pool == 'map',
       "gated_mlp with pool='map' (timm's attention pool has a plain MLP)"),
      (eva and model.distill_token, "a distillation token in an Eva (timm's rotary ViTs)"),
      (eva and model.activation != ('silu' if model.gated_mlp else 'gelu'),
       f"activation={model.activation!r} in an Eva (exact GELU; SiLU in its SwiGLU)"),
      (int(width * (hidden / width)) != hidden,
       f'mlp_dim={model.mlp_dim} (timm makes int(width * mlp_ratio))')), eva=eva)
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  if model.pre_norm:  # timm's pre_norm ViTs embed without a bias.
    hub.fold_patch_bias(model, flat)
  sd = hub.write_table(hub.expand(TABLE, model.num_layers), flat)
  sd = _join_qkv(_table_to_eva(sd, model) if eva else sd)
  num_classes = model.num_classes or 0
  size, patch = pair(model.image_size), pair(model.patch_size)
  global_pool = {'token': 'token', 'gap': 'avg', 'map': 'map'}[model.pool]
  model_args = dict(
      num_classes=num_classes, img_size=list(size),
      patch_size=patch[0] if patch[0] == patch[1] else list(patch), in_chans=3,
      global_pool=global_pool, embed_dim=width, depth=model.num_layers,
      num_heads=model.num_heads, mlp_ratio=hidden / width, qkv_bias=model.qkv_bias,
      qk_norm=model.qk_norm, init_values=model.layer_scale, class_token=model.has_class_token,
      no_embed_class=not model.prefix_posemb)
  if eva:
    model_args.update(_eva_arguments(model))
  else:
    model_args.update(reg_tokens=model.num_registers, fc_norm=model.fc_norm,
                      act_layer=model.activation, pre_norm=model.pre_norm)
  name = eva_architecture(model) if eva else architecture(model)
  if kept := _kept_architecture(model, sd, source):
    name, model_args = kept
  config: dict[str, Any] = dict(architecture=name, num_classes=num_classes,
                                num_features=width, global_pool=global_pool)
  if class_names:
    config['label_names'] = list(class_names)
  config['model_args'] = model_args
  spec = preprocessing or EvalSpec()
  config['pretrained_cfg'] = dict(
      input_size=[3, *size], fixed_input_size=not (eva and model.posemb == 'none'),
      interpolation=spec.method.removeprefix('pil_'), crop_pct=spec.crop_pct,
      crop_mode='squash' if spec.resize == 'squash' else 'center', mean=list(spec.mean),
      std=list(spec.std), num_classes=num_classes, pool_size=None,
      first_conv='patch_embed.proj', classifier='head')
  return sd, config


def _write_naflex(model: VisionTransformer, params: Mapping[str, Any], class_names: Sequence[str],
                  spec: EvalSpec, source: Mapping[str, Any] | None
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """``model`` as timm's NaFlexVit (its NaFlex preprocessing ``spec``): the source's NaFlexVit
  architecture, or ``naflexvit_base_patch16_siglip``, with model_args that give every field
  the model's function depends on; its pretrained_cfg's input size has ``spec``'s budget of
  patches (``naflex_preprocessing`` reads it back)."""
  patch, (gh, gw) = pair(model.patch_size), model.grid
  hidden = model.mlp_dim
  hub.check_export(model, 'timm', (
      (model.distill_token, 'a distillation token (NaFlexVit has none)'),
      (model.representation_size is not None, 'representation_size (a pre-logits layer)'),
      (model.norm_epsilon != LN_EPSILON,
       f'norm_epsilon={model.norm_epsilon:g} (timm\'s LayerNorms: 1e-6)', 'transformers'),
      (model.pool == 'map' and model.num_prefix_tokens > 0, f"pool='map' beside "
       f"{model.num_prefix_tokens} prefix tokens (timm's attention pool leaves them out)"),
      (model.gated_mlp, "gated_mlp (NaFlexVit's MLP is a plain one)"),
      (model.prefix_posemb and model.num_prefix_tokens > 0,
       'position embeddings of the prefix tokens (NaFlexVit embeds the patches only)'),
      (patch[0] != patch[1] or spec.patch_size != patch[0],
       f'patches {patch[0]}x{patch[1]} under a naflex preprocessing of {spec.patch_size} px '
       '(square, the same)'),
      (int(model.hidden_size * (hidden / model.hidden_size)) != hidden,
       f'mlp_dim={model.mlp_dim} (timm makes int(width * mlp_ratio))')))
  flat = {k: to_host(v) for k, v in flatten(to_release(params)).items()}
  if model.pre_norm:  # NaFlexVit's pre_norm embeds without a bias, as timm's ViTs do.
    hub.fold_patch_bias(model, flat)
  sd = _join_qkv(hub.write_table(hub.expand(TABLE, model.num_layers), flat))
  names = dict(NAFLEX_NAMES)
  sd = {names.get(k, k): v for k, v in sd.items()}
  sd['embeds.proj.weight'] = hub.linear_of_conv_patches(sd['embeds.proj.weight'])
  sd['embeds.pos_embed'] = sd['embeds.pos_embed'].reshape(1, gh, gw, model.hidden_size)
  num_classes = model.num_classes or 0
  global_pool = {'token': 'token', 'gap': 'avg', 'map': 'map'}[model.pool]
  model_args = dict(
      num_classes=num_classes, patch_size=patch[0], embed_dim=model.hidden_size,
      depth=model.num_layers, num_heads=model.num_heads, mlp_ratio=hidden / model.hidden_size,
      qkv_bias=model.qkv_bias, qk_norm=model.qk_norm, init_values=model.layer_scale,
      class_token=model.has_class_token, reg_tokens=model.num_registers,
      global_pool=global_pool, fc_norm=model.fc_norm, final_norm=True, pre_norm=model.pre_norm,
      act_layer=model.activation, norm_layer=None, embed_proj_type='linear',
      patchify_channels_last=True, pos_embed_grid_size=[gh, gw], **_NAFLEX_POSEMB)
  name = (source or {}).get('architecture')
  if name in NAFLEX_ARCHITECTURES:  # Its own model_args, where they build this model.
    kept = dict(source.get('model_args') or {}, num_classes=num_classes)
    try:
      kwargs, _, _ = read(dict(architecture=name, model_args=kept), sd, name)
      kwargs['num_classes'] = kwargs['num_classes'] or model.num_classes
      same = _computed(VisionTransformer(**kwargs)) == _computed(model)
    except (errors.UserError, ValueError):
      same = False
    model_args = kept if same else model_args
  else:
    name = 'naflexvit_base_patch16_siglip'
  config: dict[str, Any] = dict(architecture=name, num_classes=num_classes,
                                num_features=model.hidden_size, global_pool=global_pool)
  if class_names:
    config['label_names'] = list(class_names)
  config['model_args'] = model_args
  budget = spec.max_num_patches
  rows = max(r for r in range(1, math.isqrt(budget) + 1) if budget % r == 0)
  config['pretrained_cfg'] = dict(
      input_size=[3, rows * patch[0], budget // rows * patch[1]], fixed_input_size=False,
      interpolation=spec.method.removeprefix('pil_'), crop_pct=1.0, crop_mode='center',
      mean=list(spec.mean), std=list(spec.std), num_classes=num_classes, pool_size=None,
      first_conv='embeds.proj', classifier='head')
  return sd, config


def _eva_arguments(model: VisionTransformer) -> dict[str, Any]:
  """The Eva arguments of ``model`` beyond those it shares with a VisionTransformer: every
  one given, so that only the architecture's norm_layer (its epsilon) comes from its name."""
  rope = Rope.parse(model.rope) if model.rope else None
  inverse = {v: k for k, v in _ROPE_TYPES.items()}
  args = dict(
      num_reg_tokens=model.num_registers, use_fc_norm=model.fc_norm,
      use_post_transformer_norm=not model.fc_norm, use_pre_transformer_norm=model.pre_norm,
      qkv_fused=True, attn_type='rope' if model.key_bias else 'eva', swiglu_mlp=model.gated_mlp,
      swiglu_align_to=0, scale_mlp=model.mlp_norm, scale_attn_inner=model.attention_norm,
      use_abs_pos_emb=model.posemb == 'learn', use_rot_pos_emb=rope is not None,
      dynamic_img_size=model.posemb == 'none', attn_pool_num_heads=model.map_heads,
      attn_pool_mlp_ratio=None)
  if rope is not None:
    args.update(rope_type=inverse[rope.kind], rope_temperature=rope.resolved('temperature'),
                rope_rotate_half=rope.resolved('layout') == 'half',
                rope_grid_indexing='xy' if rope.xy else 'ij', rope_grid_offset=rope.offset,
                ref_feat_shape=list(rope.ref_grid) if rope.ref_grid else None)
  return args


def eva_architecture(model: VisionTransformer) -> str:
  """The timm Eva architecture ``model`` is written as: its own name where it is one, else one
  whose LayerNorms have its epsilon (its config.json's model_args give every other argument)."""
  if model.model_name in EVA_ARCHITECTURES and _epsilon(
      EVA_ARCHITECTURES[model.model_name]) == model.norm_epsilon:
    return model.model_name
  for name in ('vit_base_patch16_rope_224', 'vit_base_patch16_dinov3'):
    if _epsilon(EVA_ARCHITECTURES[name]) == model.norm_epsilon:
      return name
  raise hub.export_refusal(model, 'timm', f'norm_epsilon={model.norm_epsilon:g} (timm\'s Eva '
                           'LayerNorms: 1e-6 or 1e-5)')


def _epsilon(args: Mapping[str, Any]) -> float:
  """The LayerNorm epsilon of a registry entry's ``norm_layer`` (timm's default: 1e-6)."""
  m = _LAYER_NORM.match(str(args.get('norm_layer')))
  return float(m.group(1)) if m else LN_EPSILON


# What a trained model computes no differently with (dtypes, dropout, kernels, layouts, its
# name, initial values), left out where two models are compared.
_NOT_COMPUTED = ('parent', 'name', 'model_name', 'dropout_rate', 'attention_dropout_rate',
                 'stochastic_depth', 'attention_impl', 'scan', 'remat_policy', 'dtype',
                 'param_dtype', 'matmul_dtype', 'head_bias_init', 'class_token', 'layer_scale')


def _computed(model: VisionTransformer) -> dict[str, Any]:
  """What of ``model`` its outputs depend on, for parameters of its shapes."""
  return dict({f.name: getattr(model, f.name) for f in dataclasses.fields(model)
               if f.name not in _NOT_COMPUTED},
              image_size=pair(model.image_size), patch_size=pair(model.patch_size),
              class_token=model.has_class_token, layer_scale=model.layer_scale is not None)


def _kept_architecture(model: VisionTransformer, sd: Mapping[str, np.ndarray],
                       source: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
  """(``source``'s architecture, its model_args with ``model``'s classes and input size) where
  timm's registry (``ARCHITECTURES``, ``EVA_ARCHITECTURES``) has it and builds ``model`` from
  them: checked by reading the export's config.json and tensors back as a timm folder is read;
  None otherwise."""
  name = (source or {}).get('architecture')
  if name not in ARCHITECTURES and name not in EVA_ARCHITECTURES:
    return None
  model_args = dict(source.get('model_args') or {}, num_classes=model.num_classes or 0,
                    img_size=list(pair(model.image_size)))
  try:
    kwargs, _, _ = read(dict(architecture=name, model_args=model_args), sd, name)
    kwargs['num_classes'] = kwargs['num_classes'] or model.num_classes
    rebuilt = VisionTransformer(**{**kwargs, 'image_size': pair(kwargs['image_size'])})
  except (errors.UserError, ValueError):
    return None
  return (name, model_args) if _computed(rebuilt) == _computed(model) else None


_SIZES = {(192, 12, 3): 'tiny', (384, 12, 6): 'small', (512, 12, 8): 'medium',
          (768, 12, 12): 'base', (1024, 24, 16): 'large', (1280, 32, 16): 'huge'}


def architecture(model: VisionTransformer) -> str:
  """The timm architecture a model is one of: the registry's name where timm has one of this
  family, size, patch and resolution, else the family's base name (config.json's model_args
  give every size either way). What model_args cannot say comes with the family: the
  distilled DeiT's class, DINOv2-g's SwiGLUPacked MLP, CLIP's LayerNorm epsilon (1e-5)."""
  size = _SIZES.get((model.hidden_size, model.num_layers, model.num_heads), 'base')
  (h, w), (ph, pw) = pair(model.image_size), pair(model.patch_size)
  families = (  # (whether the model is of it, its names' pattern, its base architecture).
      (model.distill_token, 'deit_{}_distilled_patch{}_{}', 'deit_base_distilled_patch16_224'),
      (model.gated_mlp, *('vit_giant_patch14_dinov2',) * 2),  # timm's one SwiGLUPacked ViT.
      (model.pre_norm and model.norm_epsilon == CLIP_EPSILON, 'vit_{}_patch{}_clip_{}',
       'vit_base_patch16_clip_224'),
      (model.pool == 'map', 'vit_{}_patch{}_siglip_{}', 'vit_base_patch16_siglip_224'),
      (model.num_registers, f'vit_{{}}_patch{{}}_reg{model.num_registers}_gap_{{}}',
       'vit_base_patch16_reg4_gap_256'),
      (model.layer_scale is not None and not model.prefix_posemb, 'deit3_{}_patch{}_{}',
       'deit3_base_patch16_224'),
      (model.pool == 'gap' and not model.has_class_token and not model.fc_norm,
       'vit_{}_patch{}_gap_{}', 'vit_base_patch16_gap_224'),
      (True, 'vit_{}_patch{}_{}', 'vit_base_patch16_224'))
  family = next(f[1:] for f in families if f[0])
  name = family[0].format(size, ph, h)
  return name if name in ARCHITECTURES and h == w and ph == pw else family[1]

