"""VTAB-1k's 19 tasks as datasets, defined as google-research/task_adaptation defines them.

Each task: its TFDS dataset and version, the four VTAB-1k splits (``train800``, ``val200``,
``train800val200``, ``test``) as TFDS split strings, its label function and its number of
classes; ``dataset.name='vtab/TASK'`` reads one (``TaskSource``). Split strings cut at a share
of a training split are computed from the prepared size, and refused if it is not the size
of the version task_adaptation used. The protocol that fine-tunes on them: ``vit_jax.vtab``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from vit_jax.base import errors
from vit_jax.data import tfrecord

GROUPS = ('natural', 'specialized', 'structured')
SPLIT_KEYS = ('train800', 'val200', 'train800val200', 'test')


# ---------------------------------------------------------------------------
# Label functions: a raw TFDS example (NumPy, as TFDS decodes it) -> the task's class.


def _bucket(value: float, thresholds: tuple[float, ...]) -> int:
  """The index of the last threshold below ``value`` (task_adaptation's
  ``reduce_max(where(thresholds - value < 0))``); none below is an error, not a class."""
  below = np.nonzero(np.asarray(thresholds, np.float64) < np.float64(value))[0]
  if not len(below):
    raise ValueError(f'{value} is not above the first threshold {thresholds[0]}.')
  return int(below[-1])


def clevr_count(example: dict[str, Any]) -> int:
  """CLEVR count_all: the number of objects (3-10) - 3 (8 classes)."""
  return int(np.size(example['objects']['size'])) - 3


CLEVR_DISTANCE_THRESHOLDS = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)


def clevr_distance(example: dict[str, Any]) -> int:
  """CLEVR closest_object_distance: the depth of the nearest object (``pixel_coords[:, 2]``)
  in 6 bins (0, 8], (8, 8.5], (8.5, 9], (9, 9.5], (9.5, 10], (10, 100]."""
  depth = float(np.min(np.asarray(example['objects']['pixel_coords'], np.float32)[:, 2]))
  return _bucket(depth, CLEVR_DISTANCE_THRESHOLDS)


KITTI_DISTANCE_THRESHOLDS = (-100.0, 8.0, 20.0, 999.0)
KITTI_VEHICLES = 3  # Object types 0, 1, 2: Car, Van, Truck.


def kitti_distance(example: dict[str, Any]) -> int:
  """KITTI closest_vehicle_distance: the depth (``location[:, 2]``, metres) of the nearest
  car, van or truck in (-100, 8], (8, 20], (20, 999], and class 3 for no vehicle at all."""
  objects = example['objects']
  types = np.asarray(objects['type']).reshape(-1)
  depths = np.asarray(objects['location'], np.float32).reshape(-1, 3)[:, 2]
  depth = float(np.min(np.append(depths[types < KITTI_VEHICLES], np.float32(1000.0))))
  return _bucket(depth, KITTI_DISTANCE_THRESHOLDS)


def _dsprites(feature: str, original_classes: int, num_classes: int) -> Callable:
  factor = np.float32(original_classes / num_classes)

  def label(example: dict[str, Any]) -> int:
    return int(np.floor(np.float32(example[feature]) / factor))
  label.__name__ = f'dsprites_{feature}'
  label.__doc__ = (f'dSprites {feature} ({original_classes} values) grouped into {num_classes} '
                   f'classes: floor(value / {original_classes / num_classes:g}).')
  return label


dsprites_location = _dsprites('label_x_position', 32, 16)
dsprites_orientation = _dsprites('label_orientation', 40, 16)


def _feature(name: str) -> Callable:
  def label(example: dict[str, Any]) -> int:
    return int(example[name])
  label.__name__ = name
  label.__doc__ = f'The feature {name!r}.'
  return label


def _dsprites_image(image: np.ndarray) -> np.ndarray:
  """dSprites pixels are 0/1: scaled to 0/255 as task_adaptation does."""
  return (np.asarray(image, np.uint8) * 255).astype(np.uint8)


# ---------------------------------------------------------------------------
# The tasks.


@dataclasses.dataclass(frozen=True)
class Task:
  """A VTAB-1k task: where its data is, how its splits are cut, what its label is.

  ``layout`` names task_adaptation's way of cutting the splits: 'validation' (the dataset's
  own train / validation / test), 'share' (val200 from the training split at
  ``train_share`` of its size; test the dataset's ``test_split``, or what follows train and
  validation shares when ``test_split`` is None), 'smallnorb' (validation from the test
  split's first half). ``train_examples``: the training split's size in the pinned version,
  for the 'share' layout.
  """

  name: str
  group: str
  tfds_name: str
  num_classes: int
  layout: str = 'validation'
  train_share: int = 0  # Percent.
  val_share: int = 0  # Percent; 'share' layout with the test cut from train too.
  test_split: str | None = 'test'
  train_examples: int = 0
  label: Callable[[dict[str, Any]], int] = _feature('label')
  image: Callable[[np.ndarray], np.ndarray] | None = None

  def splits(self, train_examples: int | None = None) -> dict[str, str]:
    """The four VTAB-1k splits as TFDS split strings (``train_examples``: the prepared size)."""
    if self.layout == 'validation':
      val, test = 'validation[:200]', 'test'
    elif self.layout == 'smallnorb':
      val, test = 'test[:200]', 'test[50%:]'
    else:
      n = self.train_examples if train_examples is None else train_examples
      train = self.train_share * n // 100
      val = f'train[{train}:{train + 200}]'
      test = self.test_split or f'train[{train + self.val_share * n // 100}:]'
    return {'train800': 'train[:800]', 'val200': val, 'train800val200': f'train[:800]+{val}',
            'test': test}

  def describe(self) -> dict[str, Any]:
    return {'name': self.name, 'group': self.group, 'tfds_name': self.tfds_name,
            'splits': self.splits(), 'num_classes': self.num_classes}


TASKS: tuple[Task, ...] = (
    # Natural.
    Task('caltech101', 'natural', 'caltech101:3.*.*', 102, 'share', 90, train_examples=3060),
    Task('cifar100', 'natural', 'cifar100:3.*.*', 100, 'share', 90, train_examples=50_000),
    Task('dtd', 'natural', 'dtd:3.*.*', 47),
    Task('oxford_flowers102', 'natural', 'oxford_flowers102:2.*.*', 102),
    Task('oxford_iiit_pet', 'natural', 'oxford_iiit_pet:3.*.*', 37, 'share', 80,
         train_examples=3680),
    Task('sun397', 'natural', 'sun397/tfds:4.*.*', 397),
    Task('svhn', 'natural', 'svhn_cropped:3.*.*', 10, 'share', 90, train_examples=73_257),
    # Specialized.
    Task('patch_camelyon', 'specialized', 'patch_camelyon:2.*.*', 2),
    Task('eurosat', 'specialized', 'eurosat/rgb:2.*.*', 10, 'share', 60, 20, None, 27_000),
    Task('resisc45', 'specialized', 'resisc45:3.*.*', 45, 'share', 60, 20, None, 31_500),
    Task('diabetic_retinopathy', 'specialized',
         'diabetic_retinopathy_detection/btgraham-300:3.*.*', 5),
    # Structured.
    Task('clevr_count', 'structured', 'clevr:3.*.*', 8, 'share', 90, test_split='validation',
         train_examples=70_000, label=clevr_count),
    Task('clevr_dist', 'structured', 'clevr:3.*.*', 6, 'share', 90, test_split='validation',
         train_examples=70_000, label=clevr_distance),
    Task('dmlab', 'structured', 'dmlab:2.0.1', 6),
    Task('kitti_dist', 'structured', 'kitti:3.1.0', 4, label=kitti_distance),
    Task('dsprites_loc', 'structured', 'dsprites:2.*.*', 16, 'share', 80, 10, None, 737_280,
         label=dsprites_location, image=_dsprites_image),
    Task('dsprites_ori', 'structured', 'dsprites:2.*.*', 16, 'share', 80, 10, None, 737_280,
         label=dsprites_orientation, image=_dsprites_image),
    Task('smallnorb_azi', 'structured', 'smallnorb:2.*.*', 18, 'smallnorb',
         label=_feature('label_azimuth')),
    Task('smallnorb_elev', 'structured', 'smallnorb:2.*.*', 9, 'smallnorb',
         label=_feature('label_elevation')),
)
BY_NAME = {task.name: task for task in TASKS}


def select(spec: str) -> list[Task]:
  """``all``, a group name, or task names, comma-separated; in the table's order."""
  names: set[str] = set()
  for part in (p.strip() for p in spec.split(',')):
    if part == 'all':
      names |= set(BY_NAME)
    elif part in GROUPS:
      names |= {t.name for t in TASKS if t.group == part}
    elif part in BY_NAME:
      names.add(part)
    else:
      raise errors.ConfigError(
          f'--tasks: {part!r} is not a VTAB task or group. Use all, {", ".join(GROUPS)} or '
          f'task names: {", ".join(BY_NAME)}.')
  return [t for t in TASKS if t.name in names]


# ---------------------------------------------------------------------------
# The data: a task's split as a source for vit_jax's loader (dataset.name 'vtab/TASK').


class TaskSource:
  """A VTAB task's split (one of ``SPLIT_KEYS``) read from its prepared TFDS dataset.

  ``source[i]`` is ``{'image': HWC uint8, 'label': the task's class}``: the raw example
  goes through the task's label function, so the loader sees a plain classification set.
  """

  def __init__(self, task: Task, split: str, data_dir: str | None = None):
    import tensorflow_datasets as tfds

    if split not in SPLIT_KEYS:
      raise errors.ConfigError(f'VTAB task {task.name}: split {split!r} is not one of '
                               f'{", ".join(SPLIT_KEYS)}.')
    try:
      builder = tfds.builder(task.tfds_name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError as e:
      raise errors.MissingFileError(
          f'VTAB task {task.name}: TFDS dataset {task.tfds_name} not found in '
          f'{data_dir or "the default TFDS data_dir"} ({" ".join(str(e).split()[:12])}...).'
          ' Prepare it there with TFDS first (tfds build).') from None
    if not builder.is_prepared():
      raise errors.MissingFileError(
          f'VTAB task {task.name}: TFDS dataset {task.tfds_name} is not prepared in '
          f'{builder.data_dir}. Prepare it there with TFDS first (tfds build).')
    train_examples = None
    if task.layout == 'share':
      train_examples = builder.info.splits['train'].num_examples
      if train_examples != task.train_examples:
        raise errors.DataError(
            f'VTAB task {task.name}: {builder.data_dir} holds {train_examples} training '
            f'examples, but task_adaptation cut its splits of {task.tfds_name} at shares of '
            f'{task.train_examples}; another size would move val200 and test. Prepare the '
            'version task_adaptation used.')
    self.task, self.split = task, task.splits(train_examples)[split]
    try:
      if builder.info.file_format == tfds.core.FileFormat.TFRECORD:
        self._source = tfrecord.TFRecordSource(builder, self.split)
      else:
        self._source = builder.as_data_source(split=self.split)
    except (ValueError, NotImplementedError) as e:
      raise errors.DataError(f'VTAB task {task.name}: {builder.data_dir} cannot be read with '
                             f'random access ({e}).') from None
    self.num_classes = task.num_classes
    self.class_names = tuple(str(i) for i in range(task.num_classes))
    self.multi_label = False

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict[str, Any]:
    example = self._source[int(index)]
    label = self.task.label(example)
    if not 0 <= label < self.task.num_classes:
      raise errors.DataError(f'VTAB task {self.task.name}: example {index} of {self.split} '
                             f'has label {label}, outside 0-{self.task.num_classes - 1}.')
    image = example['image']
    return {'image': self.task.image(image) if self.task.image else image, 'label': label}


def task_of(name: str) -> Task:
  """The task of ``dataset.name=name`` ('vtab/TASK'); a ConfigError naming the tasks."""
  task = BY_NAME.get(name.removeprefix('vtab/'))
  if task is None:
    raise errors.ConfigError(f'config.dataset.name={name!r} is not a VTAB task: vtab/ and one '
                             f'of {", ".join(BY_NAME)}.')
  return task


def get_source(name: str, split: str, data_dir: str | None = None) -> TaskSource:
  """The source of ``dataset.name=name`` ('vtab/TASK'; ``vit_jax.data.sources.get_source``)."""
  return TaskSource(task_of(name), split, data_dir)
