r"""VTAB-1k's data on disk: which TFDS datasets the tasks read, whether a data_dir holds them,
and ``prepare`` (``python -m vit_jax.vtab prepare``), which builds them with TFDS's own builders.

``check`` reads the prepared folders' ``dataset_info.json`` without importing TFDS, so a run
whose data is missing is refused in a fraction of a second, naming every missing task and
the command that prepares them. Three datasets cannot be downloaded by TFDS (``MANUAL``): their
files are placed by hand in ``MANUAL_ROOT/NAME`` first; ``prepare`` says exactly what and where.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from vit_jax.base import errors
from vit_jax.data.vtab import Task

# What a user places by hand (TFDS cannot download it), per TFDS dataset; the folder is
# MANUAL_ROOT/NAME, TFDS's manual_dir for that dataset only.
MANUAL = {
    'resisc45': (
        'download NWPU-RESISC45.rar (about 0.4 GB, from the authors\' OneDrive: '
        'https://1drv.ms/u/s!AmgKYzARBl5ca3HNaHIlzp_IXjs) and extract it so that '
        '{dir}/NWPU-RESISC45/airplane/airplane_001.jpg exists (45 class folders, 31,500 '
        'images).'),
    'diabetic_retinopathy_detection': (
        'download the Kaggle competition\'s data (https://www.kaggle.com/c/diabetic-retinopathy'
        '-detection/data, after accepting its rules; about 85 GB of zip files: train 35 GB, '
        'test 49 GB), then unpack train.zip into {dir}/train/, test.zip into {dir}/test/, '
        'sample.zip into {dir}/sample/ and trainLabels.csv.zip into {dir}/trainLabels.csv '
        '(TFDS downloads the test labels itself).'),
    'oxford_iiit_pet': (
        'this TFDS builds only oxford_iiit_pet {built}, whose images differ from the 3.x that '
        'task_adaptation cut its splits from: copy the folder oxford_iiit_pet/3.2.0 of a '
        'data_dir prepared with tensorflow-datasets 4.8 or older into {data_dir}/.'),
}
# Files whose presence shows a manual download is in place (relative to its folder).
MANUAL_MARKS = {
    'resisc45': ('NWPU-RESISC45',),
    'diabetic_retinopathy_detection': ('train', 'test', 'sample', 'trainLabels.csv'),
}


def require_tfds(what: str, modules: Sequence[str] = ('tensorflow_datasets',)) -> None:
  """A ``ConfigError`` naming the extra to install where ``modules`` are missing (found
  without importing them)."""
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    raise errors.ConfigError(f'{what} reads TFDS datasets, and this install lacks '
                             f'{", ".join(missing)}: pip install -e ".[tf]".')


def default_data_dir() -> str:
  """TFDS's default data_dir (``TFDS_DATA_DIR``, else ``~/tensorflow_datasets``)."""
  return os.path.expanduser(os.environ.get('TFDS_DATA_DIR') or '~/tensorflow_datasets')


def parts(tfds_name: str) -> tuple[str, str, str]:
  """``'sun397/tfds:4.*.*'`` -> (dataset 'sun397', its folder 'sun397/tfds', version '4.*.*')."""
  folder, _, version = tfds_name.partition(':')
  return folder.split('/')[0], folder, version or '*.*.*'


def _version_matches(name: str, pattern: str) -> bool:
  want, have = pattern.split('.'), name.split('.')
  return len(have) == 3 and all(h.isdigit() for h in have) and all(
      w in ('*', h) for w, h in zip(want, have, strict=True))


def prepared_dir(data_dir: str, tfds_name: str) -> str | None:
  """The newest version folder of ``tfds_name`` in ``data_dir`` that TFDS finished writing
  (it holds ``dataset_info.json``), or None."""
  _, folder, version = parts(tfds_name)
  base = os.path.join(data_dir, *folder.split('/'))
  try:
    names = [n for n in os.listdir(base) if _version_matches(n, version)
             and os.path.isfile(os.path.join(base, n, 'dataset_info.json'))]
  except OSError:
    return None
  if not names:
    return None
  return os.path.join(base, max(names, key=lambda n: tuple(int(p) for p in n.split('.'))))


