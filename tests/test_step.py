"""vit_jax.training.step on 8 simulated devices: the jit and shard_map steps, every mesh,
gradient accumulation, the weights' moving average, each device's own dropout masks, DeiT's
distillation."""

import dataclasses
import functools

import chex
import jax
import numpy as np
import optax
import pytest

from vit_jax.base import sharding
from vit_jax.checkpoints.formats import layout
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.data import packing, preprocess
from vit_jax.models import get_model, naflex
from vit_jax.training import plan as plan_lib
from vit_jax.training import step as step_lib

from runs import TINY_MODEL, constant_teacher, tiny_config


def setup_step(config, state=None):
  """The plan's state (``create_train_state``'s, or ``state`` put on its mesh), its step and
  its mesh."""
  plan = plan_lib.validate(config)
  if state is None:
    state, shardings = plan.train_state()
  else:
    shardings = sharding.shardings_for(state, plan.mesh, stored=plan.shard_state)
    state = jax.device_put(state, shardings)
  return state, plan.train_step(shardings), plan.mesh


def random_batches(mesh, n, batch_size=64, seed=0, label=None):
  """Random images, labelled at random (or all ``label``)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    images = rng.uniform(-1, 1, (batch_size, 16, 16, 3)).astype(np.float32)
    labels = np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch_size) if label is None
                                          else np.full(batch_size, label)]
    out.append(jax.device_put({'image': images, 'label': labels},
                              sharding.batch_sharding(mesh)))
  return out


@pytest.mark.slow
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


@pytest.mark.slow
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
  params = layout.to_model_layout(initial.params, scanned=scan)
  start = initial.replace(params=params, opt_state=plan_lib.validate(config).tx.init(params))
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
  chex.assert_trees_all_close(layout.to_model_layout(jax.device_get(state.params), False),
                              reference.params, atol=5e-5 if matmul_dtype else 1e-6, rtol=1e-5)
  assert int(state.step) == 4


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize('step_impl', ['jit', 'shard_map'])
def test_gradient_accumulation_equals_full_batch(step_impl):
  config = tiny_config(step_impl=step_impl)
  state, _, mesh = setup_step(config)
  (batch,) = random_batches(mesh, 1)
  plan = plan_lib.validate(config)
  accumulate = dataclasses.replace(plan.step_options, grad_accum_steps=4)
  loss_and_grads = lambda options: jax.jit(functools.partial(
      step_lib.loss_and_grads, plan.model, options))(state.params, batch, state.rng)
  full, accumulated = loss_and_grads(plan.step_options), loss_and_grads(accumulate)
  chex.assert_trees_all_close(full, accumulated, atol=1e-6, rtol=1e-5)
  # And through the whole step, over several steps.
  full_state, full_losses, _ = run_steps(config)
  acc_state, acc_losses, _ = run_steps(tiny_config(step_impl=step_impl, grad_accum_steps=2))
  np.testing.assert_allclose(full_losses, acc_losses, rtol=1e-5)
  chex.assert_trees_all_close(full_state.params, acc_state.params, atol=1e-5, rtol=1e-4)


def first_step_loss(config, devices, batch):
  """The shard_map step's loss on ``batch`` on a (devices, 1, 1) mesh, from random weights
  (the zero-initialised head would hide every dropout mask)."""
  plan = plan_lib.validate(config, devices=jax.devices()[:devices])
  state, shardings = step_lib.create_train_state(plan.model, plan.tx, 0, plan.mesh,
                                                 shard_state=False)
  leaves, tree = jax.tree.flatten(jax.device_get(state.params))
  rng = np.random.default_rng(0)
  params = jax.tree.unflatten(tree, [x + rng.normal(0, 0.3, x.shape).astype(x.dtype)
                                     for x in leaves])
  state = state.replace(params=jax.device_put(params, shardings.params))
  step = step_lib.make_train_step(plan.model, plan.tx, plan.schedule, plan.step_options,
                                  plan.mesh, shardings)
  _, metrics = step(state, jax.device_put(batch, sharding.batch_sharding(plan.mesh)))
  return float(metrics['loss'])


@pytest.mark.slow
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


@pytest.mark.slow
def test_shard_map_mixes_the_global_batch_as_jit_does():
  """Guards mixup/CutMix under shard_map: one draw per step and neighbours across device
  boundaries, as the jit step (not one lambda per device rolling within its own rows)."""
  more = {**SGD, 'mixup_alpha': 0.8, 'cutmix_alpha': 1.0, 'mixup_switch_prob': 0.5}
  jit_state, jit_losses, _ = run_steps(tiny_config(step_impl='jit', **more), 3)
  state, losses, _ = run_steps(tiny_config(step_impl='shard_map', **more), 3)
  np.testing.assert_allclose(losses, jit_losses, rtol=1e-5)
  chex.assert_trees_all_close(state.params, jit_state.params, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_the_distillation_head_learns_the_teachers_labels_the_class_head_the_labels(tmp_path):
  """DeiT's hard distillation, with a teacher that answers 0 whatever the image (at 32 px in
  [-1, 1]: the run's 16 px ImageNet-normalised images are resized and rescaled for it) and
  labels that are all 3. From zero heads (uniform softmax) the first gradient of each head's
  bias is half its own target's: 0.5 (0.1 - onehot); without a teacher (timm's training)
  both heads learn the labels through their mean. A few steps on, the distillation head
  answers 0 and the class head 3, with the jit and shard_map steps alike."""
  pp = 'to_rgb|resize(16)|normalize()'
  config = tiny_config(**SGD, **{'model.pool': 'token', 'model.distill_token': True,
                                 'schedule.warmup_steps': 0,
                                 'dataset.pp_train': pp, 'dataset.pp_eval': pp})
  plan = plan_lib.validate(config)
  assert plan.teacher is None
  with config.unlocked():
    config.distill.teacher = constant_teacher(tmp_path / 'teacher.npz')
  teacher = plan_lib.validate(config).teacher
  # The teacher's inputs: the same pixels in [-1, 1], resized (all but the pixels' rounding).
  pixels = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3)).astype(np.float32)
  mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
  chex.assert_trees_all_close(teacher.inputs(((pixels / 255 - mean) / std).astype(np.float32)),
                              jax.image.resize(pixels / 127.5 - 1, (2, 32, 32, 3), 'bilinear'),
                              atol=1e-5)

  gradient = jax.jit(lambda params, batch, rng, teacher: step_lib.loss_and_grads(
      plan.model, plan.step_options, params, batch, rng, teacher=teacher)[1])
  half = lambda label: 0.5 * (0.1 - np.eye(10, dtype=np.float32)[label])
  for step_impl in ('jit', 'shard_map'):
    config.step_impl = step_impl
    state, step, mesh = setup_step(config)
    batches = random_batches(mesh, 4, label=3)
    for given, dist_label in ((teacher, 0), (None, 3)) if step_impl == 'jit' else ():
      grads = gradient(*jax.device_get((state.params, batches[0], state.rng)), given)
      chex.assert_trees_all_close((grads['head']['bias'], grads['head_dist']['bias']),
                                  (half(3), half(dist_label)), atol=1e-6)
    losses = []
    for batch in batches:
      state, metrics = step(state, batch)
      losses.append(float(metrics['loss']))
    # Each head's bias has moved towards its own target, the classifier's class.
    assert [int(np.argmax(state.params[head]['bias'])) for head in ('head', 'head_dist')] == [3, 0]
    assert losses[-1] < losses[0] / 5, losses
    if step_impl == 'jit':
      jit_losses = losses
  np.testing.assert_allclose(losses, jit_losses, rtol=1e-5)



NAFLEX = 'to_rgb|naflex(4, 16)|value_range(-1, 1)'
# Images of mixed aspect ratios: NAFLEX cuts each into its own grid of at most 16 patches.
MIXED = [(16, 16), (8, 32), (32, 8), (12, 20), (20, 12), (16, 8), (8, 16), (24, 24)]


def naflex_examples(sizes, seed=0):
  """Random images of the (height, width) ``sizes`` cut by ``NAFLEX``, stacked, with random
  one-hot labels (numpy: a loader's unpacked batch)."""
  rng = np.random.default_rng(seed)
  pp = preprocess.parse(NAFLEX)
  seqs = [pp(rng.integers(0, 256, (*size, 3), np.uint8), rng) for size in sizes]
  batch = {k: np.stack([s[k] for s in seqs]) for k in preprocess.PATCH_KEYS}
  batch['label'] = np.eye(10, dtype=np.float32)[rng.integers(0, 10, len(sizes))]
  return batch


@pytest.fixture(scope='module')
def one_device_model():
  """A one-layer ViT of width 16, random parameters (drawn in numpy: initialising compiles),
  a one-device mesh: one small compile per test."""
  model = get_model(**{**TINY_MODEL, 'hidden_size': 16, 'mlp_dim': 32, 'num_layers': 1,
                       'num_heads': 2}, num_classes=10)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          np.zeros((1, 16, 16, 3), np.float32))['params']
  rng = np.random.default_rng(0)

  def draw(path, s):  # Norm scales near 1, biases 0, the rest N(0, 0.2).
    name = sharding.path_name(path)
    mean = 1. if name.endswith('scale') else 0.
    std = 0. if name.endswith('bias') else 0.05 if name.endswith('scale') else 0.2
    return (mean + std * rng.standard_normal(s.shape)).astype(s.dtype)

  params = jax.tree_util.tree_map_with_path(draw, shapes)
  return model, params, sharding.make_mesh(None, jax.devices()[:1])


