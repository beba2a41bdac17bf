r"""VTAB-1k, the paper's protocol: fine-tune one checkpoint on each of the 19 tasks, one table.

    python -m vit_jax.vtab --list --json
    python -m vit_jax.vtab prepare --data_dir=TFDS_DIR [--tasks=...]
    python -m vit_jax.vtab --init_from=ViT-B_16.npz --workdir=DIR --data_dir=TFDS_DIR \
        [--tasks=all|natural|specialized|structured|NAME,...]

One setting for all tasks (appendix B.1.1): SGD with momentum 0.9, batch 512, lr 0.01, 2,500
steps, cosine decay, 384x384 with no augmentation; fine-tune on ``train800val200``, report top-1
on ``test``; the score is the mean over the tasks. ``prepare`` builds the tasks' TFDS datasets
(``vit_jax.data.vtab_prepare``); a run checks all its tasks' data before the first fine-tune.
The tasks: ``vit_jax.data.vtab``; docs/vtab_and_sweeps.md.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import numpy as np
from absl import app, flags
from etils import epath

from vit_jax import checkpoints, sweep
from vit_jax import config as config_lib
from vit_jax import main as main_lib
from vit_jax.base import console, errors, paths
from vit_jax.checkpoints.run import record
from vit_jax.config import cli as config_cli
from vit_jax.data import vtab_prepare
from vit_jax.data.vtab import GROUPS, SPLIT_KEYS, TASKS, Task, select

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
  config = config_lib.get_config() if base is None else base
  config.model.update(model)
  size = int(settings['image_size'])
  config.model.image_size = size
  pp = f'to_rgb|resize({size})|value_range(-1, 1)'  # task_adaptation: resize, no augmentation.
  config.dataset.update(name=f'vtab/{task.name}', data_dir=settings['data_dir'],
                        num_classes=task.num_classes, train_split=settings['train_split'],
                        eval_split=settings['eval_split'], pp_train=pp, pp_eval=pp)
  config.update(init_from=settings['init_from'], batch_size=int(settings['batch_size']),
                total_steps=int(settings['steps']), num_epochs=None, seed=int(settings['seed']),
                eval_every_steps=0)
  config.optimizer.update(name='sgd', momentum=float(settings['momentum']), weight_decay=0.0,
                          grad_clip_norm=1.0)
  config.schedule.update(base_lr=float(settings['lr']), end_lr=0.0, decay='cosine',
                         warmup_steps=int(settings['warmup_steps']), warmup_epochs=None)
  return config


def model_fields(init_from: str) -> dict[str, Any]:
  """The config.model fields of a checkpoint: a run's config, or any other SOURCE's own
  architecture (a .npz file's shapes, a timm or transformers folder's config.json, ...), as
  ``vit_jax.main``'s ``config.init_from`` takes it."""
  if record.is_workdir(init_from):
    fields = dict(record.load_config(init_from).model)
    fields.pop('image_size', None)
    return {k: v for k, v in fields.items() if v is not None}
  from vit_jax.checkpoints.formats import fit  # It imports jax: the checks of a run come first.

  try:
    fields = fit.model_options(checkpoints.load(init_from).model)
  except errors.UserError as e:
    raise type(e)(f'--init_from: {e}') from None
  fields.pop('image_size')
  return fields


RESULT_FILE = 'vtab_result.json'


def run(tasks: list[Task], workdir: str, settings: dict[str, Any],
        overrides: list[tuple[str, str | None]] = (), config_file: str | None = None,
        out: Any = None) -> dict[str, Any]:
  """Fine-tunes on each task in ``workdir/TASK`` (resuming; finished ones skipped), then
  writes ``workdir/vtab_results.json`` and prints the grouped table."""
  out = out or sys.stdout
  model = model_fields(settings['init_from'])
  configs = {}  # Every task still to run, validated before the first starts.
  for task in tasks:
    if not (epath.Path(workdir) / task.name / RESULT_FILE).exists():
      base = config_cli.load(config_file) if config_file else None
      config = config_cli.apply_overrides(task_config(task, model, settings, base), overrides)
      configs[task.name] = validate(config, str(epath.Path(workdir) / task.name))
  accuracies: dict[str, float] = {}
  for task in tasks:
    task_dir = epath.Path(workdir) / task.name
    result = task_dir / RESULT_FILE
    if result.exists():
      done = json.loads(result.read_text())
      if done['settings'] != settings:
        changed = sorted(k for k in settings if done['settings'].get(k) != settings[k])
        raise errors.ConfigError(
            f'{task_dir} finished with other settings ({", ".join(changed)} differ): '
            'use another --workdir, or the same settings to reuse it.')
      accuracies[task.name] = done['accuracy']
      print(f'{task.name}: finished earlier, accuracy {100 * done["accuracy"]:.2f}%',
            file=out, flush=True)
      continue
    config = configs[task.name]
    print(f'{task.name}: fine-tuning in {task_dir} ({settings["steps"]} steps)', file=out,
          flush=True)
    with console.logging_to(str(task_dir)):  # Its lines with absl's prefix: its log.txt.
      main_lib.train_and_evaluate(config, str(task_dir))  # Resumes from its checkpoints.
    accuracy = sweep.read_run(task_dir).accuracy  # Its headline metric at its last step.
    if accuracy is None:  # Stopped early (preempted): the next start resumes it.
      print(f'{task.name}: stopped before step {settings["steps"]}; run again to resume.',
            file=out, flush=True)
      continue
    result.write_text(json.dumps({'task': task.name, 'accuracy': accuracy,
                                  'settings': settings}, indent=1))
    accuracies[task.name] = accuracy
  summary = summarise(accuracies)
  summary['settings'] = settings
  path = epath.Path(workdir) / 'vtab_results.json'
  path.write_text(json.dumps(summary, indent=1))
  print(table(summary), file=out)
  print(f'Written: {path}', file=out, flush=True)
  return summary


