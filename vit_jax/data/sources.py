"""Random-access data sources: ``len(source)`` and ``source[i]`` -> {'image', 'label'}.

In-memory sources for small real datasets (scikit-learn's bundled 8x8 digits,
so the quickstart runs offline; IDX files of MNIST and Fashion-MNIST) and any
prepared TFDS image-classification dataset, in ArrayRecord or TFRecord format.
"""

from __future__ import annotations

import dataclasses
import gzip
import pathlib
import re
from typing import Any

import numpy as np
from etils import epath

from vit_jax.base import errors, paths
from vit_jax.data import local, tfrecord, vtab, vtab_prepare

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


class TFDSSource:
  """A prepared TFDS image-classification dataset, read with random access.

  In the format it was prepared in: ArrayRecord (or another random-access format)
  through TFDS's ``as_data_source``, TFRecord through an index of record offsets
  (``vit_jax.data.tfrecord``); the same decoding, no TensorFlow at read time.
  ``source[i]`` is ``{'image': HWC uint8, 'label': int}``.
  """

  def __init__(self, name: str, split: str, data_dir: str | None = None,
               manual_dir: str | None = None, prepare: bool = False, label_key: str = 'label'):
    try:
      import tensorflow_datasets as tfds
    except ModuleNotFoundError as e:
      if e.name != 'tensorflow_datasets':
        raise
      raise errors.ConfigError(
          f'Dataset {name!r} is read through TFDS, which this install lacks: pip install -e '
          '".[tf]" (or use a local dataset: vit_jax.data.convert).') from None

    try:
      builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError:
      raise ValueError(f'Unknown dataset {name!r}: not one of the bundled datasets '
                       f'{IN_MEMORY} and not in the TFDS catalog.') from None
    if not builder.is_prepared():
      if not prepare:
        raise FileNotFoundError(
            f'TFDS dataset {name!r} is not prepared in {builder.data_dir}. Prepare it once '
            f'with config.dataset.prepare=True (and config.dataset.manual_dir for datasets '
            f'such as imagenet2012 that need downloaded files), or point '
            f'config.dataset.data_dir at a prepared copy.')
      config = tfds.download.DownloadConfig(manual_dir=manual_dir)
      builder.download_and_prepare(download_config=config, file_format='array_record')
    file_format = builder.info.file_format
    try:
      if file_format == tfds.core.FileFormat.TFRECORD:
        self._source = tfrecord.TFRecordSource(builder, split)
      else:
        self._source = builder.as_data_source(split=split)
    except (ValueError, NotImplementedError) as e:
      raise ValueError(f'TFDS dataset {name!r} ({builder.data_dir}, {file_format}) cannot be '
                       f'read with random access: prepare it with file_format="array_record" '
                       f'or "tfrecord" ({e}).') from e
    features = builder.info.features
    if label_key not in features:
      raise ValueError(f'TFDS dataset {name!r} has no feature {label_key!r} (its features: '
                       f'{", ".join(features)}).')
    label = features[label_key]
    # A Sequence of ClassLabel (imagenet2012_real's 'real_label'): a set of classes per
    # image, given as a multi-hot row (all zeros for an empty set).
    self.multi_label = isinstance(label, tfds.features.Sequence)
    if self.multi_label:
      label = label.feature
    if not isinstance(label, tfds.features.ClassLabel):
      raise ValueError(f'TFDS dataset {name!r}: feature {label_key!r} is not a class label.')
    self.label_key = label_key
    self.num_classes = label.num_classes
    self.class_names = tuple(label.names)

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict[str, Any]:
    example = self._source[int(index)]
    label = example[self.label_key]
    if self.multi_label:
      row = np.zeros(self.num_classes, np.float32)
      row[np.asarray(label, np.int64)] = 1.
      label = row
    return {'image': example['image'], 'label': label}


IN_MEMORY = ('digits', 'mnist', 'fashion_mnist')

_SLICE = re.compile(r'^(\w+)\[(-?\d*)(%?):(-?\d*)(%?)\]$')


class Subset:
  """The examples ``indices`` of ``source`` (a sliced split of a local or in-memory source)."""

  def __init__(self, source: Any, indices: np.ndarray):
    self.source, self.indices = source, indices
    self.num_classes = source.num_classes
    self.class_names = tuple(getattr(source, 'class_names', ()))
    self.multi_label = bool(getattr(source, 'multi_label', False))

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, index: Any) -> Any:
    return self.source[self.indices[index]]


def split_slice(split: str, num_examples: int | None = None) -> tuple[str, slice | None]:
  """``'train[:98%]'`` -> ('train', the slice of ``num_examples``), as TFDS reads it (percent
  boundaries rounded to the closest example); a plain name -> (name, None)."""
  match = _SLICE.match(split)
  if not match:
    if '[' in split or '+' in split:
      raise ValueError(f'split {split!r}: only one split and one slice are read here, as '
                       "'train[:98%]' or 'train[100:200]'.")
    return split, None
  name, start, start_pct, stop, stop_pct = match.groups()
  if num_examples is None:
    return name, slice(None)

  def bound(text: str, pct: str) -> int | None:
    if not text:
      return None
    value = int(text)
    if pct and not -100 <= value <= 100:
      raise ValueError(f'split {split!r}: a percentage must be in [-100, 100].')
    return int(round(value * num_examples / 100)) if pct else value
  return name, slice(bound(start, start_pct), bound(stop, stop_pct))


