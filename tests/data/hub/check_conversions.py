"""Checks README.md's key tables: converts fixtures to the release layout and runs vit_jax's ViT.

Not a test and not a loader: a worked example of the conversions that README.md tables, for
whoever writes the loader. Run from the repository root with jax, flax, numpy, safetensors and
tensorstore importable and this repository on the path (e.g. /work/bv-venv plus
`pip install safetensors`):

    PYTHONPATH=. python tests/data/hub/check_conversions.py [FIXTURE_DIR]

Reads only with numpy, safetensors.numpy and tensorstore. For each fixture that the release
ViT can express, it prints the largest |logit difference| against the reference library's
logits: with the source's own GELU and LayerNorm epsilon (vit_jax's `nn.gelu` and LN_EPSILON
swapped in this process only), then with vit_jax's as they are (tanh GELU, 1e-6).
Written against vit_jax at commit b219c86 (`vit_jax.models.vit`, `vit_jax.checkpoints.release`,
since split into `vit_jax.checkpoints.formats`).
"""

import functools
import json
import os
import sys

import flax.linen as nn
import jax
import numpy as np
import tensorstore as ts
from safetensors.numpy import load_file

import vit_jax.models.vit as vit_module
from vit_jax.checkpoints.formats import big_vision, layout

EXACT_GELU = functools.partial(jax.nn.gelu, approximate=False)
TANH_GELU = nn.gelu
RELEASE_ATTN = 'MultiHeadDotProductAttention_1'


def block_ids(keys, prefix):
  return sorted({int(k[len(prefix):].split('.')[0]) for k in keys if k.startswith(prefix)})


def from_timm(sd, num_heads, grid):
  """timm VisionTransformer state dict -> flat release layout."""
  d = sd['patch_embed.proj.weight'].shape[0]
  dh = d // num_heads
  p = {'embedding/kernel': sd['patch_embed.proj.weight'].transpose(2, 3, 1, 0),
       'embedding/bias': sd['patch_embed.proj.bias']}
  pe = sd['pos_embed']
  if 'cls_token' in sd:
    p['cls'] = sd['cls_token']
    if pe.shape[1] == grid[0] * grid[1]:  # no_embed_class: a zero row for the class token
      pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], 1)
  p['Transformer/posembed_input/pos_embedding'] = pe
  ones = np.ones(d, np.float32)
  for i in block_ids(sd, 'blocks.'):
    b, o = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
    g1, g2 = sd.get(b + 'ls1.gamma', ones), sd.get(b + 'ls2.gamma', ones)  # layer scale
    p[o + 'LayerNorm_0/scale'], p[o + 'LayerNorm_0/bias'] = sd[b + 'norm1.weight'], sd[
        b + 'norm1.bias']
    w = sd[b + 'attn.qkv.weight'].reshape(3, num_heads, dh, d)
    bias = sd[b + 'attn.qkv.bias'].reshape(3, num_heads, dh)
    for j, name in enumerate(('query', 'key', 'value')):
      p[o + f'{RELEASE_ATTN}/{name}/kernel'] = w[j].transpose(2, 0, 1)
      p[o + f'{RELEASE_ATTN}/{name}/bias'] = bias[j]
    p[o + f'{RELEASE_ATTN}/out/kernel'] = (sd[b + 'attn.proj.weight'].T * g1).reshape(
        num_heads, dh, d)
    p[o + f'{RELEASE_ATTN}/out/bias'] = sd[b + 'attn.proj.bias'] * g1
    p[o + 'LayerNorm_2/scale'], p[o + 'LayerNorm_2/bias'] = sd[b + 'norm2.weight'], sd[
        b + 'norm2.bias']
    p[o + 'MlpBlock_3/Dense_0/kernel'] = sd[b + 'mlp.fc1.weight'].T
    p[o + 'MlpBlock_3/Dense_0/bias'] = sd[b + 'mlp.fc1.bias']
    p[o + 'MlpBlock_3/Dense_1/kernel'] = sd[b + 'mlp.fc2.weight'].T * g2
    p[o + 'MlpBlock_3/Dense_1/bias'] = sd[b + 'mlp.fc2.bias'] * g2
  p['Transformer/encoder_norm/scale'] = sd['norm.weight']
  p['Transformer/encoder_norm/bias'] = sd['norm.bias']
  p['head/kernel'], p['head/bias'] = sd['head.weight'].T, sd['head.bias']
  return p


