"""What vit_jax does only for XLA:CPU stays behind vit_jax.base.cpu's checks."""

import importlib.util
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from vit_jax.base import cpu

from runs import env
from tpu_probe import probe


@pytest.mark.parametrize('environ, on_cpu', [
    ({'JAX_PLATFORMS': 'cpu'}, True),
    ({'JAX_PLATFORMS': 'tpu'}, False),
    ({'JAX_PLATFORMS': 'cuda,cpu'}, False),
    ({'JAX_PLATFORM_NAME': 'cpu'}, True),
    ({}, True),  # This machine: no accelerator that a jax plugin drives.
])
def test_runs_on_cpu(environ, on_cpu):
  assert cpu.runs_on_cpu(environ) is on_cpu


@pytest.mark.slow
def test_an_accelerator_run_is_not_re_executed(tmp_path):
  # vit_jax.main re-executes a CPU run with glibc tunables (vit_jax.base.cpu.host_memory); on a
  # TPU or GPU it must not: there the process's first word is jax's own error here. The
  # malloc line goes to the workdir's log file only (which a run of one step writes).
  def run(platforms):
    (tmp_path / platforms).mkdir()
    done = subprocess.run(
        [sys.executable, '-m', 'vit_jax.main', '--config=configs/quickstart.py',
         f'--workdir={tmp_path / platforms}', '--config.total_steps=1',
         '--config.schedule.warmup_steps=0'],
        env={**env(1), 'JAX_PLATFORMS': platforms, 'VIT_JAX_MALLOC': 'keep_freed',
             'GLIBC_TUNABLES': ''}, capture_output=True, text=True, timeout=300)
    log = tmp_path / platforms / 'log.txt'
    return done, log.read_text() if log.exists() else ''
  (on_tpu, tpu_log), (on_cpu, cpu_log) = run('tpu'), run('cpu')
  assert 'XLA:CPU: malloc keep_freed' in cpu_log and 'malloc' not in on_cpu.stderr
  assert 'XLA:CPU: malloc' not in on_tpu.stderr + tpu_log
  assert on_tpu.returncode != 0  # No TPU here: jax says so.


@pytest.mark.slow
def test_lowered_for_cpu_picks_by_the_compilation_platform():
  assert jax.jit(cpu.lowered_for_cpu(lambda x: x * 3., lambda x: x * 5.))(
      jnp.ones(2)).tolist() == [3., 3.]
  if importlib.util.find_spec('libtpu') is None:
    pytest.skip('compiling for a TPU needs libtpu')
  # That process's backend is the CPU; a program compiled for a TPU takes the other branch.
  assert probe('lowered_for_cpu') == {'cpu_branch': False, 'other_branch': True}


def test_the_state_stays_replicated_over_cpu_devices_unless_asked():
  from vit_jax.training import plan as plan_lib

  from runs import tiny_config

  assert cpu.shards_state_by_default('tpu') and cpu.shards_state_by_default('gpu')
  assert not cpu.shards_state_by_default('cpu')
  for asked, stored in ((None, False), (True, True), (False, False)):
    assert plan_lib.validate(tiny_config(**{'mesh.shard_state': asked})).shard_state == stored
