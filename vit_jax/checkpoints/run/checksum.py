"""Checksums of a pytree's arrays, computed where the arrays are: checkpoint integrity.

Orbax's OCDBT databases checksum their B-tree nodes but not the array chunks (nor does any
option add TensorStore's ``crc32c`` to them), so bytes overwritten in a data file restore
without an error. Every checkpoint therefore records a 64-bit checksum of each array's bit
pattern, and a restore recomputes it: two sums modulo 2^32 over the array's 32-bit words ``w_i``,
``sum fmix(w_i ^ fmix(i))`` (MurmurHash3's finaliser) and ``sum w_i * (2 i + 1)``. Integer sums
do not depend on the order of reduction, so the value is the same on any mesh and number of
processes: one jitted reduction per array, sharded like it. Its cost: results/RESULTS.md. The
same program says whether the array is finite (``summary``): a diverged run's state is not.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.base import cpu
from vit_jax.base.sharding import path_name

_U32 = jnp.uint32


def _fmix(h: jax.Array) -> jax.Array:
  h = h ^ (h >> 16)
  h = h * _U32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * _U32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
  """The bit pattern of ``x`` as uint32 words (a trailing axis for 64-bit dtypes)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(_U32)
  bits = x.dtype.itemsize * 8
  if bits >= 32:
    return jax.lax.bitcast_convert_type(x, _U32)
  return jax.lax.bitcast_convert_type(x, jnp.dtype(f'uint{bits}')).astype(_U32)


def _leaf(x: jax.Array) -> jax.Array:
  """[the two sums, 1 if every value is finite else 0] (uint32)."""
  w = _words(x)
  index = jnp.zeros(w.shape, _U32)  # Row-major flat index, without reshaping a sharded array.
  for axis, size in enumerate(w.shape):
    index = index * _U32(size) + jax.lax.broadcasted_iota(_U32, w.shape, axis)
  inexact = jnp.issubdtype(x.dtype, jnp.inexact)
  finite = jnp.all(jnp.isfinite(x)) if inexact else jnp.bool_(True)
  return jnp.stack([jnp.sum(_fmix(w ^ _fmix(index)), dtype=_U32),
                    jnp.sum(w * (index * _U32(2) + _U32(1)), dtype=_U32), finite.astype(_U32)])


@functools.cache
def _jitted(out_sharding: jax.sharding.Sharding | None) -> Any:
  # One small program per array shape (compiles fast; a whole tree at once would not).
  return jax.jit(_leaf, out_shardings=out_sharding)


def _replicated_like(x: Any) -> jax.sharding.Sharding | None:
  sharding = getattr(x, 'sharding', None)
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return None


def of(tree: Any) -> dict[str, str]:
  """{'params/head/kernel': 16 hex digits, ...} for every array of ``tree``.

  Arrays may be sharded over any mesh and processes (every process gets the same
  result: call it on all of them), or host (numpy) arrays.
  """
  return {path: value for path, (value, _) in summary(tree).items()}


def summary(tree: Any) -> dict[str, tuple[str, bool]]:
  """{path: (its checksum as ``of`` gives it, whether all its values are finite)}."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  sums = []  # All dispatched, then read (one after the other where cpu.one_program_at_a_time).
  for _, x in leaves:
    sums.append(_jitted(_replicated_like(x))(x))
    if cpu.one_program_at_a_time():
      sums[-1].block_until_ready()
  out = {}
  for (path, _), s in zip(leaves, sums, strict=True):
    first, second, finite = np.asarray(s.addressable_data(0))
    out[path_name(path)] = (f'{first:08x}{second:08x}', bool(finite))
  return out
