"""Everything vit_jax does only for XLA:CPU, and the checks that decide it.

vit_jax is tested on CPUs and tuned for the TPUs and GPUs it trains on; what helps only where XLA
runs on the host's CPU stays here, behind these checks: glibc's malloc tunables, set by
re-executing the process before jax is imported (``prepare``, ``host_memory``); the warning where
bfloat16 products would be emulated (``warnings``, ``host_cpu``); XLA:CPU's operand layouts for
bfloat16 matmuls, chosen per compiled platform (``lowered_for_cpu``); programs with collectives
run one at a time (``one_program_at_a_time``); the train state replicated over CPU devices
(``shards_state_by_default``). A TPU or GPU host starts ``vit_jax.main`` with none of it.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from typing import Any

from vit_jax.base import platforms as platforms_lib
from vit_jax.base.cpu import host_cpu, host_memory


def runs_on_cpu(environ: dict[str, str] | None = None) -> bool:
  """Whether jax will run this process on the host's CPU, decided before jax is imported
  (``jax.distributed`` must start before jax picks its backend): JAX_PLATFORMS's first
  platform where it is set, else whether an accelerator that an installed jax plugin drives
  has its device files here."""
  environ = os.environ if environ is None else environ
  if platforms := environ.get('JAX_PLATFORMS') or environ.get('JAX_PLATFORM_NAME'):
    return platforms.split(',')[0].strip().lower() == 'cpu'
  tpu = (any(map(platforms_lib.installed, platforms_lib.TPU_MODULES))
         and any(glob.glob(p) for p in platforms_lib.TPU_FILES))
  return not tpu and platforms_lib.platforms_without_tpu() == 'cpu'  # Nor a GPU a plugin drives.


def device_count(cpu_devices: int | None, environ: dict[str, str] | None = None) -> int | None:
  """The CPU devices jax will make in this process, known before it starts: ``--cpu_devices``
  where given (it wins over XLA_FLAGS), else XLA_FLAGS' host platform device count or
  JAX_NUM_CPU_DEVICES, else 1; None where both of those are set (which wins is jax's)."""
  environ = os.environ if environ is None else environ
  if cpu_devices:
    return cpu_devices
  forced = re.search(r'--xla_force_host_platform_device_count=(\d+)', environ.get('XLA_FLAGS', ''))
  number = environ.get('JAX_NUM_CPU_DEVICES', '').strip()
  if forced and number:
    return None
  if forced:
    return int(forced.group(1))
  return int(number) if number.isdigit() and int(number) > 0 else 1


def prepare(cpu_devices: int) -> str:
  """Sets up a CPU run before jax is imported: jax told to use the CPU (JAX_PLATFORMS, where
  unset: no accelerator plugin is tried, and an installed libtpu stays silent), and glibc's
  malloc for XLA:CPU's buffers (``VIT_JAX_MALLOC``, else ``host_memory.default_mode``).
  Re-executes the process once where that adds tunables; returns the malloc mode."""
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  mode = os.environ.get(host_memory.ENV) or host_memory.default_mode(cpu_devices)
  host_memory.reexec(mode)
  return mode


def warnings(matmul_dtype: str | None) -> list[str]:
  """Warnings for a CPU run of this config (after jax picked the CPU)."""
  import jax

  warning = host_cpu.emulated_bf16_warning(jax.default_backend(), matmul_dtype,
                                           host_cpu.cpu_info())
  return [warning] if warning else []


def one_program_at_a_time() -> bool:
  """Whether independent programs with collectives must run one after the other: on
  XLA:CPU with several devices, whose collectives wait on the threads that run the
  programs; several dispatched at once can each hold some of the devices (seen: 7 of 8
  devices in one checksum program's all-reduce, the 8th in another's)."""
  import jax

  return jax.default_backend() == 'cpu' and jax.device_count() > 1


def shards_state_by_default(platform: str) -> bool:
  """Whether the train state is stored split over the data axis where the config leaves it
  to vit_jax (``config.mesh.shard_state=None``): not on CPU devices, where the step's
  gather and reduce-scatter cost more than the optimizer work they save (ViT-Ti/16 on 2
  CPU devices: 4-5% fewer images/s, results/RESULTS.md); on TPUs and GPUs, yes."""
  return platform != 'cpu'


def lowered_for_cpu(for_cpu: Callable[..., Any],
                    elsewhere: Callable[..., Any]) -> Callable[..., Any]:
  """A function that runs ``for_cpu`` in programs lowered for the CPU, ``elsewhere`` in
  the others (TPU, GPU). The choice is made per compilation, by the platform the program
  is compiled for, not by this process's default backend."""
  import jax

  return lambda *args: jax.lax.platform_dependent(*args, cpu=for_cpu, default=elsewhere)
