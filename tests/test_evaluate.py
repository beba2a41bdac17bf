"""vit_jax.evaluate: a finished run's evaluators against what training logged, and
`python -m vit_jax.evaluate`."""

import re
import subprocess
import sys

import chex
import jax
import pytest

from vit_jax import checkpoints, evals, evaluation
from vit_jax.base import errors, sharding
from vit_jax.checkpoints.run import workdir

from runs import QUICKSTART, TINY, TINY_RUN, env, read_metrics


@pytest.mark.slow
def test_evaluate_params_equals_what_training_logged(tiny_run):
  """The run's last eval row was computed by training's evaluator on the same weights."""
  config = workdir.load_config(tiny_run)
  params, step = workdir.restore_params(tiny_run)
  logged = next(row for row in read_metrics(tiny_run)
                if row['step'] == step and 'eval/accuracy' in row)
  ((evaluator, result),) = evaluation.evaluate_params(config, params)
  assert evaluator.name == 'eval'
  chex.assert_trees_all_close(result['accuracy'], logged['eval/accuracy'], atol=1e-6)
  chex.assert_trees_all_close(result['loss'], logged['eval/loss'], rtol=1e-5)
  assert result['examples'] == logged['eval/examples'] == 359
  # The same evaluator built from the loaded checkpoint, with no plan: the same numbers.
  loaded = checkpoints.load(str(tiny_run))
  (evaluator,) = evals.from_config(evals.Context.from_loaded(loaded, config), ['eval'])
  again = evaluator.run(jax.device_put(loaded.params, sharding.replicated(sharding.make_mesh())))
  chex.assert_trees_all_close(again, result, atol=1e-6)


@pytest.mark.slow
def test_command_prints_the_metric_with_progress(tiny_run):
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={tiny_run}', '--progress_every=0'],
      env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r'evaluating eval: [\d,]+/359 images \(\d+%\), [\d,]+/s, ETA',
                   result.stderr)
  line = result.stdout.strip().splitlines()[-1]
  logged = [row for row in read_metrics(tiny_run) if 'eval/accuracy' in row][-1]
  assert re.fullmatch(rf'.* step 10, eval: accuracy {logged["eval/accuracy"]:.4f}, '
                      r'loss [\d.]+ \(359 examples\)', line), line


@pytest.mark.slow
def test_command_refuses_a_missing_workdir_in_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={tmp_path / "nothing"}'],
      env=env(devices=1), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().startswith('error: ') and '\n' not in result.stderr.strip()


def test_a_timm_export_of_the_run_evaluates_as_the_run(tiny_run, tmp_path):
  """--source with --config: the checkpoint in the config's model, the config's evaluators."""
  from vit_jax.tools import export

  export.export(str(tiny_run), str(tmp_path / 'timm'), format='timm')
  overrides = [f'--config.{k}={v}' for k, v in {**TINY, **TINY_RUN}.items()]
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--source={tmp_path / "timm"}',
       f'--config={QUICKSTART}', *overrides, '--progress_every=0'],
      env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  line = result.stdout.strip().splitlines()[-1]
  logged = [row for row in read_metrics(tiny_run) if 'eval/accuracy' in row][-1]
  assert re.fullmatch(rf'.*timm, eval: accuracy {logged["eval/accuracy"]:.4f}, '
                      r'loss [\d.]+ \(359 examples\)', line), line
  assert not re.search(r'^[IWEF]\d{4} ', result.stderr, re.M), result.stderr  # absl's prefix.
  assert result.stderr.count('arrays loaded') == 1, result.stderr  # Into the config's model.


def test_one_checkpoint_at_several_patch_sizes(tiny_run):
  """FlexiViT's evaluation: the run's own patch size gives what training logged; another is
  the checkpoint loaded at it (checkpoints.load(..., patch_size=P)), evaluated; the work
  falls with the tokens."""
  config = workdir.load_config(tiny_run)
  rows = evaluation.at_patch_sizes(config, str(tiny_run), None, [2, 4, 8], source=False)
  assert [r['patch_size'] for r in rows] == [2, 4, 8]
  assert [r['grid'] for r in rows] == [(8, 8), (4, 4), (2, 2)]
  assert [r['tokens'] for r in rows] == [65, 17, 5]
  assert rows[0]['flops'] > rows[1]['flops'] > rows[2]['flops']
  logged = [row for row in read_metrics(tiny_run) if 'eval/accuracy' in row][-1]
  chex.assert_trees_all_close(rows[1]['metrics']['eval'][1]['accuracy'],
                              logged['eval/accuracy'], atol=1e-6)
  loaded = checkpoints.load(str(tiny_run), patch_size=8)
  (evaluator,) = evals.from_config(evals.Context.from_loaded(loaded, config), ['eval'])
  again = evaluator.run(jax.device_put(loaded.params, sharding.replicated(sharding.make_mesh())))
  chex.assert_trees_all_close(again, rows[2]['metrics']['eval'][1], atol=1e-6)
  table = evaluation.patch_size_table(rows).splitlines()
  assert table[0].split() == ['patch', 'grid', 'tokens', 'GFLOPs/image', 'eval/accuracy']
  assert table[2].split()[:3] == ['4', '4x4', '17']
  assert table[2].split()[-1] == f'{logged["eval/accuracy"]:.4f}'
  with pytest.raises(errors.ConfigError, match=r'--patch_sizes=5: config.model.image_size=16'):
    evaluation.at_patch_sizes(config, str(tiny_run), None, [5], source=False)


@pytest.mark.slow
def test_command_prints_a_table_of_patch_sizes(tiny_run, tmp_path):
  """--patch_sizes with --workdir and with --source (the run exported as .npz: its own file)."""
  from vit_jax.tools import export

  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={tiny_run}', '--patch_sizes=4,8',
       '--progress_every=0'], env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert lines[-3].split() == ['patch', 'grid', 'tokens', 'GFLOPs/image', 'eval/accuracy']
  assert [line.split()[0] for line in lines[-2:]] == ['4', '8']
  export.export(str(tiny_run), str(tmp_path / 'run.npz'))
  overrides = [f'--config.{k}={v}' for k, v in {**TINY, **TINY_RUN}.items()]
  from_file = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--source={tmp_path / "run.npz"}',
       f'--config={QUICKSTART}', *overrides, '--patch_sizes=4,8', '--progress_every=0'],
      env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert from_file.returncode == 0, from_file.stderr[-3000:]
  assert from_file.stdout.strip().splitlines()[-2:] == lines[-2:]
  bad = subprocess.run(
      [sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={tiny_run}', '--patch_sizes=4,x'],
      env=env(devices=1), capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and bad.stderr.strip() == (
      'error: --patch_sizes=4,x: give positive integers, e.g. --patch_sizes=8,16,32.')
