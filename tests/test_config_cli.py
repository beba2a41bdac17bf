"""The --config flag's overrides: typed like the recipe's fields, bad ones named in one line."""

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
                'model.name=s16', 'mesh={"data": 4, "fsdp": 2}', 'optimizer.mu_dtype=bfloat16')
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
                      r'batch_size, .* \(vit_jax/config/__init__.py\).$'),
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