def test_a_naflex_step_learns_images_of_mixed_aspect_ratios(one_device_model):
  """The train step takes a batch of patch sequences (``naflex``, one image each) and fits
  its labels."""
  model, params, mesh = one_device_model
  tx = optax.sgd(0.3)
  state = step_lib.TrainState(np.zeros((), np.int32), params, tx.init(params),
                              jax.random.PRNGKey(0))
  shardings = sharding.shardings_for(state, mesh)
  state = jax.device_put(state, shardings)
  step = step_lib.make_train_step(model, tx, optax.constant_schedule(0.3),
                                  step_lib.StepOptions(), mesh, shardings)
  batch = jax.device_put(naflex_examples(MIXED * 2), sharding.batch_sharding(mesh))
  grids = {tuple(g) for g in np.asarray(batch['patch_grid'])}
  assert len(grids) >= 5 and (2, 8) in grids and (8, 2) in grids
  losses = []
  for _ in range(10):
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.6 * losses[0], losses


def test_the_packed_loss_is_the_mean_over_real_images_and_a_padding_image_gets_no_gradient(
    one_device_model):
  """Two packed rows of three images each (NaViT), the second slot of the first row marked a
  padding image (``image_mask`` False) though its patches are there: the loss (the step's) is
  the mean of the five real images' losses, and the gradient of the padding image's patches,
  and of the padding tokens, is exactly zero; a real image's is not. (That each image's
  logits are its own alone: tests/test_naflex.py.)"""
  model, params, _ = one_device_model
  examples = naflex_examples(MIXED[:6], seed=1)
  batch = packing.pack(examples, packing.Packing(3, 48))
  assert batch['image_mask'].all()  # 48 tokens hold every image: none dropped.
  batch['image_mask'][0, 1] = False
  batch['image'] = preprocess.scale_pixels(batch['image'], 2 / 255, -1., batch['patch_mask'])
  options = step_lib.StepOptions()

  # Everything an argument: XLA would fold constants at compile time, slowly.
  @jax.jit
  def loss_and_patch_grads(params, batch):
    def loss_of(patches):
      logits = model.apply({'params': params}, naflex.inputs({**batch, 'image': patches}))
      return step_lib.packed_loss(options, logits, batch['label'], batch['image_mask']), logits
    return jax.value_and_grad(loss_of, has_aux=True)(batch['image'])

  (loss, logits), grads = loss_and_patch_grads(params, batch)
  step_loss = jax.jit(lambda params, batch: step_lib.loss_and_grads(
      model, options, params, batch, jax.random.PRNGKey(1))[0])
  np.testing.assert_allclose(step_loss(params, batch), loss, rtol=1e-6)
  logits = np.asarray(logits, np.float64)
  assert logits.shape == (2, 3, 10)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  per_image = -(batch['label'] * log_p).sum(-1)
  np.testing.assert_allclose(loss, per_image[batch['image_mask']].mean(), rtol=1e-5)
  assert not np.isclose(loss, per_image.mean(), rtol=1e-3)
  grads = np.asarray(grads)
  segments = batch['segment_ids']
  assert (grads[0][segments[0] == 2] == 0).all()  # The padding image's patches.
  assert (grads[segments == 0] == 0).all()  # The padding tokens.
  for row, segment in ((0, 1), (0, 3), (1, 1), (1, 2), (1, 3)):
    assert np.abs(grads[row][segments[row] == segment]).max() > 0
