"""The backbone fixtures' names, converted by hand, against vit_jax's model options.

Run in vit_jax's venv from the repository root (numpy, safetensors and vit_jax; no torch):

    python tests/data/hub/check_backbone_conversions.py     # "all 14 checks passed"

Each folder of BACKBONES.md is read with `safetensors.numpy`, its tensors renamed into
vit_jax's layout by the tables below (torch Linear weights (out, in) transposed; fused
projections split; (out, in) into (in, heads, head_dim)), and vit_jax's
`VisionTransformer`, built with the options that fixture needs, must give the library's
output (`backbone_logits.npz`) within 1e-4 relative. A reference for the loaders' name tables,
and the evidence for the options' math; not a loader (no config.json is read).
"""

import os
import sys

import jax
import numpy as np
from safetensors.numpy import load_file

from vit_jax.models import get_model

HERE = os.path.dirname(os.path.abspath(__file__))
HEADS = 2
TINY = dict(hidden_size=32, num_heads=HEADS, num_layers=2, patch_size=8, image_size=32)


def heads(w, b):
  """A torch Linear (out, in) for queries, keys or values -> (in, heads, head_dim)."""
  return {'kernel': w.T.reshape(w.shape[1], HEADS, -1), 'bias': b.reshape(HEADS, -1)}


def attention(q, k, v, out):
  """The (weight, bias) pairs of the q, k, v and output projections -> vit_jax's names."""
  return {'query': heads(*q), 'key': heads(*k), 'value': heads(*v),
          'out': {'kernel': out[0].T.reshape(HEADS, -1, out[0].shape[0]), 'bias': out[1]}}


class Tensors(dict):
  """A safetensors file, with torch's module names read as vit_jax's."""

  def pair(self, name):
    return self[name + '.weight'], self[name + '.bias']

  def norm(self, name):
    return {'scale': self[name + '.weight'], 'bias': self[name + '.bias']}

  def dense(self, name):
    return {'kernel': self[name + '.weight'].T, 'bias': self[name + '.bias']}

  def conv(self, name):
    bias = self.get(name + '.bias', np.zeros(self[name + '.weight'].shape[0], np.float32))
    return {'kernel': self[name + '.weight'].transpose(2, 3, 1, 0), 'bias': bias}

  def split(self, name, parts, weight='.weight', bias='.bias'):
    """A fused projection's (weight, bias) pairs, in ``parts`` along the outputs."""
    return list(zip(np.split(self[name + weight], parts), np.split(self[name + bias], parts),
                    strict=True))

  def block(self, prefix, attn, names, extra=()):
    """One encoder block; ``names``: norm1, norm2, fc1, fc2; ``extra``: (ours, theirs)."""
    n1, n2, f1, f2 = names
    return {'LayerNorm_0': self.norm(prefix + n1), 'LayerNorm_2': self.norm(prefix + n2),
            'MultiHeadDotProductAttention_1': attention(*attn),
            'MlpBlock_3': {'Dense_0': self.dense(prefix + f1), 'Dense_1': self.dense(prefix + f2)},
            **{ours: self[prefix + theirs] for ours, theirs in extra}}

  def map_head(self, probe, q, k, v, out, norm, fc1, fc2):
    return {'probe': self[probe], 'LayerNorm_0': self.norm(norm),
            'MultiHeadDotProductAttention_0': attention(q, k, v, out),
            'MlpBlock_0': {'Dense_0': self.dense(fc1), 'Dense_1': self.dense(fc2)}}


def timm(t):
  """timm's VisionTransformer (and VisionTransformerDistilled)."""
  p = {'embedding': t.conv('patch_embed.proj'), 'Transformer': {
      'posembed_input': {'pos_embedding': t['pos_embed']}, 'encoder_norm': t.norm('norm')}}
  for ours, theirs in (('cls', 'cls_token'), ('dist', 'dist_token')):
    if theirs in t:
      p[ours] = t[theirs]
  if 'norm_pre.weight' in t:
    p['Transformer']['pre_norm'] = t.norm('norm_pre')
  for i in range(2):
    b = f'blocks.{i}.'
    scale = (('ls1', 'ls1.gamma'), ('ls2', 'ls2.gamma')) if b + 'ls1.gamma' in t else ()
    p['Transformer'][f'encoderblock_{i}'] = t.block(
        b, (*t.split(b + 'attn.qkv', 3), t.pair(b + 'attn.proj')),
        ('norm1', 'norm2', 'mlp.fc1', 'mlp.fc2'), scale)
  for name in ('head', 'head_dist'):
    if name + '.weight' in t:
      p[name] = t.dense(name)
  if 'attn_pool.latent' in t:
    p['MAPHead_0'] = t.map_head('attn_pool.latent', t.pair('attn_pool.q'),
                                *t.split('attn_pool.kv', 2), t.pair('attn_pool.proj'),
                                'attn_pool.norm', 'attn_pool.mlp.fc1', 'attn_pool.mlp.fc2')
  return p


CLIP_BLOCK = ('layer_norm1', 'layer_norm2', 'mlp.fc1', 'mlp.fc2')


def clip_attention(t, b):
  return [t.pair(b + f'self_attn.{n}_proj') for n in ('q', 'k', 'v', 'out')]


