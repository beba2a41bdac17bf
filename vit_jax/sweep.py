r"""Sweeps and their tables: a grid of config values x seeds as separate runs, mean ± std.

    python -m vit_jax.sweep --config=configs/quickstart.py --workdir=DIR \
        --grid=schedule.base_lr=0.001,0.003,0.01 --seeds=3 [--minival=2] \
        [--print_commands] [--config.FIELD=VALUE ...]
    python -m vit_jax.sweep results DIR [--json=FILE]

Each grid point and seed is an ordinary ``vit_jax.main`` run in ``DIR/FIELD=VALUE/seed=K``, run
here one after the other (resumed or skipped when started again) or printed for many hosts;
``--minival=P`` first picks the point on the last P% of the training split (the paper's
fine-tuning protocol, appendix B.1.1). ``results DIR`` tables any folder of finished runs.
docs/vtab_and_sweeps.md.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import json
import math
import shlex
import sys
from typing import Any

import numpy as np
from absl import app, flags
from etils import epath

from vit_jax import config as config_lib
from vit_jax import main as main_lib
from vit_jax.base import console, errors, paths
from vit_jax.checkpoints.run import record
from vit_jax.config import cli as config_cli
from vit_jax.data import sources

IGNORED = ('seed',)  # Fields that do not make another setting.


# ---------------------------------------------------------------------------
# Reading finished runs.


@dataclasses.dataclass
class Run:
  """A workdir read back: its config (flat), its length, its final evaluation if it ran."""

  path: str
  config: dict[str, Any]
  total_steps: int
  accuracy: float | None  # The headline metric at total_steps; None: not finished.
  metric: str  # Its name (evals.headline).
  last_step: int


def total_steps(config: Any) -> int:
  """A run's length: ``total_steps`` (or its last schedule phase's), or ``num_epochs`` over
  its training split's size."""
  from vit_jax.training import optim  # jax comes with it: when runs are read, not with the command.

  config = config_lib.complete(config)
  if config.total_steps:
    return max([int(config.total_steps)] + [p['total_steps'] for p in config.schedule.phases])
  source = sources.get_source(config.dataset, config.dataset.train_split)
  return optim.resolve_steps(config, len(source))[0]


def read_run(path: Any) -> Run:
  """The run in workdir ``path`` (``config.json`` and ``metrics.jsonl``)."""
  path = epath.Path(path)
  config = config_lib.convert_old_evals(json.loads((path / record.CONFIG_FILE).read_text()))
  total = total_steps(config)
  from vit_jax import evals  # jax comes with it: when runs are read, not with the command.

  key = evals.headline(config_lib.complete(config))
  accuracy, last = None, 0
  for _, row in record.metric_rows(path):
    last = max(last, int(row['step']))
    if row['step'] == total and key in row:
      accuracy = float(row[key])
  return Run(str(path), config_lib.flatten(config), total, accuracy, key.split('/')[-1], last)


def find_runs(directory: Any) -> list[Run]:
  """Every run (a folder with ``config.json``) under ``directory``, in path order."""
  root = epath.Path(directory)
  if not root.is_dir():
    raise errors.MissingFileError(f'{directory} is not a directory of runs.')

  def walk(path: epath.Path) -> list[epath.Path]:
    if (path / record.CONFIG_FILE).exists():  # A run: its folders hold no other run.
      return [path]
    return [run for child in sorted(path.iterdir()) if child.is_dir() for run in walk(child)]
  return [read_run(p) for p in walk(root)]


def summarise(runs: list[Run], shown: list[str] = ()) -> dict[str, Any]:
  """Finished runs grouped by setting (configs equal but for the seed): mean ± std each.

  The setting of a row is shown by the fields that differ between rows (all rows share
  the rest) and the fields in ``shown`` (a sweep's grid: the setting it chose, even alone);
  std is the sample standard deviation (n - 1; 0 for a single run).
  """
  finished = [r for r in runs if r.accuracy is not None]
  groups: dict[str, list[Run]] = {}
  for run in finished:
    key = json.dumps({k: v for k, v in sorted(run.config.items()) if k not in IGNORED},
                     default=str)
    groups.setdefault(key, []).append(run)
  configs = [json.loads(k) for k in groups]
  fields = sorted({f for c in configs for f in c
                   if any(c.get(f) != other.get(f) for other in configs)} | set(shown))
  rows = []
  for group in groups.values():
    values = np.array([r.accuracy for r in group], np.float64)
    rows.append({
        'setting': {f: group[0].config.get(f) for f in fields},
        'metric': group[0].metric, 'n': len(group),
        'seeds': [r.config.get('seed') for r in group],
        'values': values.tolist(), 'mean': float(values.mean()),
        'std': float(values.std(ddof=1)) if len(group) > 1 else 0.0,
        'runs': [r.path for r in group]})
  unfinished = [{'run': r.path, 'step': r.last_step, 'total_steps': r.total_steps}
                for r in runs if r.accuracy is None]
  return {'fields': fields, 'rows': rows, 'unfinished': unfinished}


