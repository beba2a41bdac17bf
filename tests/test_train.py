"""Tests of vit_jax.train on 8 simulated devices: steps, meshes, accumulation, runs, resume."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import checkpoint, checkpoint_manager, config_base, host_cpu, optim, sharding, train
from vit_jax.models import get_model

from runs import TINY_MODEL, read_metrics, restore_state, tiny_config


def model_of(config):
  name, options = config_base.model_options(config.model)
  return get_model(name, num_classes=10, **options)


def setup_step(config, model=None, state=None):
  """The state (``create_train_state``'s, or ``state`` put on this mesh), step and mesh."""
  config = config_base.complete(config)
  model = model or model_of(config)
  mesh = sharding.make_mesh(config.mesh)
  schedule = optim.make_schedule(config.schedule, 100, 5)
  tx = optim.make_optimizer(config.optimizer, schedule)
  if state is None:
    state, shardings = train.create_train_state(model, tx, 0, mesh)
  else:
    shardings = sharding.shardings_for(state, mesh)
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


def run_steps(config, n=3, state=None):
  state, step, mesh = setup_step(config, state=state)
  metrics = []
  for batch in random_batches(mesh, n):
    state, m = step(state, batch)
    metrics.append(m)
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
  params = checkpoint.to_model_layout(initial.params, scanned=scan)
  start = initial.replace(params=params, opt_state=tx.init(params))
  state, mesh_losses, mesh_grad_norms = run_steps(config, 4, state=start)

  # Every array of the state (parameters, momentum) is laid out as the rule table says,
  # e.g. the first MLP kernel: its 32 inputs over fsdp, its 64 outputs over tensor.
  chex.assert_trees_all_equal(jax.tree.map(lambda x: x.sharding, state),
                              sharding.shardings_for(state, sharding.make_mesh(config.mesh)))
  kernel = state.params['Transformer']['encoderblock' if scan else 'encoderblock_0'][
      'MlpBlock_3']['Dense_0']['kernel']
  assert kernel.addressable_shards[0].data.shape == (*[2] * scan, 32 // mesh[1], 64 // mesh[2])
  # Parameters move by up to ~1e-3 here. bfloat16 products of inputs that differ in their
  # last float32 bits round differently: plain data parallelism with grad_accum_steps=2
  # differs by 2e-5 too.
  np.testing.assert_allclose(mesh_losses, losses, rtol=1e-5)
  np.testing.assert_allclose(mesh_grad_norms, grad_norms, rtol=3e-4 if matmul_dtype else 1e-5)
  chex.assert_trees_all_close(checkpoint.to_model_layout(jax.device_get(state.params), False),
                              reference.params, atol=5e-5 if matmul_dtype else 1e-6, rtol=1e-5)
  assert int(state.step) == 4


def test_a_state_written_on_one_mesh_restores_on_another(tmp_path):
  initial = data_parallel_run(None)[0]  # Created on the (8, 1, 1) mesh.
  state, _, _ = setup_step(tiny_config(**SGD, **{'mesh.fsdp': 2, 'mesh.tensor': 2}))
  chex.assert_trees_all_equal(jax.device_get(state), initial)  # Whatever the mesh.

  state = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s))(state)  # Not the initial state.
  manager = checkpoint_manager.make_manager(str(tmp_path), every_steps=1, keep=1)
  checkpoint_manager.save(manager, 1, state, force=True)
  manager.wait_until_finished()
  expected = jax.device_get(state)
  for mesh in ({'fsdp': 4, 'tensor': 2}, {'tensor': 8}, None):  # (1, 4, 2), (1, 1, 8), (8, 1, 1)
    shardings = sharding.shardings_for(expected, sharding.make_mesh(mesh))
    restored = checkpoint_manager.restore(
        manager, checkpoint_manager.abstract_like(expected, shardings))
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


