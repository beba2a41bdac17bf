"""The base config: the one place where every field and its default are written."""

import dataclasses

import ml_collections
import pytest

from vit_jax import config_base
from vit_jax.models import VisionTransformer


def test_every_model_option_is_a_field():
  fields = {f.name for f in dataclasses.fields(VisionTransformer)}
  # Set by the run, not the user (mpp_outputs: by config.objective and config.mpp.target).
  fields -= {'parent', 'name', 'num_classes', 'model_name', 'mpp_outputs'}
  assert set(config_base.get_config().model) - {'name'} == fields


def test_complete_fills_in_the_defaults():
  config = config_base.complete(dict(model=dict(name='s16'), batch_size=64,
                                     schedule=dict(base_lr=0.5)))
  assert (config.model.name, config.model.pool, config.batch_size) == ('s16', None, 64)
  assert (config.schedule.base_lr, config.schedule.warmup_steps) == (0.5, 10_000)
  assert config.optimizer.name == 'adam'
  assert config.mesh.to_dict() == dict(data=-1, fsdp=1, tensor=1, shard_state=None)
  assert config_base.model_options(config.model) == ('s16', {})


@pytest.mark.parametrize('config, message', [
    (dict(batch_sise=8), r'config.batch_sise is not a config field. Did you mean '
                         r'config.batch_size\b'),
    (dict(schedule=dict(warmup=5)), r'config.schedule.warmup is not a config field. Did you '
                                    r'mean config.schedule.warmup_steps, '),
    (dict(model=dict(name='b16', pos_emb='learn')), r'config.model.pos_emb .* Did you mean '
                                                    r'config.model.posemb\b'),
    (dict(mesh=4), r'config.mesh must be a group of fields'),
])
def test_unknown_fields_are_named_with_the_closest_ones(config, message):
  with pytest.raises(ValueError, match=message):
    config_base.complete(ml_collections.ConfigDict(config))
