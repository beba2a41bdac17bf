"""Tests of vit_jax.training on 8 simulated devices: steps, meshes, accumulation, runs, resume."""

import functools
import logging
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage

from vit_jax import config as config_lib
from vit_jax.base import errors, sharding
from vit_jax.base.cpu import host_cpu
from vit_jax.checkpoints import manager as manager_lib
from vit_jax.checkpoints import release
from vit_jax.models import get_model
from vit_jax.training import mfu, optim, train

from runs import TINY_MODEL, read_metrics, restore_state, tiny_config


def model_of(config):
  name, options = config_lib.model_options(config.model)
  return get_model(name, num_classes=10, **options)


def setup_step(config, model=None, state=None):
  """The state (``create_train_state``'s, or ``state`` put on this mesh), step and mesh."""
  config = config_lib.complete(config)
  model = model or model_of(config)
  mesh = sharding.make_mesh(config.mesh)
  schedule = optim.make_schedule(config.schedule, 100, 5)
  tx = optim.make_optimizer(config.optimizer, schedule)
  stored = bool(config.mesh.shard_state)  # As Plan.shard_state on these CPU devices.
  if state is None:
    state, shardings = train.create_train_state(model, tx, 0, mesh, shard_state=stored)
  else:
    shardings = sharding.shardings_for(state, mesh, stored=stored)
    state = jax.device_put(state, shardings)
  step = train.make_train_step(model, tx, schedule, config, mesh, shardings)
  return state, step, mesh


def random_batches(mesh, n, batch_size=64, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    images = rng.uniform(-1, 1, (batch_size, 16, 16, 3)).astype(np.float32)
    labels = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch_size)]
    out.append(jax.device_put({'image': images, 'label': labels},
                              sharding.batch_sharding(mesh)))
  return out


def test_jit_and_shard_map_steps_agree_with_the_weights_moving_average():
  assert jax.device_count() == 8
  decay = 0.8
  for step_impl in ('jit', 'shard_map'):
    weights = []
    config = tiny_config(**{'step_impl': step_impl, 'optimizer.ema_decay': decay})
    state, losses, _ = run_steps(config, 3, weights=weights)
    if step_impl == 'jit':
      jit_state, jit_losses = state, losses
    # The moving average after 3 steps: d^3 w_0 + (1 - d) sum_{i=1..3} d^(3-i) w_i.
    expected = jax.tree.map(lambda *w: decay**3 * w[0] + (1 - decay) * sum(
        decay**(3 - i) * w[i] for i in range(1, 4)), *weights)
    chex.assert_trees_all_close(jax.device_get(state.ema_params), expected, atol=1e-6,
                                rtol=1e-5)
    assert not np.allclose(expected['head']['bias'], weights[-1]['head']['bias'])
  np.testing.assert_allclose(jit_losses, losses, rtol=1e-6)
  chex.assert_trees_all_close(jit_state.params, state.params, atol=1e-6, rtol=1e-5)
  chex.assert_trees_all_close(jit_state.ema_params, state.ema_params, atol=1e-6, rtol=1e-5)
  assert int(state.step) == 3


def run_steps(config, n=3, state=None, weights=None):
  """``n`` steps on random batches: the state, losses and gradient norms; the weights
  before and after each step into ``weights``."""
  state, step, mesh = setup_step(config, state=state)
  metrics = []
  if weights is not None:
    weights.append(jax.device_get(state.params))
  for batch in random_batches(mesh, n):
    state, m = step(state, batch)
    metrics.append(m)
    if weights is not None:
      weights.append(jax.device_get(state.params))
  return state, [float(m['loss']) for m in metrics], [float(m['grad_norm']) for m in metrics]


# SGD without weight decay for comparing meshes: its update is the gradient, so parameters
# agree as closely as gradients do. (Adam's update is about +-lr wherever a gradient is
# nearly zero, so it turns the rounding noise there into differences of ~lr.)
SGD = {'optimizer.name': 'sgd', 'optimizer.weight_decay': 0.0, 'schedule.base_lr': 0.3}


@functools.cache
def data_parallel_run(matmul_dtype):
  """The reference for the meshes: the jit step on the (8, 1, 1) mesh, four steps."""
  config = tiny_config(**SGD, **{'model.matmul_dtype': matmul_dtype})
  initial = jax.device_get(setup_step(config)[0])
  return (initial, *jax.device_get(run_steps(config, 4, state=initial)))


