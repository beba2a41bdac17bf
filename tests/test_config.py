"""The base config: each field declared once (kind, default, range, meaning), and the config,
its checks, its evaluators and docs/config.md made from those declarations."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import chex
import ml_collections
import pytest

from vit_jax import config as config_lib
from vit_jax.base import errors
from vit_jax.checkpoints.run import workdir
from vit_jax.config.field import KINDS, REQUIRED, Field
from vit_jax.config.markdown import row
from vit_jax.models import VisionTransformer

ROOT = pathlib.Path(__file__).resolve().parents[1]


def every_field():
  """(name, Field) of every declaration: the base config's and each evaluator type's."""
  yield from config_lib.DECLARED.items()
  for kind in config_lib.EVAL_TYPES:
    yield from ((f'evals.NAME.{k}', f) for k, f in config_lib.eval_fields(kind).items())


def test_every_field_has_a_kind_a_doc_and_a_default_that_passes():
  for name, field in every_field():
    assert field.base in KINDS and field.doc.strip(), name
    if field.default is REQUIRED:  # No default: an evaluator's type, a few-shot's datasets.
      assert name.rsplit('.', 1)[1] in ('type', 'datasets'), name
    else:
      assert field.problem(field.default) == '', name
  config_lib.check(config_lib.get_config())


def test_every_model_option_is_a_field():
  fields = {f.name for f in dataclasses.fields(VisionTransformer)}
  # Set by the run, not the user (mpp_outputs: by config.objective and config.mpp.target).
  fields -= {'parent', 'name', 'num_classes', 'model_name', 'mpp_outputs'}
  assert set(config_lib.get_config().model) - {'name'} == fields


def test_get_config_round_trips_through_complete_and_json():
  config = config_lib.get_config()
  chex.assert_trees_all_equal(config_lib.complete(config).to_dict(), config.to_dict())
  from_json = config_lib.complete(json.loads(config.to_json_best_effort()))
  chex.assert_trees_all_equal(from_json.to_dict(), config.to_dict())
  assert config.evals.to_dict() == {'eval': dict(type='classification', every_steps=0,
                                                 dataset='', split='', data_dir='', pp='')}
  assert set(config_lib.flatten(config.to_dict())) >= {'evals.eval.type', 'evals.eval.split'}


def test_complete_fills_in_the_defaults_and_the_declared_types():
  config = config_lib.complete(dict(model=dict(name='s16'), batch_size=64,
                                     schedule=dict(base_lr=0.5), profile_steps=[2, 3]))
  assert (config.model.name, config.model.pool, config.batch_size) == ('s16', None, 64)
  assert (config.schedule.base_lr, config.schedule.warmup_steps) == (0.5, 10_000)
  assert config.mesh.to_dict() == dict(data=-1, fsdp=1, tensor=1, shard_state=None)
  assert config.profile_steps == (2, 3)  # config.json's lists: tuples again.
  assert config_lib.model_options(config.model) == ('s16', {})
  config.model.image_size = (16, 24)  # An int-or-pair field, unset: still takes a pair.
  with pytest.raises(TypeError):
    config.batch_size = 'big'


def test_a_partial_evaluator_is_completed_from_its_type():
  recipe = config_lib.get_config()
  recipe.evals.fewshot = dict(type='fewshot', datasets=('digits',))
  recipe.evals.eval = None  # Removed.
  evals = config_lib.complete(recipe).evals
  assert list(evals) == ['fewshot']
  assert evals.fewshot.to_dict() == dict(type='fewshot', every_steps=0, datasets=('digits',),
                                         shots=(1, 5, 10, 25), seeds=3, l2_reg=2.0**10, pp='')
  assert set(config_lib.EVAL_TYPES) == {'classification', 'real', 'fewshot', 'mpp'}


@pytest.mark.parametrize('config, message', [
    (dict(batch_sise=8), r'config.batch_sise is not a config field. Did you mean '
                         r'config.batch_size\b'),
    (dict(schedule=dict(warmup=5)), r'config.schedule.warmup is not a config field. Did you '
                                    r'mean config.schedule.warmup_steps, '),
    (dict(model=dict(name='b16', pos_emb='learn')), r'config.model.pos_emb .* Did you mean '
                                                    r'config.model.posemb\b'),
    (dict(mesh=4), r'config.mesh must be a group of fields'),
    # The evaluators.
    (dict(evals=dict(v2=dict(dataset='imagenet_v2'))),
     r"^config.evals.v2 has no type: set config.evals.v2.type to one of 'classification', "),
    (dict(evals=dict(v2=dict(type='imagenet'))), r"^config.evals.v2.type='imagenet' is not an "
                                                 r"evaluator type: one of 'classification', "),
    (dict(evals=dict(v2=dict(type=['real']))), r"^config.evals.v2.type=\['real'\] is not an "
                                               r'evaluator type'),  # Unhashable: no TypeError.
    (dict(evals=dict(fs=dict(type='fewshot', datasets=('digits',), split='test'))),
     r"^config.evals.fs.split is not a field of 'fewshot' evaluators .* The fields of "
     r'config.evals.fs: datasets, every_steps, l2_reg, pp, seeds, shots, type '),
    (dict(evals=dict(fs=dict(type='fewshot', shot=(1,)))),
     r'config.evals.fs.shot .* Did you mean config.evals.fs.shots\?'),
    (dict(evals=dict(fs=dict(type='fewshot'))),
     r"^config.evals.fs.datasets is required by 'fewshot' evaluators: 'NAME'"),
    (dict(evals=dict(fs=3)), r'^config.evals.fs=3 must be an evaluator: a dict with a type'),
])
def test_unknown_fields_and_bad_evaluators_are_named(config, message):
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.complete(ml_collections.ConfigDict(config))


def test_changing_an_evaluators_type_in_a_recipe_says_to_replace_it():
  recipe = config_lib.get_config()
  recipe.evals.eval.type = 'mpp'
  with pytest.raises(errors.ConfigError, match=r"config.evals.eval.data_dir is not a field of "
                     r"'mpp' evaluators \(to change an evaluator's type, replace it: "
                     r'config.evals.eval = dict\(type=...\)\)'):
    config_lib.complete(recipe)


@pytest.mark.parametrize('overrides, message', [
    # Zero intervals: each would divide by zero after compiling.
    (dict(checkpoint_every_steps=0), r'config.checkpoint_every_steps=0 must be >= 1 \(a number '
                                     r'of steps; 0 would divide by zero\)'),
    (dict(log_every_steps=0), r'config.log_every_steps=0 must be >= 1'),
    (dict(grad_accum_steps=0), r'config.grad_accum_steps=0 must be >= 1 \(micro-batches'),
    # None where a value is needed.
    (dict(batch_size=None), r'config.batch_size=None cannot be None'),
    (dict(optimizer=dict(b1=None)), r'config.optimizer.b1=None cannot be None'),
    (dict(dataset=dict(name=None)), r'config.dataset.name=None cannot be None'),
    # Ranges.
    (dict(keep_checkpoints=0), r'config.keep_checkpoints=0 must be >= 1 \(0 would keep no '
                               r'checkpoint'),
    (dict(schedule=dict(warmup_steps=-5)), r'config.schedule.warmup_steps=-5 must be >= 0'),
    (dict(label_smoothing=2.0), r'config.label_smoothing=2.0 must be < 1 \(the share'),
    (dict(label_smoothing=1.0), r'config.label_smoothing=1.0 must be < 1'),
    (dict(label_smoothing=-0.1), r'config.label_smoothing=-0.1 must be >= 0'),
    (dict(model=dict(name='b16', dropout_rate=1.0)), r'config.model.dropout_rate=1.0 must be '
                                                     r'< 1'),
    (dict(optimizer=dict(layer_decay=0.0)), r'config.optimizer.layer_decay=0.0 must be > 0'),
    (dict(model=dict(image_size=(16, 0))), r'config.model.image_size=\(16, 0\) is not a '
                                           r'positive int or a \(height, width\) pair'),
    # Types.
    (dict(batch_size=8.5), r'config.batch_size=8.5 must be an int, not float'),
    (dict(total_steps=True), r'config.total_steps=True must be an int, not bool'),
    (dict(loss='mse'), r"config.loss='mse' must be one of 'softmax_xent', 'sigmoid_xent'"),
    # The rules that join fields.
    (dict(schedule=dict(base_lr=0.1, end_lr=0.2)), r'config.schedule.end_lr=0.2 is above '
                                                   r'config.schedule.base_lr=0.1: the decay '
                                                   r'would climb'),
    (dict(mesh=dict(data=0)), r'config.mesh.data=0 must be -1'),
    (dict(profile_steps=(5, 2)), r'config.profile_steps=\(5, 2\) must be \(\) or \(first, '),
    (dict(total_steps=10, schedule=dict(warmup_steps=10)),
     r'^config.schedule: the warm-up \(10 steps\) is not shorter than the run \(10 steps\). '
     r'Shorten the warm-up or train longer.$'),
    # Each evaluator by its type.
    (dict(evals=dict(fs=dict(type='fewshot', datasets=()))),
     r'config.evals.fs.datasets=\(\) must hold at least one item \(to turn few-shot off, '
     r'remove the entry\)'),
    (dict(evals=dict(fs=dict(type='fewshot', datasets='digits'))),
     r"config.evals.fs.datasets='digits' must be a tuple of strings, not str"),
    (dict(evals=dict(fs=dict(type='fewshot', datasets=('digits',), shots=(1, 0)))),
     r'config.evals.fs.shots=\(1, 0\) holds 0: each item must be >= 1'),
    (dict(evals=dict(fs=dict(type='fewshot', datasets=('digits',), shots=(1, 2.5)))),
     r'config.evals.fs.shots=\(1, 2.5\) must be a tuple of ints: 2.5 is not one'),
    (dict(evals=dict(fs=dict(type='fewshot', datasets=('digits',), l2_reg=0.0))),
     r'config.evals.fs.l2_reg=0.0 must be > 0'),
    (dict(evals=dict(eval=dict(type='classification', every_steps=-1))),
     r'config.evals.eval.every_steps=-1 must be >= 0'),
    (dict(evals=dict(real=dict(type='real', pp=None))), r'config.evals.real.pp=None cannot be '
                                                        r'None'),
])
def test_check_refuses_values_outside_their_declarations(overrides, message):
  config = config_lib.complete(overrides)
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.check(config)


def test_the_values_at_the_edges_of_each_range_pass():
  config_lib.check(config_lib.complete(dict(
      eval_every_steps=0, keep_checkpoints=1, label_smoothing=0.0, grad_accum_steps=1,
      schedule=dict(base_lr=0.1, end_lr=0.1, warmup_steps=0), mixup_switch_prob=1.0,
      optimizer=dict(layer_decay=1.0), mesh=dict(data=-1), profile_steps=(3, 3),
      evals=dict(fs=dict(type='fewshot', datasets=('digits',), shots=(1,), seeds=1)))))


def test_a_declared_range_is_applied():
  field = Field('float', 0.5, '(0, 1]', 'A share.', why=' (a share)')
  assert [field.problem(v) for v in (1.0, 0.5)] == ['', '']
  assert field.problem(0.0) == 'must be > 0 (a share)'
  assert field.problem(1.5) == 'must be <= 1 (a share)'
  with pytest.raises(AssertionError, match='cannot read the range'):
    Field('int', 1, '>= one', 'A count.')


OLD_EVALS = {'fewshot': {'datasets': ['digits'], 'shots': [1, 5], 'seeds': 2, 'l2_reg': 512.0,
                         'every_steps': 0, 'pp': ''},
             'real': True, 'v2': True, 'data_dir': '/data/tfds'}


def test_an_older_runs_config_json_still_loads(tmp_path):
  (tmp_path / 'config.json').write_text(json.dumps({'batch_size': 64, 'evals': OLD_EVALS}))
  evals = workdir.load_config(tmp_path).evals.to_dict()
  assert list(evals) == ['eval', 'fewshot', 'real', 'v2']
  assert evals['eval']['type'] == 'classification'
  assert {k: evals['fewshot'][k] for k in ('type', 'datasets', 'shots', 'seeds', 'l2_reg')} == {
      'type': 'fewshot', 'datasets': ('digits',), 'shots': (1, 5), 'seeds': 2, 'l2_reg': 512.0}
  assert (evals['real']['type'], evals['real']['data_dir']) == ('real', '/data/tfds')
  assert {k: evals['v2'][k] for k in ('type', 'dataset', 'split', 'data_dir')} == {
      'type': 'classification', 'dataset': 'imagenet_v2', 'split': 'test',
      'data_dir': '/data/tfds'}
  # Few-shot off (no datasets), ReaL and v2 off: the plain evaluation only.
  off = {'fewshot': {**OLD_EVALS['fewshot'], 'datasets': []}, 'real': False, 'v2': False,
         'data_dir': ''}
  assert list(config_lib.convert_old_evals({'evals': off})['evals']) == ['eval']
  new = config_lib.get_config().to_dict()  # A config of today: as it is.
  assert config_lib.convert_old_evals(new) is new


@pytest.mark.slow
def test_docs_config_md_is_the_declarations_reference():
  text = (ROOT / 'docs' / 'config.md').read_text()
  assert text == config_lib.reference(), 'run: python -m vit_jax.config > docs/config.md'
  for name, field in every_field():  # Each its own row: name, kind, default, range, doc.
    assert row(name, field) in text.splitlines(), name
  printed = subprocess.run([sys.executable, '-m', 'vit_jax.config'], capture_output=True,
                           text=True, check=True, cwd=ROOT).stdout
  assert printed == text
