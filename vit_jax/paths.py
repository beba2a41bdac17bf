"""The paths a command line names, checked before any heavy start-up.

A workdir that cannot be written, or an input that is not there, is found out here, in a
fraction of a second and as one ``error:`` line (``vit_jax.errors``), instead of as a
traceback after jax, TensorFlow and the data pipeline have started. Only the standard
library is imported. Remote paths (``gs://bucket/...``: any ``SCHEME://``) are left to the
file system layer that opens them later.
"""

from __future__ import annotations

import os
import tempfile

from vit_jax import errors


def is_remote(path: str) -> bool:
  """Whether ``path`` names a remote file system (``gs://``, ``s3://``, ...)."""
  return '://' in path


def output_dir(path: str | None, flag: str = 'workdir') -> str:
  """``path``, created if needed, as a folder this process can write into; else a
  ``PathError`` (or ``ConfigError`` where the flag is missing) naming the flag and the fix."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: a folder to write into.')
  if is_remote(path):
    return path
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.PathError(f'--{flag}={path} is a file, not a folder: name a folder (it is '
                           'created if it does not exist).')
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):  # Write access, also on a read-only file system.
      pass
  except OSError as e:
    raise errors.PathError(f'--{flag}={path} cannot be written ({e.strerror or e}): name a '
                           'folder you can write into.') from None
  return path


def output_file(path: str | None, flag: str) -> str:
  """``path`` as a file this process can write: not a folder, in a folder that exists or can
  be created and written."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: the file to write.')
  if is_remote(path):
    return path
  if os.path.isdir(path):
    raise errors.PathError(f'--{flag}={path} is a folder: name the file to write.')
  output_dir(os.path.dirname(os.path.abspath(path)), flag)
  return path


def input_path(path: str | None, flag: str, what: str = 'file or folder') -> str:
  """``path``, which must exist (a ``MissingFileError`` naming the flag otherwise)."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: the {what} to read.')
  if not is_remote(path) and not os.path.exists(path):
    raise errors.MissingFileError(f'--{flag}={path} does not exist: name an existing {what}.')
  return path
