"""configs/backbone_finetune.py: each family's preset checks and plans, offline."""

import importlib.util
import pathlib

import numpy as np
import pytest

from vit_jax import checkpoints
from vit_jax import config as config_lib
from vit_jax.data import preprocess
from vit_jax.training import plan as plan_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Each family's fixture written by timm (tests/data/hub) in place of its Hub id, and the
# mean its images were normalised with (std follows).
FAMILIES = {'clip': ('timm_clip', (0.48145466, 0.4578275, 0.40821073)),
            'siglip': ('timm_siglip_map', (0.5, 0.5, 0.5)),
            'dinov2': ('timm_dinov2', preprocess.IMAGENET_MEAN),
            'deit_distilled': ('timm_deit_distilled', preprocess.IMAGENET_MEAN),
            'dinov3': ('timm_dinov3', preprocess.IMAGENET_MEAN),
            'eva02': ('timm_eva02', (0.48145466, 0.4578275, 0.40821073))}
# What a preset chooses apart from its checkpoint: DINOv3 pools the class token, as DINOv3
# does (timm's Eva defaults to the patches' mean).
CHOSEN = {'dinov3': ('pool',)}


def _module():
  spec = importlib.util.spec_from_file_location('backbone_finetune',
                                                ROOT / 'configs' / 'backbone_finetune.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('family', FAMILIES)
def test_each_family_preset_checks_and_plans_from_its_fixture(family):
  """Complete and checked; planned on the bundled digits with the family's timm fixture as
  init_from: the architecture the checkpoint's arrays show, its own normalisation."""
  module = _module()
  assert set(module.HUB_IDS) == set(FAMILIES)
  config = module.get_config(f'{family},digits')
  assert config.init_from == module.HUB_IDS[family]
  config_lib.check(config_lib.complete(config))
  folder, mean = FAMILIES[family]
  config.init_from = str(ROOT / 'tests' / 'data' / 'hub' / folder)
  plan = plan_lib.validate(config)
  assert 0 < plan.warmup_steps < plan.total_steps
  source = checkpoints.load(config.init_from).model
  for option in ('pool', 'pre_norm', 'distill_token', 'fc_norm', 'norm_epsilon', 'rope',
                 'posemb', 'key_bias', 'mlp_norm', 'gated_mlp'):
    if option not in CHOSEN.get(family, ()):
      assert getattr(plan.model, option) == getattr(source, option), option
  assert (plan.model.layer_scale is None) == (source.layer_scale is None)
  scale, offset = plan.pp_eval.affine  # (x / 255 - mean) / std = x * scale + offset.
  np.testing.assert_allclose(-offset / (255 * scale), mean, rtol=1e-6)
  assert plan.pp_eval.spec.split('|')[-1] in plan.pp_train.spec.split('|')  # The same scaling.


def test_a_family_or_dataset_it_does_not_have_is_named():
  with pytest.raises(ValueError, match="'eva,cifar10' is not a choice: FAMILY,DATASET"):
    _module().get_config('eva,cifar10')
