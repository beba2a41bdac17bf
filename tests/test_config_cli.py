"""The --config flag's overrides: typed by their declarations, bad ones named in one line."""

import pytest

from vit_jax.base import errors
from vit_jax.config import cli as config_cli

from runs import QUICKSTART


def load(*overrides):
  return config_cli.load(str(QUICKSTART), [tuple(o.split('=', 1)) if '=' in o else (o, None)
                                           for o in overrides])


def test_overrides_take_the_types_of_their_fields():
  config = load('model.image_size=(16, 24)', 'model.patch_size=[4, 8]', 'profile_steps=(3,5)',
                'model.pool=None', 'model.scan', 'batch_size=256', 'schedule.base_lr=1',
                'dataset.pp_train=to_rgb|resize((16, 24))|value_range(-1, 1)',
                'model.name=s16', 'model.hidden_size=None', 'model.mlp_dim=None',
                'model.num_heads=None', 'model.num_layers=None', 'mesh={"data": 4, "fsdp": 2}',
                'optimizer.mu_dtype=bfloat16')
  assert config.model.image_size == (16, 24) and config.model.patch_size == (4, 8)
  assert config.profile_steps == (3, 5) and config.model.pool is None and config.model.scan
  assert config.batch_size == 256 and config.schedule.base_lr == 1.0
  assert isinstance(config.schedule.base_lr, float)
  assert config.dataset.pp_train == 'to_rgb|resize((16, 24))|value_range(-1, 1)'
  assert (config.model.name, config.mesh.data, config.mesh.fsdp) == ('s16', 4, 2)
  assert config.optimizer.mu_dtype == 'bfloat16'
  assert load('model.scan=false').model.scan is False
  assert load('model.image_size=384').model.image_size == 384
  with pytest.raises(AttributeError):  # Locked: code cannot add fields either.
    config.no_such_key = 3


@pytest.mark.parametrize('override, message', [
    ('no_such_key=3', r'^config.no_such_key is not a config field. The fields of config: '
                      r'batch_size, .* \(vit_jax/config/table.py\).$'),
    ('model.image_sise=18', r'^config.model.image_sise is not a config field. Did you mean '
                            r'config.model.image_size\?'),
    ('schedule.warmup.steps=3', r'config.schedule.warmup is not a config field. Did you mean '
                                r'config.schedule.warmup_steps, '),
    ('batch_size=abc', r"^config.batch_size='abc' is not an int: e.g. --config.batch_size=8.$"),
    ('batch_size=2.5', r'config.batch_size=.2.5. is not an int'),
    ('profile_steps=5', r'config.profile_steps=.5. is not a tuple: e.g. '),
    ('model.scan=maybe', r'config.model.scan=.maybe. is not true or false'),
    ('batch_size', r'^--config.batch_size needs a value: --config.batch_size=VALUE.$'),
    ('model=3', r'config.model is a group of fields: set them one by one'),
    ('batch_size.x=3', r'config.batch_size is a single value, not a group'),
])
def test_bad_overrides_are_one_line_errors(override, message):
  with pytest.raises(errors.ConfigError, match=message):
    load(override)


def test_evaluators_are_added_removed_and_set_in_any_order():
  # quickstart's recipe writes a partial few-shot entry: completed before the overrides.
  config = load('evals.fewshot.shots=(1, 5)', 'evals.v2.dataset=imagenet_v2',
                'evals.v2.split=test', 'evals.v2.type=classification', 'evals.eval=None',
                'evals.mpp.type=mpp', 'evals.real={"type": "real", "data_dir": "/tfds"}')
  assert list(config.evals) == ['fewshot', 'mpp', 'real', 'v2']
  assert config.evals.fewshot.to_dict() == dict(
      type='fewshot', every_steps=0, datasets=('digits',), shots=(1, 5), seeds=3,
      l2_reg=2.0**10, pp='')
  assert config.evals.v2.to_dict() == dict(type='classification', every_steps=0,
                                           dataset='imagenet_v2', split='test', data_dir='',
                                           pp='')
  assert config.evals.mpp.to_dict() == dict(type='mpp', every_steps=0, split='', pp='')
  assert (config.evals.real.type, config.evals.real.data_dir) == ('real', '/tfds')
  # Its type changed: the fields both types have kept, the others dropped.
  retyped = load('evals.eval.split=val', 'evals.eval.pp=decode', 'evals.eval.type=mpp')
  assert retyped.evals.eval.to_dict() == dict(type='mpp', every_steps=0, split='val',
                                              pp='decode')
  # A new few-shot entry, its required datasets set after its type.
  added = load('evals.fs.datasets=("digits",)', 'evals.fs.type=fewshot')
  assert added.evals.fs.datasets == ('digits',) and added.evals.fs.shots == (1, 5, 10, 25)


