"""Which of jax's backends a process may start, decided before jax starts any.

With libtpu installed (the ``tpu`` extra, for ``vit_jax.tools.aot``) and no TPU attached, jax's
start-up prints about six lines of libtpu errors that read as failures, then runs on the CPU.
``pick``, called by ``import vit_jax``, keeps jax off the TPU backend there: where the user set
``JAX_PLATFORMS`` (or ``JAX_PLATFORM_NAME``, ``JAX_FORCE_TPU_INIT``; even empty) it changes
nothing, nor where a TPU is attached or libtpu is absent; else ``JAX_PLATFORMS`` becomes this
host's GPUs that an installed plugin drives, then ``cpu`` (also in jax's config, if jax was
imported but has started no backend). Compiling for a TPU with none attached (``aot``) goes
through jax's topology API, which needs no backend.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Mapping, MutableMapping

ENV = 'JAX_PLATFORMS'
# Variables by which a user chose the platform (jax's, and jax's switch that forces libtpu).
USER_CHOICE = (ENV, 'JAX_PLATFORM_NAME', 'JAX_FORCE_TPU_INIT')

# jax's accelerator plugins (module names), and the device files of the accelerators they
# drive, per jax platform name.
TPU_MODULES = ('libtpu',)
TPU_FILES = ('/dev/accel*', '/dev/vfio/[0-9]*')
GPUS = (
    ('cuda', ('jax_cuda12_plugin', 'jax_cuda13_plugin', 'jax_plugins.xla_cuda12',
              'jax_plugins.xla_cuda13'), ('/dev/nvidia[0-9]*', '/dev/dxg')),
    ('rocm', ('jax_rocm60_plugin', 'jax_rocm7_plugin', 'jax_plugins.xla_rocm60',
              'jax_plugins.xla_rocm7'), ('/dev/kfd',)),
)
# Google's PCI vendor id and its TPUs' device ids (v3 .. TPU7x), as jax's
# hardware_utils.num_available_tpu_chips_and_device_id reads them.
_GOOGLE_PCI_VENDOR = '0x1ae0'
_TPU_PCI_DEVICES = ('0x0027', '0x0056', '0x005e', '0x0062', '0x0063', '0x006f', '0x0076')


def installed(module: str) -> bool:
  """Whether ``module`` can be imported (found without importing it)."""
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def read_text(path: str) -> str:
  """The text of a small system file (/sys, /proc); '' where it cannot be read."""
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ''


def has_tpu(root: str = '/') -> bool:
  """Whether a TPU is attached to this machine: a Google TPU on the PCI bus, or the device
  files libtpu opens (``root``: another file system root, for tests)."""
  join = lambda pattern: os.path.join(root, pattern.lstrip('/'))  # noqa: E731
  if any(glob.glob(join(p)) for p in TPU_FILES):
    return True
  for vendor in glob.glob(join('/sys/bus/pci/devices/*/vendor')):
    if (read_text(vendor).strip() == _GOOGLE_PCI_VENDOR and read_text(
        os.path.join(os.path.dirname(vendor), 'device')).strip() in _TPU_PCI_DEVICES):
      return True
  return False


def platforms_without_tpu(root: str = '/') -> str:
  """``JAX_PLATFORMS`` for this machine less the TPU backend: its GPUs that an installed
  plugin drives, then the CPU ('cuda,cpu', or 'cpu')."""
  join = lambda pattern: os.path.join(root, pattern.lstrip('/'))  # noqa: E731
  gpus = [name for name, modules, files in GPUS
          if any(map(installed, modules)) and any(glob.glob(join(p)) for p in files)]
  return ','.join([*gpus, 'cpu'])


def choice(environ: Mapping[str, str] | None = None, root: str = '/') -> str | None:
  """The ``JAX_PLATFORMS`` that ``pick`` sets here, or None where it leaves jax's choice."""
  environ = os.environ if environ is None else environ
  if any(name in environ for name in USER_CHOICE):
    return None
  if not any(map(installed, TPU_MODULES)) or has_tpu(root):
    return None
  return platforms_without_tpu(root)


def pick(environ: MutableMapping[str, str] | None = None) -> str | None:
  """Keeps jax off the TPU backend where this machine has no TPU and the user chose no
  platform (module docstring); returns the ``JAX_PLATFORMS`` set, or None."""
  environ = os.environ if environ is None else environ
  platforms = choice(environ)
  if platforms is None:
    return None
  environ[ENV] = platforms  # This process's jax if not imported yet, and its children.
  if 'jax' in sys.modules:  # Imported already: its config read the environment then.
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized() and not jax.config.jax_platforms:
      jax.config.update('jax_platforms', platforms)
  return platforms