@pytest.mark.parametrize('mesh, step_impl, matmul_dtype, more', [
    ((8, 1, 1), 'shard_map', None, {}),
    ((2, 2, 2), 'jit', None, {'grad_accum_steps': 2}),
    ((2, 2, 2), 'shard_map', 'bfloat16', {'grad_accum_steps': 2}),
    ((1, 4, 2), 'jit', 'bfloat16', {}),
    ((1, 4, 2), 'shard_map', None, {'model.scan': True, 'model.remat_policy': 'full'}),
    ((2, 1, 4), 'jit', None, {'model.scan': True, 'model.remat_policy': 'dots'}),
    ((2, 1, 4), 'shard_map', 'bfloat16', {}),
], ids=str)
def test_every_mesh_matches_data_parallelism(mesh, step_impl, matmul_dtype, more):
  """(data, fsdp, tensor) meshes train as plain data parallelism does, with either step.

  Every run starts from the reference's initial parameters (``create_train_state`` gives
  the same ones on any mesh: the next test), in the scanned layout where the run scans;
  gradient accumulation and remat do not change the update.
  """
  initial, reference, losses, grad_norms = data_parallel_run(matmul_dtype)
  config = tiny_config(step_impl=step_impl, **{**SGD, 'model.matmul_dtype': matmul_dtype, **more},
                       **dict(zip(('mesh.data', 'mesh.fsdp', 'mesh.tensor'), mesh, strict=True)))
  scan = bool(config.model.scan)
  tx = optim.make_optimizer(config.optimizer, optim.make_schedule(config.schedule, 100, 5))
  params = release.to_model_layout(initial.params, scanned=scan)
  start = initial.replace(params=params, opt_state=tx.init(params))
  state, mesh_losses, mesh_grad_norms = run_steps(config, 4, state=start)

  # Every array of the state (parameters, momentum) is laid out as the rule table says,
  # e.g. the first MLP kernel: its 32 inputs over fsdp, its 64 outputs over tensor.
  # (Stored: split over data too, where a dimension is left: config.mesh.shard_state.)
  chex.assert_trees_all_equal(
      jax.tree.map(lambda x: x.sharding, state),
      sharding.shardings_for(state, sharding.make_mesh(config.mesh), stored=True))
  kernel = state.params['Transformer']['encoderblock' if scan else 'encoderblock_0'][
      'MlpBlock_3']['Dense_0']['kernel']
  inputs, outputs = (tuple(kernel.sharding.spec) + (None,) * kernel.ndim)[scan:scan + 2]
  assert ('fsdp' in str(inputs), 'tensor' in str(outputs)) == (mesh[1] > 1, mesh[2] > 1)
  # Parameters move by up to ~1e-3 here. bfloat16 products of inputs that differ in their
  # last float32 bits round differently: plain data parallelism with grad_accum_steps=2
  # differs by 2e-5 too.
  np.testing.assert_allclose(mesh_losses, losses, rtol=1e-5)
  np.testing.assert_allclose(mesh_grad_norms, grad_norms, rtol=3e-4 if matmul_dtype else 1e-5)
  chex.assert_trees_all_close(release.to_model_layout(jax.device_get(state.params), False),
                              reference.params, atol=5e-5 if matmul_dtype else 1e-6, rtol=1e-5)
  assert int(state.step) == 4


def test_a_state_written_on_one_mesh_restores_on_another(tmp_path):
  initial = data_parallel_run(None)[0]  # Created on the (8, 1, 1) mesh.
  state, _, _ = setup_step(tiny_config(**SGD, **{'mesh.fsdp': 2, 'mesh.tensor': 2}))
  chex.assert_trees_all_equal(jax.device_get(state), initial)  # Whatever the mesh.

  state = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s))(state)  # Not the initial state.
  manager = manager_lib.make_manager(str(tmp_path), every_steps=1, keep=1)
  manager_lib.save(manager, 1, state, force=True)
  manager.wait_until_finished()
  expected = jax.device_get(state)
  for mesh in ({'fsdp': 4, 'tensor': 2}, {'tensor': 8}, None):  # (1, 4, 2), (1, 1, 8), (8, 1, 1)
    shardings = sharding.shardings_for(expected, sharding.make_mesh(mesh))
    restored = manager_lib.restore(
        manager, manager_lib.abstract_like(expected, shardings))
    chex.assert_trees_all_equal(jax.device_get(restored), expected)
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x.sharding, restored), shardings)
  manager.close()


