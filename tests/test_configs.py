"""Every config in configs/ loads and builds its model."""

import importlib.util
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from vit_jax import config as config_lib
from vit_jax.models import get_model

# backbone_finetune's models have options the formula below does not count (pre_norm, layer
# scale, a distillation token): tests/test_backbone_finetune.py plans each.
CONFIGS = sorted(p for p in (pathlib.Path(__file__).resolve().parents[1] / 'configs').glob('*.py')
                 if p.stem != 'backbone_finetune')


def load(path: pathlib.Path, arg: str | None = None) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if arg is None else module.get_config(arg)


ROOT = pathlib.Path(__file__).resolve().parents[1]
# The configs that take an argument (``path.py:ARG``), each of their variants.
VARIANTS = {'imagenette': ('pretrain', 'finetune_64', 'finetune_128', 'finetune_native'),
            'vit_b16_finetune': ('imagenet2012', 'cifar10', 'cifar100', 'oxford_iiit_pet',
                                 'oxford_flowers102', 'local'),
            'vit_jft_like': ('b16', 'l16', 'h14'), 'vit_b16_mpp': ('jft_like', 'i1k'),
            'vit_i1k_augreg': ('ti16', 's16', 's32', 'b16', 'b32', 'l16')}
CASES = [(p, arg) for p in CONFIGS for arg in VARIANTS.get(p.stem, (None,))]
# The model each config is listed with (its name says which), in docs/models.md's zoo.
ZOO_CONFIG_MODELS = {
    'vit_b16_i1k': 'b16', 'vit_l16_i21k': 'l16', 'vit_jft_like:b16': 'b16',
    'vit_jft_like:l16': 'l16', 'vit_jft_like:h14': 'h14', 'vit_G14_jft_like': 'G14',
    'vit_22b_jft_like': '22b14', 'vit_s16_i1k_plain': 's16', 'deit_s16_i1k': 's16',
    'vit_b16_mpp:jft_like': 'b16', 'vit_b16_mpp:i1k': 'b16',
    **{f'vit_i1k_augreg:{m}': m for m in ('ti16', 's16', 's32', 'b16', 'b32', 'l16')},
    **{f'vit_b16_finetune:{d}': 'b16' for d in VARIANTS['vit_b16_finetune']},
}


def readme_models() -> dict[str, dict[str, int]]:
  """docs/models.md's zoo: short name -> layers, width, mlp, heads, patch, parameters."""
  rows = {}
  for line in (ROOT / 'docs' / 'models.md').read_text().splitlines():
    m = re.match(r'^\| `(\w+)` \| [^|]+ \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| '
                 r'([\d,]+) \|$', line)
    if m:
      layers, width, mlp, heads, patch = map(int, m.groups()[1:6])
      rows[m.group(1)] = dict(layers=layers, width=width, mlp=mlp, heads=heads, patch=patch,
                              parameters=int(m.group(7).replace(',', '')))
  return rows


