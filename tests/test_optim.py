"""Tests of vit_jax.training.optim: schedules, optimizers, losses, durations."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from vit_jax.training import optim


def cfg(**kw):
  return ml_collections.ConfigDict(kw)


@pytest.mark.parametrize('decay', ['linear', 'cosine'])
def test_schedule_warms_up_then_decays(decay):
  schedule = optim.make_schedule(cfg(base_lr=1e-3, decay=decay), 1000, 100)
  lrs = np.array([schedule(s) for s in range(1001)])
  np.testing.assert_allclose(lrs[:101], np.linspace(0, 1e-3, 101), rtol=1e-5, atol=1e-9)
  assert np.all(np.diff(lrs[100:]) <= 1e-12)
  assert lrs[-1] == pytest.approx(0., abs=1e-9)
  midpoint = 1e-3 * (0.5 if decay == 'linear' else 0.5 * (1 + np.cos(np.pi / 2)))
  assert lrs[550] == pytest.approx(midpoint, rel=1e-4)


def test_durations_from_epochs():
  config = cfg(batch_size=100, num_epochs=3, schedule=cfg(warmup_epochs=0.5))
  assert optim.resolve_steps(config, 1050) == (32, 6)
  config = cfg(batch_size=100, total_steps=50, schedule=cfg(warmup_steps=10))
  assert optim.resolve_steps(config, 1050) == (50, 10)
  with pytest.raises(ValueError, match=r'warm-up \(60 steps\) is not shorter than the run'):
    optim.resolve_steps(cfg(batch_size=10, total_steps=60, schedule=cfg(warmup_steps=60)), 100)
  with pytest.raises(ValueError, match='total_steps or config.num_epochs'):
    optim.resolve_steps(cfg(batch_size=10, schedule=cfg()), 100)


def test_weight_decay_only_on_kernels():
  params = {'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)},
            'LayerNorm_0': {'scale': jnp.ones(2)}, 'cls': jnp.ones((1, 1, 2))}
  tx = optim.make_optimizer(cfg(name='adam', weight_decay=0.5), optax.constant_schedule(0.1))
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  # Zero gradients: only the decoupled decay moves the kernel, by lr * wd * p.
  chex.assert_trees_all_close(updates['dense']['kernel'], jnp.full((2, 2), -0.05))
  chex.assert_trees_all_equal(updates['dense']['bias'], jnp.zeros(2))
  chex.assert_trees_all_equal(updates['LayerNorm_0']['scale'], jnp.zeros(2))
  chex.assert_trees_all_equal(updates['cls'], jnp.zeros((1, 1, 2)))


def test_adam_bfloat16_first_moment_and_clipping():
  params = {'w': {'kernel': jnp.ones((3,))}}
  tx = optim.make_optimizer(cfg(name='adam', mu_dtype='bfloat16', grad_clip_norm=1.0),
                            optax.constant_schedule(1.0))
  state = tx.init(params)
  mu = [x for x in jax.tree.leaves(state) if x.shape == (3,)][0]
  chex.assert_type(mu, jnp.bfloat16)
  clip = optim.make_optimizer(cfg(name='sgd', momentum=0.0, grad_clip_norm=1.0),
                              optax.constant_schedule(1.0))
  updates, _ = clip.update({'w': {'kernel': jnp.array([30., 40., 0.])}},
                           clip.init(params), params)
  chex.assert_trees_all_close(updates['w']['kernel'], jnp.array([-0.6, -0.8, 0.]))


def test_sgd_momentum():
  params = {'kernel': jnp.zeros(1)}
  tx = optim.make_optimizer(cfg(name='sgd', momentum=0.9), optax.constant_schedule(0.1))
  state = tx.init(params)
  grads = {'kernel': jnp.ones(1)}
  u1, state = tx.update(grads, state, params)
  u2, state = tx.update(grads, state, params)
  chex.assert_trees_all_close((u1['kernel'], u2['kernel']), (jnp.array([-0.1]),
                                                             jnp.array([-0.19])))


def test_losses():
  logits = jnp.array([[2., 0., -1.]])
  onehot = jnp.array([[1., 0., 0.]])
  expected = -jax.nn.log_softmax(logits)[0, 0]
  chex.assert_trees_all_close(optim.loss_fn('softmax_xent', logits, onehot)[0], expected)
  smoothed = optim.loss_fn('softmax_xent', logits, onehot, label_smoothing=0.3)[0]
  target = jnp.array([0.8, 0.1, 0.1])
  chex.assert_trees_all_close(smoothed, -(target * jax.nn.log_softmax(logits)[0]).sum())
  multi = jnp.array([[1., 1., 0.]])
  sig = optim.loss_fn('sigmoid_xent', logits, multi)[0]
  manual = -(jnp.log(jax.nn.sigmoid(2.)) + jnp.log(jax.nn.sigmoid(0.))
             + jnp.log(1 - jax.nn.sigmoid(-1.)))
  chex.assert_trees_all_close(sig, manual, rtol=1e-6)
  with pytest.raises(ValueError, match="config.loss='mse'"):
    optim.loss_fn('mse', logits, onehot)


def test_bad_optimizer_config():
  with pytest.raises(ValueError, match="config.optimizer.name='lamb'"):
    optim.make_optimizer(cfg(name='lamb'), optax.constant_schedule(1.))
  with pytest.raises(ValueError, match="config.schedule.decay='step'"):
    optim.make_schedule(cfg(base_lr=1., decay='step'), 10, 1)


@pytest.mark.slow
def test_layer_wise_lr_decay_scales_each_block_by_its_depth():
  from vit_jax.checkpoints.formats import layout
  from vit_jax.models import get_model

  decay, depth = 0.5, 3
  kw = dict(num_classes=4, image_size=16, patch_size=8, hidden_size=8, mlp_dim=16, num_heads=2,
            num_layers=depth, pool='map')
  params = {scan: jax.eval_shape(get_model('ti16', scan=scan, **kw).init, jax.random.key(0),
                                 jnp.zeros((1, 16, 16, 3)))['params'] for scan in (False, True)}
  scales = layout.flatten(optim.layer_scales(params[False], decay))
  for key, scale in scales.items():
    if key.startswith('Transformer/encoderblock_'):  # Block i (from 0) of 3: 0.5^(3 - i).
      assert scale == decay ** (depth - int(key.split('/')[1].split('_')[1])), key
    elif key.split('/')[0] in ('embedding', 'cls') or 'posembed_input' in key:
      assert scale == decay ** (depth + 1), key
    else:  # The final LayerNorm, the MAP head, the classifier.
      assert scale == 1., key
  assert scales['embedding/kernel'] == 1 / 16 and scales['head/kernel'] == 1.
  assert scales['MAPHead_0/probe'] == 1.
  # Through the optimizer (SGD, lr 1, unit gradients): each step is minus its scale, and
  # a scanned model's stacked blocks get the same steps as the unrolled ones.
  config = cfg(name='sgd', momentum=0., grad_clip_norm=0., layer_decay=decay)
  steps = {}
  for scan, shapes in params.items():
    tx = optim.make_optimizer(config, optax.constant_schedule(1.))
    p = jax.tree.map(lambda s: jnp.ones(s.shape), shapes)
    steps[scan], _ = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, p), tx.init(p), p)
  chex.assert_trees_all_close(layout.flatten(steps[False]),
                              {k: -np.full(np.shape(v), s) for k, v, s in zip(
                                  scales, layout.flatten(steps[False]).values(),
                                  scales.values(), strict=True)})
  chex.assert_trees_all_close(layout.to_release(steps[True]), steps[False])
  with pytest.raises(ValueError, match='config.optimizer.layer_decay=1.5 is not in'):
    optim.make_optimizer(cfg(name='adam', layer_decay=1.5), optax.constant_schedule(1.))


def test_weight_ema_of_bfloat16_weights_moves_in_float32():
  # bfloat16 weights near 1 that a plain SGD step moves by 0.01 a step: the average
  # ema = d * ema + (1 - d) * w with d = 0.9999 changes by ~1e-6 a step, far below
  # bfloat16's resolution at 1 (2**-8 = 0.0039), so it only moves in float32.
  decay, steps = 0.9999, 30
  params = {'w': {'kernel': jnp.ones((4,), jnp.bfloat16)}}
  tx = optim.make_optimizer(cfg(name='sgd', momentum=0.0, grad_clip_norm=0.0, ema_decay=decay),
                            optax.constant_schedule(0.01))
  state = tx.init(params)
  chex.assert_trees_all_equal(optim.ema_params(state),
                              {'w': {'kernel': np.ones((4,), np.float32)}})
  reference = np.ones(4, np.float64)  # The same average of the same weights, in float64.
  grads = {'w': {'kernel': jnp.asarray([1., -1., 2., 0.5], jnp.bfloat16)}}
  for _ in range(steps):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    reference = decay * reference + (1 - decay) * np.asarray(params['w']['kernel'], np.float64)
  ema = optim.ema_params(state)['w']['kernel']
  chex.assert_type(ema, jnp.float32)
  assert np.all(np.asarray(ema) != 1.)  # It moved (in bfloat16 it stays at 1 exactly).
  chex.assert_trees_all_close(np.asarray(ema, np.float64), reference, rtol=1e-6, atol=0)