@pytest.mark.parametrize('step_impl', ['jit', 'shard_map'])
def test_gradient_accumulation_equals_full_batch(step_impl):
  config = tiny_config(step_impl=step_impl)
  model = get_model(num_classes=10, **TINY_MODEL)
  state, _, mesh = setup_step(config, model)
  (batch,) = random_batches(mesh, 1)
  full = train.loss_and_grads(model, config, state.params, batch, state.rng)
  accumulated = train.loss_and_grads(model, tiny_config(grad_accum_steps=4), state.params,
                                     batch, state.rng)
  chex.assert_trees_all_close(full, accumulated, atol=1e-6, rtol=1e-5)
  # And through the whole step, over several steps.
  full_state, full_losses, _ = run_steps(config)
  acc_state, acc_losses, _ = run_steps(tiny_config(step_impl=step_impl, grad_accum_steps=2))
  np.testing.assert_allclose(full_losses, acc_losses, rtol=1e-5)
  chex.assert_trees_all_close(full_state.params, acc_state.params, atol=1e-5, rtol=1e-4)


def test_a_run_warns_where_the_cpu_emulates_bfloat16_products(tmp_path, caplog):
  config = tiny_config(**{'model.matmul_dtype': 'bfloat16', 'total_steps': 2,
                          'schedule.warmup_steps': 1,
                          'checkpoint_every_steps': 2, 'log_every_steps': 1})
  train.train_and_evaluate(config, str(tmp_path))
  warned = [r for r in caplog.records if 'has no bfloat16 instructions' in r.getMessage()]
  assert len(warned) == (0 if host_cpu.cpu_info()['native_bf16'] else 1)


def test_resumed_run_equals_uninterrupted_run(tmp_path, caplog):
  """With DeiT's ingredients: timm's RandAugment, random erasing, repeated augmentation,
  mixup or CutMix, layer-wise learning-rate decay, and the weights' moving average
  (checkpointed, and evaluated too)."""
  caplog.set_level(logging.INFO)
  config = tiny_config(**{
      'dataset.pp_train': "to_rgb|resize(16)|pad_crop(2)|rand_augment('rand-m9-mstd0.5-inc1')|"
                          'value_range(-1, 1)|random_erase(0.5)',
      'dataset.repeats': 3,
      'mixup_alpha': 0.8, 'cutmix_alpha': 1.0, 'optimizer.layer_decay': 0.75,
      'optimizer.ema_decay': 0.9})
  result = train.train_and_evaluate(config, str(tmp_path / 'a'))
  assert result['examples'] == 359  # Every held-out example, once (6 padded batches of 64).
  assert result['ema/loss'] != result['loss']
  steps = sorted(int(p.name) for p in (tmp_path / 'a' / 'checkpoints').iterdir())
  assert steps == [10, 20]
  # The closing summary: steps, time, the evaluations, where everything is.
  assert re.search(r'Done: step 20/20, 20 trained in 0h\d\dm\d\ds \(compiling \d+s, '
                   r'evaluating \d+s\), [\d,]+ img/s, MFU \d+\.\d%', caplog.text)
  assert f'eval accuracy: final {result["accuracy"]:.4f} (step 20), best' in caplog.text
  assert f'EMA eval accuracy: final {result["ema/accuracy"]:.4f} (step 20)' in caplog.text
  assert re.search(r'eval at step 20: accuracy [\d.]+, loss [\d.]+; EMA accuracy [\d.]+, '
                   r'loss [\d.]+ \(359 examples\)', caplog.text)
  assert f'Checkpoints: {tmp_path / "a" / "checkpoints"} (steps 10, 20). Logs: ' \
         f'{tmp_path / "a" / "metrics.jsonl"}' in caplog.text

  a = read_metrics(tmp_path / 'a')
  assert [m['step'] for m in a] == [5, 10, 15, 20, 20]
  assert set(a[-1]) == {'step', 'eval/accuracy', 'eval/loss', 'eval/examples',
                        'eval/ema/accuracy', 'eval/ema/loss'}
  # MFU: the model's FLOPs of a training image at the logged speed, over the peak.
  peak, how = mfu.device_peak('float32')
  assert 'float32 matmul peak of 8 cpu devices' in how
  assert a[0]['train/mfu'] == pytest.approx(
      3 * train.validate(config).model.forward_flops() * a[0]['train/images_per_s'] / peak)

  # A second run that had the step-10 checkpoint when it was restarted, and the log
  # lines of the steps after it (the first run stopped after logging them); it logs
  # every step.
  import shutil
  (tmp_path / 'b' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'a' / 'checkpoints' / '10', tmp_path / 'b' / 'checkpoints' / '10')
  shutil.copy(tmp_path / 'a' / 'metrics.jsonl', tmp_path / 'b' / 'metrics.jsonl')
  config.log_every_steps = 1
  resumed = train.train_and_evaluate(config, str(tmp_path / 'b'))
  b = read_metrics(tmp_path / 'b')
  assert [m['step'] for m in b] == [5, 10, *range(11, 21), 20]  # None twice.
  assert b[:2] == a[:2] and b[-1] == a[-1]
  # Each line's loss is the mean since the last line: a's at 15 and 20 are the means of
  # the losses of b's steps 11-15 and 16-20, which are a's steps, bit for bit.
  losses = [m['train/loss'] for m in b[2:-1]]
  assert len(set(losses)) == 10
  assert a[2]['train/loss'] == pytest.approx(np.mean(losses[:5]), rel=1e-6)
  assert a[3]['train/loss'] == pytest.approx(np.mean(losses[5:]), rel=1e-6)
  chex.assert_trees_all_equal(restore_state(tmp_path / 'a', config),
                              restore_state(tmp_path / 'b', config))
  assert resumed == result
  # A finished run, started again: nothing to train, the same evaluation, no new row.
  assert train.train_and_evaluate(config, str(tmp_path / 'a')) == result
  assert read_metrics(tmp_path / 'a') == a


