"""Sweeps: the README's three-seed sweep of the quickstart with the minival choice, the
results table, the printed commands, and the refused inputs."""

import io
import json
import subprocess
import sys

import chex
import ml_collections
import numpy as np
import pytest

from vit_jax import sweep
from vit_jax.base import errors
from vit_jax.data import sources

from runs import QUICKSTART, TINY, env, read_metrics

# The tiny recipe, shorter still: 5 runs in one process.
FAST = {**TINY, 'total_steps': 12, 'schedule.warmup_steps': 2, 'log_every_steps': 6,
        'checkpoint_every_steps': 12, 'batch_size': 32, 'eval_batch_size': 32}


def _sweep_command(workdir, *flags):
  return [sys.executable, '-m', 'vit_jax.sweep', f'--config={QUICKSTART}',
          f'--workdir={workdir}', *flags] + [f'--config.{k}={v}' for k, v in FAST.items()]


def _final_accuracy(run):
  rows = [r for r in read_metrics(run) if 'eval/accuracy' in r]
  chex.assert_equal(rows[-1]['step'], FAST['total_steps'])
  return rows[-1]['eval/accuracy'], rows[-1]['eval/examples']


@pytest.mark.slow
def test_three_seed_sweep_with_minival_prints_mean_and_std(tmp_path):
  workdir = tmp_path / 'sweep'
  command = _sweep_command(workdir, '--grid=schedule.base_lr=0.0003,0.003', '--seeds=3',
                           '--minival=2')
  result = subprocess.run(command, env=env(2), capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]

  # The minival runs: 98% of digits' 1,438 training images, evaluated on the other 29.
  minival = {}
  for lr in ('0.0003', '0.003'):
    run = workdir / 'minival' / f'schedule.base_lr={lr}' / 'seed=0'
    config = json.loads((run / 'config.json').read_text())
    assert (config['dataset']['train_split'], config['dataset']['eval_split']) == \
        ('train[:98%]', 'train[98%:]')
    minival[lr], examples = _final_accuracy(run)
    chex.assert_equal(examples, 29)
  chosen = max(minival, key=minival.get)
  assert f'chosen on the minival split (train[98%:]): schedule.base_lr={chosen}' in \
      result.stdout

  # The chosen rate with seeds 0, 1, 2 on the whole training split, evaluated on the test split.
  accuracies = []
  for seed in range(3):
    run = workdir / f'schedule.base_lr={chosen}' / f'seed={seed}'
    config = json.loads((run / 'config.json').read_text())
    assert (config['seed'], config['schedule']['base_lr']) == (seed, float(chosen))
    assert config['dataset']['train_split'] == 'train'
    accuracy, examples = _final_accuracy(run)
    chex.assert_equal(examples, 359)
    accuracies.append(accuracy)
  assert len(set(accuracies)) > 1  # The seeds differ.
  mean, std = np.mean(accuracies), np.std(accuracies, ddof=1)
  assert f'| {float(chosen)} | {100 * mean:.2f} ± {100 * std:.2f} | 3 | 0, 1, 2 |' in \
      result.stdout  # The table names the chosen setting.
  assert (f'Chosen on the minival split train[98%:]: schedule.base_lr={chosen} (accuracy '
          f'{100 * minival[chosen]:.2f}%)') in (workdir / 'results.md').read_text()
  summary = json.loads((workdir / 'results.json').read_text())
  chex.assert_equal(len(summary['rows']), 1)
  np.testing.assert_allclose([summary['rows'][0]['mean'], summary['rows'][0]['std']],
                             [mean, std], rtol=1e-12)

  # Again: every run is finished, nothing trains; the same table.
  again = subprocess.run(command, env=env(2), capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  chex.assert_equal(again.stdout.count('finished earlier'), 5)
  assert f'{100 * mean:.2f} ± {100 * std:.2f}' in again.stdout

  # results over the whole folder: the minival rows beside the final one.
  table = subprocess.run([sys.executable, '-m', 'vit_jax.sweep', 'results', str(workdir),
                          f'--json={tmp_path / "all.json"}'], env=env(2), capture_output=True,
                         text=True, timeout=300)
  assert table.returncode == 0, table.stderr[-3000:]
  everything = json.loads((tmp_path / 'all.json').read_text())
  assert everything['fields'] == ['dataset.eval_split', 'dataset.train_split',
                                  'schedule.base_lr']
  assert sorted(r['n'] for r in everything['rows']) == [1, 1, 3]
  assert f'| test | train | {float(chosen)} | {100 * mean:.2f} ± {100 * std:.2f} |' in \
      table.stdout
  assert (tmp_path / 'all.md').read_text().strip() == table.stdout.strip()


def test_results_groups_by_setting_and_lists_unfinished_runs(tmp_path):
  def write(path, seed, lr, accuracy, last_step=10):
    path.mkdir(parents=True)
    config = {'seed': seed, 'total_steps': 10, 'schedule': {'base_lr': lr},
              'dataset': {'name': 'digits'}}
    (path / 'config.json').write_text(json.dumps(config))
    rows = [{'step': 5, 'train/loss': 1.0}, {'step': last_step, 'eval/accuracy': accuracy}]
    (path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))

  for seed, accuracy in enumerate((0.5, 0.6, 0.7)):
    write(tmp_path / 'a' / str(seed), seed, 0.01, accuracy)
  write(tmp_path / 'b' / '0', 0, 0.03, 0.9)
  write(tmp_path / 'c' / '0', 1, 0.03, 0.8, last_step=5)  # Stopped at step 5 of 10.
  summary = sweep.summarise(sweep.find_runs(tmp_path))
  assert summary['fields'] == ['schedule.base_lr']
  rows = {r['setting']['schedule.base_lr']: r for r in summary['rows']}
  np.testing.assert_allclose([rows[0.01]['mean'], rows[0.01]['std']], [0.6, 0.1])
  assert (rows[0.03]['n'], rows[0.03]['std']) == (1, 0.0)
  assert summary['unfinished'] == [{'run': str(tmp_path / 'c' / '0'), 'step': 5,
                                    'total_steps': 10}]
  text = sweep.markdown(summary)
  assert '| 0.01 | 60.00 ± 10.00 | 3 | 0, 1, 2 |' in text
  assert 'not finished:' in text

  # A sweep's final runs share their setting: its grid field is still a column, and the
  # choice on the minival split comes first.
  chosen = sweep.summarise(sweep.find_runs(tmp_path / 'a'), ['schedule.base_lr'])
  chosen['chosen'] = {'point': 'schedule.base_lr=0.01', 'minival_split': 'train[98%:]',
                      'minival': 0.75}
  lines = sweep.markdown(chosen).splitlines()
  assert lines[0] == ('Chosen on the minival split train[98%:]: schedule.base_lr=0.01 (accuracy '
                      '75.00%); trained on the whole training split with 3 seeds:')
  assert lines[2:5] == ['| schedule.base_lr | accuracy (%) | runs | seeds |',
                        '| --- | --- | --- | --- |', '| 0.01 | 60.00 ± 10.00 | 3 | 0, 1, 2 |']


