"""big_vision's tensorstore checkpoints (``big_vision.utils.save_checkpoint_ts``), read.

big_vision's trainer keeps ``WORKDIR/checkpoint.bv-LAST`` (the name of the current step's
folder) and ``WORKDIR/checkpoint.bv-{step:09d}/``, one zarr array per leaf of its train state,
named by the leaf's path with ``~`` for ``/`` (``params~embedding~kernel``, ``opt~...``).
Only the ``params~`` arrays are read, with tensorstore; their names and layout are those of
big_vision's .npz files, which ``release`` maps onto the release layout.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from vit_jax.base import errors, paths
from vit_jax.checkpoints import release

PREFIX = 'checkpoint.bv'
LAST = '-LAST'


def step_folder(path: str | os.PathLike, step: int | None = None) -> str | None:
  """The step folder of a big_vision checkpoint: ``path`` a workdir holding
  ``checkpoint.bv-LAST``, the ``WORKDIR/checkpoint.bv`` prefix big_vision's own loader takes,
  or a step folder itself; None where ``path`` is none of them. ``step``: that step's folder
  instead of the last one."""
  root = paths.path(path)
  for prefix in (root / PREFIX, root):
    last = prefix.parent / (prefix.name + LAST)
    if paths.is_file(last):
      name = f'{step:09d}' if step is not None else last.read_text().strip()
      folder = prefix.parent / f'{prefix.name}-{name}'
      if not paths.is_dir(folder):
        raise errors.MissingFileError(f'{path}: the big_vision checkpoint folder {folder} is '
                                      'missing.')
      return str(folder)
  if paths.is_dir(root) and any(p.name.startswith('params~') for p in root.iterdir()):
    return str(root)
  return None


def _open(folder: Any) -> np.ndarray:
  import tensorstore as ts

  location = str(folder)
  kvstore = location if paths.is_remote(location) else {'driver': 'file', 'path': location}
  return ts.open({'driver': 'zarr', 'kvstore': kvstore}, open=True).result().read().result()


def read_params(path: str | os.PathLike, step: int | None = None) -> dict[str, np.ndarray]:
  """The ``params`` of a big_vision tensorstore checkpoint in the flat release layout."""
  folder = step_folder(path, step)
  if folder is None:
    raise errors.CheckpointError(f'{path} is not a big_vision tensorstore checkpoint (no '
                                 f'{PREFIX}{LAST} and no params~ arrays).')
  flat = {}
  try:
    for entry in paths.path(folder).iterdir():
      if entry.name.startswith('params~'):
        flat[entry.name.replace('~', '/')] = np.asarray(_open(entry))
  except ValueError as e:  # tensorstore's errors: a damaged or partial array.
    raise errors.CheckpointError(f'{folder}: an array cannot be read ({e}).') from None
  return release.canonical(flat, folder)