def test_non_finite_loss_stops_with_the_step_and_keeps_good_checkpoints(tmp_path):
  config = tiny_config(**{'schedule.base_lr': 1e8, 'optimizer.grad_clip_norm': None,
                          'optimizer.name': 'sgd', 'total_steps': 40,
                          'checkpoint_every_steps': 2, 'log_every_steps': 1})
  with pytest.raises(FloatingPointError, match=r'Non-finite loss \(nan\) at step (\d+)\. .*'
                                               r'last good checkpoint is step'):
    train.train_and_evaluate(config, str(tmp_path))
  for step_dir in (tmp_path / 'checkpoints').iterdir():
    restored = restore_state(tmp_path, config, int(step_dir.name))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(restored.params)))


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
    # config_base's schema (every case: tests/test_config_base.py), checked first.
    ({'batch_size': None}, r'^config.batch_size=None cannot be None.$'),
    ({'checkpoint_every_steps': 0}, r'^config.checkpoint_every_steps=0 must be >= 1'),
    ({'schedule.end_lr': 0.5}, r'^config.schedule.end_lr=0.5 is above config.schedule.base_lr'),
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
    train.validate(config)


def test_missing_data_path_is_named(tmp_path):
  config = tiny_config()
  config.dataset.name = 'fashion_mnist'
  with config.unlocked():
    config.dataset.data_dir = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match='config.dataset.data_dir=.*nowhere does not exist'):
    train.validate(config)


