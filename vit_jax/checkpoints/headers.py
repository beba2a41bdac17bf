"""A checkpoint file's first bytes and header, read without jax: a damaged or partial file is
one line before a command starts jax (``vit_jax.main``'s ``config.init_from``), and again where
the file is read (``formats.release``, ``formats.hub``)."""

from __future__ import annotations

import json
import os
import zipfile
import zlib

from etils import epath

from vit_jax.base import errors, paths
from vit_jax.checkpoints.hf_hub import WEIGHTS

_ZIP_MAGIC, _NPY_MAGIC = b'PK\x03\x04', b'\x93NUMPY'


def unreadable_npz(path: str | os.PathLike, e: Exception) -> errors.CheckpointError:
  """The one line of a .npz file numpy cannot read (``e``: why)."""
  what = ('holds Python objects (pickled), which a checkpoint never has' if 'pickle' in str(e)
          else f'is damaged ({type(e).__name__}: {e})')
  return errors.CheckpointError(f'{path} is not a .npz checkpoint numpy can read: it {what}. '
                                'Release checkpoints are .npz archives of float32 arrays; '
                                'download it again.')


def check_npz(path: str | os.PathLike) -> None:
  """Its first bytes are a zip archive's (not a single .npy array's) and its zip directory
  reads: a ``CheckpointError`` where not."""
  try:
    with paths.path(path).open('rb') as f:
      magic = f.read(len(_NPY_MAGIC))
      if magic.startswith(_NPY_MAGIC):
        raise errors.CheckpointError(f'{path} is not a .npz checkpoint: it holds a single array '
                                     '(a .npy file), not a named archive of arrays.')
      if not magic.startswith(_ZIP_MAGIC):
        raise errors.CheckpointError(
            f'{path} is not a .npz checkpoint: it does not begin as a zip archive does (a '
            'damaged or partial download, or another kind of file). Download it again.')
      f.seek(0)
      zipfile.ZipFile(f).namelist()  # The directory, at the file's end: a partial file's lacks.
  except errors.UserError:
    raise
  except (ValueError, zipfile.BadZipFile, EOFError, zlib.error) as e:
    raise unreadable_npz(path, e) from None
  except Exception as e:
    if paths.filesystem_error(e):
      raise paths.unreachable(path, e) from None
    raise


def check_safetensors(path: epath.Path) -> None:
  """A .safetensors file's length is what its header says (8 bytes, the header, the tensors)."""
  size, end = path.stat().length, None
  with path.open('rb') as f:
    length = int.from_bytes(f.read(8), 'little')
    try:
      header = json.loads(f.read(length)) if length < size else {}
      end = 8 + length + max((t['data_offsets'][1] for k, t in header.items()
                              if k != '__metadata__'), default=0)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
      pass
  if end != size:
    raise errors.CheckpointError(f'{path} is not a safetensors file: its header does not '
                                 'describe its bytes (a damaged or partial download, or '
                                 'another kind of file). Download it again.')


def check_file(source: str, field: str) -> None:
  """``check_npz`` of a local .npz file, ``check_safetensors`` of a local folder's
  model.safetensors, named by the config ``field`` (``config.init_from``); anything else (a
  workdir, sharded weights, a big_vision folder, a bucket) is read where it is used."""
  path = epath.Path(source)
  try:
    if source.endswith('.npz') and '://' not in source and path.is_file():
      check_npz(path)
    elif '://' not in source and (path / WEIGHTS).is_file():
      check_safetensors(path / WEIGHTS)
  except errors.UserError as e:
    raise type(e)(f'config.{field}: {e}') from None