def split_sizes(version_dir: str) -> dict[str, int]:
  """{split: examples} of a prepared TFDS folder (its ``dataset_info.json``)."""
  with open(os.path.join(version_dir, 'dataset_info.json')) as f:
    info = json.load(f)
  return {s['name']: sum(int(n) for n in s.get('shardLengths', ())) for s in info['splits']}


def datasets_of(tasks: Sequence[Task]) -> dict[str, list[str]]:
  """{TFDS name: the tasks that read it}, in the table's order (CLEVR, dSprites and
  smallNORB each serve two tasks)."""
  out: dict[str, list[str]] = {}
  for task in tasks:
    out.setdefault(task.tfds_name, []).append(task.name)
  return out


def problem(task: Task, data_dir: str) -> str | None:
  """Why ``task`` cannot run from ``data_dir`` (missing, or prepared at another size), or None."""
  found = prepared_dir(data_dir, task.tfds_name)
  if found is None:
    return 'missing'
  try:  # Read for every task: TFDS would crash in protobuf on a damaged one.
    train = split_sizes(found).get('train')
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return (f'{found}/dataset_info.json is damaged, not TFDS\'s JSON: remove {found} and '
            'prepare it again')
  if task.layout == 'share' and train != task.train_examples:
    return (f'{train} training examples, not the {task.train_examples:,} of '
            'task_adaptation\'s version')
  return None


def check(tasks: Sequence[Task], data_dir: str, spec: str = '') -> None:
  """Every task's data is prepared in ``data_dir`` ('' : TFDS's default), or one
  ``MissingFileError`` naming every task that is not, and how to prepare them (``spec``: the
  --tasks value, repeated where every task is missing)."""
  where = data_dir or default_data_dir()
  problems = {t.name: p for t in tasks if (p := problem(t, where))}
  if not problems:
    return
  missing = [n for n, p in problems.items() if p == 'missing']
  other = [f'{n} ({p})' for n, p in problems.items() if p != 'missing']
  folder = '' if os.path.isdir(where) else ' (the folder does not exist)'
  said = []
  if missing:
    said.append(f'{len(missing)} of the {len(tasks)} tasks have no prepared TFDS dataset in '
                f'{where}{folder}: {", ".join(missing)}')
  if other:
    said.append(f'wrong data for {", ".join(other)}')
  manual = sorted({parts(t.tfds_name)[0] for t in tasks if t.name in problems} & set(MANUAL))
  also = (f'; {", ".join(manual)} need{"s" if len(manual) == 1 else ""} a manual download '
          'first, which it explains' if manual else '')
  data_flag = f' --data_dir={data_dir}' if data_dir else ''
  todo = spec if spec and len(problems) == len(tasks) else ','.join(problems)
  raise errors.MissingFileError(
      f'VTAB data: {"; ".join(said)}. Prepare them with: python -m vit_jax.vtab prepare'
      f'{data_flag} --tasks={todo}{also} (docs/vtab_and_sweeps.md).')


# ---------------------------------------------------------------------------
# Preparing: TFDS's own builders, one dataset at a time, whatever the others do.


def folder_bytes(path: str) -> int:
  """The bytes of the files under ``path`` (0 where it does not exist)."""
  total = 0
  for root, _, files in os.walk(path):
    for f in files:
      with contextlib.suppress(OSError):  # Removed meanwhile: not there.
        total += os.path.getsize(os.path.join(root, f))
  return total


def size_text(n: float | None) -> str:
  if n is None:
    return '?'
  for unit, scale in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= scale:
      return f'{n / scale:.1f} {unit}'
  return f'{int(n)} B'


