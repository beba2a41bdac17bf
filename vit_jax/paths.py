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
  """``path`` as a folder this process can write into, or create (nothing is created
  here); else a ``PathError`` (or ``ConfigError`` where the flag is missing) naming the flag
  and the fix."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: a folder to write into.')
  if is_remote(path):
    return path
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.PathError(f'--{flag}={path} is a file, not a folder: name a folder (it is '
                           'created if it does not exist).')
  _writable(path, path, flag)
  return path


def output_path(path: str | None, flag: str, folder: bool = False) -> str:
  """``path`` as a file (or, ``folder``, a folder) to be written there: in a folder that
  exists or can be created, and can be written; not a folder where a file is asked for."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: the {"folder" if folder else "file"} '
                             'to write.')
  if is_remote(path):
    return path
  if not folder and os.path.isdir(path):
    raise errors.PathError(f'--{flag}={path} is a folder: name the file to write.')
  if folder and os.path.exists(path) and not os.path.isdir(path):
    raise errors.PathError(f'--{flag}={path} is a file: name a folder to write.')
  _writable(os.path.dirname(os.path.abspath(path)), path, flag)
  return path


def _writable(folder: str, path: str, flag: str) -> None:
  """``folder``, or the nearest of its parents that exists where it does not (it would be
  created there), written to once: which also finds a read-only file system, where the
  permission bits say nothing for root."""
  existing = os.path.abspath(folder)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise errors.PathError(f'--{flag}={path} cannot be created: {existing} is a file.')
  try:
    with tempfile.TemporaryFile(dir=existing):
      pass
  except OSError as e:
    raise errors.PathError(f'--{flag}={path} cannot be written ({e.strerror or e}): name a '
                           'place you can write into.') from None


def input_path(path: str | None, flag: str, what: str = 'file or folder') -> str:
  """``path``, which must exist (a ``MissingFileError`` naming the flag otherwise)."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: the {what} to read.')
  if not is_remote(path) and not os.path.exists(path):
    raise errors.MissingFileError(f'--{flag}={path} does not exist: name an existing {what}.')
  return path


def input_files(files: list[str], what: str = 'image files', every: bool = True) -> list[str]:
  """``files``, each of which must exist (a ``MissingFileError`` naming the missing ones);
  ``every=False``: at least one (a tool that reports each missing file and goes on)."""
  missing = [f for f in files if not is_remote(f) and not os.path.exists(f)]
  if missing and (every or len(missing) == len(files)):
    raise errors.MissingFileError(f'{", ".join(missing[:5])}{" ..." if len(missing) > 5 else ""} '
                                  f'{"does" if len(missing) == 1 else "do"} not exist: name '
                                  f'{what} that exist.')
  return files


def run_dir(path: str | None, flag: str = 'workdir') -> str:
  """``path`` as the workdir of a ``vit_jax.main`` run: a folder with ``checkpoints/``
  (``vit_jax.workdir``'s layout)."""
  input_path(path, flag, 'workdir of a vit_jax.main run')
  if not is_remote(path) and not os.path.isdir(os.path.join(path, 'checkpoints')):
    raise errors.MissingFileError(f'--{flag}={path} is not the workdir of a vit_jax.main run '
                                  '(no checkpoints/ in it): train there first, or name the '
                                  'run\'s --workdir.')
  return path