def test_a_run_is_read_by_its_evaluators_headline_metric(tmp_path):
  """A self-supervised run's evaluator scores colours: its run is finished by that metric."""
  config = {'objective': 'mpp', 'total_steps': 10, 'evals': {'eval': {'type': 'mpp'}},
            'dataset': {'name': 'digits'}}
  (tmp_path / 'config.json').write_text(json.dumps(config))
  (tmp_path / 'metrics.jsonl').write_text(json.dumps(
      {'step': 10, 'eval/color_accuracy': 0.25, 'eval/loss': 3.0}) + '\n')
  run = sweep.read_run(tmp_path)
  assert (run.metric, run.accuracy) == ('color_accuracy', 0.25)


@pytest.mark.slow
def test_print_commands_are_main_command_lines(tmp_path):
  out = subprocess.run(_sweep_command(tmp_path / 's', '--grid=schedule.base_lr=0.001,0.01',
                                      '--grid=model.num_layers=1,2', '--seeds=2',
                                      '--print_commands'),
                       env=env(2), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  commands = [line for line in out.stdout.splitlines() if not line.startswith('#')]
  chex.assert_equal(len(commands), 2 * 2 * 2)
  for command in commands:
    assert ' -m vit_jax.main ' in command and f'--config={QUICKSTART}' in command
    assert '--config.total_steps=12' in command
  assert any('--workdir=' + str(tmp_path / 's' / 'schedule.base_lr=0.01,model.num_layers=2'
                                / 'seed=1') in c and '--config.seed=1' in c
             and '--config.schedule.base_lr=0.01' in c and '--config.model.num_layers=2' in c
             for c in commands)
  minival = subprocess.run(_sweep_command(tmp_path / 'm', '--grid=schedule.base_lr=0.001,0.01',
                                          '--minival=2', '--print_commands'),
                           env=env(2), capture_output=True, text=True, timeout=300)
  lines = minival.stdout.splitlines()
  chex.assert_equal(sum('vit_jax.main' in line for line in lines), 2)
  assert all("'--config.dataset.train_split=train[:98%]'" in line
             for line in lines if 'vit_jax.main' in line)


@pytest.mark.slow
@pytest.mark.parametrize('flags, message', [
    (['--grid=schedule.base_lr=0.01,fast'], "schedule.base_lr='fast' is not a number"),
    (['--grid=schedule.lr=0.01'], 'schedule.lr is not a config field'),
    (['--grid=seed=1,2'], 'the seeds are --seeds'),
    (['--minival=2', '--config.dataset.train_split=train[:90%]'], 'already a slice'),
])
def test_bad_sweeps_are_refused_in_one_line(tmp_path, flags, message):
  result = subprocess.run(_sweep_command(tmp_path / 's', *flags), env=env(2),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == errors.EXIT_STATUS
  assert 'Traceback' not in result.stderr and message in result.stderr
  assert not (tmp_path / 's').exists()


def test_sliced_splits_of_in_memory_sources_follow_tfds_rounding():
  config = ml_collections.ConfigDict({'name': 'digits', 'data_dir': ''})
  whole = sources.get_source(config, 'train')
  head, tail = (sources.get_source(config, s) for s in ('train[:98%]', 'train[98%:]'))
  chex.assert_equal((len(whole), len(head), len(tail)), (1438, 1409, 29))  # round(1409.24).
  chex.assert_trees_all_equal(tail[0], whole[1409])
  chex.assert_trees_all_equal(head[1408], whole[1408])
  chex.assert_equal(len(sources.get_source(config, 'train[10:20]')), 10)
  with pytest.raises(ValueError, match='one split and one slice'):
    sources.get_source(config, 'train[:10]+test')


def test_grid_values_with_commas_as_a_list():
  grid = sweep.parse_grid(['model.image_size=[(16, 16), (24, 24)]', 'seeds_x=1'])
  assert grid[0] == ('model.image_size', ['(16, 16)', '(24, 24)'])
  assert sweep.point_name([('model.image_size', '(16, 16)')]) == 'model.image_size=_16,_16_'
  with pytest.raises(errors.ConfigError, match='FIELD=VALUE'):
    sweep.parse_grid(['schedule.base_lr'])



def test_every_runs_config_is_validated_before_the_first_run_starts(tmp_path):
  """A warm-up as long as the run in one grid point: refused in one line naming that run
  before the first run (whose config is fine) trains; before, 136 s into the first run."""
  workdir = tmp_path / 's'
  plan = sweep.Sweep(str(QUICKSTART), [(k, str(v)) for k, v in FAST.items()], str(workdir),
                     sweep.parse_grid(['schedule.warmup_steps=2,12']), seeds=2, minival=0)
  with pytest.raises(errors.ConfigError, match=(
      rf'^{workdir}/schedule.warmup_steps=12/seed=0: config.schedule: the warm-up \(12 steps\) '
      r'is not shorter than the run \(12 steps\)\. .* \(checked before the sweep\'s first run\)$')):
    sweep.run_sweep(plan, out=io.StringIO())
  assert not list(workdir.rglob('checkpoints'))