def vit_parameters(*, layers, width, mlp, heads, patch, image=224, classes=1000, pool='token',
                   posemb='learn', representation=None, qkv_bias=True, norm='layernorm',
                   qk_norm=False, parallel_block=False) -> int:
  """The parameters of a (non-hybrid) ViT, counted from the paper's equations (section 3.1,
  eq. 1-4) and the variants' definitions, not from the Flax modules."""
  d, head_dim = width, width // heads
  norm_params = d if norm == 'rmsnorm' else 2 * d  # Scale only / scale and bias.
  attention = 3 * d * d + (3 * d if qkv_bias else 0) + d * d + d  # q, k, v; out.
  attention += 2 * head_dim if qk_norm else 0  # A scale per head dimension, queries and keys.
  mlp_block = d * mlp + mlp + mlp * d + d
  block = attention + mlp_block + norm_params * (1 if parallel_block else 2)
  tokens = (image // patch) ** 2
  total = patch * patch * 3 * d + d + layers * block + norm_params  # Embedding, encoder norm.
  total += d if pool == 'token' else 0  # The class token ...
  if posemb == 'learn':  # ... and its position.
    total += (tokens + (pool == 'token')) * d
  if pool == 'map':  # The probe, its attention, norm and MLP.
    total += d + attention + norm_params + mlp_block
  out = d
  if representation:
    total += d * representation + representation
    out = representation
  return total + (out * classes + classes if classes else 0)


def test_the_parameter_formula_gives_the_readme_model_table():
  rows = readme_models()
  assert {'ti16', 'b16', 'l16', 'h14', 'g14', 'G14', 'e14', '22b14'} <= set(rows)
  for name, row in rows.items():
    options = config_lib.model_options(ml_collections.ConfigDict({'name': name}))[1]
    model = get_model(name, num_classes=1000, **options)
    arch = dict(layers=model.num_layers, width=model.hidden_size, mlp=model.mlp_dim,
                heads=model.num_heads, patch=model.patch_size[0])
    assert arch == {k: row[k] for k in arch}, name
    extra = dict(qkv_bias=model.qkv_bias, norm=model.norm, qk_norm=model.qk_norm,
                 parallel_block=model.parallel_block)
    assert vit_parameters(**arch, **extra) == row['parameters'], name


@pytest.mark.parametrize('path, arg', CASES,
                         ids=[p.stem + (f':{a}' if a else '') for p, a in CASES])
def test_config_builds_the_zoo_model(path, arg):
  """Each shipped config's model: its zoo row's architecture where it names one
  unchanged, and the parameter count of the formula above (checked against the zoo's
  table) for its image size, classes, pooling and heads."""
  config = load(path, arg)
  name, options = config_lib.model_options(config.model)
  classes = config.dataset.num_classes
  model = get_model(name, num_classes=classes, **options)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *model.image_size, 3)))
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  arch = dict(layers=model.num_layers, width=model.hidden_size, mlp=model.mlp_dim,
              heads=model.num_heads, patch=model.patch_size[0])
  sized = {'num_layers', 'hidden_size', 'mlp_dim', 'num_heads', 'patch_size'} & set(options)
  row = readme_models().get(name)
  listed = path.stem + (f':{arg}' if arg else '')
  if not sized:  # A model of the zoo's table as it is.
    assert name == ZOO_CONFIG_MODELS[listed] and row is not None, (listed, name)
    assert arch == {k: row[k] for k in arch}, name
  assert count == vit_parameters(
      **arch, image=model.image_size[0], classes=classes, pool=model.pool, posemb=model.posemb,
      representation=model.representation_size, qkv_bias=model.qkv_bias, norm=model.norm,
      qk_norm=model.qk_norm, parallel_block=model.parallel_block)
  if path.stem == 'fashion_mnist':  # docs/training.md: "a 0.8M-parameter ViT".
    assert round(count / 1e6, 1) == 0.8


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


def test_s16_i1k_plain_is_big_visions_plain_vit_baseline():
  config = load(pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'vit_s16_i1k_plain.py')
  assert (config.model.name, config.model.pool, config.model.posemb) == ('s16', 'gap', 'sincos2d')
  assert (config.batch_size, config.num_epochs, config.mixup_alpha) == (1024, 300, 0.2)
  assert (config.schedule.base_lr, config.schedule.warmup_steps) == (1e-3, 10_000)
  assert config.loss == 'softmax_xent'
  # big_vision's weight decay 1e-4 is not scaled by the learning rate; here it is.
  assert config.optimizer.weight_decay * config.schedule.base_lr == pytest.approx(1e-4)
  assert 'randaug(2, 10)' in config.dataset.pp_train


@pytest.mark.parametrize('model, randaug, mixup', [('b16', 15, 0.5), ('s16', 15, 0.5),
                                                   ('s32', 15, 0.2), ('ti16', 0, 0.0)])
