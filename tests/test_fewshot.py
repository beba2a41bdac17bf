"""`python -m vit_jax.fewshot` and few-shot evaluation in training: the training loop's metrics, the
command line (its mistakes, any checkpoint as a source) and the quickstart's accuracy."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from vit_jax import evals, main
from vit_jax.base import errors
from vit_jax.evals import fewshot

from runs import ROOT, env, read_metrics, tiny_config

FEWSHOT = dict(type='fewshot', datasets=('digits',))


@pytest.mark.slow
def test_training_logs_fewshot_metrics_and_the_cli_agrees(tmp_path):
  config = tiny_config(**{'evals.fewshot': FEWSHOT | dict(shots=(1, 5), seeds=2),
                          'eval_every_steps': 10})
  result = main.train_and_evaluate(config, str(tmp_path))
  rows = [r for r in read_metrics(tmp_path) if any(k.startswith('fewshot/') for k in r)]
  assert [r['step'] for r in rows] == [10, 20]
  assert set(rows[-1]) == {'step', 'fewshot/digits_1shot', 'fewshot/digits_5shot'}
  assert result['fewshot/digits_5shot'] == rows[-1]['fewshot/digits_5shot']
  from tensorboard.backend.event_processing import event_accumulator

  events = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={'tensors': 0})
  events.Reload()
  logged = events.Tensors('fewshot/digits_5shot')
  assert [e.step for e in logged] == [10, 20]

  out = tmp_path / 'fewshot.json'
  run = subprocess.run([sys.executable, '-m', 'vit_jax.fewshot', f'--workdir={tmp_path}',
                        '--dataset=digits', '--shots=1,5,200', '--seeds=2', '--batch_size=64',
                        f'--json={out}'], capture_output=True, text=True, env=env(), cwd=ROOT,
                       timeout=300)
  assert run.returncode == 0, run.stderr
  (row,) = [line for line in run.stdout.splitlines() if line.startswith('| digits |')]
  assert '5-shot | 200-shot |' in run.stdout and row.endswith(' | - |')  # No class has 200.
  assert 'sample std' in run.stdout
  assert sum('too few for 200-shot: skipped (1-shot, 5-shot computed)' in line
             for line in run.stderr.splitlines()) == 1
  assert len(run.stderr.splitlines()) == 1, run.stderr  # Its own line; no Orbax INFO lines.
  cli = {(r['dataset'], r['shots']): r['mean'] for r in json.loads(out.read_text())}
  assert set(cli) == {('digits', 1), ('digits', 5)}
  # The same checkpoint (step 20), on 1 device instead of 8, float32 features.
  assert cli[('digits', 5)] == pytest.approx(rows[-1]['fewshot/digits_5shot'], abs=1e-6)
  assert cli[('digits', 1)] == pytest.approx(rows[-1]['fewshot/digits_1shot'], abs=1e-6)


@pytest.mark.parametrize('entry,match', [
    (dict(datasets=('digits,train',)), 'NAME,TRAIN_SPLIT,TEST_SPLIT'),
    (dict(datasets=('no_such_dataset',)), 'not in the TFDS catalog'),
    (dict(shots=(200,)), r"config.evals.fewshot.shots=\(200,\): no class of few-shot dataset"),
    (dict(shots=(0,)), r'config.evals.fewshot.shots=\(0,\) holds 0: each item must be >= 1'),
    (dict(pp='to_rgb|resize(8)'), r'config.evals.fewshot.pp=.* makes 8x8x3 images'),
    (dict(datasets=()), r'config.evals.fewshot.datasets=\(\) '),
])
def test_bad_fewshot_configs_are_refused_before_anything_starts(tmp_path, entry, match):
  config = tiny_config(**{'evals.fewshot': FEWSHOT | entry})
  with pytest.raises(errors.UserError, match=match):
    main.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
  for args, match in (([f'--workdir={tmp_path}', '--dataset=digits'], 'not the workdir'),
                      (['--npz=/no/such.npz', '--dataset=digits'], 'does not exist'),
                      ([f'--workdir={tmp_path}', '--dataset=digits', '--shots=1,x'],
                       'comma-separated ints')):
    run = subprocess.run([sys.executable, '-m', 'vit_jax.fewshot', *args], capture_output=True,
                         text=True, env=env(1), cwd=ROOT, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith('error:')]
    assert len(lines) == 1 and match in lines[0], run.stderr
    assert 'Traceback' not in run.stderr



def test_the_quickstart_logs_fewshot_accuracy_on_the_digits():
  import importlib.util

  from vit_jax.training import plan as plan_lib

  from runs import QUICKSTART

  spec = importlib.util.spec_from_file_location('quickstart', QUICKSTART)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  plan = plan_lib.validate(module.get_config())
  ctx = evals.Context.from_plan(plan)
  (evaluator,) = [e for e in evals.from_config(ctx) if e.name == 'fewshot']
  assert isinstance(evaluator, fewshot.Evaluator)
  assert [d.name for d in evaluator.datasets] == ['digits']
  assert (len(evaluator.datasets[0].train), len(evaluator.datasets[0].test)) == (1438, 359)
  assert evaluator.shots == (1, 5, 10, 25) and evaluator.seeds == 3
  assert evaluator.due(500, 1500, plan.config.eval_every_steps)


def test_cli_takes_any_checkpoint_as_source(tmp_path):
  source = pathlib.Path(__file__).resolve().parent / 'data' / 'hub' / 'timm_augreg'
  run = subprocess.run([sys.executable, '-m', 'vit_jax.fewshot', f'--source={source}',
                        '--dataset=digits', '--shots=1', '--seeds=1', '--batch_size=64'],
                       capture_output=True, text=True, env=env(1), cwd=ROOT, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.startswith('# ViT (2 layers, width 32, MLP 128, 2 heads, patch 8): 32-d')
  assert not re.search(r'^[IWEF]\d{4} ', run.stderr, re.M), run.stderr  # No absl prefixes.
  assert 'arrays loaded' not in run.stderr  # Read into its own model: nothing to say.
