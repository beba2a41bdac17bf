"""Tests of vit_jax.base.cpu.host_memory: which glibc tunables are added where, and that a
re-executed process really gets its large blocks as huge pages and reuses them."""

import os
import subprocess
import sys

import pytest

from vit_jax.base.cpu import host_memory

GLIBC = (2, 36)
HUGE = 'glibc.malloc.hugetlb=1'
KEEP = ':'.join(host_memory.KEEP_FREED)


def _tunables(environ, glibc=GLIBC, thp='madvise', mode=None, default='huge_pages'):
  tuned = host_memory.tuned_environ(environ, glibc, thp, mode, default)
  return None if tuned is None else tuned['GLIBC_TUNABLES']


def test_freed_memory_is_kept_by_default_only_for_a_cpu_split_into_devices():
  assert [host_memory.default_mode(n) for n in (0, 1, 2, 8)] == [
      'huge_pages', 'huge_pages', 'keep_freed', 'keep_freed']
  assert _tunables({}, default='keep_freed') == f'{HUGE}:{KEEP}'
  # The user's VIT_JAX_MALLOC wins over the default.
  assert _tunables({'VIT_JAX_MALLOC': 'huge_pages'}, default='keep_freed') == HUGE
  assert _tunables({'VIT_JAX_MALLOC': 'default'}, default='keep_freed') is None


def test_huge_pages_by_default_and_freed_memory_kept_on_request():
  assert host_memory.tuned_environ({'HOME': '/h'}, GLIBC, 'madvise') == {
      'HOME': '/h', 'GLIBC_TUNABLES': HUGE}
  assert _tunables({'VIT_JAX_MALLOC': 'keep_freed'}) == f'{HUGE}:{KEEP}'
  assert _tunables({}, mode='keep_freed') == f'{HUGE}:{KEEP}'
  assert KEEP == ('glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:'
                  'glibc.malloc.arena_max=1')
  assert _tunables({'VIT_JAX_MALLOC': 'default'}) is None


@pytest.mark.parametrize('thp, mode, expected', [
    ('always', 'huge_pages', None),  # The kernel uses huge pages already.
    ('never', 'huge_pages', None),
    (None, 'huge_pages', None),  # No transparent huge pages at all.
    ('always', 'keep_freed', KEEP),
    (None, 'keep_freed', KEEP),
])
def test_adds_what_applies_to_the_kernel(thp, mode, expected):
  assert _tunables({}, thp=thp, mode=mode) == expected


def test_glibc_versions():
  assert _tunables({}, glibc=(2, 34), mode='keep_freed') == KEEP  # Before hugetlb.
  assert _tunables({}, glibc=(2, 34)) is None
  assert _tunables({}, glibc=(2, 25), mode='keep_freed') is None  # Before tunables.
  assert _tunables({}, glibc=None, mode='keep_freed') is None  # Another C library.


def test_leaves_the_users_tunables_alone():
  user = 'glibc.malloc.arena_max=4:glibc.malloc.hugetlb=0'
  assert _tunables({'GLIBC_TUNABLES': user}, mode='keep_freed') == (
      f'{user}:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736')
  # Everything set already (also: in the re-executed process itself): nothing.
  assert _tunables({'GLIBC_TUNABLES': f'{HUGE}:{KEEP}'}, mode='keep_freed') is None


def test_names_the_variable_of_a_wrong_mode():
  with pytest.raises(ValueError, match=r"VIT_JAX_MALLOC='huge'.*keep_freed"):
    _tunables({'VIT_JAX_MALLOC': 'huge'})


def test_without_tuning_keeps_only_the_users_other_tunables():
  environ = {'GLIBC_TUNABLES': f'glibc.pthread.rseq=0:{HUGE}:{KEEP}', 'HOME': '/h'}
  assert host_memory.without_tuning(environ) == {
      'GLIBC_TUNABLES': 'glibc.pthread.rseq=0', 'HOME': '/h'}


def test_reads_the_kernels_mode(tmp_path):
  path = tmp_path / 'enabled'
  path.write_text('always [madvise] never\n')
  assert host_memory.thp_mode(str(path)) == 'madvise'
  assert host_memory.thp_mode(str(tmp_path / 'missing')) is None


# What XLA:CPU does every step: a large block allocated, written and freed, on a thread.
_PROGRAM = '''
import ctypes, os, resource, sys, threading
from vit_jax.base.cpu import host_memory
host_memory.reexec()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def step():
  block = libc.malloc(128 << 20)
  ctypes.memset(block, 1, 128 << 20)
  libc.free(block)
def faults_of_a_step():
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  thread = threading.Thread(target=step)
  thread.start()
  thread.join()
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
first, second = faults_of_a_step(), faults_of_a_step()
print(os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:], first, second, sep='|')
'''


def _run(mode: str) -> tuple[str, str, int, int]:
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
  env['VIT_JAX_MALLOC'] = mode
  done = subprocess.run([sys.executable, '-c', _PROGRAM, 'a', '--b=c'], capture_output=True,
                        text=True, check=True, env=env)
  tunables, argv, first, second = done.stdout.strip().split('|')
  return tunables, argv, int(first), int(second)


_TUNED = _tunables({}, host_memory.glibc_version(), host_memory.thp_mode(), 'keep_freed')


@pytest.mark.slow
@pytest.mark.skipif(_TUNED is None, reason='no tunable would change anything on this machine')
def test_reexecuted_process_gets_huge_pages_and_reuses_its_memory():
  tunables, argv, first, second = _run('keep_freed')
  assert tunables == _TUNED and argv == "['a', '--b=c']"
  plain_tunables, plain_argv, plain_first, plain_second = _run('default')
  assert plain_tunables == '' and plain_argv == argv
  # 128 MiB in 4 KiB pages is 32,768 faults, in every step with glibc's defaults.
  assert plain_first > 30_000 and plain_second > 30_000, (plain_first, plain_second)
  if HUGE in _TUNED:  # In 2 MiB pages: 64.
    assert first < plain_first / 20, (first, plain_first)
  if KEEP in _TUNED:  # The second step reuses the first one's memory.
    assert second < 100, second
  # VIT_JAX_MALLOC unset: huge pages alone, where they apply.
  tunables, _, first, second = _run('')
  assert tunables == (_tunables({}, host_memory.glibc_version(), host_memory.thp_mode()) or '')
  if HUGE in tunables:
    assert first < plain_first / 20 and second < plain_second / 20, (first, second)
