"""glibc's malloc set up for XLA:CPU's per-step host buffers (Linux).

XLA:CPU allocates each step's temporaries afresh; with glibc's defaults the kernel faults them
in again, zero-filled, every step. ``VIT_JAX_MALLOC`` (unset: ``default_mode``) picks
``huge_pages`` (2 MiB pages: hundreds of times fewer faults), ``keep_freed`` (also one step's
memory reused by the next: no faults, but the process keeps its peak memory; the default with
``--cpu_devices=2`` or more) or ``default`` (glibc's own). glibc reads tunables once, at
start-up, so an entry point calls ``reexec()`` before jax is imported; tunables the user set in
``GLIBC_TUNABLES`` are kept. The measurements: results/RESULTS.md ("XLA:CPU and glibc's malloc").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from vit_jax.base import platforms

HUGE_PAGES = ('glibc.malloc.hugetlb=1',)
KEEP_FREED = ('glibc.malloc.mmap_max=0', f'glibc.malloc.trim_threshold={64 << 30}',
              'glibc.malloc.arena_max=1')
MODES = ('huge_pages', 'keep_freed', 'default')
ENV = 'VIT_JAX_MALLOC'
THP_ENABLED = '/sys/kernel/mm/transparent_hugepage/enabled'


def glibc_version() -> tuple[int, ...] | None:
  """(2, 36) for glibc 2.36; None for another C library."""
  try:
    name, version = os.confstr('CS_GNU_LIBC_VERSION').split()
  except (AttributeError, ValueError, OSError):
    return None
  return tuple(int(p) for p in version.split('.')[:2]) if name == 'glibc' else None


def thp_mode(path: str = THP_ENABLED) -> str | None:
  """The kernel's transparent huge page mode ('always', 'madvise', 'never'), if any."""
  text = platforms.read_text(path)
  return text[text.find('[') + 1:text.find(']')] if '[' in text else None


def _name(tunable: str) -> str:
  return tunable.partition('=')[0]


def default_mode(cpu_devices: int) -> str:
  """The mode where VIT_JAX_MALLOC is unset: 'keep_freed' for a CPU split into 2 or more
  devices (``vit_jax.main --cpu_devices``), where it measured faster with flat memory;
  else 'huge_pages'."""
  return 'keep_freed' if cpu_devices >= 2 else 'huge_pages'


def tuned_environ(environ: Mapping[str, str], glibc: tuple[int, ...] | None,
                  thp: str | None, mode: str | None = None,
                  default: str = 'huge_pages') -> dict[str, str] | None:
  """``environ`` with the tunables of ``mode`` (else ``environ``'s VIT_JAX_MALLOC, else
  ``default``) that apply to this machine's ``glibc_version()`` and ``thp_mode()`` added
  to GLIBC_TUNABLES; None where that adds nothing."""
  mode = mode or environ.get(ENV) or default
  if mode not in MODES:
    raise ValueError(f'{ENV}={mode!r}: expected one of {MODES} (vit_jax/base/cpu/host_memory.py).')
  if mode == 'default' or glibc is None:
    return None
  add = [*(HUGE_PAGES if glibc >= (2, 35) and thp == 'madvise' else ()),
         *(KEEP_FREED if mode == 'keep_freed' and glibc >= (2, 26) else ())]
  tunables = environ.get('GLIBC_TUNABLES', '')
  users = {_name(t) for t in tunables.split(':')}
  add = [t for t in add if _name(t) not in users]
  if not add:
    return None
  return {**environ, 'GLIBC_TUNABLES': ':'.join(filter(None, [tunables, *add]))}


def without_tuning(environ: Mapping[str, str]) -> dict[str, str]:
  """``environ`` without any of this module's tunables: glibc's defaults."""
  ours = {_name(t) for t in HUGE_PAGES + KEEP_FREED}
  kept = [t for t in environ.get('GLIBC_TUNABLES', '').split(':')
          if t and _name(t) not in ours]
  return {**environ, 'GLIBC_TUNABLES': ':'.join(kept)}


def reexec(default: str = 'huge_pages') -> None:
  """Re-executes this process's command with the tunables of VIT_JAX_MALLOC's mode (unset:
  ``default``), where they apply; returns where there are none to add (or once added)."""
  environ = tuned_environ(os.environ, glibc_version(), thp_mode(), default=default)
  if environ is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