def _sliced(split: str, read: Any) -> Any:
  """``read(name)`` for a plain split; for ``name[a:b]`` its examples a to b."""
  name, _ = split_slice(split)
  source = read(name)
  if name == split:
    return source
  _, part = split_slice(split, len(source))
  return Subset(source, np.arange(len(source))[part])


def check_name(dataset: Any, what: str = '') -> None:
  """Refuses a ``dataset.name`` that ``get_source`` would not find, reading no data: not a
  VTAB task, a bundled or local dataset, nor a TFDS dataset prepared in ``data_dir`` (one to
  be prepared, or in a bucket, TFDS judges later). A command asks before it starts jax.
  ``what``: which dataset it is, for the message (default: ``config.dataset``'s)."""
  name, data_dir = dataset['name'], dataset.get('data_dir') or ''
  if name.startswith('vtab/'):
    vtab.task_of(name)
    return
  if (name == 'digits' or (data_dir and (name in ('mnist', 'fashion_mnist') or '://' in data_dir
                                         or (epath.Path(data_dir) / local.METADATA).exists()))
      or dataset.get('prepare')):
    return
  where = data_dir or vtab_prepare.default_data_dir()
  if vtab_prepare.prepared_dir(where, name) is None:
    fix = ('set config.dataset.data_dir to where it is prepared, or prepare it once with '
           'config.dataset.prepare=True' if not what else 'give the folder it is prepared in '
           '(NAME,TRAIN_SPLIT,TEST_SPLIT,DATA_DIR), or prepare it once with a run of '
           'config.dataset.prepare=True')
    raise errors.ConfigError(
        f'{what or f"config.dataset.name={name!r}"}: no dataset of that name is prepared in '
        f'{where} (nor is it digits, vtab/TASK or a converted dataset\'s data_dir). A TFDS '
        f'dataset: {fix} (docs/data.md).')


def parse_fewshot_spec(spec: str) -> tuple[str, str, str, str]:
  """``'NAME[,TRAIN_SPLIT,TEST_SPLIT[,DATA_DIR]]'`` -> (name, train, test, data_dir)."""
  parts = [p.strip() for p in str(spec).split(',')]
  if len(parts) not in (1, 3, 4) or not all(parts):
    raise errors.ConfigError(
        f'few-shot dataset {spec!r}: write NAME, or NAME,TRAIN_SPLIT,TEST_SPLIT, or '
        'NAME,TRAIN_SPLIT,TEST_SPLIT,DATA_DIR (e.g. "digits" or '
        '"cifar100,train[:10000],test").')
  if len(parts) == 1:
    parts += ['train', 'test']
  if len(parts) == 3:
    parts.append('')
  parts[3] = paths.expand(parts[3])  # A DATA_DIR with ~ or $VAR, as a path flag's.
  return tuple(parts)


def check_fewshot_names(config: Any) -> None:
  """``check_name`` of each dataset of the few-shot evaluators of ``config.evals``, read from
  where they would read it (its DATA_DIR, the run's data_dir for the run's dataset, else
  TFDS's), before jax starts."""
  for entry_name, entry in config.evals.items():
    if entry.get('type') != 'fewshot':
      continue
    for spec in entry.datasets:
      name, _, _, data_dir = parse_fewshot_spec(spec)
      directory = data_dir or (config.dataset.data_dir if name == config.dataset.name else '')
      check_name({'name': name, 'data_dir': directory, 'prepare': False},
                 f'config.evals.{entry_name}: few-shot dataset {spec!r}')


def get_source(dataset: Any, split: str) -> ArraySource | TFDSSource | local.LocalSource:
  """The source of ``split`` for ``config.dataset``.

  A ``data_dir`` holding a converted dataset (``metadata.json``) is read in the
  local sharded format, whatever the name. Otherwise ``dataset.name`` is one of the
  bundled in-memory datasets (``digits``; ``mnist`` and ``fashion_mnist`` from IDX
  files in ``data_dir``) or any TFDS name (``imagenet2012``, ``cifar10``, ...;
  ``data_dir``, ``manual_dir``, ``prepare``). ``vtab/TASK`` is a VTAB-1k task
  (``vit_jax.data.vtab``), its split one of train800, val200, train800val200, test. The local
  and in-memory sources take a slice of a split as TFDS does (``train[:98%]``,
  ``train[98%:]``: a minival split, ``vit_jax.sweep``).
  """
  name = dataset.name
  data_dir = dataset.get('data_dir') or None  # '' in a config means: the default.
  if name.startswith('vtab/'):  # A VTAB-1k task: split is train800, val200, ... (vit_jax.vtab).
    return vtab.get_source(name, split, data_dir)
  if data_dir and (epath.Path(data_dir) / local.METADATA).exists():
    return _sliced(split, lambda s: local.LocalSource(str(data_dir), s))
  if name == 'digits':
    return _sliced(split, digits)
  if name in ('mnist', 'fashion_mnist') and data_dir:
    names = FASHION_MNIST_CLASSES if name == 'fashion_mnist' else ()
    return _sliced(split, lambda s: idx_dataset(data_dir, s, names))
  return TFDSSource(name, split, data_dir, dataset.get('manual_dir') or None,
                    bool(dataset.get('prepare', False)))