@dataclasses.dataclass
class Outcome:
  """What ``prepare`` did with one TFDS dataset."""

  tfds_name: str
  tasks: list[str]
  status: str  # 'prepared', 'prepared earlier', 'manual', 'no network', 'failed'
  detail: str = ''
  download_bytes: int | None = None  # From TFDS's registered checksums; None: by hand.
  prepared_bytes: int | None = None  # Measured on disk.


def _url_infos(builder: Any) -> dict[str, Any]:
  """{URL: TFDS's UrlInfo (size, file name)} of what ``builder`` downloads (its registered
  checksums); {} where unknown."""
  try:
    infos = builder.url_infos or {}
  except Exception:  # noqa: BLE001 (a builder without registered checksums: unknown)
    return {}
  url = getattr(builder.builder_config, 'download_url', None)  # EuroSAT: one config's file.
  return {url: infos[url]} if url in infos else dict(infos)


def unreachable(url: str, timeout: float = 10.0) -> str:
  """Why ``url``'s host cannot be reached ('' where it answers, with any status): one try
  through the proxies TFDS's downloads take (HTTPS_PROXY, ...), so that a machine without
  network is told at once, not after TFDS's retries (minutes for each dataset)."""
  import re
  from urllib.parse import urlparse

  import requests

  try:
    requests.head(url, timeout=timeout, allow_redirects=False).close()
  except requests.RequestException as e:
    causes = re.findall(r'\[Errno -?\d+\] [^\'"()]+', str(e))
    return (f'{urlparse(url).hostname} cannot be reached: {type(e).__name__}'
            f'{": " + causes[-1].strip() if causes else ""}')
  return ''


def prepare_one(tfds_name: str, tasks: list[str], data_dir: str, manual_dir: str,
                file_format: str = 'array_record', network: dict[str, str] | None = None
                ) -> Outcome:
  """Builds ``tfds_name`` in ``data_dir`` with TFDS's builder (its download, or the files
  placed in ``manual_dir/NAME``); a failure is an ``Outcome``, never raised. ``network``:
  {'unreachable': why} once known (asked once for all the datasets of a ``prepare``)."""
  import tensorflow_datasets as tfds

  name = parts(tfds_name)[0]
  found = prepared_dir(data_dir, tfds_name)
  if found:
    return Outcome(tfds_name, tasks, 'prepared earlier', found,
                   prepared_bytes=folder_bytes(found))
  folder = os.path.join(manual_dir, name)
  try:
    builder = tfds.builder(tfds_name, data_dir=data_dir)
  except (AssertionError, ValueError, tfds.core.DatasetNotFoundError) as e:
    if name in MANUAL:  # oxford_iiit_pet: this TFDS cannot build the version the tasks read.
      built = getattr(tfds.builder_cls(name), 'VERSION', '?')
      return Outcome(tfds_name, tasks, 'manual',
                     MANUAL[name].format(dir=folder, built=built, data_dir=data_dir))
    return Outcome(tfds_name, tasks, 'failed', ' '.join(str(e).split())[:300])
  infos = {} if name in MANUAL else _url_infos(builder)
  download = sum(int(i.size) for i in infos.values()) or None
  if any(not os.path.exists(os.path.join(folder, m)) for m in MANUAL_MARKS.get(name, ())):
    return Outcome(tfds_name, tasks, 'manual', MANUAL[name].format(dir=folder))
  # {URL: file name}: TFDS takes a file of that name from its manual_dir instead of downloading.
  files = {u: i.filename or os.path.basename(u.split('?')[0]) for u, i in infos.items()}
  if any(not os.path.exists(os.path.join(folder, f)) for f in files.values()):
    network = {} if network is None else network
    if 'unreachable' not in network:
      network['unreachable'] = unreachable(next(iter(files)))
    if network['unreachable']:
      placed = '; '.join(f'{f} (from {u})' for u, f in files.items())
      return Outcome(tfds_name, tasks, 'no network', f'place {placed} in {folder}', download)
  config = tfds.download.DownloadConfig(manual_dir=folder)  # Files placed there are taken.
  try:
    builder.download_and_prepare(download_config=config, file_format=file_format)
  except Exception as e:  # noqa: BLE001 (network, a damaged download: named, and the rest go on)
    reason = ' '.join(str(e).split())[:300] or type(e).__name__
    return Outcome(tfds_name, tasks, 'failed', f'{type(e).__name__}: {reason}', download)
  found = prepared_dir(data_dir, tfds_name)
  return Outcome(tfds_name, tasks, 'prepared', found or builder.data_dir, download,
                 folder_bytes(found or builder.data_dir))


