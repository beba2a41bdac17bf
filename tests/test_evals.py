"""vit_jax.evals: every entry of config.evals built by its type, checked before anything
compiles, and run by training for the weights and their moving average."""

import pytest

from vit_jax import config as config_lib
from vit_jax import evals, main
from vit_jax.base import errors
from vit_jax.evals import classification, fewshot
from vit_jax.training import plan as plan_lib

from runs import read_metrics, tiny_config

FEWSHOT = dict(type='fewshot', datasets=('digits',), shots=(1,), seeds=1)


def test_the_headline_metric_is_named_by_the_evaluator_of_its_type():
  """What a sweep or VTAB reads of a run: config.evals.eval's metric as its type names it (the
  loss's for a classifier), else the first entry's by name; '' without an evaluator."""
  def headline(**config):
    return evals.headline(config_lib.complete(config))

  assert headline() == 'eval/accuracy'
  assert headline(loss='sigmoid_xent') == 'eval/prec@1'
  assert headline(evals={'eval': {'type': 'mpp'}}) == 'eval/color_accuracy'
  assert headline(evals={'v2': {'type': 'real'}, 'few': {
      'type': 'fewshot', 'datasets': ('cars196:2.1.0,train,test',), 'shots': (1, 5)}}) == \
      'few/cars196_5shot'
  assert headline(evals={}) == ''


def test_each_entry_is_built_by_its_type_under_its_name():
  ctx = evals.Context.from_plan(plan_lib.validate(tiny_config(**{
      'evals.fewshot': FEWSHOT,
      'evals.train': dict(type='classification', split='train', every_steps=7)})))
  built = {e.name: e for e in evals.from_config(ctx)}
  assert set(built) == {'eval', 'fewshot', 'train'}
  assert isinstance(built['eval'], classification.Evaluator)
  assert isinstance(built['fewshot'], fewshot.Evaluator)
  assert (len(built['eval'].source), len(built['train'].source)) == (359, 1438)
  assert built['train'].due(7, 20, 5) and not built['train'].due(5, 20, 5)
  assert built['eval'].due(5, 20, 5) and built['eval'].due(20, 20, 0)
  assert not built['eval'].due(5, 20, 0)  # eval_every_steps=0: at the end only.
  assert [e.name for e in evals.from_config(ctx, ['train'])] == ['train']
  with pytest.raises(errors.ConfigError, match=r"no evaluator valid in config.evals \(it has: "
                                               r'eval, fewshot, train\)'):
    evals.from_config(ctx, ['valid'])


def test_an_entry_that_cannot_evaluate_the_run_is_refused_before_anything_starts(tmp_path):
  config = tiny_config(**{'evals.colors': dict(type='mpp')})
  with pytest.raises(errors.ConfigError, match=r"^config.evals.colors has type 'mpp', which "
                                               r'scores masked patch prediction'):
    main.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_every_evaluator_runs_for_the_weights_and_their_moving_average(tmp_path):
  config = tiny_config(**{'evals.fewshot': FEWSHOT, 'optimizer.ema_decay': 0.5,
                          'total_steps': 2, 'schedule.warmup_steps': 1,
                          'checkpoint_every_steps': 2})
  result = main.train_and_evaluate(config, str(tmp_path))
  rows = {k for row in read_metrics(tmp_path) if row['step'] == 2 for k in row}
  for name, metric in (('eval', 'accuracy'), ('fewshot', 'digits_1shot')):
    assert {f'{name}/{metric}', f'{name}/ema/{metric}'} <= rows
    assert 0 <= result[f'{name}/ema/{metric}'] <= 1
