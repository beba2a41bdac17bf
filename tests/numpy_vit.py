"""An independent NumPy ViT that reads the flat release layout, for cross-checks.

Written from the paper's equations and the release file layout only (float64,
no Flax): it makes release files of its own and computes their logits, so that
vit_jax's loading and exporting can be checked against something it does not share
code with. Beside the release's ViT it reads the arrays of the backbones' options where
they are present: ``Transformer/pre_norm`` (CLIP), a gated MLP (``Dense_0`` twice as wide
as ``Dense_1`` is deep: SwiGLU), a distillation token ``dist`` with ``head_dist`` (DeiT).
"""

from __future__ import annotations

import math
import re

import numpy as np


def random_release_params(rng: np.random.Generator, *, width: int, depth: int, heads: int,
                          mlp: int, patch: int, grid: tuple[int, int], classes: int,
                          representation: int | None = None, vit22b: bool = False,
                          pre_norm: bool = False, gated: bool = False,
                          distill: bool = False) -> dict[str, np.ndarray]:
  """A flat release-layout dict of random float32 arrays.

  ``vit22b``: ViT-22B's blocks (Dehghani et al., 2023, section 2): attention and MLP in
  parallel on one norm; norms without centering and bias; queries and keys normalised
  per head (``query_ln``, ``key_ln``); no query/key/value biases. ``pre_norm``, ``gated``,
  ``distill``: the backbones' options (the module docstring).
  """
  hd = width // heads

  def normal(*shape, scale=None):
    scale = scale if scale is not None else 1 / np.sqrt(shape[0] if len(shape) > 1 else 1)
    return (rng.standard_normal(shape) * scale).astype(np.float32)

  p = {
      'embedding/kernel': normal(patch, patch, 3, width, scale=1 / np.sqrt(patch * patch * 3)),
      'embedding/bias': normal(width, scale=0.1),
      'cls': normal(1, 1, width, scale=0.5),
      'Transformer/posembed_input/pos_embedding': normal(
          1, 1 + distill + grid[0] * grid[1], width, scale=0.5),
      'Transformer/encoder_norm/scale': 1 + normal(width, scale=0.1),
      'Transformer/encoder_norm/bias': normal(width, scale=0.1),
  }
  for i in range(depth):
    b = f'Transformer/encoderblock_{i}/'
    for ln in ('LayerNorm_0',) if vit22b else ('LayerNorm_0', 'LayerNorm_2'):
      p[b + ln + '/scale'] = 1 + normal(width, scale=0.1)
      p[b + ln + '/bias'] = normal(width, scale=0.1)
    att = b + 'MultiHeadDotProductAttention_1/'
    for name in ('query', 'key', 'value'):
      p[att + name + '/kernel'] = normal(width, heads, hd)
      p[att + name + '/bias'] = normal(heads, hd, scale=0.1)
    if vit22b:
      for name in ('query_ln', 'key_ln'):
        p[att + name + '/scale'] = 1 + normal(hd, scale=0.1)
    p[att + 'out/kernel'] = normal(heads, hd, width, scale=1 / np.sqrt(width))
    p[att + 'out/bias'] = normal(width, scale=0.1)
    p[b + 'MlpBlock_3/Dense_0/kernel'] = normal(width, mlp * (1 + gated))
    p[b + 'MlpBlock_3/Dense_0/bias'] = normal(mlp * (1 + gated), scale=0.1)
    p[b + 'MlpBlock_3/Dense_1/kernel'] = normal(mlp, width)
    p[b + 'MlpBlock_3/Dense_1/bias'] = normal(width, scale=0.1)
  out = width
  if representation:
    p['pre_logits/kernel'] = normal(width, representation)
    p['pre_logits/bias'] = normal(representation, scale=0.1)
    out = representation
  p['head/kernel'] = normal(out, classes)
  p['head/bias'] = normal(classes, scale=0.1)
  if pre_norm:
    p['Transformer/pre_norm/scale'] = 1 + normal(width, scale=0.1)
    p['Transformer/pre_norm/bias'] = normal(width, scale=0.1)
  if distill:
    p['dist'] = normal(1, 1, width, scale=0.5)
    p['head_dist/kernel'] = normal(out, classes)
    p['head_dist/bias'] = normal(classes, scale=0.1)
  if vit22b:
    p = {k: v for k, v in p.items()
         if not ((k.endswith('/bias') and ('norm' in k or 'LayerNorm' in k))
                 or re.search(r'/(query|key|value)/bias$', k))}
  return p