def test_resumed_run_equals_uninterrupted_run(tmp_path):
  config = tiny_config()
  result = train.train_and_evaluate(config, str(tmp_path / 'a'))
  assert result['examples'] == 359  # Every held-out example, once (6 padded batches of 64).
  steps = sorted(int(p.name) for p in (tmp_path / 'a' / 'checkpoints').iterdir())
  assert steps == [10, 20]

  # A second run that only had the step-10 checkpoint when it was restarted.
  import shutil
  (tmp_path / 'b' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'a' / 'checkpoints' / '10', tmp_path / 'b' / 'checkpoints' / '10')
  resumed = train.train_and_evaluate(config, str(tmp_path / 'b'))
  a = {m['step']: m['train/loss'] for m in read_metrics(tmp_path / 'a') if 'train/loss' in m}
  b = {m['step']: m['train/loss'] for m in read_metrics(tmp_path / 'b') if 'train/loss' in m}
  assert sorted(b) == [15, 20]
  assert all(a[s] == b[s] for s in b)  # Identical, not just close.
  chex.assert_trees_all_equal(restore_state(tmp_path / 'a', config),
                              restore_state(tmp_path / 'b', config))
  assert resumed == result
  # A finished run, started again: nothing to train, the same evaluation.
  assert train.train_and_evaluate(config, str(tmp_path / 'a')) == result


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
    ({'mesh.tensor': 3}, r'config.mesh: data=2 x fsdp=1 x tensor=3 does not cover the 8 '),
])
def test_bad_configs_fail_before_compiling(overrides, message):
  config = tiny_config()
  with config.unlocked():
    for key, value in overrides.items():
      *parents, leaf = key.split('.')
      node = config
      for p in parents:
        node = node[p]
      node[leaf] = value
  with pytest.raises(ValueError, match=message):
    train.validate(config)


def test_missing_data_path_is_named(tmp_path):
  config = tiny_config()
  config.dataset.name = 'fashion_mnist'
  with config.unlocked():
    config.dataset.data_dir = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match='config.dataset.data_dir=.*nowhere does not exist'):
    train.validate(config)


def test_fine_tune_starts_from_a_release_file(tmp_path):
  from vit_jax import checkpoint

  # A "pre-trained" 16 px model with 7 classes and a pre-logits layer...
  source = get_model(num_classes=7, **{**TINY_MODEL, 'representation_size': 32})
  source_params = source.init(jax.random.key(3), np.zeros((1, 16, 16, 3)))['params']
  checkpoint.save_npz(tmp_path / 'pretrained.npz', source_params)
  # ... fine-tuned at 24 px on 10 classes, with a zero learning rate so that the
  # final parameters are exactly the adapted ones.
  config = tiny_config(**{'init_from': str(tmp_path / 'pretrained.npz'), 'model.image_size': 24,
                          'dataset.pp_train': 'to_rgb|resize(24)|value_range(-1, 1)',
                          'dataset.pp_eval': 'to_rgb|resize(24)|value_range(-1, 1)',
                          'schedule.base_lr': 0.0, 'total_steps': 6, 'optimizer.name': 'sgd'})
  train.train_and_evaluate(config, str(tmp_path / 'run'))
  model = get_model(num_classes=10, **{**TINY_MODEL, 'image_size': 24})
  expected = checkpoint.load_pretrained(tmp_path / 'pretrained.npz', model.init(
      jax.random.key(0), np.zeros((1, 24, 24, 3)))['params'], model)
  final = jax.device_get(restore_state(tmp_path / 'run', config).params)
  chex.assert_trees_all_equal(final, expected)
  chex.assert_shape(final['Transformer']['posembed_input']['pos_embedding'], (1, 36, 32))
  assert 'pre_logits' not in final

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


@pytest.mark.parametrize('append', [True, False])
def test_metrics_log_keeps_earlier_lines_across_a_resume(tmp_path, append):
  # append=False is how gs:// workdirs are written (object stores cannot append).
  for steps in ((1, 2), (3,)):  # A run, then its resumed continuation.
    log = train._MetricsLog(str(tmp_path), append=append)
    for step in steps:
      log.write(step, {'train/loss': 1. / step})
    log.close()
  assert [m['step'] for m in read_metrics(tmp_path)] == [1, 2, 3]
  assert read_metrics(tmp_path)[2]['train/loss'] == pytest.approx(1 / 3)
