"""The host's CPU and the instruction sets that decide how fast it multiplies matrices.

A cloud machine of the same name can be another processor from one day to the next, and
one without bfloat16 instructions emulates bfloat16 products (slower than float32 ones):
the benchmarks record the CPU with every result, and training warns when
``model.matmul_dtype='bfloat16'`` would be emulated. Standard library only:
``benchmarks.timm_step`` runs it without jax.
"""

from __future__ import annotations

import os
import platform

from vit_jax.base import platforms

# The /proc/cpuinfo flags that decide matmul speed: x86 (vector width, bfloat16 dot
# products, AMX tiles) and Arm (Features: bf16, sve).
ISA_FLAGS = ('avx2', 'fma', 'avx512f', 'avx512_bf16', 'amx_tile', 'amx_bf16', 'asimd', 'sve',
             'bf16')
BF16_FLAGS = ('avx512_bf16', 'amx_bf16', 'bf16')


def cpu_info(cpuinfo: str | None = None) -> dict[str, object]:
  """The first processor of ``cpuinfo`` (default: /proc/cpuinfo): its name and ISA flags.

  ``native_bf16`` says whether it has bfloat16 dot-product instructions; where it does
  not, bfloat16 matmuls (``model.matmul_dtype='bfloat16'``, PyTorch's autocast) are
  emulated. Off Linux, only what ``platform`` knows.
  """
  if cpuinfo is None:
    cpuinfo = platforms.read_text('/proc/cpuinfo')
  fields: dict[str, str] = {}
  for line in cpuinfo.split('\n\n')[0].splitlines():
    key, sep, value = line.partition(':')
    if sep:
      fields.setdefault(key.strip(), value.strip())
  flags = set((fields.get('flags') or fields.get('Features') or '').split())
  isa = [f for f in ISA_FLAGS if f in flags]
  return {
      'model_name': fields.get('model name') or platform.processor() or platform.machine(),
      'family': fields.get('cpu family'), 'model': fields.get('model'),
      'cores': os.cpu_count(), 'isa': isa,
      'native_bf16': any(f in flags for f in BF16_FLAGS),
  }


def describe(info: dict[str, object]) -> str:
  """One line for a table's header: 'AMD EPYC (family 25, model 1), 2 cores: avx2 fma; ...'."""
  where = f' (family {info["family"]}, model {info["model"]})' if info['family'] else ''
  bf16 = ('bfloat16 dot products native' if info['native_bf16']
          else 'no bfloat16 instructions: bfloat16 products are emulated')
  return (f'{info["model_name"]}{where}, {info["cores"]} cores: '
          f'{" ".join(info["isa"]) or "no ISA flags read"}; {bf16}')


def emulated_bf16_warning(backend: str, matmul_dtype: str | None,
                          info: dict[str, object]) -> str | None:
  """A warning where ``matmul_dtype`` asks for bfloat16 products that this CPU emulates."""
  if backend != 'cpu' or matmul_dtype != 'bfloat16' or info['native_bf16']:
    return None
  return (f'model.matmul_dtype=bfloat16, but this CPU has no bfloat16 instructions '
          f'({info["model_name"]}: {" ".join(info["isa"]) or "no ISA flags read"}): XLA '
          'emulates bfloat16 products, and the train step is slower than in float32 '
          '(ViT-Ti/16 on an AVX2 EPYC: 0.65-0.85x the images/s; results/RESULTS.md). '
          'Leave model.matmul_dtype unset on this machine.')
