"""Large host allocations on transparent huge pages (Linux with glibc).

XLA:CPU allocates the temporaries of every step afresh (690 MiB per device for a
ViT-Ti/16 step at batch 16 per device). glibc maps each such block anew and the kernel
faults it in, zero-filled, 4 KiB at a time: about 350,000 page faults and 0.7 s of
kernel time per Ti/16 step on the development machine, a quarter of the step's CPU
time. glibc's tunable ``glibc.malloc.hugetlb=1`` (glibc 2.35+) has malloc ask for 2 MiB
pages instead (``madvise``): about 1,700 faults per step. The effect on the step is in
benchmarks/RESULTS.md (``--sweep=huge_pages=0,1`` of ``vit_jax.benchmarks.train``).

glibc reads tunables once, when a process starts, so an entry point calls
``reexec_with_huge_pages()`` before anything else: it runs the same command again with
the tunable added to ``GLIBC_TUNABLES``. It does nothing where that would change
nothing: without glibc 2.35+, when the kernel's transparent huge pages are not in
'madvise' mode ('always' uses them already, 'never' not at all), when GLIBC_TUNABLES
already sets ``glibc.malloc.hugetlb``, or with ``VIT_JAX_HUGE_PAGES=0``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

TUNABLE = 'glibc.malloc.hugetlb'
THP_ENABLED = '/sys/kernel/mm/transparent_hugepage/enabled'
OPT_OUT = 'VIT_JAX_HUGE_PAGES'


def glibc_version() -> tuple[int, ...] | None:
  """(2, 36) for glibc 2.36; None for another C library."""
  try:
    name, version = os.confstr('CS_GNU_LIBC_VERSION').split()
  except (AttributeError, ValueError, OSError):
    return None
  return tuple(int(p) for p in version.split('.')[:2]) if name == 'glibc' else None


def thp_mode(path: str = THP_ENABLED) -> str | None:
  """The kernel's transparent huge page mode ('always', 'madvise', 'never'), if any."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  return text[text.find('[') + 1:text.find(']')] if '[' in text else None


def environ_with_huge_pages(environ: Mapping[str, str], glibc: tuple[int, ...] | None,
                            thp: str | None) -> dict[str, str] | None:
  """``environ`` with ``glibc.malloc.hugetlb=1`` in GLIBC_TUNABLES, or None where the
  tunable would change nothing (see the module's docstring), given the machine's
  ``glibc_version()`` and ``thp_mode()``."""
  tunables = environ.get('GLIBC_TUNABLES', '')
  if environ.get(OPT_OUT, '1') == '0' or TUNABLE in tunables:
    return None
  if glibc is None or glibc < (2, 35) or thp != 'madvise':
    return None
  return {**environ, 'GLIBC_TUNABLES': ':'.join(filter(None, [tunables, f'{TUNABLE}=1']))}


def reexec_with_huge_pages() -> None:
  """Re-executes this process's command with the tunable set, where it helps."""
  environ = environ_with_huge_pages(os.environ, glibc_version(), thp_mode())
  if environ is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
