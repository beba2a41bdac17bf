"""The layers of the Transformer's blocks: norms, the MLP, multi-head attention and its
kernels (the einsum, ``jax.nn``'s fused 'xla' and 'cudnn', and 'auto''s choice between them for
this machine), with ``BlockOptions``, how every block computes. ``vit`` assembles the ViT from
them; their module and parameter names are the release's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.base import sharding
from vit_jax.models import posemb
from vit_jax.models.matmul import dot_general_for

Array = jax.Array
Dtype = Any

LN_EPSILON = 1e-6
# The MLP's activation, by timm's names: the tanh-approximate GELU (flax's nn.gelu, the releases'
# and big_vision's), the exact erf GELU (timm's and transformers' default), OpenAI CLIP's quick
# GELU, and SiLU (the gate of DINOv2-g's SwiGLU MLP).
ACTIVATIONS = {
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'gelu': functools.partial(nn.gelu, approximate=False),
    'quick_gelu': lambda x: x * nn.sigmoid(1.702 * x),
    'silu': nn.silu,
}

dense_init = nn.initializers.xavier_uniform()
bias_init = nn.initializers.normal(stddev=1e-6)


def norm_layer(kind: str, *, use_bias: bool = True, epsilon: float = LN_EPSILON,
               **kw: Any) -> nn.Module:
  """A 'layernorm', or an 'rmsnorm': LayerNorm without centering and bias (ViT-22B)."""
  if kind == 'rmsnorm':
    return nn.RMSNorm(epsilon=epsilon, **kw)
  return nn.LayerNorm(epsilon=epsilon, use_bias=use_bias, **kw)


@dataclasses.dataclass(frozen=True)
class BlockOptions:
  """How every block computes: ``VisionTransformer``'s fields of the same names (documented
  there), passed down as one value to the blocks, their attention and MLP, and the MAP head."""

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  attention_impl: str = 'auto'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  matmul_dtype: Dtype | None = None
  parallel_block: bool = False
  qk_norm: bool = False
  qkv_bias: bool = True
  norm: str = 'layernorm'
  norm_epsilon: float = LN_EPSILON
  activation: str = 'gelu_tanh'
  gated_mlp: bool = False
  layer_scale: float | None = None
  key_bias: bool = True
  mlp_norm: bool = False
  attention_norm: bool = False
  rope: str | None = None

  def norm_layer(self, name: str, **kw: Any) -> nn.Module:
    """The blocks' kind of norm, with their epsilon and dtypes."""
    return norm_layer(self.norm, epsilon=self.norm_epsilon, dtype=self.dtype,
                      param_dtype=self.param_dtype, name=name, **kw)


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> ``activation`` -> Dense(D), dropout after each.

  ``gated_mlp``: the first Dense gives 2 * mlp_dim units, and ``activation`` of the first half
  gates the second: Dense(D)(act(a) * b), SwiGLU with 'silu' (timm's ``SwiGLUPacked``: one
  packed matmul, as DINOv2-g has it). ``mlp_norm``: a norm on the hidden units before the
  second Dense, ``hidden_norm`` (NormFormer; EVA-02's ``scale_mlp``).
  """

  options: BlockOptions

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    o = self.options
    dense = lambda n: nn.Dense(n, dtype=o.dtype, param_dtype=o.param_dtype,
                               dot_general=dot_general_for(o.matmul_dtype),
                               kernel_init=dense_init, bias_init=bias_init)
    width = x.shape[-1]
    activation = ACTIVATIONS[o.activation]
    if o.gated_mlp:
      gate, x = jnp.split(dense(2 * o.mlp_dim)(x), 2, axis=-1)
      x = activation(gate) * x
    else:
      x = activation(dense(o.mlp_dim)(x))
    x = sharding.constrain(x, 'hidden')
    x = nn.Dropout(o.dropout_rate)(x, deterministic=deterministic)
    if o.mlp_norm:
      x = o.norm_layer('hidden_norm')(x)
    x = dense(width)(x)
    return nn.Dropout(o.dropout_rate)(x, deterministic=deterministic)


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention with the release's parameter layout.

  ``query``/``key``/``value`` kernels are (D, heads, head_dim), ``out`` is
  (heads, head_dim, D). ``options.attention_impl`` picks the kernel (the functions below):
  'einsum' (plain softmax attention; the only one that supports attention dropout and
  records the weights in the 'intermediates' collection), or ``jax.nn.dot_product_attention``
  with 'xla' or 'cudnn' (the fused flash kernel on NVIDIA GPUs); 'auto' (the default) is
  ``attention_for``'s choice for this machine. ``qk_norm`` normalises each head's queries
  and keys (ViT-22B; flax's ``normalize_qk`` names). ``key_bias=False``: no bias on the keys
  (EVA's attention). ``rope`` with ``positions`` (the patches' rotary coordinates,
  ``posemb.coordinates``; the patches are the last tokens): the patches' queries and keys are
  rotated (``posemb.apply_rope``). ``key_mask`` (batch, keys) bool: the keys that may be
  attended to (a patch sequence's padding is not), or (batch, queries, keys) per query;
  'xla' takes it as its mask, 'cudnn' computes a masked attention with the einsum.
  ``attention_norm``: a norm on the heads' joined outputs before ``out``, ``out_norm``
  (EVA-02 CLIP's ``scale_attn_inner``).
  """

  options: BlockOptions

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array, *, deterministic: bool,
               positions: Array | None = None, key_mask: Array | None = None) -> Array:
    o = self.options
    width = inputs_q.shape[-1]
    if width % o.num_heads:
      raise ValueError(f'width {width} is not divisible by num_heads={o.num_heads}.')
    head_dim = width // o.num_heads
    dot_general = dot_general_for(o.matmul_dtype)
    proj = lambda name, bias=o.qkv_bias: nn.DenseGeneral(
        (o.num_heads, head_dim), dtype=o.dtype, param_dtype=o.param_dtype,
        dot_general=dot_general, kernel_init=dense_init, use_bias=bias, name=name)
    q = proj('query')(inputs_q)
    k = proj('key', o.qkv_bias and o.key_bias)(inputs_kv)
    v = proj('value')(inputs_kv)
    q, k, v = (sharding.constrain(t, 'heads') for t in (q, k, v))
    if o.qk_norm:
      q, k = o.norm_layer('query_ln', use_bias=False)(q), o.norm_layer('key_ln', use_bias=False)(k)
    if o.rope and positions is not None:
      q, k = posemb.apply_rope(self, posemb.Rope.parse(o.rope), q, k, positions,
                               prefix=k.shape[1] - positions.shape[-2])

    implementation = o.attention_impl
    dropout = o.attention_dropout_rate
    if implementation == 'auto':
      implementation = attention_for(
          q.dtype, head_dim, dropout=bool(dropout) and not deterministic,
          recording=self.is_mutable_collection('intermediates'))
    if implementation == 'cudnn' and key_mask is not None:
      implementation = 'einsum'  # A mask of any pattern, on every backend.
    if implementation == 'einsum':
      x = einsum_attention(self, q, k, v, dot_general, dropout=dropout,
                           deterministic=deterministic, dtype=o.dtype, key_mask=key_mask)
    else:
      if dropout and not deterministic:
        raise ValueError('attention_dropout_rate > 0 needs attention_impl="einsum".')
      x = fused_attention(q, k, v, implementation, key_mask=key_mask)

    x = sharding.constrain(x, 'heads')
    if o.attention_norm:
      x = o.norm_layer('out_norm')(x.reshape(x.shape[:-2] + (-1,))).reshape(x.shape)
    return nn.DenseGeneral(width, axis=(-2, -1), dtype=o.dtype, param_dtype=o.param_dtype,
                           dot_general=dot_general, kernel_init=dense_init, name='out')(x)


