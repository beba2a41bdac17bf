"""What a run's workdir records of it, read without jax: its config.json, its checkpoints'
steps, its metrics.jsonl rows, and whether a resume's config is the same run
(``check_resume``), so that a command answers a resume it must refuse before anything starts.
``workdir`` reads the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import ml_collections
from etils import epath

from vit_jax import config as config_lib
from vit_jax.base import errors, paths

CONFIG_FILE = 'config.json'
CLASSES_FILE = 'classes.json'
CHECKPOINTS = 'checkpoints'
METRICS_FILE = 'metrics.jsonl'


def is_workdir(path: str | os.PathLike) -> bool:
  """True for a directory with a ``checkpoints/`` folder (a run's workdir), local or remote;
  an unreachable filesystem (``gs://`` offline) is a ``errors.MissingFileError``."""
  return paths.is_dir(path) and paths.is_dir(paths.path(path) / CHECKPOINTS)


def steps(workdir: str | os.PathLike) -> list[int]:
  """The steps of the complete checkpoints in ``workdir``, ascending."""
  root = epath.Path(workdir) / CHECKPOINTS
  if not root.is_dir():
    return []
  # Orbax renames a checkpoint's temporary directory to its step when it is complete.
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def step_dir(workdir: str | os.PathLike, step: int) -> epath.Path:
  """The folder of checkpoint ``step`` in ``workdir``."""
  return epath.Path(workdir) / CHECKPOINTS / str(step)


def resolve_step(workdir: str | os.PathLike, step: int | None = None) -> int:
  """``step`` if ``workdir`` has it (the latest if None); an error naming the choices."""
  available = steps(workdir)
  if not available:
    raise errors.MissingFileError(f'{workdir} holds no complete checkpoint (nothing in '
                                  f'{epath.Path(workdir) / CHECKPOINTS}). Train there first.')
  if step is None:
    return available[-1]
  if step not in available:
    raise errors.MissingFileError(f'{workdir} has no checkpoint at step {step}; it has steps '
                                  f'{available}.')
  return step


def check_resume(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> None:
  """Refuses, in one ``errors.ConfigError``, a resume whose ``config`` would train another
  run than the one in ``workdir``: a field that changes the trajectory (every field but
  ``vit_jax.config.MAY_CHANGE_ON_RESUME``) differs from its recorded config.json. Only
  ``config.schedule.phases`` may grow (a finished run trained further). Nothing to check
  where the workdir holds no checkpoint yet."""
  path = epath.Path(workdir) / CONFIG_FILE
  if not steps(workdir) or not path.exists():
    return
  recorded = config_lib.flatten(load_config(workdir).to_dict())
  given = config_lib.flatten(config_lib.complete(config).to_dict())
  free = config_lib.MAY_CHANGE_ON_RESUME
  differ = [k for k in config_lib.DECLARED if k not in free and k != 'schedule.phases'
            and recorded.get(k) != given.get(k)
            and not (k == 'dataset.num_classes' and not given[k])]  # 0: the data's.
  old, new = recorded['schedule.phases'], given['schedule.phases']
  where = f'the run in {workdir} was trained with'
  new_run = (f'To start a new run from it instead: --workdir=NEW_WORKDIR '
             f'--config.init_from={workdir} (its parameters, a fresh optimizer and schedule).')
  if differ:
    fields = ', '.join(f'config.{k}={given.get(k)!r} ({recorded.get(k)!r})'
                       for k in differ[:5]) + (f' and {len(differ) - 5} more fields'
                                                if len(differ) > 5 else '')
    more = ''
    if {'total_steps', 'num_epochs'} & set(differ):
      more = (' A new total would recompute the schedule; to train it further, add a named '
              "phase: --config.schedule.phases=\"({'name': 'more', 'total_steps': N, "
              "'base_lr': LR},)\" (docs/training.md).")
    raise errors.ConfigError(
        f'A resume is the same run, but {fields}: {where} the values in brackets (its '
        f'{CONFIG_FILE}). Resume with them.{more} {new_run}')
  if tuple(new[:len(old)]) != tuple(old):
    raise errors.ConfigError(
        f'config.schedule.phases={new!r}, but {where} {old!r} ({CONFIG_FILE}): phases may only '
        f'be added after the recorded ones. {new_run}')


def load_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config the run in ``workdir`` was started with."""
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    raise errors.MissingFileError(f'{path} does not exist: {workdir} is not the workdir of a '
                                  'vit_jax.main run.')
  # An older run's config.json: its evals fields as named evaluators.
  return config_lib.complete(config_lib.convert_old_evals(json.loads(path.read_text())))


def metric_rows(workdir: str | os.PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
  """Each ``(line, row)`` of the run's metrics.jsonl, in order (none without the file)."""
  path = epath.Path(workdir) / METRICS_FILE
  return parse_metrics(path.read_text() if path.exists() else '')


def parse_metrics(text: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """Each ``(line, row)`` of a metrics.jsonl's ``text``; a line cut short by a crash is
  passed over."""
  for line in text.splitlines(keepends=True):
    try:
      yield line, json.loads(line)
    except json.JSONDecodeError:
      continue
