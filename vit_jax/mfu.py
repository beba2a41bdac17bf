"""Model FLOPs utilisation: the model's FLOPs per image over the devices' peak.

The training loop's log line and the train-step benchmark (``vit_jax.benchmarks.train``)
both compute it here:

* FLOPs per image of a training step: the model's analytic count (``forward_flops``,
  x3 for forward + backward, 2 per multiply-add; what papers publish), or, for the
  hybrids that have none, XLA's cost analysis of the compiled step. XLA counts a loop
  body once, so its count is not used where the model has one: for a 2-layer ViT it
  is 1.08x the analytic count unrolled, 0.59x scanned, 0.31x with ``grad_accum_steps=4``.
* The peak: the published bfloat16 peak of the TPU and NVIDIA chips that
  ``vit_jax.accelerators`` knows (the usual denominator), else (CPUs, other chips) the
  measured rate of large matmuls in the step's matmul dtype, all devices multiplying at
  once (CPU devices share the cores).
"""

from __future__ import annotations

import functools
import time
from typing import Any


def analytic_train_flops(model: Any, all_tokens: bool = False) -> int | None:
  """Model FLOPs of one image's training step: forward + backward = 3 x forward.

  ``all_tokens``: as if the last block computed every token's output, as timm's does
  (vit_jax's computes only the class token's there; ``VisionTransformer.head_tokens``).
  """
  forward = model.forward_flops(all_tokens)
  return None if forward is None else 3 * forward


def cost(compiled: Any) -> dict[str, float]:
  """XLA's cost analysis of a compiled program (of one device's share)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # Older jax: one dict per program.
    analysis = analysis[0] if analysis else {}
  return dict(analysis or {})


def train_flops_per_image(model: Any, compiled: Any, devices: int,
                          batch_size: int) -> float | None:
  """Model FLOPs of one image's training step: analytic, or XLA's for hybrids."""
  analytic = analytic_train_flops(model)
  if analytic:
    return float(analytic)
  flops = cost(compiled).get('flops')
  return flops * devices / batch_size if flops else None


def matmul_peak(dtype: str, n: int, repeats: int) -> float:
  """FLOP/s per device of n x n x n products (float32 accumulation) on all devices at once."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.array(devices), ('devices',))
  one_each = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('devices'))
  a, b = (jax.device_put(np.random.default_rng(i).standard_normal(
      (len(devices), n, n), np.float32).astype(dtype), one_each) for i in (0, 1))
  matmul = jax.jit(lambda a, b: jnp.einsum('dij,djk->dik', a, b,
                                           preferred_element_type=jnp.float32),
                   out_shardings=one_each)
  matmul(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * n**3 / float(np.median(times))


@functools.cache
def device_peak(dtype: str) -> tuple[float, str]:
  """(peak FLOP/s of all devices together, how it was found) for matmuls in ``dtype``.

  Published where ``accelerators`` knows the chip; else measured (1024^3 products, the
  median of 3, about a second on a CPU: a smaller product than the benchmark's).
  """
  import jax

  from vit_jax import accelerators

  devices = jax.devices()
  kind = devices[0].device_kind
  if peak := accelerators.peak_bf16_flops(kind):
    return (peak * len(devices),
            f'the published bfloat16 peak of {len(devices)} x {kind}, {peak / 1e12:.1f} '
            'TFLOP/s each')
  peak = matmul_peak(dtype, 1024 if jax.default_backend() == 'cpu' else 8192, 3)
  count = f'{len(devices)} {kind} device' + ('s' if len(devices) > 1 else '')
  return (peak * len(devices),
          f'the measured {dtype} matmul peak of {count}, {peak * len(devices) / 1e9:,.0f} GFLOP/s')
