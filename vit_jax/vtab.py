r"""VTAB-1k: the 19 tasks of the Visual Task Adaptation Benchmark, and the paper's protocol.

The tasks are defined as google-research/task_adaptation defines them (``data/*.py``):
the TFDS dataset and version, the four VTAB-1k splits as TFDS split strings (``train800``,
``val200``, ``train800val200``, ``test``), the label functions of the structured tasks, the
number of classes and the three groups (Natural 7, Specialized 4, Structured 8). Several
split strings cut a dataset's training split at a share of its size (e.g. CIFAR-100's
``val200`` is ``train[45000:45200]``, 90% of 50,000): those are computed from the prepared
dataset's size and refused if it is not the size of the version task_adaptation used.

The protocol (ViT paper, appendix B.1.1, after Kolesnikov et al. 2020): one setting for all
tasks, chosen on the 200-example validation sets: SGD with momentum 0.9, batch 512, learning
rate 0.01, 2,500 steps, cosine decay, no weight decay, gradient clipping at norm 1, images
resized to 384x384 (task_adaptation's pre-processing: a plain resize, no augmentation);
fine-tune on ``train800val200``, report top-1 accuracy on ``test``. The VTAB score is the
mean over the 19 tasks. docs/vtab_and_sweeps.md.

    python -m vit_jax.vtab --list --json
    python -m vit_jax.vtab --init_from=ViT-B_16.npz --workdir=DIR --data_dir=TFDS_DIR \
        [--tasks=all|natural|specialized|structured|NAME,...]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from vit_jax import console, errors

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
      return {'train800': 'train[:800]', 'val200': 'validation[:200]',
              'train800val200': 'train[:800]+validation[:200]', 'test': 'test'}
    if self.layout == 'smallnorb':
      return {'train800': 'train[:800]', 'val200': 'test[:200]',
              'train800val200': 'train[:800]+test[:200]', 'test': 'test[50%:]'}
    n = self.train_examples if train_examples is None else train_examples
    train = self.train_share * n // 100
    test = self.test_split or f'train[{train + self.val_share * n // 100}:]'
    return {'train800': 'train[:800]', 'val200': f'train[{train}:{train + 200}]',
            'train800val200': f'train[:800]+train[{train}:{train + 200}]', 'test': test}

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

    from vit_jax.data import tfrecord

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


def get_source(name: str, split: str, data_dir: str | None = None) -> TaskSource:
  """The source of ``dataset.name='vtab/TASK'`` (``vit_jax.data.sources.get_source``)."""
  task = BY_NAME.get(name)
  if task is None:
    raise errors.ConfigError(f'vtab/{name} is not a VTAB task: vtab/ and one of '
                             f'{", ".join(BY_NAME)}.')
  return TaskSource(task, split, data_dir)


# ---------------------------------------------------------------------------
# Results.


def summarise(accuracies: dict[str, float]) -> dict[str, Any]:
  """Per-task accuracies -> group means and the VTAB mean (over tasks, as the benchmark's)."""
  groups = {}
  for group in GROUPS:
    members = [t.name for t in TASKS if t.group == group]
    done = [accuracies[n] for n in members if n in accuracies]
    groups[group] = {'mean': float(np.mean(done)) if done else None, 'tasks': len(done),
                     'of': len(members)}
  values = list(accuracies.values())
  return {'tasks': dict(accuracies), 'groups': groups,
          'mean': float(np.mean(values)) if values else None,
          'tasks_run': len(values), 'of': len(TASKS)}


def table(summary: dict[str, Any]) -> str:
  """The grouped table as Markdown (accuracy in %)."""
  def pct(value: float | None) -> str:
    return '-' if value is None else f'{100 * value:.2f}'

  lines = ['| task | group | accuracy |', '| --- | --- | --- |']
  for task in TASKS:
    if task.name in summary['tasks']:
      lines.append(f'| {task.name} | {task.group} | {pct(summary["tasks"][task.name])} |')
  for group in GROUPS:
    g = summary['groups'][group]
    note = '' if g['tasks'] == g['of'] else f' ({g["tasks"]} of {g["of"]} tasks)'
    lines.append(f'| **{group}** mean{note} | | {pct(g["mean"])} |')
  note = '' if summary['tasks_run'] == summary['of'] else \
      f' ({summary["tasks_run"]} of {summary["of"]} tasks)'
  lines.append(f'| **VTAB** mean{note} | | {pct(summary["mean"])} |')
  return '\n'.join(lines)


# ---------------------------------------------------------------------------
# The protocol's runs.


def task_config(task: Task, model: dict[str, Any], settings: dict[str, Any],
                base: Any = None) -> Any:
  """The training config of one task: the protocol's ``settings`` over ``base``.

  ``model``: the config.model fields of the checkpoint (its architecture); ``settings``:
  init_from, data_dir, lr, steps, warmup_steps, batch_size, image_size, momentum, seed,
  train_split, eval_split.
  """
  from vit_jax import config_base

  config = config_base.get_config() if base is None else base
  config.model.update(model)
  size = int(settings['image_size'])
  config.model.image_size = size
  pp = f'to_rgb|resize({size})|value_range(-1, 1)'  # task_adaptation: resize, no augmentation.
  config.dataset.update(name=f'vtab/{task.name}', data_dir=settings['data_dir'],
                        num_classes=task.num_classes, train_split=settings['train_split'],
                        eval_split=settings['eval_split'], pp_train=pp, pp_eval=pp)
  config.init_from = settings['init_from']
  config.batch_size = int(settings['batch_size'])
  config.total_steps = int(settings['steps'])
  config.num_epochs = None
  config.optimizer.update(name='sgd', momentum=float(settings['momentum']), weight_decay=0.0,
                          grad_clip_norm=1.0)
  config.schedule.update(base_lr=float(settings['lr']), end_lr=0.0, decay='cosine',
                         warmup_steps=int(settings['warmup_steps']), warmup_epochs=None)
  config.seed = int(settings['seed'])
  config.eval_every_steps = 0
  return config


def model_fields(init_from: str) -> dict[str, Any]:
  """The config.model fields of a checkpoint: a run's config, or a release file's shapes."""
  from vit_jax import paths
  from vit_jax import workdir as workdir_lib
  from vit_jax.checkpoints import release

  if workdir_lib.is_workdir(init_from):
    fields = dict(workdir_lib.load_config(init_from).model)
    fields.pop('image_size', None)
    return {k: v for k, v in fields.items() if v is not None}
  if not paths.is_file(init_from):
    raise errors.MissingFileError(f'--init_from={init_from} is neither a release .npz file nor '
                                  'the workdir of a run (a directory with checkpoints/).')
  arch = release.npz_architecture(release.flatten(release.load_npz(init_from)))
  arch.pop('image_size')
  return {'name': 'b16', **{k: v for k, v in arch.items() if v is not None}}


RESULT_FILE = 'vtab_result.json'


def finished_accuracy(workdir: Any, steps: int) -> float | None:
  """The test accuracy of a task run that reached ``steps`` (its metrics.jsonl), else None."""
  from etils import epath

  path = epath.Path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return None
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if row.get('step') == steps and 'eval/accuracy' in row:
      return float(row['eval/accuracy'])
  return None


def run(tasks: list[Task], workdir: str, settings: dict[str, Any],
        overrides: list[tuple[str, str | None]] = (), config_file: str | None = None,
        out: Any = None) -> dict[str, Any]:
  """Fine-tunes on each task in ``workdir/TASK`` (resuming; finished ones skipped), then
  writes ``workdir/vtab_results.json`` and prints the grouped table."""
  from etils import epath

  from vit_jax import config_cli

  out = out or sys.stdout
  model = model_fields(settings['init_from'])
  accuracies: dict[str, float] = {}
  for task in tasks:
    task_dir = epath.Path(workdir) / task.name
    record = task_dir / RESULT_FILE
    if record.exists():
      done = json.loads(record.read_text())
      if done['settings'] != settings:
        changed = sorted(k for k in settings if done['settings'].get(k) != settings[k])
        raise errors.ConfigError(
            f'{task_dir} finished with other settings ({", ".join(changed)} differ): '
            'use another --workdir, or the same settings to reuse it.')
      accuracies[task.name] = done['accuracy']
      print(f'{task.name}: finished earlier, accuracy {100 * done["accuracy"]:.2f}%',
            file=out, flush=True)
      continue
    base = config_cli.load(config_file) if config_file else None
    config = task_config(task, model, settings, base)
    config = config_cli.apply_overrides(config, overrides)
    print(f'{task.name}: fine-tuning in {task_dir} ({settings["steps"]} steps)', file=out,
          flush=True)
    with console.logging_to(str(task_dir)):  # Its lines with absl's prefix: its log.txt.
      train_and_evaluate(config, str(task_dir))
    accuracy = finished_accuracy(task_dir, int(settings['steps']))
    if accuracy is None:  # Stopped early (preempted): the next start resumes it.
      print(f'{task.name}: stopped before step {settings["steps"]}; run again to resume.',
            file=out, flush=True)
      continue
    record.write_text(json.dumps({'task': task.name, 'accuracy': accuracy,
                                  'settings': settings}, indent=1))
    accuracies[task.name] = accuracy
  summary = summarise(accuracies)
  summary['settings'] = settings
  path = epath.Path(workdir) / 'vtab_results.json'
  path.write_text(json.dumps(summary, indent=1))
  print(table(summary), file=out)
  print(f'Written: {path}', file=out, flush=True)
  return summary


def train_and_evaluate(config: Any, workdir: str) -> Any:
  """One task's run: ``vit_jax.train.train_and_evaluate`` (resumes from its checkpoints)."""
  from vit_jax import train

  return train.train_and_evaluate(config, workdir)


# ---------------------------------------------------------------------------
# The command line.


def _define_flags() -> dict[str, Any]:
  from absl import flags

  from vit_jax import config_cli

  f = flags
  return dict(
      list=f.DEFINE_bool('list', False, 'Print the task table and exit.'),
      json=f.DEFINE_bool('json', False, 'With --list: as JSON.'),
      init_from=f.DEFINE_string('init_from', None, 'The checkpoint to fine-tune: a run\'s '
                                'workdir or a release .npz file.'),
      workdir=f.DEFINE_string('workdir', None, 'One sub-folder per task, and the results.'),
      tasks=f.DEFINE_string('tasks', 'all', 'all, natural, specialized, structured or task '
                            'names, comma-separated.'),
      data_dir=f.DEFINE_string('data_dir', '', 'The TFDS data_dir holding the prepared '
                               'datasets ("": TFDS\'s default).'),
      lr=f.DEFINE_float('lr', 0.01, 'Learning rate (the paper\'s VTAB setting).'),
      steps=f.DEFINE_integer('steps', 2500, 'Training steps per task (the paper\'s).'),
      warmup_steps=f.DEFINE_integer('warmup_steps', 500, 'Linear warm-up steps (the paper '
                                    'gives none for VTAB; 500 is its code\'s fine-tuning '
                                    'default).'),
      batch_size=f.DEFINE_integer('batch_size', 512, 'Global batch (the paper\'s '
                                  'fine-tuning batch).'),
      image_size=f.DEFINE_integer('image_size', 384, 'Images resized to this square (the '
                                  'paper: 384 for every task).'),
      momentum=f.DEFINE_float('momentum', 0.9, 'SGD momentum.'),
      seed=f.DEFINE_integer('seed', 0, 'The runs\' seed.'),
      train_split=f.DEFINE_enum('train_split', 'train800val200', list(SPLIT_KEYS),
                                'Fine-tuning split (train800 to choose settings on val200).'),
      eval_split=f.DEFINE_enum('eval_split', 'test', list(SPLIT_KEYS), 'Reported split.'),
      cpu_devices=f.DEFINE_integer('cpu_devices', 0, 'As vit_jax.main\'s --cpu_devices.'),
      config=config_cli.DEFINE_config('config', 'Optional base config (default: '
                                      'vit_jax/config_base.py\'s); the protocol\'s settings '
                                      'are laid over it.'),
  )


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  from absl import app

  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if flags_['list'].value:
    if flags_['json'].value:
      print(json.dumps([t.describe() for t in TASKS], indent=1))
    else:
      print('| name | group | tfds_name | train800val200 | test | classes |')
      print('| --- | --- | --- | --- | --- | --- |')
      for t in TASKS:
        s = t.splits()
        print(f'| {t.name} | {t.group} | {t.tfds_name} | {s["train800val200"]} | {s["test"]} '
              f'| {t.num_classes} |')
    return
  for name in ('init_from', 'workdir'):
    if not flags_[name].value:
      raise errors.ConfigError(f'--{name} is required (or --list).')
  tasks = select(flags_['tasks'].value)
  settings = {k: flags_[k].value for k in (
      'init_from', 'data_dir', 'lr', 'steps', 'warmup_steps', 'batch_size', 'image_size',
      'momentum', 'seed', 'train_split', 'eval_split')}
  if settings['data_dir']:
    from etils import epath
    if not epath.Path(settings['data_dir']).exists():
      raise errors.MissingFileError(f'--data_dir={settings["data_dir"]} does not exist.')
  from vit_jax import console, paths

  paths.input_path(settings['init_from'], 'init_from', 'release .npz file or workdir')
  paths.output_dir(flags_['workdir'].value)  # Before jax and TensorFlow start.
  console.start(flags_['cpu_devices'].value)
  config_flag = flags_['config']
  run(tasks, flags_['workdir'].value, settings, config_flag.overrides, config_flag.file.value)


if __name__ == '__main__':
  import functools

  from vit_jax import config_cli

  config_cli.run(functools.partial(main, flags_=_define_flags()))
