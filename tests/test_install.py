"""The install's Python version guard: setup.py refuses an old Python before pip resolves."""

import glob
import os
import re
import shutil
import subprocess
import tomllib

import pytest

from runs import ROOT


def _setup_minimum() -> tuple[int, int]:
  match = re.search(r'^MINIMUM = \((\d+), (\d+)\)', (ROOT / 'setup.py').read_text(), re.M)
  return int(match[1]), int(match[2])


def test_setup_guard_and_requires_python_agree():
  project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
  major, minor = _setup_minimum()
  assert project['requires-python'] == f'>={major}.{minor}'
  # The ruff target is the lowest supported Python too.
  tool = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['ruff']
  assert tool['target-version'] == f'py{major}{minor}'


@pytest.mark.slow
def test_an_older_python_is_refused_with_one_message():
  major, minor = _setup_minimum()
  version = f'{major}.{minor - 1}'
  found = [shutil.which(f'python{version}'),
           *sorted(glob.glob(os.path.expanduser(f'~/.pyenv/versions/{version}.*/bin/python3')))]
  older = next((p for p in found if p and subprocess.run(
      [p, '--version'], capture_output=True).returncode == 0), None)
  if older is None:
    pytest.skip(f'no python{version} on this machine')
  done = subprocess.run([older, 'setup.py', '--name'], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)
  assert done.returncode == 1
  assert done.stderr.startswith(f'error: vit_jax needs Python >= {major}.{minor} '), done.stderr
  assert len(done.stderr.splitlines()) == 1
  # This Python passes the guard (setuptools reads the rest from pyproject.toml).
  import sys
  ok = subprocess.run([sys.executable, 'setup.py', '--name'], cwd=ROOT, capture_output=True,
                      text=True, timeout=120)
  assert ok.returncode == 0 and ok.stdout.strip().splitlines()[-1] == 'vit_jax', ok.stderr
