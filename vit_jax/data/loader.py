"""The loader: global shuffling, per-process shares, global sharded batches.

Training batches are a pure function of (seed, step): epoch ``e`` visits the examples in a
permutation keyed by (seed, e), computed index by index (a Feistel network: nothing the size of
the dataset is held), and example ``j`` of batch ``k`` is augmented with a generator seeded by
(seed, k, j). So the loader's whole state is the step: a resumed run sees exactly the batches of
an uninterrupted one, and 1 process x 8 devices the same global batches as 2 x 4. Each process
reads only the rows its devices hold, joined into one global ``jax.Array``. A pipeline's trailing
``value_range`` runs on the devices, so the host assembles and copies uint8 batches
(``local_batch`` returns them; multi-process XLA:CPU runs keep it on the host: ``_split``).
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from vit_jax.base import sharding as sharding_lib
from vit_jax.data import packing as packing_lib

Batch = dict[str, Any]


def _labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
  """Integer labels -> one-hot; multi-hot rows pass through. float32.

  ``num_classes=0`` (unlabelled data, or labels a self-supervised run ignores): zeros
  (n, 1), a placeholder; not (n, 0): JAX lays a zero-size array out on one device only,
  not split over the batch's.
  """
  if not num_classes:
    return np.zeros((len(labels), 1), np.float32)
  if labels.ndim == 2:
    return labels.astype(np.float32)
  # Scattered, not np.eye(num_classes)[labels]: that is 1.9 GB for ImageNet-21k.
  onehot = np.zeros((len(labels), num_classes), np.float32)
  onehot[np.arange(len(labels)), labels] = 1.
  return onehot


def permute(indices: np.ndarray, n: int, key: tuple[int, ...]) -> np.ndarray:
  """A keyed pseudo-random permutation of range(n), evaluated at ``indices``.

  A 4-round Feistel network on the smallest even number of bits that covers n,
  with cycle walking for values >= n: O(1) memory whatever n is.
  """
  bits = max(2, int(n - 1).bit_length())
  bits += bits % 2
  half, mask = bits // 2, np.uint64((1 << (bits // 2)) - 1)
  round_keys = np.random.default_rng(list(key)).integers(0, 2**63, 4, dtype=np.uint64)

  def feistel(x: np.ndarray) -> np.ndarray:
    left, right = x >> np.uint64(half), x & mask
    for k in round_keys:  # splitmix64-style mixing as the round function.
      f = (right ^ k) * np.uint64(0x9E3779B97F4A7C15)
      f ^= f >> np.uint64(31)
      f *= np.uint64(0xBF58476D1CE4E5B9)
      f ^= f >> np.uint64(29)
      left, right = right, left ^ (f & mask)
    return (left << np.uint64(half)) | right

  with np.errstate(over='ignore'):
    out = feistel(np.asarray(indices, np.uint64))
    while (outside := out >= n).any():
      out[outside] = feistel(out[outside])
  return out.astype(np.int64)


def process_rows(sharding: jax.sharding.Sharding, global_batch_size: int,
                 devices: Any = None) -> np.ndarray:
  """The rows of a global batch that a process's devices hold, in order.

  This process's devices by default. Processes whose devices hold the same rows (along
  a 'tensor' axis that spans hosts) read the same rows.
  """
  devices = sharding.addressable_devices if devices is None else set(devices)
  indices = sharding.devices_indices_map((global_batch_size,))
  rows = [np.arange(global_batch_size)[index[0]] for d, index in indices.items() if d in devices]
  return np.unique(np.concatenate(rows))


def _assemble(source: Any, preprocess: Callable, draws: list[tuple[int, np.random.Generator]],
              num_classes: int) -> Batch:
  """Example ``index`` of ``source`` preprocessed with ``rng``, for each (index, rng) of
  ``draws``, written into one batch array as it is made (no list, no stack copy); a patch
  sequence (``preprocess.naflex``: a dict of fixed shapes) into one array per key."""
  arrays, labels = None, []
  for j, (index, rng) in enumerate(draws):
    example = source[int(index)]
    out = preprocess(example['image'], rng)
    out = out if isinstance(out, dict) else {'image': out}
    if arrays is None:
      arrays = {k: np.empty((len(draws), *v.shape), v.dtype) for k, v in out.items()}
    for key, value in out.items():
      arrays[key][j] = value
    labels.append(example['label'])
  return {**arrays, 'label': _labels(np.stack(labels), num_classes)}


def to_global(local: Batch, sharding: jax.sharding.Sharding, global_batch_size: int) -> Batch:
  """Joins every process's rows into global arrays sharded over the batch axes."""
  return {k: jax.make_array_from_process_local_data(
      sharding, v, (global_batch_size,) + v.shape[1:]) for k, v in local.items()}


