"""The attention kernels of ``vit.MultiHeadAttention``: the einsum, ``jax.nn``'s fused
ones ('xla', 'cudnn'), and 'auto''s choice between them for this machine."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Dtype = Any


def einsum_attention(module: nn.Module, q: Array, k: Array, v: Array, dot_general: Callable,
                     *, dropout: float, deterministic: bool, dtype: Dtype) -> Array:
  """Softmax attention of (batch, tokens, heads, head_dim) inputs, in ``module``: the only
  kernel with attention dropout, and the one that records the weights (``module``'s
  'intermediates' collection, ``attention_weights``)."""
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
  weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
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
                    even_lengths: bool | None = None) -> Array:
  """``jax.nn.dot_product_attention`` of (batch, tokens, heads, head_dim) inputs.

  ``even_lengths`` (by default for 'cudnn'): odd token counts (ViT's: 196 patches + the
  class token; the last block's single query) are padded by one token, masked by their
  true lengths and cut off again: jax's cuDNN training path (0.10-0.11) refuses odd
  lengths, even without a bias.
  """
  (b, t), s = q.shape[:2], k.shape[1]
  if even_lengths is None:
    even_lengths = implementation == 'cudnn'
  if not even_lengths or not (t % 2 or s % 2):
    return jax.nn.dot_product_attention(q, k, v, implementation=implementation)
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n % 2), (0, 0), (0, 0)))
  x = jax.nn.dot_product_attention(
      pad(q, t), pad(k, s), pad(v, s), query_seq_lengths=jnp.full((b,), t, jnp.int32),
      key_value_seq_lengths=jnp.full((b,), s, jnp.int32), implementation=implementation)
  return x[:, :t]
