"""What vit_jax does only for XLA:CPU stays behind vit_jax.cpu_backend's checks."""

import importlib.util
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from vit_jax import accelerators, cpu_backend

from runs import env


@pytest.mark.parametrize('environ, on_cpu', [
    ({'JAX_PLATFORMS': 'cpu'}, True),
    ({'JAX_PLATFORMS': 'tpu'}, False),
    ({'JAX_PLATFORMS': 'cuda,cpu'}, False),
    ({'JAX_PLATFORM_NAME': 'cpu'}, True),
    ({}, True),  # This machine: no accelerator that a jax plugin drives.
])
def test_runs_on_cpu(environ, on_cpu):
  assert cpu_backend.runs_on_cpu(environ) is on_cpu


def test_an_accelerator_run_is_not_re_executed():
  # vit_jax.main re-executes a CPU run with glibc tunables (vit_jax.host_memory); on a
  # TPU or GPU it must not: there the process's first word is jax's own error here.
  run = lambda platforms: subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--config=configs/quickstart.py',
       '--workdir=/nonexistent/never', '--config.total_steps=0'],
      env={**env(1), 'JAX_PLATFORMS': platforms, 'VIT_JAX_MALLOC': 'keep_freed',
           'GLIBC_TUNABLES': ''}, capture_output=True, text=True, timeout=300)
  on_tpu, on_cpu = run('tpu'), run('cpu')
  assert 'XLA:CPU: malloc keep_freed' in on_cpu.stderr
  assert 'XLA:CPU: malloc' not in on_tpu.stderr
  assert on_tpu.returncode != 0  # No TPU here: jax says so.


def _lowered_text(devices):
  mesh = jax.make_mesh((len(devices),), ('x',), devices=devices)
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  f = cpu_backend.lowered_for_cpu(lambda x: x * 3., lambda x: x * 5.)
  arg = jax.ShapeDtypeStruct((4,), jnp.float32, sharding=sharding)
  return jax.jit(f).lower(arg).compile().as_text()


def test_lowered_for_cpu_picks_by_the_compilation_platform():
  assert jax.jit(cpu_backend.lowered_for_cpu(lambda x: x * 3., lambda x: x * 5.))(
      jnp.ones(2)).tolist() == [3., 3.]
  if importlib.util.find_spec('libtpu') is None:
    pytest.skip('compiling for a TPU needs libtpu')
  # This process's backend is the CPU; a program compiled for a TPU takes the other branch.
  text = _lowered_text(accelerators.tpu_slice('v3-8').compile_devices()[:1])
  assert 'constant(5)' in text and 'constant(3)' not in text
