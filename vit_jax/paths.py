"""Paths wherever users keep their files: local, ``gs://``, and the other filesystems of gfile.

etils epath is the project's one filesystem layer. A local path goes to the os; a
``gs://`` path (and ``s3://``, ``az://``, ``hf://``) to TensorFlow's ``tf.io.gfile``,
which epath picks whenever TensorFlow is installed (it is a dependency here; its gfile
reads ``gs://`` itself, with the machine's Google credentials or anonymously for a public
bucket such as ``gs://vit_models``; ``s3://`` and the others need a gfile plugin). Without
TensorFlow (or with ``EPATH_USE_TF=false``) epath reads them with fsspec, which needs
``gcsfs`` for ``gs://``.
``os.path`` and ``open`` see none of these, so every file the user names is opened and
checked through here (or ``epath.Path``), never through them.

This module adds two schemes epath does not know:

* ``ram://``: TensorFlow's in-memory filesystem, through the same gfile backend as
  ``gs://``. It holds nothing across processes; it is the non-local filesystem the tests
  read and write release files on, since this project's machine has no network.
* ``file://`` URIs: the local path they name.

and the checks that refuse a missing file before any heavy start-up, with a remote
filesystem's failures (no network, no credentials, no permission) as one user error.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from etils import epath
from etils.epath import backend as epath_backend
from etils.epath import gpath

from vit_jax import errors

RAM = 'ram://'
FILE = 'file://'


def _ram_parts(parts: tuple[Any, ...]) -> tuple[Any, ...]:
  """'ram://a/b' -> '/ram/a/b': the root form epath gives 'gs://' (``gpath._process_parts``)."""
  full = '/'.join(os.fspath(p) for p in parts)
  return (full.replace(RAM, '/ram/', 1),) if full.startswith(RAM) else parts


@epath.register_path_cls(RAM)
class RamPath(gpath.PosixGPath):
  """A ``ram://`` path: TensorFlow's in-memory filesystem through epath's gfile backend."""

  if sys.version_info < (3, 12):

    def __new__(cls, *parts: Any) -> RamPath:
      return super().__new__(cls, *_ram_parts(parts))

  else:

    def __init__(self, *parts: Any) -> None:
      super().__init__(*_ram_parts(parts))

  @property
  def _uri_scheme(self) -> str | None:
    return 'ram' if self.parts[:2] == ('/', 'ram') else None

  @property
  def _backend(self) -> epath_backend.Backend:
    return epath_backend.tf_backend


def path(p: str | os.PathLike) -> epath.Path:
  """``p`` as an epath path (``file://`` URIs as their local path)."""
  if isinstance(p, str) and p.startswith(FILE):
    p = p[len(FILE):]
    if not p.startswith('/'):
      raise errors.ConfigError(f'{FILE}{p} is not an absolute file:// URI: write '
                               f'{FILE}/ABSOLUTE/PATH or the plain path.')
  return epath.Path(p)


def is_remote(p: str | os.PathLike) -> bool:
  """Whether ``p`` is on a filesystem that ``os.path`` cannot see (a ``scheme://`` URI)."""
  return '://' in os.fspath(p) and not os.fspath(p).startswith(FILE)


def filesystem_error(e: BaseException) -> bool:
  """Whether ``e`` is the filesystem's (an ``OSError`` or TensorFlow gfile's ``OpError``)."""
  if isinstance(e, OSError):
    return True
  tf = sys.modules.get('tensorflow')  # Only gfile raises these, so it is imported already.
  op_error = getattr(getattr(tf, 'errors', None), 'OpError', None)
  return op_error is not None and isinstance(e, op_error)


def unreachable(p: str | os.PathLike, e: BaseException) -> errors.MissingFileError:
  """A filesystem's failure to answer about ``p`` as a user error naming what to check."""
  reason = ' '.join(str(getattr(e, 'message', '') or e).split()) or type(e).__name__
  hint = ''
  if os.fspath(p).startswith('gs://'):
    hint = (' Check the network and the Google credentials (gcloud auth application-default '
            'login), or copy the file here first (gcloud storage cp).')
  return errors.MissingFileError(f'cannot read {p}: {reason}.{hint}')


def _ask(p: str | os.PathLike, question: str) -> bool:
  try:
    p = path(p)
    # exists() first: gfile's isdir answers False, not an error, where it cannot reach.
    return p.exists() and (question == 'exists' or getattr(p, question)())
  except errors.UserError:
    raise
  except ImportError as e:  # No backend for the scheme: TensorFlow absent, no fsspec plugin.
    if not is_remote(p):
      raise
    raise errors.MissingFileError(
        f'cannot read {p}: no filesystem for it is installed ({e}). gs:// is read by '
        'TensorFlow (pip install tensorflow-cpu) or by gcsfs (pip install gcsfs).') from None
  except Exception as e:  # Narrowed to the filesystem's errors below; others are bugs.
    if filesystem_error(e):
      raise unreachable(p, e) from None
    raise


def exists(p: str | os.PathLike) -> bool:
  """``path(p).exists()``; an unreachable filesystem is a ``MissingFileError``."""
  return _ask(p, 'exists')


def is_file(p: str | os.PathLike) -> bool:
  """``path(p).is_file()``; an unreachable filesystem is a ``MissingFileError``."""
  return _ask(p, 'is_file')


def is_dir(p: str | os.PathLike) -> bool:
  """``path(p).is_dir()``; an unreachable filesystem is a ``MissingFileError``."""
  return _ask(p, 'is_dir')


def read_bytes(p: str | os.PathLike, what: str = 'file') -> bytes:
  """The bytes of a file, or a ``MissingFileError`` naming it (missing or unreadable)."""
  if not is_file(p):
    raise errors.MissingFileError(f'cannot read {what} {p}: no such file.')
  try:
    return path(p).read_bytes()
  except Exception as e:
    if filesystem_error(e):
      raise unreachable(p, e) from None
    raise