@pytest.mark.parametrize('override, message', [
    ('evals.v2.split=test', r"^config.evals.v2 is not an evaluator of this config. Its "
                            r"evaluators: eval, fewshot; add one with "
                            r"--config.evals.v2.type=TYPE \(classification, fewshot, real, "
                            r"mpp\).$"),
    ('evals.fewshots=None', r'config.evals.fewshots is not an evaluator of this config. Did you '
                            r'mean config.evals.fewshot\?'),
    ('evals.v2.type=imagenet', r"^config.evals.v2.type='imagenet' is not an evaluator type: one "
                               r"of 'classification', 'fewshot', 'real', 'mpp'.$"),
    ('evals.fewshot.seed=2', r"^config.evals.fewshot.seed is not a field of 'fewshot' "
                             r'evaluators. Did you mean config.evals.fewshot.seeds\? The '
                             r'fields of config.evals.fewshot: datasets, every_steps, '),
    ('evals.fewshot.seeds=many', r"config.evals.fewshot.seeds='many' is not an int"),
    ('evals.fewshot.shots=5', r"config.evals.fewshot.shots='5' is not a tuple: e.g. "
                              r'--config.evals.fewshot.shots=\(1, 5\).$'),
    ('evals.eval=3', r'config.evals.eval is an evaluator: set its fields one by one'),
    ('evals.eval.split.x=3', r'config.evals.eval.split is a single value, not a group'),
    ('evals.v2={"dataset": "imagenet_v2"}', r'config.evals.v2 has no type'),
])
def test_bad_evaluator_overrides_are_one_line_errors(override, message):
  with pytest.raises(errors.ConfigError, match=message):
    load(override)


def test_file_colon_argument_is_passed_to_get_config():
  config = config_cli.load(str(QUICKSTART.parent / 'vit_b16_finetune.py') + ':oxford_iiit_pet',
                           [('total_steps', '7')])
  assert (config.dataset.name, config.dataset.num_classes, config.total_steps) == (
      'oxford_iiit_pet', 37, 7)


def test_a_missing_config_file_is_named(tmp_path):
  with pytest.raises(errors.MissingFileError, match=r'--config=.*nowhere.py does not exist'):
    config_cli.load(str(tmp_path / 'nowhere.py'))
  with pytest.raises(errors.ConfigError, match='is not a Python config file'):
    config_cli.load(str(tmp_path))
  with pytest.raises(errors.ConfigError, match='--config is required'):
    config_cli.load(None)


def test_a_model_name_the_recipes_sizes_contradict_is_refused_naming_both():
  """--config.model.name=b17 (meant b16) on the quickstart, whose recipe sets a 4-layer
  model's sizes: refused, naming the named model and the recipe's sizes, not trained as the
  recipe's model under another name; the sizes given too, or dropped, it is taken."""
  with pytest.raises(errors.ConfigError) as e:
    load('model.name=b17')
  message = str(e.value)
  assert message.startswith("config.model.name='b17' names ViT-B_17 (hidden_size=768, ")
  assert 'quickstart.py sets model.hidden_size=64, model.mlp_dim=128, model.num_heads=4, ' \
      'model.num_layers=4, model.patch_size=4: ' in message and '\n' not in message
  sizes = ('model.hidden_size=64', 'model.mlp_dim=128', 'model.num_heads=4',
           'model.num_layers=4', 'model.patch_size=4')
  assert load('model.name=s16', *sizes).model.num_layers == 4  # All given: meant.
  dropped = load('model.name=b16', *(s.split('=')[0] + '=None' for s in sizes))
  assert dropped.model.name == 'b16' and dropped.model.num_layers is None
  assert load('model.num_layers=2').model.name == 'ti16'  # No name given: the recipe's.