def markdown(summary: dict[str, Any]) -> str:
  """The summary as a Markdown table (metric in %, mean ± std over n runs); a sweep's choice
  on its minival split first."""
  fields = summary['fields']
  metric = summary['rows'][0]['metric'] if summary['rows'] else 'accuracy'
  chosen = summary.get('chosen')
  lines = [f'Chosen on the minival split {chosen["minival_split"]}: {chosen["point"]} '
           f'({metric} {100 * chosen["minival"]:.2f}%); trained on the whole training split '
           f'with {len(summary["rows"][0]["seeds"]) if summary["rows"] else 0} seeds:\n'] \
      if chosen else []
  lines += ['| ' + ' | '.join([*fields, f'{metric} (%)', 'runs', 'seeds']) + ' |',
           '| ' + ' | '.join(['---'] * (len(fields) + 3)) + ' |']
  for row in summary['rows']:
    cells = [str(row['setting'][f]) for f in fields]
    cells += [f'{100 * row["mean"]:.2f} ± {100 * row["std"]:.2f}', str(row['n']),
              ', '.join(str(s) for s in row['seeds'])]
    lines.append('| ' + ' | '.join(cells) + ' |')
  for run in summary['unfinished']:
    lines.append(f'\nnot finished: {run["run"]} (step {run["step"]} of {run["total_steps"]})')
  return '\n'.join(lines)


def write_results(directory: Any, out: Any = None, json_path: str | None = None,
                  summary: dict[str, Any] | None = None) -> dict[str, Any]:
  """Prints the table of the runs under ``directory`` (or ``summary``, a sweep's); writes it
  as JSON (and Markdown)."""
  out = out or sys.stdout
  summary = summarise(find_runs(directory)) if summary is None else summary
  text = markdown(summary)
  print(text, file=out, flush=True)
  path = epath.Path(json_path) if json_path else epath.Path(directory) / 'results.json'
  path.write_text(json.dumps(summary, indent=1))
  path.with_suffix('.md').write_text(text + '\n')
  return summary


# ---------------------------------------------------------------------------
# The grid.


def parse_grid(specs: list[str]) -> list[tuple[str, list[str]]]:
  """``FIELD=v1,v2`` (or ``FIELD=[v1, v2]``, a Python list, for values with commas) ->
  (field, the values' command-line texts)."""
  grid = []
  for spec in specs:
    field, eq, values = spec.partition('=')
    if not eq or not field or not values:
      raise errors.ConfigError(f'--grid={spec}: write --grid=FIELD=VALUE,VALUE (e.g. '
                               '--grid=schedule.base_lr=0.001,0.003).')
    if values.startswith('['):
      try:
        texts = [repr(v) if not isinstance(v, str) else v for v in ast.literal_eval(values)]
      except (SyntaxError, ValueError):
        raise errors.ConfigError(f'--grid={spec}: {values} is not a Python list.') from None
    else:
      texts = [v.strip() for v in values.split(',')]
    if any(f == field for f, _ in grid):
      raise errors.ConfigError(f'--grid: {field} is given twice; list its values once.')
    if field in IGNORED:
      raise errors.ConfigError(f'--grid={spec}: the seeds are --seeds, not a grid field.')
    grid.append((field, texts))
  return grid


def points(grid: list[tuple[str, list[str]]]) -> list[list[tuple[str, str]]]:
  """Every combination of the grid's values, as (field, text) overrides."""
  fields = [f for f, _ in grid]
  return [list(zip(fields, combo, strict=True))
          for combo in itertools.product(*(v for _, v in grid))]


def point_name(point: list[tuple[str, str]]) -> str:
  name = ','.join(f'{f}={v}' for f, v in point) or 'base'
  return ''.join(c if c.isalnum() or c in '.,=-_+' else '_' for c in name)


@dataclasses.dataclass
class Plan:
  """A run of the sweep: its workdir and its overrides (after the user's)."""

  workdir: str
  overrides: list[tuple[str, str]]


