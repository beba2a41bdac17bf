"""vit_jax.training.plan: a config's mistakes, each one line naming the field, before compiling."""

import json
import logging
import pathlib

import chex
import numpy as np
import pytest

from vit_jax.base import errors
from vit_jax.data import packing
from vit_jax.training import plan as plan_lib

from runs import constant_teacher, tiny_config

NAFLEX = 'to_rgb|naflex(4, 16)|value_range(-1, 1)'


@pytest.mark.parametrize('overrides, message', [
    ({'model.name': 'vit_giant'}, r"config.model.name: Unknown model 'vit_giant'"),
    ({'model.hidden': 3}, r"config.model.hidden is not a config field. Did you mean "
                          r"config.model.hidden_size\?"),
    ({'dataset.name': 'imagenet9'}, r"config.dataset \('imagenet9'\): Unknown dataset 'imagenet9': "
                                    r"not one of the bundled datasets .* not in the TFDS catalog"),
    ({'batch_size': 60}, r'config.batch_size=60 is not divisible by the 8 devices'),
    ({'eval_batch_size': 12}, r'config.eval_batch_size=12 is not divisible by the 8 devices'),
    ({'grad_accum_steps': 3}, r'config.grad_accum_steps=3 does not divide'),
    ({'schedule.warmup_steps': 20}, r'warm-up \(20 steps\) is not shorter than the run'),
    ({'loss': 'hinge'}, r"config.loss='hinge'"),
    ({'dataset.pp_train': 'to_rgb|sharpen(2)'}, r"Unknown preprocessing op 'sharpen\(2\)'"),
    ({'schedule.base_lr': -0.003}, r'^config.schedule.base_lr=-0.003 must be positive \(e.g. '
                                   r'1e-3\): a negative rate climbs the loss'),
    ({'schedule.base_lr': 0.0}, r'^config.schedule.base_lr=0.0 must be positive'),
    ({'schedule.end_lr': -1e-5}, r'^config.schedule.end_lr=-1e-05 must be >= 0'),
    ({'model.image_size': 18}, r'^config.model.image_size=18: 18 px is not a multiple of the '
                               r'patch size \(4 px\), so the last 2 px would be dropped. Use 16 '
                               r'or 20.$'),
    ({'model.name': 'r50_b16', 'model.patch_size': 1, 'model.image_size': 24},
     r"^config.model.image_size=24: 24 px is not a multiple of the patch size \(1 x the BiT "
     r"stem's stride 16 = 16 px\), so the last 8 px would be dropped. Use 16 or 32.$"),
    ({'model.image_size': 'abc'}, r"^config.model.image_size='abc' is not a positive int or a "
                                  r"\(height, width\) pair"),
    ({'model.image_size': (16, 24)}, r"^config.dataset.pp_train='to_rgb\|resize\(16\)\|.*' "
                                     r"makes 16x16x3 images \(on the first 'train' example\), "
                                     r"but the model takes 16x24x3 .*resize\(\(16, 24\)\)"),
    ({'dataset.pp_eval': 'resize(16)|value_range(-1, 1)'},
     r"^config.dataset.pp_eval=.* makes 16x16x1 images \(on the first 'test' example\), but "
     r"the model takes 16x16x3 .*\(and add to_rgb\).$"),
    ({'batch_size': 4}, r'^config.batch_size=4 is smaller than the 8 devices: each device '
                        r'needs at least one example'),
    ({'mesh.tensor': 3}, r'config.mesh: data=2 x fsdp=1 x tensor=3 does not cover the 8 '),
    ({'dataset.repeats': 0}, r'^config.dataset.repeats=0 must be >= 1 \(3: DeiT repeated'),
    ({'dataset.pp_train': 'to_rgb|random_erase(0.25)|value_range(-1, 1)'},
     r'^config.dataset.pp_train: random_erase in .* comes before value_range'),
    ({'dataset.pp_train': "to_rgb|rand_augment('rand-m9-inc0')|value_range(-1, 1)"},
     r"^config.dataset.pp_train: rand_augment\('rand-m9-inc0'\): cannot read the section 'inc0'"),
    # vit_jax.config's declarations (every case: tests/test_config.py), checked first.
    ({'batch_size': None}, r'^config.batch_size=None cannot be None.$'),
    ({'checkpoint_every_steps': 0}, r'^config.checkpoint_every_steps=0 must be >= 1'),
    ({'schedule.end_lr': 0.5}, r'^config.schedule.end_lr=0.5 is above config.schedule.base_lr'),
    # Patch sequences (naflex) and NaViT packing: what cannot take them.
    ({'packing.images_per_row': 2}, r"^config.packing.images_per_row=2 packs patch sequences, "
                                    r"but config.dataset.pp_train='to_rgb\|resize\(16\).*' "
                                    r'makes images: end it with naflex'),
    ({'packing.images_per_row': 3, 'dataset.pp_train': NAFLEX},
     r'^config.batch_size=64 does not split into packed rows of '
     r'config.packing.images_per_row=3: use a multiple of 3.$'),
    ({'model.name': 'r50_b16', 'model.patch_size': 1, 'model.image_size': 16,
      'dataset.pp_train': 'to_rgb|naflex(1, 64)|value_range(-1, 1)'},
     r"^config.dataset.pp_train=.* makes NaFlex patch sequences, but the model is a hybrid"),
    ({'objective': 'mpp', 'dataset.pp_eval': NAFLEX},
     r"^config.dataset.pp_eval=.* makes NaFlex patch sequences, but config.objective='mpp'"),
    ({'dataset.pp_train': 'to_rgb|naflex(8, 16)|value_range(-1, 1)'},
     r"^config.dataset.pp_train=.* makes NaFlex patch sequences of 8x8 patches, but the "
     r"model's are 4x4 \(config.model.patch_size\): use naflex\(4, 16\)"),
    ({'dataset.pp_train': NAFLEX, 'cutmix_alpha': 1.0},
     r'^config.dataset.pp_train=.* makes NaFlex patch sequences, which mixup and CutMix '
     r'cannot mix .*: set config.mixup_alpha=0 and config.cutmix_alpha=0.$'),
    ({'dataset.pp_train': NAFLEX, 'model.distill_token': True, 'model.pool': 'token',
      'distill.teacher': '/teacher'},
     r'^config.dataset.pp_train=.* makes NaFlex patch sequences, but a distillation teacher '),
    ({'dataset.pp_train': NAFLEX, 'flexi.patch_sizes': (2, 4)},
     r'^config.dataset.pp_train=.* makes NaFlex patch sequences of one patch size, but '
     r'config.flexi.patch_sizes=\(2, 4\) draws one a step'),
    ({'dataset.pp_train': NAFLEX, 'packing.images_per_row': 2, 'packing.seq_len': 12},
     r"^config.packing.seq_len=12 is shorter than naflex's max_num_patches=16 "
     r'\(config.dataset.pp_train\): an image of 16 patches would never fit. Use 16 or more'),
    ({'dataset.pp_train': NAFLEX, 'packing.images_per_row': 16},
     r'^config.batch_size=64 packs into 4 rows of config.packing.images_per_row=16, which do '
     r'not split over the 8 devices .*: use a multiple of 128.$'),
])
def test_bad_configs_fail_before_compiling(overrides, message):
  """Each a ConfigError, which vit_jax.main prints as one line (tests/test_faults.py)."""
  config = tiny_config()
  with config.unlocked():
    for key, value in overrides.items():
      *parents, leaf = key.split('.')
      node = config
      for p in parents:
        node = node[p]
      node[leaf] = value
  with pytest.raises(errors.ConfigError, match=message):
    plan_lib.validate(config)


