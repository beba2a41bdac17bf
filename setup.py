"""The Python version check, before pip resolves anything (pyproject.toml holds the rest).

pip checks ``requires-python`` only after resolving the dependencies, so on Python 3.10
it reports "No matching distribution found for orbax-checkpoint>=0.12.8" instead of the
version. This runs first, when pip prepares the package's metadata.
"""

import sys

MINIMUM = (3, 11)  # pyproject.toml's requires-python; tests/test_install.py checks both agree.

if sys.version_info < MINIMUM:
  sys.exit(f'error: vit_jax needs Python >= {MINIMUM[0]}.{MINIMUM[1]} (jax, flax, '
           f'orbax-checkpoint and grain do); this is Python {sys.version.split()[0]}. Make the '
           f'virtual environment with python{MINIMUM[0]}.{MINIMUM[1]} or newer: '
           f'python{MINIMUM[0]}.{MINIMUM[1]} -m venv .venv')

from setuptools import setup  # noqa: E402

setup()
