"""Tests of vit_jax.hugepages: when the tunable is added, and that the re-executed process
really faults its large blocks in as huge pages."""

import os
import subprocess
import sys

import pytest

from vit_jax import hugepages

GLIBC = (2, 36)


def test_adds_the_tunable_for_glibc_with_thp_on_madvise():
  env = hugepages.environ_with_huge_pages({'HOME': '/h'}, GLIBC, 'madvise')
  assert env == {'HOME': '/h', 'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}
  env = hugepages.environ_with_huge_pages({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'},
                                          GLIBC, 'madvise')
  assert env == {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'}


@pytest.mark.parametrize('environ, glibc, thp', [
    ({}, GLIBC, 'always'),  # The kernel uses huge pages already.
    ({}, GLIBC, 'never'),
    ({}, GLIBC, None),  # No transparent huge pages at all.
    ({}, (2, 34), 'madvise'),  # glibc before the tunable.
    ({'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'}, GLIBC, 'madvise'),  # The user's choice.
    ({'VIT_JAX_HUGE_PAGES': '0'}, GLIBC, 'madvise'),
])
def test_changes_nothing_where_it_would_not_help(environ, glibc, thp):
  assert hugepages.environ_with_huge_pages(environ, glibc, thp) is None


def test_reads_the_kernels_mode(tmp_path):
  path = tmp_path / 'enabled'
  path.write_text('always [madvise] never\n')
  assert hugepages.thp_mode(str(path)) == 'madvise'
  assert hugepages.thp_mode(str(tmp_path / 'missing')) is None


# What XLA:CPU does every step: a large block allocated, written and freed.
_PROGRAM = '''
import ctypes, os, resource, sys
from vit_jax import hugepages
hugepages.reexec_with_huge_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
  block = libc.malloc(128 << 20)
  ctypes.memset(block, 1, 128 << 20)
  libc.free(block)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:], faults, sep='|')
'''


def _run(opt_out: str) -> tuple[str, str, int]:
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
  done = subprocess.run([sys.executable, '-c', _PROGRAM, 'a', '--b=c'], capture_output=True,
                        text=True, check=True, env={**env, 'VIT_JAX_HUGE_PAGES': opt_out})
  tunables, argv, faults = done.stdout.strip().split('|')
  return tunables, argv, int(faults)


@pytest.mark.skipif(hugepages.environ_with_huge_pages({}, hugepages.glibc_version(),
                                                     hugepages.thp_mode()) is None,
                    reason='the tunable would change nothing on this machine')
def test_reexecuted_process_faults_large_blocks_in_as_huge_pages():
  tunables, argv, faults = _run(opt_out='1')
  assert tunables == 'glibc.malloc.hugetlb=1' and argv == "['a', '--b=c']"
  plain_tunables, plain_argv, plain_faults = _run(opt_out='0')
  assert plain_tunables == '' and plain_argv == argv
  # 256 MiB in 4 KiB pages is 65,536 faults; in 2 MiB pages, 128.
  assert plain_faults > 60_000 and faults < plain_faults / 20, (faults, plain_faults)