def test_a_packed_naflex_run_plans_its_packing_and_takes_naflex_evaluation():
  """config.packing resolved (seq_len 0: the naflex budget), a naflex pp_eval taken."""
  plan = plan_lib.validate(tiny_config(**{'dataset.pp_train': NAFLEX, 'dataset.pp_eval': NAFLEX,
                                          'packing.images_per_row': 4}))
  assert plan.packing == packing.Packing(4, 16)
  assert plan.pp_train.patches and plan.pp_eval.patches
  assert plan_lib.validate(tiny_config(**{'dataset.pp_train': NAFLEX})).packing is None


def test_missing_data_path_is_named(tmp_path):
  config = tiny_config()
  config.dataset.name = 'fashion_mnist'
  with config.unlocked():
    config.dataset.data_dir = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match='config.dataset.data_dir=.*nowhere does not exist'):
    plan_lib.validate(config)


DATA = pathlib.Path(__file__).resolve().parent / 'data'
# The timm_clip reference case's geometry (tests/data/preprocess/make_fixtures.py), scaled to
# [-1, 1] as the releases' pipelines are: only the scaling is left to the checkpoint.
CLIP_GEOMETRY = "decode|resize_small(32, 'pil_bicubic')|central_crop(32, 'round')"


def _finetune(init_from, caplog, **overrides):
  pp = f'{CLIP_GEOMETRY}|value_range(-1, 1)'
  config = tiny_config(**{'init_from': str(init_from), 'model.image_size': 32,
                          'dataset.pp_train': pp, 'dataset.pp_eval': pp, **overrides})
  caplog.set_level(logging.INFO)
  caplog.clear()
  return plan_lib.validate(config), pp