def hf_clip(t):
  """CLIPVisionModel and SiglipVisionModel (the same encoder layer)."""
  pe = t['embeddings.position_embedding.weight'][None]
  p = {'embedding': t.conv('embeddings.patch_embedding'), 'Transformer': {
      'posembed_input': {'pos_embedding': pe}, 'encoder_norm': t.norm('post_layernorm'),
      **{f'encoderblock_{i}': t.block(f'encoder.layers.{i}.',
                                      clip_attention(t, f'encoder.layers.{i}.'), CLIP_BLOCK)
         for i in range(2)}}}
  if 'pre_layrnorm.weight' in t:
    p['Transformer']['pre_norm'] = t.norm('pre_layrnorm')
  if 'embeddings.class_embedding' in t:
    p['cls'] = t['embeddings.class_embedding'][None, None]
  if 'head.probe' in t:
    p['MAPHead_0'] = t.map_head(
        'head.probe', *t.split('head.attention.in_proj', 3, '_weight', '_bias'),
        t.pair('head.attention.out_proj'), 'head.layernorm', 'head.mlp.fc1', 'head.mlp.fc2')
  return p


def hf_vit_like(t, prefix, mlp, extra):
  """Dinov2Model and DeiT: ViTModel's names (``prefix``: 'deit.' or '')."""
  e = prefix + 'embeddings.'
  p = {'embedding': t.conv(e + 'patch_embeddings.projection'), 'cls': t[e + 'cls_token'],
       'Transformer': {'posembed_input': {'pos_embedding': t[e + 'position_embeddings']},
                       'encoder_norm': t.norm(prefix + 'layernorm')}}
  if e + 'distillation_token' in t:
    p['dist'] = t[e + 'distillation_token']
  for i in range(2):
    b = f'{prefix}encoder.layer.{i}.'
    attn = [t.pair(b + f'attention.attention.{n}') for n in ('query', 'key', 'value')]
    p['Transformer'][f'encoderblock_{i}'] = t.block(
        b, (*attn, t.pair(b + 'attention.output.dense')), mlp, extra)
  return p


def hf_dinov2(t):
  mlp = 'weights_in', 'weights_out'
  mlp = mlp if 'encoder.layer.0.mlp.weights_in.weight' in t else ('fc1', 'fc2')
  return hf_vit_like(t, '', ('norm1', 'norm2', *(f'mlp.{n}' for n in mlp)),
                     (('ls1', 'layer_scale1.lambda1'), ('ls2', 'layer_scale2.lambda1')))


def hf_deit(t):
  p = hf_vit_like(t, 'deit.', ('layernorm_before', 'layernorm_after', 'intermediate.dense',
                               'output.dense'), ())
  return {**p, 'head': t.dense('cls_classifier'), 'head_dist': t.dense('distillation_classifier')}


# fixture -> (convert, vit_jax options, reference output key)
CHECKS = {
    'timm_clip': (timm, dict(mlp_dim=128, pre_norm=True, norm_epsilon=1e-5, activation='gelu',
                             num_classes=5), 'logits'),
    'timm_clip_quickgelu': (timm, dict(mlp_dim=128, pre_norm=True, norm_epsilon=1e-5,
                                       activation='quick_gelu'), 'pre_logits'),
    'timm_siglip_map': (timm, dict(mlp_dim=128, pool='map', class_token=False,
                                   activation='gelu', num_classes=5), 'logits'),
    'timm_dinov2_swiglu': (timm, dict(mlp_dim=85, gated_mlp=True, activation='silu',
                                      layer_scale=1.), 'pre_logits'),
    'timm_deit_distilled': (timm, dict(mlp_dim=128, distill_token=True, activation='gelu',
                                       num_classes=5), 'logits'),
    'hf_clip_vision': (hf_clip, dict(mlp_dim=64, pre_norm=True, norm_epsilon=1e-5,
                                     activation='quick_gelu'), 'pooler_output'),
    'hf_siglip_vision': (hf_clip, dict(mlp_dim=64, pool='map', class_token=False),
                         'pooler_output'),
    'hf_dinov2': (hf_dinov2, dict(mlp_dim=64, layer_scale=1., activation='gelu'),
                  'pooler_output'),
    'hf_dinov2_swiglu': (hf_dinov2, dict(mlp_dim=88, layer_scale=1., gated_mlp=True,
                                         activation='silu'), 'pooler_output'),
    'hf_deit_distilled': (hf_deit, dict(mlp_dim=64, distill_token=True, activation='gelu',
                                        norm_epsilon=1e-12, num_classes=5), 'logits'),
}


def main():
  ref = np.load(os.path.join(HERE, 'backbone_logits.npz'))
  failed, checks = [], 0
  for name, (convert, options, key) in CHECKS.items():
    params = convert(Tensors(load_file(os.path.join(HERE, name, 'model.safetensors'))))
    model = get_model('ti16', **TINY, **{'num_classes': None, **options})
    outputs = [(key, model)]
    if model.num_classes:  # The features too: timm's pre_logits.
      outputs.append(('pre_logits', model.clone(num_classes=None)))
    for k, m in outputs:
      got = np.asarray(jax.jit(m.apply)({'params': params}, ref['images']))
      want = ref[f'{name}/{k}']
      rel = float(np.abs(got - want).max() / np.abs(want).max())
      checks += 1
      print(f'{name}/{k}: max relative difference {rel:.1e}')
      if rel > 1e-4:
        failed.append(f'{name}/{k}')
  if failed:
    sys.exit(f'FAILED: {failed}')
  print(f'all {checks} checks passed')


if __name__ == '__main__':
  main()