def table(outcomes: Sequence[Outcome]) -> str:
  """The outcomes as Markdown: dataset, tasks, what happened, download and prepared sizes."""
  lines = ['| TFDS dataset | tasks | status | download | prepared |',
           '| --- | --- | --- | --- | --- |']
  for o in outcomes:
    manual = parts(o.tfds_name)[0] in MANUAL
    lines.append(f'| {o.tfds_name} | {", ".join(o.tasks)} | {o.status} | '
                 f'{"by hand" if manual else size_text(o.download_bytes)} | '
                 f'{size_text(o.prepared_bytes)} |')
  total = sum(o.prepared_bytes or 0 for o in outcomes)
  lines.append(f'| total | | | | {size_text(total)} |')
  return '\n'.join(lines)


def prepare(tasks: Sequence[Task], data_dir: str, manual_dir: str = '',
            out: Any = None) -> list[Outcome]:
  """Prepares every dataset of ``tasks`` it can in ``data_dir``; prints each as it goes, the
  table, then what is left to do by hand. Raises a ``UserError`` naming the tasks that still
  cannot run (after the table), so a script sees a non-zero status."""
  out = out or sys.stdout
  downloads = os.path.join(data_dir, 'downloads')
  manual_dir = manual_dir or os.path.join(downloads, 'manual')  # TFDS's own default.
  outcomes: list[Outcome] = []
  network: dict[str, str] = {}
  for tfds_name, names in datasets_of(tasks).items():
    start = time.monotonic()
    print(f'{tfds_name} ({", ".join(names)}): ...', file=out, flush=True)
    outcome = prepare_one(tfds_name, names, data_dir, manual_dir, network=network)
    if outcome.status == 'no network' and all(o.status != 'no network' for o in outcomes):
      print(f'No network ({network["unreachable"]}): the downloads are not tried. Place '
            f'each dataset\'s files in {manual_dir}/NAME (named below), or run this where '
            'there is network.', file=out, flush=True)
    outcomes.append(outcome)
    print(f'{tfds_name}: {outcome.status} in {time.monotonic() - start:.0f} s'
          f'{": " + outcome.detail if outcome.status in ("failed", "no network") else ""}',
          file=out, flush=True)
  print(table(outcomes), file=out)
  manual = [o for o in outcomes if o.status == 'manual']
  if manual:
    print('\nManual downloads (then run this command again):', file=out)
    for o in manual:
      print(f'- {o.tfds_name}: {o.detail}', file=out)
  if any(o.status == 'failed' for o in outcomes):
    print('\nA failed download is tried again by running this command again.', file=out)
  if os.path.isdir(downloads):
    print(f'\nThe downloads and their extracted files ({size_text(folder_bytes(downloads))} '
          f'in {downloads}) are no longer needed once prepared; the runs read only the '
          'prepared folders.', file=out)
  out.flush()
  left = {o.tfds_name: o for o in outcomes if o.status in ('manual', 'no network', 'failed')}
  names = [f'{n} ({o.status})' for o in left.values() for n in o.tasks]
  names += [f'{t.name} ({p})' for t in tasks
            if t.tfds_name not in left and (p := problem(t, data_dir))]
  if names:
    raise errors.UserError(
        f'VTAB prepare: {len(names)} of the {len(tasks)} tasks cannot run yet: '
        f'{", ".join(names)}; see the lines above'
        f'{" for the manual downloads" if manual else ""}.')
  return outcomes