def test_fine_tune_starts_from_a_release_file(tmp_path):
  from vit_jax.checkpoints import release

  # A "pre-trained" 16 px model with 7 classes and a pre-logits layer...
  source = get_model(num_classes=7, **{**TINY_MODEL, 'representation_size': 32})
  source_params = source.init(jax.random.key(3), np.zeros((1, 16, 16, 3)))['params']
  release.save_npz(tmp_path / 'pretrained.npz', source_params)
  # ... fine-tuned at 24 px on 10 classes. The warm-up starts at a learning rate of 0,
  # so the parameters after step 1 are exactly the adapted ones.
  config = tiny_config(**{'init_from': str(tmp_path / 'pretrained.npz'), 'model.image_size': 24,
                          'dataset.pp_train': 'to_rgb|resize(24)|value_range(-1, 1)',
                          'dataset.pp_eval': 'to_rgb|resize(24)|value_range(-1, 1)',
                          'total_steps': 2, 'schedule.warmup_steps': 1,
                          'checkpoint_every_steps': 1, 'optimizer.name': 'sgd'})
  train.train_and_evaluate(config, str(tmp_path / 'run'))
  final = jax.device_get(restore_state(tmp_path / 'run', config, step=1).params)
  # Expected, without load_pretrained: the source's encoder as it is, no pre-logits, a
  # fresh zero head for 10 classes, and the 4x4 position grid resized to 6x6 as the
  # releases resize it (scipy.ndimage.zoom, order 1; TINY_MODEL pools 'gap': no class token).
  expected = jax.tree.map(np.asarray, {k: v for k, v in source_params.items()
                                       if k not in ('pre_logits', 'head')})
  grid = expected['Transformer']['posembed_input']['pos_embedding'].reshape(4, 4, 32)
  resized = scipy.ndimage.zoom(grid.astype(np.float64), (1.5, 1.5, 1), order=1)
  expected['Transformer'] = {**expected['Transformer'], 'posembed_input': {
      'pos_embedding': resized.reshape(1, 36, 32).astype(np.float32)}}
  expected['head'] = {'kernel': np.zeros((32, 10), np.float32), 'bias': np.zeros(10, np.float32)}
  chex.assert_trees_all_close(final, expected, atol=1e-6, rtol=1e-6)

  config.init_from = str(tmp_path / 'missing.npz')
  with pytest.raises(FileNotFoundError,
                     match='config.init_from=.*missing.npz is neither a release .npz file'):
    train.validate(config)


def test_mixup_mixes_images_and_labels_alike():
  rng = np.random.default_rng(0)
  batch = {'image': jnp.asarray(rng.uniform(-1, 1, (8, 4, 4, 3)), jnp.float32),
           'label': jnp.eye(10)[jnp.arange(8)]}
  mixed = train.mixup(batch, jax.random.key(1), alpha=0.2)
  p = float(mixed['label'][0, 0])  # Example 0 keeps p of its own class...
  assert 0.5 <= p <= 1.0
  chex.assert_trees_all_close(mixed['label'][0, 7], 1. - p, atol=1e-6)  # ... and its neighbour's.
  chex.assert_trees_all_close(mixed['image'][0],
                              p * batch['image'][0] + (1 - p) * batch['image'][7], atol=1e-6)
  _, losses, _ = run_steps(tiny_config(mixup_alpha=0.2), n=2)
  assert all(np.isfinite(losses))


def numbered_batch(n=8, size=(12, 10)):
  """Example j: an image of value j, one-hot label j."""
  return {'image': jnp.broadcast_to(jnp.arange(n, dtype=jnp.float32)[:, None, None, None],
                                    (n, *size, 3)),
          'label': jnp.eye(n)}