def from_transformers(sd, num_heads):
  """transformers ViTModel / ViTForImageClassification state dict -> flat release layout."""
  pre = 'vit.' if any(k.startswith('vit.') for k in sd) else ''
  g = lambda k: sd[pre + k]
  d = g('embeddings.patch_embeddings.projection.weight').shape[0]
  dh = d // num_heads
  p = {'embedding/kernel': g('embeddings.patch_embeddings.projection.weight').transpose(2, 3, 1, 0),
       'embedding/bias': g('embeddings.patch_embeddings.projection.bias'),
       'cls': g('embeddings.cls_token'),
       'Transformer/posembed_input/pos_embedding': g('embeddings.position_embeddings'),
       'Transformer/encoder_norm/scale': g('layernorm.weight'),
       'Transformer/encoder_norm/bias': g('layernorm.bias')}
  for i in block_ids(sd, pre + 'encoder.layer.'):
    b, o = f'encoder.layer.{i}.', f'Transformer/encoderblock_{i}/'
    p[o + 'LayerNorm_0/scale'] = g(b + 'layernorm_before.weight')
    p[o + 'LayerNorm_0/bias'] = g(b + 'layernorm_before.bias')
    for name in ('query', 'key', 'value'):
      w, bias = (g(b + f'attention.attention.{name}.{t}') for t in ('weight', 'bias'))
      p[o + f'{RELEASE_ATTN}/{name}/kernel'] = w.T.reshape(d, num_heads, dh)
      p[o + f'{RELEASE_ATTN}/{name}/bias'] = bias.reshape(num_heads, dh)
    p[o + f'{RELEASE_ATTN}/out/kernel'] = g(b + 'attention.output.dense.weight').T.reshape(
        num_heads, dh, d)
    p[o + f'{RELEASE_ATTN}/out/bias'] = g(b + 'attention.output.dense.bias')
    p[o + 'LayerNorm_2/scale'] = g(b + 'layernorm_after.weight')
    p[o + 'LayerNorm_2/bias'] = g(b + 'layernorm_after.bias')
    p[o + 'MlpBlock_3/Dense_0/kernel'] = g(b + 'intermediate.dense.weight').T
    p[o + 'MlpBlock_3/Dense_0/bias'] = g(b + 'intermediate.dense.bias')
    p[o + 'MlpBlock_3/Dense_1/kernel'] = g(b + 'output.dense.weight').T
    p[o + 'MlpBlock_3/Dense_1/bias'] = g(b + 'output.dense.bias')
  if 'classifier.weight' in sd:
    p['head/kernel'], p['head/bias'] = sd['classifier.weight'].T, sd['classifier.bias']
  if 'pooler.dense.weight' in sd:  # Dense + tanh on the class token = the release's pre_logits
    p['pre_logits/kernel'], p['pre_logits/bias'] = sd['pooler.dense.weight'].T, sd[
        'pooler.dense.bias']
  return p


def read_tensorstore_checkpoint(workdir):
  """big_vision's `<workdir>/checkpoint.bv-LAST` -> {'params/...': array, 'opt/...': ...}."""
  with open(os.path.join(workdir, 'checkpoint.bv-LAST')) as f:
    folder = os.path.join(workdir, 'checkpoint.bv-' + f.read().strip())
  out = {}
  for entry in os.listdir(folder):
    spec = {'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': os.path.join(folder, entry)}}
    out[entry.replace('~', '/')] = ts.open(spec).result().read().result()
  return out


