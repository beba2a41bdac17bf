"""NaViT packing (Dehghani et al., 2023, "Patch n' Pack"): several images' patch sequences in
one sequence of a fixed token budget.

The input is patch sequences as ``preprocess.naflex`` makes them (``PATCH_KEYS``: patches,
coordinates, mask, grid; each image padded to its own budget). A packed row takes the
images of a fixed group of ``images_per_row`` consecutive examples, greedily: each in turn
if its patches fit in what is left of ``seq_len`` tokens, else it is dropped (NaViT drops
what overflows). So a packed batch is a function of its images alone, and the loader's
batches stay a function of the step (exact resume, any number of processes): packed row r
holds examples r * images_per_row ... (r + 1) * images_per_row - 1 of the unpacked batch.

A packed row (``PACKED_KEYS``), shapes fixed for the compiler:

* ``image`` (seq_len, p*p*3): the kept images' patches one after the other, zeros after;
* ``patch_coords`` (seq_len, 2) int32: each patch's (row, column) in its own image's grid;
* ``patch_mask`` (seq_len,) bool: True for an image's patch, False for padding;
* ``segment_ids`` (seq_len,) int32: k + 1 for the patches of the row's k-th image slot, 0 for
  padding (attention within a segment only; pooling per segment);
* ``patch_grid`` (images_per_row, 2) int32: each slot's grid (0, 0 for an empty slot);
* ``image_mask`` (images_per_row,) bool: the slot holds an image (False: a padding image,
  out of the loss and the metrics);
* ``label`` (images_per_row, classes): each slot's label (zeros for an empty slot).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

PACKED_KEYS = ('image', 'patch_coords', 'patch_mask', 'segment_ids', 'patch_grid',
               'image_mask', 'label')


@dataclasses.dataclass(frozen=True)
class Packing:
  """Packed rows of ``seq_len`` tokens, each from ``images_per_row`` consecutive images."""

  images_per_row: int
  seq_len: int

  def __post_init__(self):
    for name in ('images_per_row', 'seq_len'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'Packing: {name}={value!r} must be a positive int.')


def pack_row(images: Mapping[str, np.ndarray], labels: np.ndarray, seq_len: int
             ) -> dict[str, np.ndarray]:
  """One packed row (``PACKED_KEYS``) of k patch sequences (``images``: each key's arrays
  stacked, (k, ...), as the loader batches ``naflex``'s output) and their (k, classes)
  ``labels``: each image in turn if its patches fit in what ``seq_len`` has left, else
  dropped."""
  count = len(labels)
  lengths = np.asarray(images['patch_mask']).sum(axis=1)
  patches, coords = np.asarray(images['image']), np.asarray(images['patch_coords'])
  row = {'image': np.zeros((seq_len, patches.shape[-1]), patches.dtype),
         'patch_coords': np.zeros((seq_len, 2), np.int32),
         'patch_mask': np.zeros(seq_len, bool),
         'segment_ids': np.zeros(seq_len, np.int32),
         'patch_grid': np.zeros((count, 2), np.int32),
         'image_mask': np.zeros(count, bool),
         'label': np.zeros(np.shape(labels), np.float32)}
  used = slot = 0
  for i in range(count):
    n = int(lengths[i])
    if used + n > seq_len:
      continue  # Dropped: it does not fit in what is left.
    # naflex puts an image's patches first: its first n rows are its patches.
    row['image'][used:used + n] = patches[i, :n]
    row['patch_coords'][used:used + n] = coords[i, :n]
    row['patch_mask'][used:used + n] = True
    row['segment_ids'][used:used + n] = slot + 1
    row['patch_grid'][slot] = images['patch_grid'][i]
    row['image_mask'][slot] = True
    row['label'][slot] = labels[i]
    used += n
    slot += 1
  return row


def pack(batch: Mapping[str, np.ndarray], packing: Packing) -> dict[str, np.ndarray]:
  """A batch of B patch sequences (``naflex``'s keys and ``label``, each (B, ...)) as
  B / images_per_row packed rows: row r from examples r * images_per_row onwards."""
  k = packing.images_per_row
  size = len(batch['label'])
  if size % k:
    raise ValueError(f'A batch of {size} images does not split into rows of '
                     f'images_per_row={k}.')
  if 'patch_mask' not in batch:
    raise ValueError('Packing takes patch sequences: end the preprocessing with naflex(...) '
                     '(and a scaling).')
  rows = [pack_row({key: batch[key][r * k:(r + 1) * k] for key in batch if key != 'label'},
                   batch['label'][r * k:(r + 1) * k], packing.seq_len)
          for r in range(size // k)]
  return {key: np.stack([row[key] for row in rows]) for key in PACKED_KEYS}