def _layer_norm(x, scale, bias):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * scale + bias


def _norm(x, p, name):
  """LayerNorm; where the file has no bias, ViT-22B's norm: no centering, no bias."""
  if name + '/bias' not in p:
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * p[name + '/scale']
  return _layer_norm(x, p[name + '/scale'], p[name + '/bias'])


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS = {
    'gelu_tanh': _gelu_tanh,
    'gelu': lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2))),
    'quick_gelu': lambda x: x / (1 + np.exp(-1.702 * x)),
    'silu': lambda x: x / (1 + np.exp(-x)),
}


def mlp(x: np.ndarray, w0, b0, w1, b1, activation: str = 'gelu_tanh') -> np.ndarray:
  """Dense, activation, Dense; gated where ``w0`` has twice the units ``w1`` takes: the
  activation of the first half times the second half (SwiGLU with 'silu')."""
  h = x @ w0 + b0
  if h.shape[-1] == 2 * np.shape(w1)[0]:
    gate, h = np.split(h, 2, axis=-1)
    h = ACTIVATIONS[activation](gate) * h
  else:
    h = ACTIVATIONS[activation](h)
  return h @ w1 + b1


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def forward(params: dict[str, np.ndarray], images: np.ndarray,
            activation: str = 'gelu_tanh') -> np.ndarray:
  """Logits of a class-token ViT given flat release-layout params and NHWC images."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  kernel = p['embedding/kernel']
  ph, pw, c, width = kernel.shape
  b, h, w, _ = images.shape
  x = images.astype(np.float64).reshape(b, h // ph, ph, w // pw, pw, c)
  x = np.einsum('byixjc,ijcd->byxd', x, kernel) + p['embedding/bias']
  x = x.reshape(b, -1, width)
  prefix = [np.broadcast_to(p[t], (b, 1, width)) for t in ('cls', 'dist') if t in p]
  x = np.concatenate(prefix + [x], axis=1)
  x = x + p['Transformer/posembed_input/pos_embedding']
  if 'Transformer/pre_norm/scale' in p:
    x = _norm(x, p, 'Transformer/pre_norm')

  depth = len({k.split('/')[1] for k in p if k.startswith('Transformer/encoderblock_')})
  for i in range(depth):
    blk = f'Transformer/encoderblock_{i}/'
    g = lambda name, blk=blk: p.get(blk + name, 0.)  # 0 for a bias the file does not have.
    y = _norm(x, p, blk + 'LayerNorm_0')
    att = 'MultiHeadDotProductAttention_1/'
    q, k, v = (np.einsum('bnd,dhk->bnhk', y, g(att + n + '/kernel')) + g(att + n + '/bias')
               for n in ('query', 'key', 'value'))
    if blk + att + 'query_ln/scale' in p:  # Each head's queries and keys normalised.
      q, k = _norm(q, p, blk + att + 'query_ln'), _norm(k, p, blk + att + 'key_ln')
    logits = np.einsum('bqhk,bshk->bhqs', q, k) / np.sqrt(q.shape[-1])
    o = np.einsum('bhqs,bshk->bqhk', _softmax(logits), v)
    attention = np.einsum('bqhk,hkd->bqd', o, g(att + 'out/kernel')) + g(att + 'out/bias')
    x = x + attention
    if blk + 'LayerNorm_2/scale' in p:  # Else parallel: the MLP reads the attention's input.
      y = _norm(x, p, blk + 'LayerNorm_2')
    x = x + mlp(y, *(g(f'MlpBlock_3/Dense_{j}/{n}') for j in (0, 1) for n in ('kernel', 'bias')),
                activation)

  x = _norm(x, p, 'Transformer/encoder_norm')
  x = x[:, :2] if 'dist' in p else x[:, 0]
  if 'pre_logits/kernel' in p:
    x = np.tanh(x @ p['pre_logits/kernel'] + p['pre_logits/bias'])
  if 'dist' in p:  # The two heads' mean.
    return (x[:, 0] @ p['head/kernel'] + p['head/bias']
            + x[:, 1] @ p['head_dist/kernel'] + p['head_dist/bias']) / 2
  return x @ p['head/kernel'] + p['head/bias']
