"""Paths wherever users keep their files: local, ``gs://``, and the other filesystems of gfile.

etils epath is the project's one filesystem layer: a local path goes to the os, a ``gs://`` one
(``s3://``, ``az://``, ``hf://``) to TensorFlow's ``tf.io.gfile`` (without TensorFlow, or with
``EPATH_USE_TF=false``, to fsspec, which needs ``gcsfs``). ``os.path`` and ``open`` see none of
these, so every file a user names goes through here or ``epath.Path``. This module adds
``ram://`` (TensorFlow's in-memory filesystem: the tests' non-local filesystem) and ``file://``
URIs, the command lines' path flags (``DEFINE_path``: ``~`` and ``$VAR`` expanded, which a shell
leaves in ``--flag=~/x``) and their checks (``output_dir``, ``input_path``, ``run_dir``, ...): a
missing input or an unwritable workdir is one ``error:`` line before jax, TensorFlow and the data
start.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from absl import flags
from etils import epath
from etils.epath import backend as epath_backend
from etils.epath import gpath

from vit_jax.base import errors

RAM = 'ram://'
FILE = 'file://'
# What starts a URI (gs://, file://, hf-hub:ORG/NAME) rather than a local path.
_SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+-]*:')


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


def expand(p: Any) -> Any:
  """``p`` as a path a user typed, naming the same file wherever it is read: ``$VAR`` /
  ``${VAR}`` and a leading ``~`` expanded (a shell leaves them in ``--flag=~/x``), and a local
  path made absolute against the current folder (Orbax refuses a relative one, and config.json
  keeps it for commands run from elsewhere). A URI (``gs://``, ``file://``, ``hf-hub:``), and
  anything but a non-empty string, as it is."""
  if not isinstance(p, str) or not p:
    return p
  p = os.path.expandvars(p)
  return p if _SCHEME.match(p) else os.path.abspath(os.path.expanduser(p))


def absolute(p: str | os.PathLike) -> epath.Path:
  """``p`` as an epath path, absolute where it is local: what Orbax needs (it refuses a
  relative path, which a caller of the Python API may give)."""
  p = path(p)
  return p if is_remote(p) else epath.Path(os.path.abspath(p))


class _PathParser(flags.ArgumentParser):
  """absl's string flag, its value ``expand``-ed."""

  syntactic_help = 'a path (~ and $VAR are expanded; relative to the current folder)'

  def parse(self, argument: Any) -> Any:
    return expand(argument)

  def flag_type(self) -> str:
    return 'string'


def DEFINE_path(name: str, default: str | None, help_string: str,  # noqa: N802
                **kwargs: Any) -> flags.FlagHolder:
  """An absl string flag for a file or folder: its value ``expand``-ed (``~``, ``$VAR``,
  made absolute)."""
  return flags.DEFINE(_PathParser(), name, default, help_string,
                      serializer=flags.ArgumentSerializer(), **kwargs)


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


@contextlib.contextmanager
def atomic_files(*targets: str | os.PathLike) -> Iterator[list[epath.Path]]:
  """A temporary beside each of ``targets`` (``.NAME.tmp-PID``) for the caller to write: once
  all are written, each is renamed onto its target (a reader sees the old files or the new, never
  a part); if any write fails, or the command is interrupted, every temporary is removed, and a
  failure of the filesystem (a full disk, a permission) is one ``errors.WriteError`` naming the
  cause, the file and the fix."""
  targets_ = [path(t) for t in targets]
  tmps = [t.parent / f'.{t.name}.tmp-{os.getpid()}' for t in targets_]
  folder = targets_[0].parent
  created = not folder.exists()
  try:
    folder.mkdir(parents=True, exist_ok=True)
    yield tmps
    for tmp, target in zip(tmps, targets_, strict=True):
      tmp.replace(target)
  except BaseException as e:
    for tmp in tmps:
      with contextlib.suppress(Exception):
        tmp.unlink(missing_ok=True)
    if created:  # The folder made for them, empty again.
      with contextlib.suppress(Exception):
        folder.rmdir()
    if isinstance(e, Exception) and not isinstance(e, errors.UserError) and filesystem_error(e):
      cause, fix = errors.write_failure(e, run=False)
      name = targets_[0] if len(targets_) == 1 else targets_[0].parent
      raise errors.WriteError(f'Writing {name} failed: {cause}. Nothing was written there: '
                              f'{fix}, then run the same command again.') from None
    raise


def local(p: str | os.PathLike) -> str:
  """A local path as the os names it (a ``file://`` URI as its path)."""
  return os.fspath(path(p)) if os.fspath(p).startswith(FILE) else os.fspath(p)


def output_dir(path: str | None, flag: str = 'workdir') -> str:
  """``path`` as a folder this process can write into, or create (nothing is created
  here); else a ``PathError`` (or ``ConfigError`` where the flag is missing) naming the flag
  and the fix."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: a folder to write into.')
  if is_remote(path):
    return path
  path = local(path)
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
  path = local(path)
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
  if not is_remote(path) and not os.path.exists(local(path)):
    raise errors.MissingFileError(f'--{flag}={path} does not exist: name an existing {what}.')
  return path


def input_files(files: list[str], what: str = 'image files', every: bool = True) -> list[str]:
  """``files``, each of which must exist (a ``MissingFileError`` naming the missing ones);
  ``every=False``: at least one (a tool that reports each missing file and goes on)."""
  missing = [f for f in files if not is_remote(f) and not os.path.exists(local(f))]
  if missing and (every or len(missing) == len(files)):
    raise errors.MissingFileError(f'{", ".join(missing[:5])}{" ..." if len(missing) > 5 else ""} '
                                  f'{"does" if len(missing) == 1 else "do"} not exist: name '
                                  f'{what} that exist.')
  return files


def run_dir(path: str | None, flag: str = 'workdir') -> str:
  """``path`` as the workdir of a ``vit_jax.main`` run: a folder with ``checkpoints/``
  (``vit_jax.checkpoints.run.workdir``'s layout)."""
  input_path(path, flag, 'workdir of a vit_jax.main run')
  if not is_remote(path) and not os.path.isdir(os.path.join(local(path), 'checkpoints')):
    raise errors.MissingFileError(f'--{flag}={path} is not the workdir of a vit_jax.main run '
                                  '(no checkpoints/ in it): train there first, or name the '
                                  'run\'s --workdir.')
  return path
