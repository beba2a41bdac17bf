"""Test set-up: eight simulated CPU devices, and the shared real data when present."""

import atexit
import os
import pathlib
import shutil
import subprocess
import tempfile

# Must happen before jax is imported anywhere.
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The CPU peak that MFU is measured against is kept per machine (vit_jax.training.mfu): the tests
# measure theirs under their own load into a folder of their own, never the user's cache.
os.environ['XDG_CACHE_HOME'] = tempfile.mkdtemp(prefix='vit_jax_test_cache_')
# The tests compile the same small programs many times, in this process and in the runs it
# starts (they inherit the environment): jax's persistent compilation cache, for the session,
# compiles each once. The same program gives the same executable: results are unchanged.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='vit_jax_test_jit_')
  atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], True)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / 'shared' / 'data'


@pytest.fixture
def shared_data() -> pathlib.Path:
  """../shared/data, or a skip when this checkout has none beside it."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f'real data not found at {SHARED_DATA} (only the project machines have it)')
  return SHARED_DATA


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory) -> pathlib.Path:
  """A workdir trained by the tiny recipe (class token; 10 steps, checkpoints 5 and 10).

  Shared by the tests that read a run back (fine-tuning, export, predict, inspect):
  one in-process training instead of one per test file.
  """
  from vit_jax import main

  from runs import TINY_RUN, tiny_config

  directory = tmp_path_factory.mktemp('tiny_run')
  main.train_and_evaluate(tiny_config(**TINY_RUN), str(directory))
  return directory


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
  """An empty Hugging Face cache (HF_HOME) used offline (HF_HUB_OFFLINE=1); call the fixture
  with (repo_id, folder) to put a folder in it. huggingface_hub reads its environment when
  imported, so its constants are set too, for this process."""
  from huggingface_hub import constants

  from runs import hub_cache

  home = tmp_path / 'hf_home'
  monkeypatch.setenv('HF_HOME', str(home))
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(home / 'hub'))
  monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
  return lambda repo_id, folder: hub_cache(home / 'hub', repo_id, folder)


@pytest.fixture
def small_disk(tmp_path):
  """A 32 MiB tmpfs mounted at tmp_path/disk (skips where mounting is not permitted)."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  mount = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=32m', 'tmpfs', str(disk)],
                         capture_output=True, text=True)
  if mount.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {mount.stderr.strip()}')
  yield disk
  subprocess.run(['umount', str(disk)], check=True)


# The files whose tests take longest, started first: the workers (a file each, pytest-xdist's
# --dist=loadfile) then end together instead of one finishing them alone.
LONGEST_FIRST = ('test_main.py', 'test_faults.py', 'test_benchmarks.py', 'test_aot.py',
                 'test_step.py', 'test_models.py', 'test_sweep.py', 'test_vtab.py')


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: else as before.