def test_cutmix_label_weights_equal_the_pasted_area():
  batch = numbered_batch()
  cutmix = jax.jit(jax.vmap(lambda key: train.cutmix(batch, key, alpha=1.0)))
  outputs = jax.device_get(cutmix(jax.random.split(jax.random.key(0), 20)))
  shares = []
  for image, label in zip(outputs['image'], outputs['label'], strict=True):
    pasted = image[..., 0] == np.roll(np.arange(8), 1)[:, None, None]  # The neighbour's pixels.
    assert np.all(pasted | (image[..., 0] == np.arange(8)[:, None, None]))
    # One box, the same for every example, its share of the pixels on the labels.
    assert all(np.array_equal(pasted[0], pasted[j]) for j in range(8))
    rows, cols = np.where(pasted[0])
    if len(rows):
      assert pasted[0, rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
    share = pasted[0].mean()
    np.testing.assert_allclose(np.diag(label), 1 - share, atol=1e-6)
    np.testing.assert_allclose(label[np.arange(8), np.roll(np.arange(8), 1)], share, atol=1e-6)
    shares.append(share)
  assert 0.2 < np.mean(shares) < 0.8 and len(set(shares)) > 10  # Beta(1, 1) areas.


def test_mixup_cutmix_switch():
  """DeiT's switch: each batch takes CutMix or mixup, CutMix with probability 0.3 here."""
  batch = numbered_batch()
  config = tiny_config(mixup_alpha=0.8, cutmix_alpha=1.0, mixup_switch_prob=0.3)
  mix = jax.jit(jax.vmap(lambda key: train.mix(batch, key, config)['image']))
  images = np.asarray(mix(jax.random.split(jax.random.key(1), 200))[..., 0])
  whole = np.isin(images, np.arange(8)).reshape(200, -1)  # CutMix pastes; mixup blends.
  assert np.all(whole.all(1) | ~whole.any(1))
  assert abs(whole.all(1).mean() - 0.3) <= 0.1


@pytest.mark.parametrize('append', [True, False])
def test_metrics_log_keeps_earlier_lines_across_a_resume(tmp_path, append):
  # append=False is how gs:// workdirs are written (object stores cannot append).
  # A run logs steps 1-3 and stops; resumed from its step-2 checkpoint, it logs 3 again.
  for start, steps in ((0, (1, 2, 3)), (2, (3,))):
    log = train._MetricsLog(str(tmp_path), start, append=append)
    for step in steps:
      log.write(step, {'train/loss': 1. / step})
    log.close()
  assert [m['step'] for m in read_metrics(tmp_path)] == [1, 2, 3]
  assert read_metrics(tmp_path)[2]['train/loss'] == pytest.approx(1 / 3)


def first_step_loss(config, devices, batch):
  """The shard_map step's loss on ``batch`` on a (devices, 1, 1) mesh, from random weights
  (the zero-initialised head would hide every dropout mask)."""
  model = model_of(config_lib.complete(config))
  mesh = sharding.make_mesh(None, devices=jax.devices()[:devices])
  schedule = optim.make_schedule(config.schedule, 100, 5)
  tx = optim.make_optimizer(config.optimizer, schedule)
  state, shardings = train.create_train_state(model, tx, 0, mesh, shard_state=False)
  leaves, tree = jax.tree.flatten(jax.device_get(state.params))
  rng = np.random.default_rng(0)
  params = jax.tree.unflatten(tree, [x + rng.normal(0, 0.3, x.shape).astype(x.dtype)
                                     for x in leaves])
  state = state.replace(params=jax.device_put(params, shardings.params))
  step = train.make_train_step(model, tx, schedule, config, mesh, shardings)
  _, metrics = step(state, jax.device_put(batch, sharding.batch_sharding(mesh)))
  return float(metrics['loss'])


def test_shard_map_devices_draw_different_masks():
  """Guards the per-device fold_in of the shard_map step's key.

  One example copied onto 8 devices: the step's loss is the mean of 8 devices' losses.
  With one key for all, every device draws the first device's masks and the mean equals
  the loss of that example alone on a 1-device mesh; with a key per device it does not.
  Without dropout both are the same loss (the control).
  """
  rng = np.random.default_rng(1)
  row = {'image': rng.uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32),
         'label': np.eye(10, dtype=np.float32)[[3]]}
  copies = jax.tree.map(lambda x: np.repeat(x, 8, axis=0), row)
  plain = tiny_config(step_impl='shard_map')
  np.testing.assert_allclose(first_step_loss(plain, 8, copies), first_step_loss(plain, 1, row),
                             rtol=1e-5)
  config = tiny_config(step_impl='shard_map',
                       **{'model.dropout_rate': 0.5, 'model.stochastic_depth': 0.5})
  one, eight = first_step_loss(config, 1, row), first_step_loss(config, 8, copies)
  assert abs(eight - one) > 1e-3 * abs(one), (one, eight)


def test_shard_map_mixes_the_global_batch_as_jit_does():
  """Guards mixup/CutMix under shard_map: one draw per step and neighbours across device
  boundaries, as the jit step (not one lambda per device rolling within its own rows)."""
  more = {**SGD, 'mixup_alpha': 0.8, 'cutmix_alpha': 1.0, 'mixup_switch_prob': 0.5}
  jit_state, jit_losses, _ = run_steps(tiny_config(step_impl='jit', **more), 3)
  state, losses, _ = run_steps(tiny_config(step_impl='shard_map', **more), 3)
  np.testing.assert_allclose(losses, jit_losses, rtol=1e-5)
  chex.assert_trees_all_close(state.params, jit_state.params, atol=1e-6, rtol=1e-5)
