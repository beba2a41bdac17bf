r"""Attention alone on one TPU device, from the TPU compiler: einsum against Pallas kernels.

    python -m benchmarks.tpu_attention --topology=v5p-8 --batch=128 --heads=12 \
        --tokens=577 --impls=einsum,flash,splash

The gradient of one bfloat16 attention, compiled for one device with no TPU attached: the cost
model's time, the temporaries and the FLOPs it counts. ``einsum`` is vit_jax's attention;
``flash`` and ``splash`` are ``jax.experimental.pallas.ops.tpu``'s kernels (keys padded to a
multiple of 128, masked). Where the FLOPs counted fall far below the products', the cost model
did not see inside the kernel and its time is not the kernel's (results/RESULTS.md, "Fine-tuning
cells").
"""

from __future__ import annotations

import os
from typing import Any

from absl import flags

from vit_jax.base import paths

IMPLS = ('einsum', 'flash', 'splash')
BLOCK = 128  # The Pallas kernels' sequence block.


def _define_flags() -> None:
  """The CLI's flags: defined when run as a program only (tpu_step has a --topology too)."""
  flags.DEFINE_string('topology', 'v5p-8', 'A Cloud TPU slice (vit_jax.tools.aot).')
  flags.DEFINE_integer('batch', 128, 'Images per device.')
  flags.DEFINE_integer('heads', 12, 'Attention heads.')
  flags.DEFINE_integer('tokens', 577, 'Sequence length (577: B/16 at 384 px).')
  flags.DEFINE_integer('head_dim', 64, 'Features per head.')
  flags.DEFINE_list('impls', list(IMPLS), 'einsum, flash, splash.')
  paths.DEFINE_path('json', None, 'Write the results here.')


def attention(impl: str, tokens: int) -> Any:
  """(q, k, v) -> the attention's output, for ``tokens`` real tokens of the inputs' length."""
  import jax
  import jax.numpy as jnp

  def einsum(q, k, v):
    s = jnp.einsum('bhqd,bhkd->bhqk', q * q.shape[-1] ** -0.5, k)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum('bhqk,bhkd->bhqd', p, v)

  def flash(q, k, v):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    real = (jnp.arange(q.shape[2]) < tokens).astype(jnp.int32)[None].repeat(q.shape[0], 0)
    ids = fa.SegmentIds(q=real, kv=real) if tokens < q.shape[2] else None
    return fa.flash_attention(q, k, v, segment_ids=ids, sm_scale=q.shape[-1] ** -0.5)

  def splash(q, k, v):
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    length = q.shape[2]
    keys = np.broadcast_to(np.arange(length) < tokens, (length, length))
    keys = keys | ~(np.arange(length) < tokens)[:, None]  # Padded queries see all (no NaN).
    mask = sm.MultiHeadMask([sm.NumpyMask(keys) for _ in range(q.shape[1])])
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1)
    return jax.vmap(kernel)(q * q.shape[-1] ** -0.5, k, v)

  return {'einsum': einsum, 'flash': flash, 'splash': splash}[impl]


def measure(impl: str, device: Any, batch: int, heads: int, tokens: int,
            head_dim: int) -> dict[str, Any]:
  """Compiles the attention's gradient for ``device``: cost-model time, temporaries, FLOPs."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import SingleDeviceSharding

  from vit_jax.training import mfu

  length = tokens if impl == 'einsum' else -(-tokens // BLOCK) * BLOCK
  fn = attention(impl, tokens)
  grad = jax.jit(jax.grad(lambda q, k, v: fn(q, k, v).astype(jnp.float32).sum(),
                          argnums=(0, 1, 2)))
  x = jax.ShapeDtypeStruct((batch, heads, length, head_dim), jnp.bfloat16,
                           sharding=SingleDeviceSharding(device))
  row = {'impl': impl, 'batch': batch, 'heads': heads, 'tokens': tokens, 'length': length,
         'head_dim': head_dim,
         # The two products, forward and backward (4 products), at the real length.
         'product_flops': 2 * 2 * 3 * batch * heads * tokens ** 2 * head_dim}
  try:
    compiled = grad.lower(x, x, x).compile()
  except Exception as e:  # noqa: BLE001 - a kernel Mosaic refuses for the chip is an answer.
    return row | {'error': ' '.join(str(e).split())[:300]}
  cost = mfu.cost(compiled)
  seconds = cost.get('optimal_seconds')
  return row | {'cost_model_seconds': seconds if seconds and seconds > 0 else None,
                'temp_bytes': compiled.memory_analysis().temp_size_in_bytes,
                'flops_counted': cost.get('flops')}


def main(argv: list[str]) -> None:
  del argv
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from benchmarks import results
  from vit_jax.base import accelerators, errors

  f = flags.FLAGS
  bad = [i for i in f.impls if i not in IMPLS]
  if bad:
    raise errors.UserError(f'--impls={bad[0]} is not one of {", ".join(IMPLS)}.')
  if min(f.batch, f.heads, f.tokens, f.head_dim) <= 0:
    raise errors.UserError('--batch, --heads, --tokens and --head_dim must be positive.')
  tpu = accelerators.tpu_slice(f.topology)
  device = tpu.compile_devices()[0]
  print(f'{tpu.name}: one {device.device_kind}, attention gradient, ({f.batch}, '
        f'{f.heads}, {f.tokens}, {f.head_dim}) bfloat16; cost model.')
  rows = []
  for impl in f.impls:
    row = measure(impl, device, f.batch, f.heads, f.tokens, f.head_dim)
    rows.append(row)
    if 'error' in row:
      print(f'{impl:8} refused: {row["error"]}', flush=True)
      continue
    seen = (row['flops_counted'] or 0) / row['product_flops']
    print(f'{impl:8} {row["length"]:5} tokens  {1e3 * (row["cost_model_seconds"] or 0):8.3f} ms'
          f'  temporaries {row["temp_bytes"] / 2**30:6.3f} GiB  FLOPs counted {seen:6.1%} of '
          'the products\'', flush=True)
  if f.json:
    results.write(f.json, 'benchmarks.tpu_attention', cpu={},
                  load=os.getloadavg(), topology=tpu.name, rows=rows)


if __name__ == '__main__':
  from vit_jax.base import errors

  _define_flags()
  errors.run(main)