def logits(flat, images, gelu=TANH_GELU, eps=1e-6, **kw):
  nn.gelu, vit_module.LN_EPSILON = gelu, eps  # MlpBlock and norm_layer look them up per call
  try:
    model = vit_module.VisionTransformer(attention_impl='einsum', num_layers=2, num_heads=2, **kw)
    return np.asarray(model.apply({'params': layout.unflatten(flat)}, images))
  finally:
    nn.gelu, vit_module.LN_EPSILON = TANH_GELU, 1e-6


def report(name, got, want, note):
  print(f'{name:18s} max |diff| {np.abs(got - want).max():.1e}  {note}')


def main(fix):
  ref = np.load(os.path.join(fix, 'logits.npz'))
  for name, pool in (('timm_augreg', 'token'), ('timm_deit3', 'token'),
                     ('timm_gap_nofcnorm', 'gap')):
    with open(os.path.join(fix, name, 'config.json')) as f:
      patch = json.load(f)['model_args']['patch_size']
    images = ref[str(ref[f'{name}/input'])]
    grid = (images.shape[1] // patch, images.shape[2] // patch)
    flat = from_timm(load_file(os.path.join(fix, name, 'model.safetensors')), 2, grid)
    kw = dict(num_classes=5, patch_size=patch, hidden_size=32, image_size=images.shape[1:3],
              pool=pool, mlp_dim=flat['Transformer/encoderblock_0/MlpBlock_3/Dense_0/bias'].size)
    want = ref[f'{name}/logits']
    report(name, logits(flat, images, EXACT_GELU, 1e-6, **kw), want, 'exact GELU, eps 1e-6 (timm)')
    report(name, logits(flat, images, **kw), want, 'vit_jax as it is')
  for name, gelu, eps in (('hf_vit_cls', EXACT_GELU, 1e-12), ('hf_vit_cls_tanh', TANH_GELU, 1e-6)):
    flat = from_transformers(load_file(os.path.join(fix, name, 'model.safetensors')), 2)
    kw = dict(num_classes=5, patch_size=8, hidden_size=32, mlp_dim=64, image_size=32)
    want = ref[f'{name}/logits']
    report(name, logits(flat, ref['images'], gelu, eps, **kw), want, f'its GELU, eps {eps}')
    report(name, logits(flat, ref['images'], **kw), want, 'vit_jax as it is')
  flat = from_transformers(load_file(os.path.join(fix, 'hf_vit_model', 'model.safetensors')), 2)
  kw = dict(num_classes=0, patch_size=4, hidden_size=32, mlp_dim=64, image_size=32,
            representation_size=32)
  report('hf_vit_model', logits(flat, ref['images'], EXACT_GELU, 1e-12, **kw),
         ref['hf_vit_model/pooler_output'], 'pooler_output = pre_logits features, its GELU/eps')

  bv_ref = np.load(os.path.join(fix, 'bv_logits.npz'))
  for name, pool, rep in (('bv_tok', 'token', 8), ('bv_gap_scan', 'gap', None)):
    flat = read_tensorstore_checkpoint(os.path.join(fix, name))
    # big_vision's names and posemb -> the release layout: what load_npz does for .npz files.
    params = {k: v for k, v in flat.items() if k.startswith('params/')}
    params = big_vision.canonical(params, name)  # a private helper of vit_jax, read-only use
    kw = dict(num_classes=5, patch_size=4, hidden_size=16, mlp_dim=32, image_size=(16, 24),
              pool=pool, representation_size=rep)
    report(name, logits(params, bv_ref['images'], **kw), bv_ref[f'{name}/logits'],
           'vit_jax as it is (tanh GELU, 1e-6: big_vision\'s own)')


if __name__ == '__main__':
  jax.config.update('jax_platforms', 'cpu')
  main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