@pytest.mark.parametrize('folder', ['timm_clip', 'hf_clip_vision'])
def test_a_fine_tune_from_clip_scales_as_clip(folder, caplog):
  """init_from a CLIP folder (timm's, transformers'): training and evaluation take OpenAI's
  mean and std, as timm's own eval transform of a real image makes it (reference.npz), and
  config.json's pp_eval says so; init_normalization=False keeps the pipelines', in one line."""
  reference = np.load(DATA / 'preprocess' / 'reference.npz')
  openai = json.loads(str(reference['timm_clip/settings']))
  plan, pp = _finetune(DATA / 'hub' / folder, caplog)
  image = (DATA / 'preprocess' / 'images' / 'wide.png').read_bytes()
  chex.assert_trees_all_close(plan.pp_eval(image, np.random.default_rng(0)),
                              reference['timm_clip/wide'].transpose(1, 2, 0), atol=2e-6)
  scale, offset = plan.pp_train.affine  # The training pipeline's scaling, on the devices.
  chex.assert_trees_all_close((scale, offset), (1 / (255 * np.float32(openai['std'])),
                              -np.float32(openai['mean']) / np.float32(openai['std'])), rtol=1e-6)
  assert plan.config.dataset.pp_eval == plan.pp_eval.spec != pp
  assert caplog.text.count("were scaled by normalize([0.48145466, 0.4578275, 0.40821073], "
                            '[0.26862954, 0.26130258, 0.27577711]), taken here') == 1

  plan, _ = _finetune(DATA / 'hub' / folder, caplog, init_normalization=False)
  assert plan.pp_train.spec == plan.pp_eval.spec == plan.config.dataset.pp_eval == pp
  assert caplog.text.count("which the config's pipelines override") == 1


def test_a_fine_tune_from_a_release_file_keeps_its_pipelines(caplog):
  """A .npz file records no preprocessing: the pipelines as written, nothing logged."""
  plan, pp = _finetune(DATA / 'big_vision' / 'tok_params.npz', caplog)
  assert plan.pp_train.spec == plan.pp_eval.spec == plan.config.dataset.pp_eval == pp
  assert 'Preprocessing' not in caplog.text


def test_a_non_square_teacher_takes_a_run_of_its_aspect_ratio_not_of_its_transpose(tmp_path):
  """A 24x32 teacher (height x width) teaches a 48x64 run (resized: the same proportions) and
  is refused for a 32x24 one (its transpose), naming both sizes."""
  teacher = constant_teacher(tmp_path / 'teacher', image_size=(24, 32), format='timm')
  distilled = {'model.pool': 'token', 'model.distill_token': True, 'distill.teacher': teacher}

  def pp(h, w):
    spec = f'to_rgb|resize(({h}, {w}))|value_range(-1, 1)'
    return {'model.image_size': (h, w), 'dataset.pp_train': spec, 'dataset.pp_eval': spec}
  plan = plan_lib.validate(tiny_config(**distilled, **pp(48, 64)))
  assert plan.teacher is not None
  with pytest.raises(errors.ConfigError, match=r'teacher takes 24x32 images, value_range'
                     r'\(-1, 1\); the run makes 32x24, '):
    plan_lib.validate(tiny_config(**distilled, **pp(32, 24)))


def test_a_teacher_that_cannot_teach_the_model_is_refused_naming_both(tmp_path):
  """config.distill.teacher: a model without a distillation head, other classes (by count,
  by name), another aspect ratio, a missing SOURCE; each one line naming the field."""
  deit = str(pathlib.Path(__file__).parent / 'data' / 'hub' / 'timm_deit_distilled')
  teacher = constant_teacher(tmp_path / 'teacher.npz')
  letters = constant_teacher(tmp_path / 'letters', class_names=tuple('abcdefghij'),
                             format='timm')
  distilled = {'model.pool': 'token', 'model.distill_token': True}
  square_pp = {'dataset.pp_train': 'to_rgb|resize((16, 32))|value_range(-1, 1)',
               'dataset.pp_eval': 'to_rgb|resize((16, 32))|value_range(-1, 1)'}
  for overrides, error, message in [
      ({'distill.teacher': teacher}, errors.ConfigError,
       r'^config.distill.teacher=.*teacher.npz, but the model has no distillation head to '
       r'learn from it: set config.model.distill_token=True, or leave the teacher out.$'),
      ({**distilled, 'distill.teacher': deit}, errors.ConfigError,
       r'^config.distill.teacher=.*timm_deit_distilled labels 5 classes \(tench, goldfish, '
       r"great white shark, ...\), the data has 10 classes \(0, 1, 2, ...\): name a teacher "
       r"trained on the data's classes.$"),
      ({**distilled, 'distill.teacher': letters}, errors.ConfigError,
       r'labels 10 classes \(a, b, c, ...\), the data has 10 classes \(0, 1, 2, ...\)'),
      ({**distilled, **square_pp, 'model.image_size': (16, 32), 'distill.teacher': teacher},
       errors.ConfigError, r'^config.distill.teacher=.*teacher.npz takes 32x32 images, '
       r'value_range\(-1, 1\); the run makes 16x32, value_range\(-1, 1\) '
       r"\(config.dataset.pp_train\): give the run the teacher's aspect ratio"),
      ({**distilled, 'distill.teacher': str(tmp_path / 'absent')}, errors.MissingFileError,
       r'^config.distill.teacher: .*absent does not exist')]:
    with pytest.raises(error, match=message):
      plan_lib.validate(tiny_config(**overrides))