def validate(config: Any, workdir: str) -> Any:
  """``config``, checked as ``vit_jax.main.train_and_evaluate`` checks it (``main.prepare``,
  and a resume's against its workdir); a problem names the task's workdir."""
  try:
    record.check_resume(workdir, config)
    main_lib.prepare(config)
  except errors.UserError as e:
    raise type(e)(f'{workdir}: {e} (checked before the first task\'s run)') from None
  return config


# ---------------------------------------------------------------------------
# The command line.


def _define_flags() -> dict[str, Any]:
  f = flags
  return dict(
      list=f.DEFINE_bool('list', False, 'Print the task table and exit.'),
      json=f.DEFINE_bool('json', False, 'With --list: as JSON.'),
      init_from=paths.DEFINE_path('init_from', None, 'The checkpoint to fine-tune: a run\'s '
                                  'workdir, a release .npz file or any other SOURCE '
                                  '(docs/checkpoints.md).'),
      workdir=paths.DEFINE_path('workdir', None, 'One sub-folder per task, and the results.'),
      tasks=f.DEFINE_string('tasks', 'all', 'all, natural, specialized, structured or task '
                            'names, comma-separated.'),
      data_dir=paths.DEFINE_path('data_dir', '', 'The TFDS data_dir holding the prepared '
                                 'datasets ("": TFDS\'s default); prepare: where to build them.'),
      manual_dir=paths.DEFINE_path('manual_dir', '', 'prepare: the folder of the manual '
                                   'downloads, one sub-folder per dataset (default: '
                                   'DATA_DIR/downloads/manual).'),
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
                                      'vit_jax/config/table.py\'s); the protocol\'s settings '
                                      'are laid over it.'),
  )


def prepare(flags_: dict[str, Any]) -> None:
  """``vtab prepare``: builds the requested tasks' TFDS datasets in --data_dir."""
  tasks = select(flags_['tasks'].value)
  # TFDS 4.9's builders import importlib_resources without declaring it.
  vtab_prepare.require_tfds('vit_jax.vtab prepare', ('tensorflow_datasets', 'importlib_resources'))
  data_dir = flags_['data_dir'].value or vtab_prepare.default_data_dir()
  paths.output_dir(data_dir, 'data_dir')
  manual_dir = flags_['manual_dir'].value
  if manual_dir:
    paths.input_path(manual_dir, 'manual_dir', 'folder of manual downloads')
  vtab_prepare.prepare(tasks, data_dir, manual_dir)


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  if argv[1:2] == ['prepare'] and len(argv) == 2:
    prepare(flags_)
    return
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]} (prepare, or flags).')
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
  if not settings['init_from'].startswith('hf-hub:'):
    paths.input_path(settings['init_from'], 'init_from', 'checkpoint (docs/checkpoints.md)')
  paths.output_dir(flags_['workdir'].value)  # Before jax and TensorFlow start.
  # Every task's data, before the first fine-tune (and before jax starts).
  vtab_prepare.check(tasks, settings['data_dir'], flags_['tasks'].value)
  vtab_prepare.require_tfds('vit_jax.vtab')
  console.start(flags_['cpu_devices'].value)
  config_flag = flags_['config']
  run(tasks, flags_['workdir'].value, settings, config_flag.overrides, config_flag.file.value)


if __name__ == '__main__':
  config_cli.run(functools.partial(main, flags_=_define_flags()))
