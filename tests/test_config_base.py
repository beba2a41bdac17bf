"""The base config: the one place where every field and its default are written."""

import dataclasses

import ml_collections
import pytest

from vit_jax import config as config_lib
from vit_jax.base import errors
from vit_jax.models import VisionTransformer


def test_every_model_option_is_a_field():
  fields = {f.name for f in dataclasses.fields(VisionTransformer)}
  # Set by the run, not the user (mpp_outputs: by config.objective and config.mpp.target).
  fields -= {'parent', 'name', 'num_classes', 'model_name', 'mpp_outputs'}
  assert set(config_lib.get_config().model) - {'name'} == fields


def test_complete_fills_in_the_defaults():
  config = config_lib.complete(dict(model=dict(name='s16'), batch_size=64,
                                     schedule=dict(base_lr=0.5)))
  assert (config.model.name, config.model.pool, config.batch_size) == ('s16', None, 64)
  assert (config.schedule.base_lr, config.schedule.warmup_steps) == (0.5, 10_000)
  assert config.optimizer.name == 'adam'
  assert config.mesh.to_dict() == dict(data=-1, fsdp=1, tensor=1, shard_state=None)
  assert config_lib.model_options(config.model) == ('s16', {})


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
    config_lib.complete(ml_collections.ConfigDict(config))


def test_the_schema_covers_every_field_and_the_defaults_pass_it():
  config = config_lib.get_config()
  assert set(config_lib.SCHEMA) == set(config_lib.flatten(config.to_dict()))
  config_lib.check(config)


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
    (dict(schedule=dict(base_lr=0.1, end_lr=0.2)), r'config.schedule.end_lr=0.2 is above '
                                                   r'config.schedule.base_lr=0.1: the decay '
                                                   r'would climb'),
    (dict(schedule=dict(warmup_steps=-5)), r'config.schedule.warmup_steps=-5 must be >= 0'),
    (dict(label_smoothing=2.0), r'config.label_smoothing=2.0 must be < 1 \(the share'),
    (dict(label_smoothing=1.0), r'config.label_smoothing=1.0 must be < 1'),
    (dict(label_smoothing=-0.1), r'config.label_smoothing=-0.1 must be >= 0'),
    (dict(model=dict(name='b16', dropout_rate=1.0)), r'config.model.dropout_rate=1.0 must be '
                                                     r'< 1'),
    (dict(mesh=dict(data=0)), r'config.mesh.data=0 must be -1'),
    (dict(optimizer=dict(layer_decay=0.0)), r'config.optimizer.layer_decay=0.0 must be > 0'),
    (dict(profile_steps=(5, 2)), r'config.profile_steps=\(5, 2\) must be \(\) or \(first, '),
    # Types.
    (dict(batch_size=8.5), r'config.batch_size=8.5 must be an int, not float'),
    (dict(total_steps=True), r'config.total_steps=True must be an int, not bool'),
    (dict(loss='mse'), r"config.loss='mse' must be one of 'softmax_xent', 'sigmoid_xent'"),
])
def test_check_refuses_values_outside_the_schema(overrides, message):
  config = config_lib.complete(overrides)
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.check(config)


def test_the_values_at_the_edges_of_each_range_pass():
  config_lib.check(config_lib.complete(dict(
      eval_every_steps=0, keep_checkpoints=1, label_smoothing=0.0, grad_accum_steps=1,
      schedule=dict(base_lr=0.1, end_lr=0.1, warmup_steps=0), mixup_switch_prob=1.0,
      optimizer=dict(layer_decay=1.0), mesh=dict(data=-1), profile_steps=(3, 3))))
