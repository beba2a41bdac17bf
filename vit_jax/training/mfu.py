"""Model FLOPs utilisation: the model's FLOPs per image over the devices' peak.

The training loop's log line and ``benchmarks.train`` both compute it here. FLOPs per image of a
training step: the model's analytic count (``forward_flops`` x 3, 2 per multiply-add; what
papers publish), or for the hybrids, which have none, XLA's count of the compiled step (which
counts a loop's body once, so it is not used where the model has a count). The peak: the
published bfloat16 peak of the chips ``vit_jax.base.accelerators`` knows, else (CPUs, other
chips) the measured rate of large matmuls on all devices at once, measured once per machine and
kept (``device_peak``).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import time
from typing import Any

from vit_jax.base import accelerators
from vit_jax.base.cpu import host_cpu


def analytic_train_flops(model: Any, all_tokens: bool = False,
                         teacher: Any = None) -> int | None:
  """Model FLOPs of one image's training step: forward + backward = 3 x forward, and a
  distillation ``teacher``'s forward pass (a model) where there is one.

  ``all_tokens``: as if the last block computed every token's output, as timm's does
  (vit_jax's computes only the class token's there; ``VisionTransformer.head_tokens``).
  """
  forward = model.forward_flops(all_tokens)
  if forward is None:
    return None
  return 3 * forward + ((teacher.forward_flops() or 0) if teacher else 0)


def cost(compiled: Any) -> dict[str, float]:
  """XLA's cost analysis of a compiled program (of one device's share)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # Older jax: one dict per program.
    analysis = analysis[0] if analysis else {}
  return dict(analysis or {})


def train_flops_per_image(model: Any, compiled: Any, devices: int, batch_size: int,
                          teacher: Any = None, patch_sizes: tuple[int, ...] = (),
                          probabilities: tuple[float, ...] = ()) -> float | None:
  """Model FLOPs of one image's training step: analytic, or XLA's for hybrids. With
  ``patch_sizes`` (FlexiViT: each step at one drawn with ``probabilities``, () uniform):
  their mean over the draw."""
  analytic = analytic_train_flops(model, teacher=teacher)
  if analytic and patch_sizes:
    weights = probabilities or (1.,) * len(patch_sizes)
    analytic = sum(w * analytic_train_flops(model.clone(patch_size=p), teacher=teacher)
                   for w, p in zip(weights, patch_sizes, strict=True)) / sum(weights)
  if analytic:
    return float(analytic)
  flops = cost(compiled).get('flops')
  return flops * devices / batch_size if flops else None


def matmul_peak(dtype: str, n: int, repeats: int, best: bool = False) -> float:
  """FLOP/s per device of n x n x n products (float32 accumulation) on all devices at once:
  of the median time of ``repeats``, or of the fastest (``best``: the peak)."""
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
  return 2 * n**3 / float(min(times) if best else np.median(times))


def peak_cache() -> str:
  """The file that keeps measured peaks: ``$XDG_CACHE_HOME/vit_jax/matmul_peak.json``
  (else ``~/.cache/...``)."""
  return os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'),
                      'vit_jax', 'matmul_peak.json')


def peak_key(platform: str, kind: str, devices: int, dtype: str) -> str:
  """A measured peak's key in ``peak_cache()``: what decides it. On a CPU the processor's
  model and core count (a cloud machine of the same name can be another processor),
  and the number of devices its cores are split into."""
  if platform == 'cpu':
    info = host_cpu.cpu_info()
    kind = f'{info["model_name"]}, {info["cores"]} cores'
  return f'{kind}; {devices} {platform} device{"s" if devices > 1 else ""}; {dtype}'


def _read_peaks(path: str) -> dict[str, Any]:
  try:
    with open(path) as f:
      peaks = json.load(f)
  except (OSError, ValueError):  # None yet, or damaged: measured again.
    return {}
  return peaks if isinstance(peaks, dict) else {}


def _keep_peak(path: str, key: str, peak: float) -> str | None:
  """Adds ``peak`` to the file (written whole, then renamed); the reason where it cannot."""
  peaks = _read_peaks(path)
  peaks[key] = {'flops': peak, 'measured': datetime.date.today().isoformat()}
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w') as f:
      json.dump(peaks, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
  except OSError as e:
    return e.strerror or str(e)
  return None


@functools.cache
def device_peak(dtype: str) -> tuple[float, str]:
  """(peak FLOP/s of all devices together, how it was found) for matmuls in ``dtype``.

  Published where ``accelerators`` knows the chip. Else (CPUs, other chips) measured once
  per processor and device count (1024^3 products on a CPU, the best of 5: a second or
  so) and kept in ``peak_cache()``, so that the MFU of every later run has the same
  denominator, whatever the machine's load at its start (measured at each start, it
  swung 12-47% for the same run). Delete the entry to measure again, on an idle machine,
  or write another ``flops`` there.
  """
  import jax

  devices = jax.devices()
  kind = devices[0].device_kind
  if peak := accelerators.peak_bf16_flops(kind):
    return (peak * len(devices),
            f'the published bfloat16 peak of {len(devices)} x {kind}, {peak / 1e12:.1f} '
            'TFLOP/s each')
  count = f'{len(devices)} {kind} device' + ('s' if len(devices) > 1 else '')
  path, key = peak_cache(), peak_key(devices[0].platform, kind, len(devices), dtype)
  kept = _read_peaks(path).get(key)
  if isinstance(kept, dict) and isinstance(kept.get('flops'), (int, float)) and kept['flops'] > 0:
    return (float(kept['flops']),
            f'the {dtype} matmul peak of {count}, {kept["flops"] / 1e9:,.0f} GFLOP/s, measured '
            f'{kept.get("measured", "before")} (kept in {path})')
  n = 1024 if jax.default_backend() == 'cpu' else 8192
  peak = len(devices) * matmul_peak(dtype, n, 5, best=True)
  failed = _keep_peak(path, key, peak)
  where = f'not kept: {path}: {failed}' if failed else f'kept in {path}'
  return (peak, f'the {dtype} matmul peak of {count}, {peak / 1e9:,.0f} GFLOP/s, measured '
          f'now ({where})')
