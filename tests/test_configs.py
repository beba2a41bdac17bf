"""Every config in configs/ loads and builds its model."""

import importlib.util
import math
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from vit_jax.models import get_model

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / 'configs').glob('*.py'))


def load(path: pathlib.Path) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.mark.parametrize('path', CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds_its_model(path):
  config = load(path)
  model_config = dict(config.model)
  model = get_model(model_config.pop('name'), num_classes=config.dataset.num_classes,
                    **model_config)
  size = model.image_size
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *size, 3)))
  assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) > 0


def test_l16_i21k_is_the_paper_recipe():
  config = load(pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'vit_l16_i21k.py')
  assert config.model.name == 'l16'
  assert (config.batch_size, config.num_epochs) == (4096, 90)
  assert (config.schedule.base_lr, config.schedule.warmup_steps) == (1e-3, 10_000)
  assert config.optimizer.weight_decay == 0.03 and config.optimizer.grad_clip_norm == 1.0
  assert config.model.head_bias_init == -10.0 and config.loss == 'sigmoid_xent'
  model = get_model('l16', num_classes=21843, representation_size=1024)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  # REFERENCE.md's 304,326,632 for 1000 classes, plus the pre-logits layer and the
  # 21,843-class head instead of the 1000-class one.
  expected = 304_326_632 + 1024 * 1024 + 1024 + (1024 + 1) * (21843 - 1000)
  assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == expected
