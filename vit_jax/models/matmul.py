"""Matrix products with low-precision inputs and float32 accumulation, both ways.

``mixed_dot_general(dtype)`` is a drop-in ``dot_general`` for Flax's ``Dense`` and
``DenseGeneral``: the operands are cast to ``dtype`` (bfloat16) and multiplied with float32
accumulation, and so are the two products of the backward pass, whose gradients stay float32
(what TPUs do by default, and PyTorch's bfloat16 autocast around its matmuls). A custom VJP is
needed: plain autodiff of ``dot_general(..., preferred_element_type=float32)`` multiplies the
float32 cotangent with a bfloat16 operand, which XLA computes in float32.
"""

from __future__ import annotations

import functools
import math
import string
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from vit_jax.base import cpu

Array = jax.Array
DimensionNumbers = tuple[tuple[Any, Any], tuple[Any, Any]]


def einsum_specs(lhs_ndim: int, rhs_ndim: int,
                 dimension_numbers: DimensionNumbers) -> tuple[str, str, str]:
  """The ``dot_general`` as einsum operands: ('bqd', 'bkd', 'bqk') for a batched q.k^T."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  letters = iter(string.ascii_letters)
  lhs, rhs = [''] * lhs_ndim, [''] * rhs_ndim
  for i, j in zip((*lhs_batch, *lhs_contract), (*rhs_batch, *rhs_contract), strict=True):
    lhs[i] = rhs[j] = next(letters)
  lhs = [c or next(letters) for c in lhs]
  rhs = [c or next(letters) for c in rhs]
  out = ([lhs[i] for i in lhs_batch]
         + [c for i, c in enumerate(lhs) if i not in (*lhs_batch, *lhs_contract)]
         + [c for i, c in enumerate(rhs) if i not in (*rhs_batch, *rhs_contract)])
  return ''.join(lhs), ''.join(rhs), ''.join(out)


def _product(spec: str, a: Array, b: Array) -> Array:
  """``einsum(spec, a, b)`` accumulated in float32: in the form below for XLA:CPU, plain for
  the other backends (which lay products out themselves)."""
  plain = lambda a, b: jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  return cpu.lowered_for_cpu(functools.partial(_product_for_cpu, spec), plain)(a, b)


def _product_for_cpu(spec: str, a: Array, b: Array) -> Array:
  """``einsum(spec, a, b)`` accumulated in float32, as a (batch, m, k) x (batch, k, n) product.

  XLA:CPU's bfloat16 matmul kernels (YNNPACK) take only row-major operands whose batch
  dimensions lead and, for the left one, whose contracted dimensions come last; XLA
  may compute other bfloat16 products in float32, at half the rate. It did so for
  operands that are transposes (the attention's heads-first q, k and v) and for backward
  products that contract over the left operand's tokens (the attention's key and value
  gradients): 6 of the 24 products of a training step per layer. So both operands are
  transposed into that form and reshaped to rank 3: a reshape is free for a row-major
  array and makes XLA write a transpose out row-major once.
  """
  operands, out = spec.split('->')
  a_spec, b_spec = operands.split(',')
  batch = [c for c in a_spec if c in b_spec and c in out]
  contracted = [c for c in a_spec if c in b_spec and c not in out]
  a_free = [c for c in a_spec if c not in b_spec]
  b_free = [c for c in b_spec if c not in a_spec]
  size = dict(zip(a_spec, a.shape, strict=True)) | dict(zip(b_spec, b.shape, strict=True))
  n = lambda letters: math.prod(size[c] for c in letters)
  a = jnp.einsum(f'{a_spec}->{"".join(batch + a_free + contracted)}', a)
  b = jnp.einsum(f'{b_spec}->{"".join(batch + contracted + b_free)}', b)
  a = a.reshape(n(batch), n(a_free), n(contracted))
  b = b.reshape(n(batch), n(contracted), n(b_free))
  y = jnp.einsum('bmk,bkn->bmn', a, b, preferred_element_type=jnp.float32)
  y = y.reshape([size[c] for c in batch + a_free + b_free])
  return jnp.einsum(f'{"".join(batch + a_free + b_free)}->{out}', y)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _mixed(lhs: Array, rhs: Array, dimension_numbers: DimensionNumbers, dtype: Any) -> Array:
  return _mixed_fwd(lhs, rhs, dimension_numbers, dtype)[0]


def _mixed_fwd(lhs, rhs, dimension_numbers, dtype):
  a, b = lhs.astype(dtype), rhs.astype(dtype)
  a_spec, b_spec, out_spec = einsum_specs(a.ndim, b.ndim, dimension_numbers)
  # The residuals are the low-precision operands (half the memory of float32 ones)
  # and, as empty arrays, the original dtypes that the gradients are returned in.
  residuals = (a, b, jnp.zeros((0,), lhs.dtype), jnp.zeros((0,), rhs.dtype))
  return _product(f'{a_spec},{b_spec}->{out_spec}', a, b), residuals


def _mixed_bwd(dimension_numbers, dtype, residuals, g):
  a, b, lhs_like, rhs_like = residuals
  a_spec, b_spec, out_spec = einsum_specs(a.ndim, b.ndim, dimension_numbers)
  g = g.astype(dtype)
  return (_product(f'{out_spec},{b_spec}->{a_spec}', g, b).astype(lhs_like.dtype),
          _product(f'{a_spec},{out_spec}->{b_spec}', a, g).astype(rhs_like.dtype))


_mixed.defvjp(_mixed_fwd, _mixed_bwd)


def mixed_dot_general(dtype: Any) -> Callable[..., Array]:
  """A ``lax.dot_general`` computing in ``dtype`` with float32 accumulation (see above).

  The result has ``preferred_element_type`` if given, else the operands' common type.
  """
  dtype = jnp.dtype(dtype)

  def dot_general(lhs: Array, rhs: Array, dimension_numbers: DimensionNumbers,
                  precision: Any = None, preferred_element_type: Any = None) -> Array:
    del precision  # The operands' dtype fixes it.
    out_dtype = preferred_element_type or jnp.result_type(lhs, rhs)
    dimension_numbers = tuple(tuple(tuple(int(i) for i in dims) for dims in pair)
                              for pair in dimension_numbers)
    return _mixed(lhs, rhs, dimension_numbers, dtype).astype(out_dtype)

  return dot_general


def dot_general_for(matmul_dtype: Any | None) -> Callable[..., Array]:
  """``mixed_dot_general(matmul_dtype)``, or ``lax.dot_general`` for None."""
  return lax.dot_general if matmul_dtype is None else mixed_dot_general(matmul_dtype)
