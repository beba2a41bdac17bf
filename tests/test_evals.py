"""vit_jax.evals: every entry of config.evals built by its type, checked before anything
compiles, and run by training for the weights and their moving average."""

import dataclasses
import pathlib

import numpy as np
import pytest

from vit_jax import checkpoints, evals, main
from vit_jax import config as config_lib
from vit_jax.base import errors
from vit_jax.data import sources
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


# A timm folder at 24x32 (height x width), 5 named classes (tests/data/hub/make_fixtures.py).
NON_SQUARE = pathlib.Path(__file__).parent / 'data' / 'hub' / 'timm_gap_nofcnorm'


@pytest.fixture(scope='module')
def loaded_ctx():
  """The evaluation context of a loaded non-square checkpoint, as fewshot and evaluate
  --source build it."""
  loaded = checkpoints.load(str(NON_SQUARE))
  return evals.Context.from_loaded(loaded, config_lib.complete(tiny_config()))


def test_a_loaded_non_square_checkpoints_context_makes_its_height_by_width_input(loaded_ctx):
  """Its own preprocessing at (height, width): a tall and a wide image both become 24x32."""
  for shape in ((90, 47, 3), (61, 83, 3)):
    image = np.random.default_rng(0).integers(0, 256, shape, np.uint8)
    assert loaded_ctx.pp_eval(image, None).shape == (24, 32, 3)
  assert loaded_ctx.model.image_size == (24, 32)


def test_another_splits_classes_must_be_the_runs_in_order_not_only_as_a_set(loaded_ctx):
  """The same five class names in another order would score each prediction against another
  class: refused, naming the first of each; in the run's order, taken."""
  names = loaded_ctx.class_names
  assert len(names) == 5
  images, labels = np.zeros((2, 24, 32, 3), np.uint8), np.zeros(2, np.int64)
  classification.check_classes('other', sources.ArraySource(images, labels, 5, names), loaded_ctx)
  shuffled = sources.ArraySource(images, labels, 5, names[1:] + names[:1])
  with pytest.raises(errors.ConfigError, match=r"^config.evals.other: the run's classes are not "
                     r'in the order of its data'):
    classification.check_classes('other', shuffled, loaded_ctx)


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


def test_an_evaluators_naflex_pipeline_is_checked_against_the_models_patch():
  """A classification entry's ``pp`` may cut patch sequences (naflex) of the model's patch
  size, not of another; a model that takes images only (masked patch prediction's) refuses
  them."""
  naflex = "to_rgb|naflex({}, 16)|value_range(-1, 1)"
  config = tiny_config(**{'evals.eval': dict(type='classification', pp=naflex.format(8))})
  plan = plan_lib.validate(config)
  message = (r"^config.evals.eval.pp='to_rgb\|naflex\(8, 16\).*' cuts 8x8 patches, but the "
             r"model's are 4x4 \(config.model.patch_size\): use naflex\(4, 16\).$")
  with pytest.raises(errors.ConfigError, match=message):
    evals.from_config(plan)
  plan.config.evals.eval.pp = naflex.format(4)
  (evaluator,) = evals.from_config(plan)
  assert evaluator.pp.patches
  ctx = evals.base.Context.from_plan(plan)
  ctx = dataclasses.replace(ctx, model=ctx.model.clone(mpp_outputs=4))
  with pytest.raises(errors.ConfigError, match=r'makes NaFlex patch sequences \(naflex\), which '
                                               r'this model does not take'):
    evals.base.pipeline('eval', plan.config.evals.eval, ctx, plan.eval_source,
                        'its first example')