def head_mask(key_mask: Array) -> Array:
  """A (batch, keys) or (batch, queries, keys) mask as (batch, heads, queries, keys) sees it."""
  return key_mask[:, None, None, :] if key_mask.ndim == 2 else key_mask[:, None]


def einsum_attention(module: nn.Module, q: Array, k: Array, v: Array, dot_general: Callable,
                     *, dropout: float, deterministic: bool, dtype: Dtype,
                     key_mask: Array | None = None) -> Array:
  """Softmax attention of (batch, tokens, heads, head_dim) inputs, in ``module``: the only
  kernel with attention dropout, and the one that records the weights (``module``'s
  'intermediates' collection, ``attention_weights``). ``key_mask`` (batch, keys) bool: the
  other keys get weight exactly 0 (and no gradient); (batch, queries, keys): per query."""
  # Heads next to the batch, (b, h, tokens, d): the batched matmuls' preferred layout
  # on XLA:CPU (the two products 1.3x and 2x faster than in (b, tokens, h, d)); the TPU
  # compiler lays them out itself (the same step time either way, cost model).
  head_dim = q.shape[-1]
  q, k, v = (t.swapaxes(1, 2) for t in (q / jnp.sqrt(head_dim).astype(q.dtype), k, v))
  # Batched over (b, h): q k^T -> (b, h, q, k), then weights v -> (b, h, q, d). Both
  # products accumulate in float32 and return `dtype`; the softmax computes in float32.
  # In bfloat16, the (b, h, q, k) tensors that are stored and read several times are
  # thus half the bytes (the TPU step: 9% faster, 19% less HBM; results/RESULTS.md).
  logits = dot_general(q, k, (((3,), (3,)), ((0, 1), (0, 1))), preferred_element_type=dtype)
  logits = logits.astype(jnp.float32)
  if key_mask is not None:
    logits = jnp.where(head_mask(key_mask), logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  module.sow('intermediates', 'attention_weights', weights)
  weights = nn.Dropout(dropout, broadcast_dims=())(
      weights, deterministic=deterministic).astype(dtype)
  x = dot_general(weights, v, (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=dtype)
  return x.swapaxes(1, 2)


@functools.cache
def cudnn_attention_available() -> bool:
  """Whether jax's default devices are NVIDIA GPUs that cuDNN's fused attention runs on
  (compute capability 8.0 or later: A100, H100, H200, ...)."""
  if jax.default_backend() != 'gpu':
    return False
  capability = getattr(jax.devices()[0], 'compute_capability', None)
  try:
    return float(capability) >= 8.0
  except (TypeError, ValueError):  # ROCm GPUs, or jax without the attribute.
    return False


def attention_for(dtype: Dtype, head_dim: int, *, dropout: bool, recording: bool,
                  cudnn: bool | None = None) -> str:
  """'auto' attention: cuDNN's fused kernel where it applies (``cudnn``: by default
  ``cudnn_attention_available()``; bfloat16 or float16 inputs, head_dim a multiple of 8 up
  to 256, no attention dropout, weights not recorded), else the einsum. On an H200 the
  fused kernel makes ViT-B/16's train step 1.20x faster at 224 px and 1.56x at 384 px
  (results/RESULTS.md); TPUs and CPUs keep the einsum."""
  if cudnn is None:
    cudnn = cudnn_attention_available()
  fits = (jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0
          and head_dim <= 256)
  return 'cudnn' if cudnn and fits and not dropout and not recording else 'einsum'


def fused_attention(q: Array, k: Array, v: Array, implementation: str,
                    even_lengths: bool | None = None, key_mask: Array | None = None) -> Array:
  """``jax.nn.dot_product_attention`` of (batch, tokens, heads, head_dim) inputs;
  ``key_mask`` (batch, keys) bool: the keys that may be attended to ('xla' only).

  ``even_lengths`` (by default for 'cudnn'): odd token counts (ViT's: 196 patches + the
  class token; the last block's single query) are padded by one token, masked by their
  true lengths and cut off again: jax's cuDNN training path (0.10-0.11) refuses odd
  lengths, even without a bias.
  """
  (b, t), s = q.shape[:2], k.shape[1]
  if key_mask is not None:
    if implementation != 'xla':
      raise ValueError(f'a key mask needs attention_impl "xla" or "einsum", not '
                       f'{implementation!r}.')
    return jax.nn.dot_product_attention(q, k, v, mask=head_mask(key_mask),
                                        implementation=implementation)
  if even_lengths is None:
    even_lengths = implementation == 'cudnn'
  if not even_lengths or not (t % 2 or s % 2):
    return jax.nn.dot_product_attention(q, k, v, implementation=implementation)
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n % 2), (0, 0), (0, 0)))
  x = jax.nn.dot_product_attention(
      pad(q, t), pad(k, s), pad(v, s), query_seq_lengths=jnp.full((b,), t, jnp.int32),
      key_value_seq_lengths=jnp.full((b,), s, jnp.int32), implementation=implementation)
  return x[:, :t]