def minival_splits(train_split: str, percent: float) -> tuple[str, str]:
  """The training split less its last ``percent``%, and those ``percent``%."""
  if '[' in train_split or '+' in train_split:
    raise errors.ConfigError(
        f'--minival cuts its split from the whole training split, but '
        f'config.dataset.train_split={train_split!r} is already a slice: set '
        '--config.dataset.train_split to the whole split (e.g. train).')
  if not 0 < percent < 100:
    raise errors.ConfigError(f'--minival={percent:g} must be a percentage in (0, 100).')
  keep = f'{100 - percent:g}'
  return f'{train_split}[:{keep}%]', f'{train_split}[{keep}%:]'


class Sweep:
  """The runs of one sweep command."""

  def __init__(self, config_file: str, user_overrides: list[tuple[str, str | None]],
               workdir: str, grid: list[tuple[str, list[str]]], seeds: int, minival: float):
    if seeds < 1:
      raise errors.ConfigError(f'--seeds={seeds}: at least one.')
    self.config_file, self.user, self.workdir = config_file, list(user_overrides), workdir
    self.grid, self.seeds, self.minival = grid, seeds, minival
    self.base = config_cli.load(config_file, self.user)  # Its errors now, before any run.
    for point in points(grid):
      config_cli.load(config_file, self.user + point)  # Every grid value, typed and checked.
    self.splits = (minival_splits(self.base.dataset.train_split, minival)
                   if minival else None)

  def config(self, plan: Plan) -> Any:
    return config_cli.load(self.config_file, self.user + plan.overrides)

  def minival_runs(self) -> list[Plan]:
    train, held_out = self.splits
    return [Plan(str(epath.Path(self.workdir) / 'minival' / point_name(p) / 'seed=0'),
                 p + [('seed', '0'), ('dataset.train_split', train),
                      ('dataset.eval_split', held_out)])
            for p in points(self.grid)]

  def final_runs(self, chosen: list[list[tuple[str, str]]]) -> list[Plan]:
    return [Plan(str(epath.Path(self.workdir) / point_name(p) / f'seed={seed}'),
                 p + [('seed', str(seed))])
            for p in chosen for seed in range(self.seeds)]

  def choose(self) -> tuple[list[tuple[str, str]] | None, list[dict[str, Any]]]:
    """The grid point with the best minival accuracy (None until all have finished)."""
    scores = []
    for plan, point in zip(self.minival_runs(), points(self.grid), strict=True):
      run = read_run(plan.workdir) if (epath.Path(plan.workdir) / record.CONFIG_FILE).exists() \
          else None
      scores.append({'point': point_name(point), 'minival':
                     None if run is None else run.accuracy})
    if any(s['minival'] is None for s in scores):
      return None, scores
    best = max(range(len(scores)), key=lambda i: scores[i]['minival'])  # First of ties.
    return points(self.grid)[best], scores

  def command(self, plan: Plan) -> str:
    """The ``vit_jax.main`` command line of a run."""
    args = [sys.executable, '-m', 'vit_jax.main', f'--config={self.config_file}',
            f'--workdir={plan.workdir}']
    args += [f'--config.{f}' if t is None else f'--config.{f}={t}'
             for f, t in self.user + plan.overrides]
    return ' '.join(shlex.quote(a) for a in args)


def finished(plan: Plan) -> bool:
  path = epath.Path(plan.workdir)
  return (path / record.CONFIG_FILE).exists() and read_run(path).accuracy is not None


def train(sweep: Sweep, plans: list[Plan], out: Any) -> None:
  for i, plan in enumerate(plans, 1):
    if finished(plan):
      print(f'[{i}/{len(plans)}] {plan.workdir}: finished earlier', file=out, flush=True)
      continue
    print(f'[{i}/{len(plans)}] {plan.workdir}', file=out, flush=True)
    with console.logging_to(plan.workdir):  # Its lines with absl's prefix: its log.txt.
      main_lib.train_and_evaluate(sweep.config(plan), plan.workdir)
    if not finished(plan):
      raise errors.UserError(f'{plan.workdir} stopped before its end (preempted?): run the '
                             'same sweep command again to resume it.')


def validate(sweep: Sweep, plans: list[Plan]) -> None:
  """Every unfinished run's config checked as ``vit_jax.main.train_and_evaluate`` checks it
  (``main.prepare``, and a resume's against its workdir), before the first run starts: a
  mistake in one grid point is one line at once, not a failure hours into the sweep. Runs
  that differ only in their seed are prepared once."""
  prepared = set()
  for plan in plans:
    if finished(plan):
      continue
    config = sweep.config(plan)
    setting = json.dumps([o for o in plan.overrides if o[0] not in IGNORED])
    try:
      record.check_resume(plan.workdir, config)
      if setting not in prepared:
        main_lib.prepare(config)
        prepared.add(setting)
    except errors.UserError as e:
      raise type(e)(f'{plan.workdir}: {e} (checked before the sweep\'s first run)') from None


