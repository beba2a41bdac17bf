"""The BiT ResNet stem of the hybrid models (Kolesnikov et al., 2020).

Weight-standardised convolutions and GroupNorm, bottleneck units. Names follow
the release files: ``conv_root``, ``gn_root``, ``block{i}/unit{j}/{conv,gn}{1,2,3}``
and ``conv_proj``/``gn_proj`` where a unit changes shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Dtype = Any


class StdConv(nn.Conv):
  """A convolution whose kernel is standardised per output channel before use.

  The stored kernel is the raw one (as in the release files); the standardisation
  (w - mean) / (std + 1e-5) over (H, W, in) is recomputed at every call.
  """

  def param(self, name: str, init_fn: Any, *init_args: Any, **init_kwargs: Any) -> Any:
    value = super().param(name, init_fn, *init_args, **init_kwargs)
    if name != 'kernel':
      return value
    mean = jnp.mean(value, axis=(0, 1, 2), keepdims=True)
    std = jnp.std(value, axis=(0, 1, 2), keepdims=True)
    return (value - mean) / (std + 1e-5)


class BottleneckUnit(nn.Module):
  """1x1 -> 3x3 (strided) -> 1x1 (x4 channels) with a projected shortcut if needed."""

  features: int
  strides: int = 1
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kw = dict(use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
    gn = lambda name, **k: nn.GroupNorm(name=name, dtype=self.dtype,
                                        param_dtype=self.param_dtype, **k)
    out = self.features * 4
    residual = x
    if x.shape[-1] != out or self.strides != 1:
      residual = StdConv(out, (1, 1), self.strides, name='conv_proj', **kw)(x)
      residual = gn('gn_proj')(residual)

    y = nn.relu(gn('gn1')(StdConv(self.features, (1, 1), name='conv1', **kw)(x)))
    y = StdConv(self.features, (3, 3), self.strides, name='conv2', **kw)(y)
    y = nn.relu(gn('gn2')(y))
    y = StdConv(out, (1, 1), name='conv3', **kw)(y)
    # Zero-initialised last norm: each unit starts as the identity on its shortcut.
    y = gn('gn3', scale_init=nn.initializers.zeros)(y)
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """``num_units`` bottleneck units; the first one may downsample."""

  num_units: int
  features: int
  first_stride: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    for j in range(self.num_units):
      x = BottleneckUnit(self.features, self.first_stride if j == 0 else 1,
                         name=f'unit{j + 1}', **kw)(x)
    return x


def bit_stem(x: Array, layers: Sequence[int], width_factor: int = 1, *,
             dtype: Dtype = jnp.float32, param_dtype: Dtype = jnp.float32) -> Array:
  """Root conv 7x7/2 + GroupNorm + max-pool 3x3/2, then one stage per entry of ``layers``.

  Called from inside the parent's compact ``__call__``, so the modules it makes
  sit at the parent's top level, as in the release files. The root alone
  downsamples 4x; every stage after the first another 2x.
  """
  kw = dict(dtype=dtype, param_dtype=param_dtype)
  width = 64 * width_factor
  x = StdConv(width, (7, 7), 2, use_bias=False, name='conv_root', **kw)(x)
  x = nn.relu(nn.GroupNorm(name='gn_root', **kw)(x))
  x = nn.max_pool(x, (3, 3), strides=(2, 2), padding='SAME')
  for i, units in enumerate(layers):
    x = ResNetStage(units, width * 2**i, 1 if i == 0 else 2, name=f'block{i + 1}', **kw)(x)
  return x
