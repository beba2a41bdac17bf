"""vit_jax.base.platforms: jax kept off an installed libtpu where no TPU is attached, before jax
starts; the user's JAX_PLATFORMS left alone."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from vit_jax.base import platforms

ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_libtpu_and_no_tpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None or platforms.has_tpu(),
    reason='needs libtpu installed (the [tpu] extra) and no TPU attached')
# libtpu's start-up lines where it finds no TPU (libtpu 0.0.52: "could not determine TPU
# accelerator type", "INVALID_ARGUMENT: ... TPU_WORKER_HOSTNAMES", ...).
LIBTPU_SIGNS = ('TPU', 'libtpu', 'INVALID_ARGUMENT', 'InitGoogle')


def fake_root(tmp_path, pci=(), dev=()):
  """A file system root with PCI devices ((vendor, device) ids) and /dev files."""
  for i, (vendor, device) in enumerate(pci):
    folder = tmp_path / 'sys' / 'bus' / 'pci' / 'devices' / f'0000:00:0{i}.0'
    folder.mkdir(parents=True)
    (folder / 'vendor').write_text(vendor + '\n')
    (folder / 'device').write_text(device + '\n')
  for name in dev:
    path = tmp_path / name.lstrip('/')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('')
  return str(tmp_path)


@pytest.mark.parametrize('pci, dev, tpu', [
    ((), (), False),
    ((('0x1ae0', '0x0042'),), (), False),  # Google's gVNIC network card: no TPU.
    ((('0x8086', '0x0062'),), (), False),  # A TPU's device id from another vendor.
    ((('0x1ae0', '0x0062'),), (), True),   # TPU v5p, as jax's hardware_utils reads it.
    ((('0x1ae0', '0x005e'),), (), True),   # TPU v4.
    ((), ('/dev/accel0',), True),          # TPU VM v2-v4 device files.
    ((), ('/dev/vfio/0',), True),          # v5e and later.
    ((), ('/dev/vfio/vfio',), False),      # The vfio control file alone: no device.
])
def test_has_tpu_reads_the_pci_bus_and_device_files(tmp_path, pci, dev, tpu):
  assert platforms.has_tpu(fake_root(tmp_path, pci, dev)) is tpu


@pytest.mark.parametrize('environ', [
    {'JAX_PLATFORMS': 'tpu'}, {'JAX_PLATFORMS': ''}, {'JAX_PLATFORM_NAME': 'cpu'},
    {'JAX_FORCE_TPU_INIT': '1'}])
def test_the_users_choice_is_left_alone(tmp_path, environ):
  environ = dict(environ)
  assert platforms.choice(environ, fake_root(tmp_path)) is None
  before = dict(environ)
  platforms.pick(environ)
  assert environ == before


@needs_libtpu_and_no_tpu
def test_no_tpu_keeps_the_gpus_an_installed_plugin_drives(tmp_path, monkeypatch):
  root = fake_root(tmp_path / 'none')
  assert platforms.choice({}, root) == 'cpu'
  assert platforms.choice({}, fake_root(tmp_path / 'v6e', (('0x1ae0', '0x006f'),))) is None
  gpu_root = fake_root(tmp_path / 'gpu', dev=('/dev/nvidia0',))
  assert platforms.choice({}, gpu_root) == 'cpu'  # No CUDA plugin installed here.
  # With jax's CUDA plugin installed (not here: its module name stands in for it).
  monkeypatch.setattr(platforms, 'installed', lambda m: m in ('libtpu', 'jax_cuda12_plugin'))
  assert platforms.choice({}, gpu_root) == 'cuda,cpu'
  assert platforms.choice({}, root) == 'cpu'


def _run(code: str, **environ: str) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k not in platforms.USER_CHOICE}
  return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                        env={**env, 'PYTHONPATH': str(ROOT), **environ}, timeout=120)


# The README's snippet as a user's script: jax imported first, then vit_jax's models.
README_SNIPPET = ('import jax, jax.numpy as jnp\n'
                  'from vit_jax.models import get_model\n'
                  'print(jax.default_backend(), jnp.zeros((2, 3)).sum())\n')


@pytest.mark.slow
@needs_libtpu_and_no_tpu
@pytest.mark.parametrize('code', [
    README_SNIPPET,
    'import vit_jax, jax\nprint(jax.default_backend(), jax.numpy.zeros(3).sum())\n',
], ids=['jax-first', 'vit_jax-first'])
def test_with_libtpu_and_no_tpu_a_script_is_quiet_and_on_the_cpu(code):
  p = _run(code)
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == ['cpu', '0.0']
  assert not [line for line in p.stderr.splitlines()
              if any(sign in line for sign in LIBTPU_SIGNS)], p.stderr


@pytest.mark.slow
@needs_libtpu_and_no_tpu
def test_jax_own_choice_still_tries_libtpu():
  """JAX_PLATFORMS='' gives jax its own choice back: libtpu starts and prints its lines (what
  the tests above would see without vit_jax's pick)."""
  p = _run(README_SNIPPET, JAX_PLATFORMS='')
  assert p.returncode == 0, p.stderr
  assert [line for line in p.stderr.splitlines() if any(s in line for s in LIBTPU_SIGNS)]


@pytest.mark.slow
@needs_libtpu_and_no_tpu
def test_a_command_is_quiet():
  """A command that starts jax (the issue's: aot --topology=cpu compiles on this host)."""
  p = subprocess.run([sys.executable, '-m', 'vit_jax.tools.aot', '--config=configs/quickstart.py',
                      '--topology=cpu', '--config.model.num_layers=1',
                      '--config.model.hidden_size=32', '--config.model.mlp_dim=64',
                      '--config.batch_size=8', '--config.eval_batch_size=8'],
                     capture_output=True, text=True, cwd=ROOT, timeout=300,
                     env={**{k: v for k, v in os.environ.items()
                             if k not in platforms.USER_CHOICE}, 'PYTHONPATH': str(ROOT)})
  assert p.returncode == 0, p.stderr
  assert not [line for line in p.stderr.splitlines()
              if any(sign in line for sign in LIBTPU_SIGNS)], p.stderr