def run_sweep(sweep: Sweep, print_commands: bool = False, out: Any = None) -> dict | None:
  """Trains (or prints) the sweep's runs; prints and writes the table of the final runs.
  Before the first run trains, every run's config is validated (``validate``)."""
  out = out or sys.stdout
  if not print_commands:
    validate(sweep, (sweep.minival_runs() if sweep.minival else [])
             + sweep.final_runs(points(sweep.grid)))
  chosen: list[list[tuple[str, str]]] | None = points(sweep.grid)
  if sweep.minival:
    stage = sweep.minival_runs()
    if print_commands:
      todo = [p for p in stage if not finished(p)]
      for plan in todo:
        print(sweep.command(plan), file=out)
      if todo:
        print(f'# Then run this sweep command again: it chooses on the minival runs and '
              f'prints the {sweep.seeds} seed runs.', file=out, flush=True)
        return None
    else:
      train(sweep, stage, out)
    point, scores = sweep.choose()
    best = next(s for s in scores if s['point'] == point_name(point))
    for score in scores:
      print(f'minival {score["point"]}: {100 * score["minival"]:.2f}%', file=out)
    print(f'chosen on the minival split ({sweep.splits[1]}): {point_name(point)}', file=out,
          flush=True)
    chosen = [point]
    (epath.Path(sweep.workdir) / 'minival' / 'choice.json').write_text(json.dumps(
        {'minival_split': sweep.splits[1], 'scores': scores, 'chosen': point_name(point)},
        indent=1))
  plans = sweep.final_runs(chosen)
  if print_commands:
    for plan in plans:
      if not finished(plan):
        print(sweep.command(plan), file=out)
    print(f'# When they have finished: python -m vit_jax.sweep results {sweep.workdir}',
          file=out, flush=True)
    return None
  train(sweep, plans, out)
  runs = [read_run(p.workdir) for p in plans]
  summary = summarise(runs, [f for f, _ in sweep.grid])
  if sweep.minival:
    summary['chosen'] = {'point': point_name(chosen[0]), 'minival_split': sweep.splits[1],
                         'minival': best['minival']}
  write_results(sweep.workdir, out, summary=summary)
  print(f'Written: {epath.Path(sweep.workdir) / "results.json"}', file=out, flush=True)
  return summary


# ---------------------------------------------------------------------------
# The command line.


def _define_flags() -> dict[str, Any]:
  return dict(
      config=config_cli.DEFINE_config('config', 'The recipe swept.'),
      workdir=paths.DEFINE_path('workdir', None, 'The sweep\'s folder: one workdir a run.'),
      grid=flags.DEFINE_multi_string('grid', [], 'FIELD=VALUE,VALUE,...: the values of a '
                                     'config field (repeat for more fields: their product).'),
      seeds=flags.DEFINE_integer('seeds', 3, 'Seeds 0 .. N-1 of each setting (the paper: 3).'),
      minival=flags.DEFINE_float('minival', 0, 'Choose the grid point on this percentage of '
                                 'the training split held out (the paper: 2 for CIFAR), then '
                                 'run it with every seed; 0: every point with every seed.'),
      print_commands=flags.DEFINE_bool('print_commands', False, 'Print the vit_jax.main '
                                       'command of each run still to do instead of running.'),
      json=paths.DEFINE_path('json', None, 'results: the JSON file (default DIR/results.json; '
                               'the Markdown beside it).'),
      cpu_devices=flags.DEFINE_integer('cpu_devices', 0, 'As vit_jax.main\'s --cpu_devices.'),
  )


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  if len(argv) > 1 and argv[1] == 'results':
    if len(argv) != 3:
      raise app.UsageError('python -m vit_jax.sweep results DIR')
    write_results(paths.expand(argv[2]), json_path=flags_['json'].value)
    return
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]} (results DIR, or flags).')
  if not flags_['workdir'].value:
    raise errors.ConfigError('--workdir is required: the sweep\'s folder.')
  config_flag = flags_['config']
  if not math.isfinite(flags_['minival'].value):
    raise errors.ConfigError('--minival must be a percentage.')
  sweep = Sweep(config_flag.file.value, config_flag.overrides, flags_['workdir'].value,
                parse_grid(flags_['grid'].value), flags_['seeds'].value, flags_['minival'].value)
  if not flags_['print_commands'].value:
    paths.output_dir(flags_['workdir'].value)  # Before jax and TensorFlow start.
    console.start(flags_['cpu_devices'].value)
  run_sweep(sweep, flags_['print_commands'].value)


if __name__ == '__main__':
  config_cli.run(functools.partial(main, flags_=_define_flags()))