def _split(preprocess: Callable) -> tuple[Callable, Callable[[Batch], Batch]]:
  """(per-example host function, device function of the global batch).

  Multi-process runs on XLA:CPU keep the whole pipeline on the host: their steps wait
  for their inputs (``sharding.inputs_ready``), and an input that is the output of a
  scaling computation queued behind the previous step would make each step wait for
  the last one to finish, where a transferred batch is ready while it runs. (Their
  batches are host memory either way.)
  """
  if getattr(preprocess, 'affine', None) is None or sharding_lib.waits_for_inputs():
    return preprocess, lambda batch: batch
  return preprocess.host, _on_device(preprocess.on_device)


@functools.cache
def _on_device(fn: Callable) -> Callable[[Batch], Batch]:
  """``fn`` on the batch's images (a patch sequence's patches, with their mask), jitted once
  per pipeline (evaluation makes many loaders)."""
  def scaled(batch: Batch) -> Batch:
    mask = batch.get('patch_mask')
    return {**batch, 'image': fn(batch['image']) if mask is None else fn(batch['image'], mask)}
  return jax.jit(scaled)


def batch_shapes(pipeline: Any, size: int, image_size: tuple[int, int], num_classes: int,
                 packing: packing_lib.Packing | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """The arrays of a global batch of ``size`` examples as the step receives them (after the
  pipeline's scaling): images (``image_size``), or a ``naflex`` pipeline's patch sequences
  (``preprocess.PATCH_KEYS``), packed into ``size / images_per_row`` rows where ``packing``
  (``packing.PACKED_KEYS``); labels of ``num_classes`` (one-hot or multi-hot). For planning a
  run without its data (``vit_jax.tools.aot``, the benchmarks)."""
  f32, i32 = np.float32, np.int32
  op = pipeline.naflex
  if op is None:
    shapes = {'image': ((size, *image_size, 3), f32), 'label': ((size, num_classes), f32)}
  elif packing is None:
    n, d = op.max_num_patches, op.patch_size ** 2 * 3
    shapes = {'image': ((size, n, d), f32), 'patch_coords': ((size, n, 2), i32),
              'patch_mask': ((size, n), bool), 'patch_grid': ((size, 2), i32),
              'label': ((size, num_classes), f32)}
  else:
    k, n, d = packing.images_per_row, packing.seq_len, op.patch_size ** 2 * 3
    rows = size // k
    shapes = {'image': ((rows, n, d), f32), 'patch_coords': ((rows, n, 2), i32),
              'patch_mask': ((rows, n), bool), 'segment_ids': ((rows, n), i32),
              'patch_grid': ((rows, k, 2), i32), 'image_mask': ((rows, k), bool),
              'label': ((rows, k, num_classes), f32)}
  return {key: jax.ShapeDtypeStruct(shape, dtype) for key, (shape, dtype) in shapes.items()}


class TrainLoader:
  """Shuffled, augmented, endlessly repeating training batches.

  ``packing`` (NaViT, ``vit_jax.data.packing``; a ``naflex`` pipeline): each global batch of
  ``global_batch_size`` images is packed into ``global_batch_size / images_per_row`` rows
  of ``seq_len`` tokens, the rows sharded over the batch axes; a process reads the images of
  its rows only, so the batches stay a function of the step.
  """

  def __init__(self, source: Any, preprocess: Callable, *, global_batch_size: int, seed: int,
               sharding: jax.sharding.Sharding, num_classes: int, num_workers: int = 4,
               prefetch: int | None = None, process_index: int | None = None,
               process_count: int | None = None, repeats: int = 1,
               packing: packing_lib.Packing | None = None):
    if not isinstance(repeats, int) or repeats < 1:
      raise ValueError(f'repeats={repeats!r}: each image is seen an integer >= 1 times in a row '
                       '(3: DeiT repeated augmentation; 1: off).')
    self.source, self.repeats = source, repeats
    self.preprocess, self.on_device = _split(preprocess)
    self.batch_size, self.seed, self.sharding = global_batch_size, seed, sharding
    # Batches in flight, one thread each (default: every worker busy; fewer caps the cores).
    self.num_classes, self.num_workers = num_classes, num_workers
    self.prefetch = prefetch or num_workers
    self.steps_per_epoch = len(source) // global_batch_size
    if not self.steps_per_epoch:
      raise ValueError(f'The batch size {global_batch_size} is larger than the '
                       f'{len(source)} training examples.')
    devices = None
    if process_count:  # Process `process_index` of `process_count`, simulated in this one.
      ordered = sorted(sharding.device_set, key=lambda d: d.id)
      share = len(ordered) // process_count
      devices = ordered[process_index * share:(process_index + 1) * share]
    self.packing = packing
    if packing is None:
      self.rows = process_rows(sharding, global_batch_size, devices)
      self.global_rows = global_batch_size
    else:
      k = packing.images_per_row
      if global_batch_size % k:
        raise ValueError(f'The batch size {global_batch_size} does not split into packed rows '
                         f'of images_per_row={k}.')
      self.global_rows = global_batch_size // k
      packed = process_rows(sharding, self.global_rows, devices)
      self.rows = (packed[:, None] * k + np.arange(k)).reshape(-1)  # The rows' images.

  def indices(self, step: int) -> np.ndarray:
    """The dataset indices of global batch ``step`` (last partial batch of an epoch dropped).

    With ``repeats`` r (repeated augmentation, timm's ``RepeatAugSampler``), the epoch's
    stream is its permutation with each index r times in a row, cut at the epoch's length:
    an epoch sees 1/r of the images, r times each, in the same batch or the next, each
    copy augmented with its own generator.
    """
    epoch, position = divmod(step, self.steps_per_epoch)
    start = position * self.batch_size
    stream = np.arange(start, start + self.batch_size) // self.repeats
    return permute(stream, len(self.source), (self.seed, epoch))

  def local_batch(self, step: int) -> Batch:
    """This process's rows of batch ``step``, preprocessed, as numpy arrays."""
    indices = self.indices(step)
    draws = [(indices[j], np.random.default_rng([self.seed, step, j])) for j in self.rows]
    batch = _assemble(self.source, self.preprocess, draws, self.num_classes)
    return batch if self.packing is None else packing_lib.pack(batch, self.packing)

  def iterate_local(self, start_step: int = 0) -> Iterator[tuple[int, Batch]]:
    """(step, this process's numpy batch), assembled ahead in ``num_workers`` threads."""
    steps = itertools.count(start_step)
    yield from zip(itertools.count(start_step),
                   _ahead(self.local_batch, steps, self.num_workers, self.prefetch))

  def iterate(self, start_step: int = 0) -> Iterator[tuple[int, Batch]]:
    """(step, global batch sharded over the mesh) from ``start_step`` on."""
    batches = self.iterate_local(start_step)
    try:
      for step, local in batches:
        yield step, self.on_device(to_global(local, self.sharding, self.global_rows))
    finally:
      batches.close()


def _ahead(fn: Callable, keys: Iterator, workers: int, depth: int) -> Iterator:
  """fn(k) for each key, in order, computed up to ``depth`` keys ahead in threads."""
  with ThreadPoolExecutor(workers) as pool:
    pending = collections.deque(pool.submit(fn, k) for k in itertools.islice(keys, depth))
    while pending:
      result = pending.popleft().result()
      pending.extend(pool.submit(fn, k) for k in itertools.islice(keys, 1))
      yield result


def eval_batches(source: Any, preprocess: Callable, *, global_batch_size: int,
                 sharding: jax.sharding.Sharding, num_classes: int,
                 num_workers: int = 4) -> Iterator[Batch]:
  """Every example exactly once, in order; the last batch padded, with a 0/1 'mask'."""
  batch_rows = process_rows(sharding, global_batch_size)
  n = len(source)
  preprocess, on_device = _split(preprocess)

  def local_batch(b: int) -> Batch:
    rows = b * global_batch_size + batch_rows
    mask = rows < n
    draws = [(i, np.random.default_rng(0)) for i in np.where(mask, rows, 0)]
    local = _assemble(source, preprocess, draws, num_classes)
    local['mask'] = mask.astype(np.float32)
    return local

  batches = iter(range(math.ceil(n / global_batch_size)))
  for local in _ahead(local_batch, batches, num_workers, num_workers):
    yield on_device(to_global(local, sharding, global_batch_size))
