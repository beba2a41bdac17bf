"""Random-access data sources: ``len(source)`` and ``source[indices]``.

In-memory sources for small real datasets: scikit-learn's bundled 8x8 digits
(no download, so the quickstart runs offline) and IDX files (MNIST,
Fashion-MNIST).
"""

from __future__ import annotations

import dataclasses
import gzip
import pathlib
from typing import Any

import numpy as np

FASHION_MNIST_CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal',
                         'Shirt', 'Sneaker', 'Bag', 'Ankle boot')


@dataclasses.dataclass(frozen=True)
class ArraySource:
  """Images (N, H, W, C) uint8 and integer labels (N,), held in memory."""

  images: np.ndarray
  labels: np.ndarray
  num_classes: int
  class_names: tuple[str, ...] = ()
  multi_label: bool = False

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, index: Any) -> dict[str, np.ndarray]:
    return {'image': self.images[index], 'label': self.labels[index]}


def digits(split: str) -> ArraySource:
  """scikit-learn's 1,797 handwritten 8x8 digits; a fixed 20% held out as 'test'."""
  from sklearn.datasets import load_digits

  data = load_digits()
  images = np.round(data.images * (255 / 16)).astype(np.uint8)[..., None]
  order = np.random.default_rng(0).permutation(len(images))
  held_out = len(images) // 5
  index = {'train': order[held_out:], 'test': order[:held_out]}.get(split)
  if index is None:
    raise ValueError(f"digits has splits 'train' and 'test', not {split!r}.")
  return ArraySource(images[index], data.target[index].astype(np.int32), 10,
                     tuple(str(d) for d in range(10)))


def _read_idx(path: pathlib.Path, magic: int) -> np.ndarray:
  if not path.exists():
    raise FileNotFoundError(f'IDX file {path} not found.')
  with gzip.open(path, 'rb') if path.suffix == '.gz' else open(path, 'rb') as f:
    data = f.read()
  header = np.frombuffer(data[:4], '>u4')[0]
  if header != magic:
    raise ValueError(f'{path} is not an IDX file with magic {magic} (found {header}).')
  ndim = magic & 0xFF
  shape = tuple(int(d) for d in np.frombuffer(data[4:4 + 4 * ndim], '>u4'))
  array = np.frombuffer(data[4 + 4 * ndim:], np.uint8)
  if array.size != np.prod(shape):
    raise ValueError(f'{path} is truncated: header says {shape}, found {array.size} bytes.')
  return array.reshape(shape)


def idx_dataset(directory: str | pathlib.Path, split: str,
                class_names: tuple[str, ...] = ()) -> ArraySource:
  """MNIST-style IDX files: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``."""
  directory = pathlib.Path(directory)
  prefix = {'train': 'train', 'test': 't10k'}.get(split)
  if prefix is None:
    raise ValueError(f"IDX datasets have splits 'train' and 'test', not {split!r}.")

  def find(name: str) -> pathlib.Path:
    for candidate in (directory / f'{name}.gz', directory / name):
      if candidate.exists():
        return candidate
    raise FileNotFoundError(f'{name}[.gz] not found in {directory}.')

  images = _read_idx(find(f'{prefix}-images-idx3-ubyte'), 2051)[..., None]
  labels = _read_idx(find(f'{prefix}-labels-idx1-ubyte'), 2049).astype(np.int32)
  if len(images) != len(labels):
    raise ValueError(f'{directory}: {len(images)} images but {len(labels)} labels.')
  return ArraySource(images, labels, 10, class_names)


DATASETS = ('digits', 'mnist', 'fashion_mnist')


def get_source(dataset: Any, split: str) -> ArraySource:
  """The source of ``split`` for ``config.dataset`` (``name`` and, for files, ``data_dir``)."""
  name = dataset.name
  if name == 'digits':
    return digits(split)
  if name in ('mnist', 'fashion_mnist'):
    if not dataset.get('data_dir'):
      raise ValueError(f'config.dataset.data_dir must point to the {name} IDX files.')
    names = FASHION_MNIST_CLASSES if name == 'fashion_mnist' else ()
    return idx_dataset(dataset.data_dir, split, names)
  raise ValueError(f'Unknown dataset {name!r} (config.dataset.name). Known: {DATASETS}.')