def test_i1k_augreg_is_big_visions_vit_i1k(model, randaug, mixup):
  """big_vision's configs/vit_i1k.py: its RandAugment and mixup by model (its table)."""
  path = pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'vit_i1k_augreg.py'
  spec = importlib.util.spec_from_file_location('augreg', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(model)
  assert (config.model.name, config.model.pool, config.model.posemb) == (model, 'token', 'learn')
  assert config.model.representation_size == {'b16': 768, 's16': 384, 's32': 384,
                                              'ti16': 192}[model]
  assert (config.loss, config.model.head_bias_init) == ('sigmoid_xent', -6.9)
  assert (config.batch_size, config.num_epochs, config.mixup_alpha) == (4096, 300, mixup)
  assert (config.schedule.base_lr, config.schedule.warmup_steps, config.schedule.decay) == (
      1e-3, 10_000, 'cosine')
  assert config.optimizer.weight_decay * config.schedule.base_lr == pytest.approx(1e-4)
  assert config.optimizer.grad_clip_norm == 1.0 and config.dataset.train_split == 'train[:99%]'
  assert f'|randaug(2, {randaug})|' in config.dataset.pp_train
  with pytest.raises(ValueError, match='pick one of'):
    module.get_config('h14')


def test_deit_s16_is_the_deit_recipe():
  config = load(pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'deit_s16_i1k.py')
  assert (config.mixup_alpha, config.cutmix_alpha, config.mixup_switch_prob) == (0.8, 1.0, 0.5)
  assert (config.label_smoothing, config.optimizer.ema_decay, config.model.stochastic_depth) == (
      0.1, 0.99996, 0.1)
  assert (config.optimizer.weight_decay, config.schedule.warmup_epochs) == (0.05, 5)
  # timm's RandAugment, random erasing in normalised units, repeated augmentation x 3.
  assert config.dataset.pp_train.endswith(
      "|rand_augment('rand-m9-mstd0.5-inc1')|value_range(-1, 1)|random_erase(0.25)")
  assert config.dataset.repeats == 3


@pytest.mark.parametrize('name, chips', [('vit_G14_jft_like', 128), ('vit_22b_jft_like', 1024)])
def test_giant_recipes_divide_evenly_on_their_slices(name, chips):
  """The slice a giant recipe names (TPU v4-N: N/2 chips) fits its mesh, model and batch."""
  path = CONFIGS[[p.stem for p in CONFIGS].index(name)]
  assert f'v4-{2 * chips} slice' in path.read_text()
  config = config_lib.complete(load(path))
  model_name, options = config_lib.model_options(config.model)
  model = get_model(model_name, num_classes=config.dataset.num_classes, **options)
  fsdp, tensor = config.mesh.fsdp, config.mesh.tensor
  batch_devices = chips // tensor  # data x fsdp (data=-1: what fsdp and tensor leave).
  assert config.mesh.data == -1 and batch_devices % fsdp == 0
  assert model.num_heads % tensor == 0 and model.mlp_dim % tensor == 0
  assert model.hidden_size % fsdp == 0 and model.mlp_dim % fsdp == 0
  assert (config.batch_size // batch_devices) % config.grad_accum_steps == 0
  assert (config.loss, model.pool, model.head_bias_init, model.image_size) == (
      'sigmoid_xent', 'map', -10.0, (224, 224))


@pytest.mark.parametrize('dataset', ['imagenet2012', 'cifar10', 'cifar100', 'oxford_iiit_pet',
                                     'oxford_flowers102'])
def test_recipes_pass_validation_up_to_their_data(dataset, tmp_path):
  from vit_jax.training import plan as plan_lib

  root = pathlib.Path(__file__).resolve().parents[1] / 'configs'
  spec = importlib.util.spec_from_file_location('finetune', root / 'vit_b16_finetune.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  spec = importlib.util.spec_from_file_location('augreg', root / 'vit_i1k_augreg.py')
  augreg = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(augreg)
  for config in (module.get_config(dataset), load(root / 'vit_b16_i1k.py'),
                 load(root / 'vit_s16_i1k_plain.py'), load(root / 'deit_s16_i1k.py'),
                 augreg.get_config('s16')):
    config.init_from = ''
    config.dataset.data_dir = str(tmp_path)
    # Everything else checks out (model, batch sizes on 8 devices, ops, schedule):
    # only the dataset itself is missing here.
    with pytest.raises(FileNotFoundError, match='is not prepared in'):
      plan_lib.validate(config)


def test_fashion_mnist_config_validates(shared_data, monkeypatch):
  from vit_jax.training import plan as plan_lib

  root = pathlib.Path(__file__).resolve().parents[1]
  monkeypatch.chdir(root)
  plan = plan_lib.validate(load(root / 'configs' / 'fashion_mnist.py'))
  assert (len(plan.train_source), len(plan.eval_source)) == (60_000, 10_000)
  assert plan.total_steps == 7032  # 30 epochs of 60,000 at batch 256.


def test_finetune_presets_train_on_the_whole_split_and_hold_out_only_to_choose(tmp_path):
  """The paper's fine-tuning (appendix B.1.1): the reported runs train on the whole training
  set; a minival (1% ImageNet, 2% CIFAR, 10% Pets and Flowers) is held out only by the sweep
  that chooses the learning rate."""
  from vit_jax import sweep

  root = pathlib.Path(__file__).resolve().parents[1] / 'configs'
  spec = importlib.util.spec_from_file_location('finetune', root / 'vit_b16_finetune.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.MINIVAL == {'imagenet2012': 1, 'cifar10': 2, 'cifar100': 2,
                            'oxford_iiit_pet': 10, 'oxford_flowers102': 10}
  for dataset, percent in module.MINIVAL.items():
    assert module.get_config(dataset).dataset.train_split == 'train'
    grid = [('schedule.base_lr', ['0.001', '0.003', '0.01', '0.03'])]
    chosen = sweep.Sweep(f'{root}/vit_b16_finetune.py:{dataset}', [], str(tmp_path), grid, 3,
                         percent)
    assert chosen.splits == (f'train[:{100 - percent}%]', f'train[{100 - percent}%:]')
    (final, *_), = [chosen.final_runs([grid_point]) for grid_point in
                    [[('schedule.base_lr', '0.01')]]]
    assert 'dataset.train_split' not in dict(final.overrides)  # The whole split.
