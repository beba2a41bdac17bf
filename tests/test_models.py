"""Tests of vit_jax.models: the zoo's parameter counts, every option, bad inputs."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.checkpoints.formats import layout, release
from vit_jax.models import canonical_name, get_model, list_models, release_name

import numpy_bit
import numpy_vit

# A small ViT for tests: 32 px images, 8 px patches (a 4x4 grid), width 32.
SMALL = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8, image_size=32)

VIT22B_BLOCK = dict(parallel_block=True, qk_norm=True, qkv_bias=False, norm='rmsnorm')

# REFERENCE.md: 224 px, 1000 classes, no pre-logits.
PARAM_COUNTS = {
    'ti16': 5_717_416, 's16': 22_050_664, 's32': 22_878_952, 'b8': 86_576_872,
    'b16': 86_567_656, 'b32': 88_224_232, 'l16': 304_326_632, 'l32': 306_535_400,
    'h14': 632_045_800, 'r50_b16': 98_659_112, 'r26_s32': 36_431_912,
}


def count_params(model, image_size=224):
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, image_size, image_size, 3)))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def init(model, batch=2, seed=0):
  return model.init(jax.random.key(seed), jnp.zeros((batch, *model.image_size, 3)))['params']


def images_for(model, batch=2, seed=1):
  return jax.random.uniform(jax.random.key(seed), (batch, *model.image_size, 3),
                            minval=-1., maxval=1.)


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(PARAM_COUNTS))
def test_parameter_count(name):
  assert count_params(get_model(name, num_classes=1000)) == PARAM_COUNTS[name]


def encoder_parameters(name, pool='gap', kernels_only=False):
  """Parameters of a model without classifier (and so without class token for 'gap')."""
  model = get_model(name, num_classes=0, pool=pool, scan=True)  # Scanned: traces fast.
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  return sum(math.prod(x.shape) for path, x in layout.flatten(shapes['params']).items()
             if not kernels_only or ('encoderblock' in path and path.endswith('/kernel')))


def test_giant_parameter_counts_match_the_papers():
  # Zhai et al., 2022 (table 2) count the encoder, in millions: g/14 1011, G/14 1843.
  assert round(encoder_parameters('g14') / 1e6) == 1011
  assert round(encoder_parameters('G14') / 1e6) == 1843
  # PaLI (Chen et al., 2022): ViT-e 3.9B; Dehghani et al., 2023 (table 1): 3926M. Both
  # count its MAP head and its classifier for JFT-3B's 29,593 classes (the number of
  # big_vision's ViT-g/G config); the encoder alone has 3.81B.
  e14 = encoder_parameters('e14', pool='map') + (1792 + 1) * 29_593
  assert round(e14 / 1e6) == 3926 and round(e14 / 1e9, 1) == 3.9
  # Dehghani et al., 2023 (table 1): ViT-22B 21,743M, the weight matrices of its 48 blocks.
  # With patch and position embeddings, norms and biases the encoder has 21.75B.
  assert encoder_parameters('22b14', kernels_only=True) // 10**6 == 21_743
  assert round(encoder_parameters('22b14') / 1e9, 2) == 21.75
  model = get_model('22b14', num_classes=1000)
  assert (model.hidden_size, model.num_layers, model.mlp_dim, model.num_heads,
          model.patch_size) == (6144, 48, 24576, 48, (14, 14))
  assert (model.parallel_block, model.qk_norm, model.qkv_bias, model.norm) == (
      True, True, False, 'rmsnorm')


def test_vit22b_block_matches_an_independent_implementation():
  """Parallel attention and MLP, QK norms, no QKV or norm biases: numpy_vit's reading."""
  flat = numpy_vit.random_release_params(np.random.default_rng(0), width=32, depth=2, heads=4,
                                         mlp=64, patch=8, grid=(4, 4), classes=6, vit22b=True)
  model = get_model('ti16', num_classes=6, **SMALL, **VIT22B_BLOCK)
  params = layout.unflatten(flat)
  x = images_for(model)
  chex.assert_trees_all_equal_shapes(  # The same names and shapes.
      params, jax.eval_shape(model.init, jax.random.key(0), x)['params'])
  logits = jax.jit(model.apply)({'params': params}, x)
  chex.assert_trees_all_close(logits, numpy_vit.forward(flat, np.asarray(x)).astype(np.float32),
                              atol=1e-4, rtol=1e-4)
  scanned = get_model('ti16', num_classes=6, scan=True, **SMALL, **VIT22B_BLOCK)
  stacked = layout.to_model_layout(params, scanned=True)
  chex.assert_trees_all_close(jax.jit(scanned.apply)({'params': stacked}, x), logits,
                              atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('options, arrays', [
    ({'pre_norm': True, 'activation': 'quick_gelu'}, {'pre_norm': True}),  # OpenAI CLIP.
    ({'gated_mlp': True, 'activation': 'silu'}, {'gated': True}),  # DINOv2-g's SwiGLU.
    ({'distill_token': True, 'activation': 'gelu'}, {'distill': True}),  # Distilled DeiT.
])
def test_backbone_options_match_an_independent_implementation(options, arrays):
  """Each backbone option's names, shapes and math: numpy_vit reads the same arrays."""
  flat = numpy_vit.random_release_params(np.random.default_rng(1), width=32, depth=2, heads=4,
                                         mlp=64, patch=8, grid=(4, 4), classes=6, **arrays)
  model = get_model('ti16', num_classes=6, **SMALL, **options)
  params = layout.unflatten(flat)
  x = images_for(model)
  chex.assert_trees_all_equal_shapes(  # The same names and shapes.
      params, jax.eval_shape(model.init, jax.random.key(0), x)['params'])
  expected = numpy_vit.forward(flat, np.asarray(x), activation=options['activation'])
  chex.assert_trees_all_close(jax.jit(model.apply)({'params': params}, x),
                              expected.astype(np.float32), atol=1e-4, rtol=1e-4)


def test_distillation_token_pools_two_tokens_and_both_heads_learn():
  """Names and shapes; the features are the two tokens' mean (the logits, the two heads'
  mean: numpy_vit above); a label loss reaches both heads."""
  model = get_model('ti16', num_classes=6, distill_token=True, **SMALL)
  x = images_for(model)
  params = jax.jit(model.init)(jax.random.key(0), x)['params']
  chex.assert_shape(params['dist'], (1, 1, 32))
  chex.assert_shape(params['Transformer']['posembed_input']['pos_embedding'], (1, 18, 32))
  assert params['dist'].std() > 0  # Apart from the (zero) class token: not the same token.
  assert model.num_prefix_tokens == 2 and model.head_tokens == 2
  features, state = jax.jit(functools.partial(
      model.clone(num_classes=None).apply, capture_intermediates=True))({'params': params}, x)
  tokens = state['intermediates']['Transformer']['encoder_norm']['__call__'][0]
  chex.assert_shape(tokens, (2, 18, 32))
  chex.assert_trees_all_close(features, tokens[:, :2].mean(1), atol=1e-6)
  # Trained on the labels (no teacher), as timm: the loss of the mean reaches both heads.
  heads = {k: params[k] for k in ('head', 'head_dist')}
  loss = lambda h: -jax.nn.log_softmax(model.apply({'params': {**params, **h}}, x))[:, 0].mean()
  grads = jax.jit(jax.grad(loss))(heads)
  assert jnp.abs(grads['head']['kernel']).min() > 0
  assert jnp.abs(grads['head_dist']['kernel']).min() > 0
  with pytest.raises(ValueError, match="distill_token=True reads the class and distillation"):
    get_model('ti16', num_classes=6, distill_token=True, pool='gap', **SMALL)


def test_forward_flops_follow_the_backbone_options():
  """The gated MLP's third matrix and the distillation token's work, in forward_flops and in
  XLA's count of the forward pass (before optimisation: no compile)."""
  model = lambda **o: get_model('ti16', num_classes=6, **SMALL, **o)
  silu, gated, plain, distilled = (
      model(activation='silu'), model(activation='silu', gated_mlp=True), model(),
      model(distill_token=True))
  t, d, m = 17, 32, 64
  block = lambda q, t=t: 4 * t * d * d + 4 * q * d * d + 4 * q * t * d + 4 * q * d * m
  assert gated.forward_flops() - silu.forward_flops() == 2 * d * m * (t + 1)  # t, then 1.
  assert distilled.forward_flops() - plain.forward_flops() == (
      block(18, 18) + block(2, 18) - block(17) - block(1) + 2 * d * 6)
  xla = lambda m: jax.jit(m.apply).lower(
      jax.eval_shape(m.init, jax.random.key(0), images_for(m, batch=1)),
      images_for(m, batch=1)).cost_analysis()['flops']
  for base, option in ((silu, gated), (plain, distilled)):  # The work is there, and no more.
    extra = option.forward_flops() - base.forward_flops()
    assert extra <= xla(option) - xla(base) <= 1.2 * extra


@pytest.mark.parametrize('name, expected', [('b16', 86_566_120), ('s16', 22_049_896)])
def test_parameter_count_gap(name, expected):
  assert count_params(get_model(name, num_classes=1000, pool='gap')) == expected


def test_every_registered_name_builds_with_release_name():
  for name in list_models():
    model = get_model(release_name(name), num_classes=10)
    assert canonical_name(model.model_name) == name
  assert canonical_name('ViT-B/16') == 'b16'
  assert canonical_name('r50+vit-b_16') == 'r50_b16'
  # big_vision's g (giant) and G (gigantic) differ by case; every other size ignores it.
  assert [canonical_name(n) for n in ('g/14', 'ViT-g_14', 'G/14', 'vit-G_14', 'VIT-22B/14')] == [
      'g14', 'g14', 'G14', 'G14', '22b14']
  # Any size with any patch size.
  assert get_model('s8', num_classes=1).patch_size == (8, 8)


@pytest.mark.slow
@pytest.mark.parametrize('pool', ['token', 'gap', 'map'])
@pytest.mark.parametrize('representation_size, num_classes', [(None, 10), (16, None), (16, 10)])
def test_output_shapes_and_dtypes(pool, representation_size, num_classes):
  model = get_model('ti16', num_classes=num_classes, pool=pool,
                    representation_size=representation_size, **SMALL)
  params = init(model)
  out = model.apply({'params': params}, images_for(model), train=False)
  width = representation_size or SMALL['hidden_size']
  chex.assert_shape(out, (2, num_classes or width))
  chex.assert_type(out, jnp.float32)
  chex.assert_tree_all_finite(out)
  assert ('cls' in params) == (pool == 'token')
  assert ('MAPHead_0' in params) == (pool == 'map')
  assert ('pre_logits' in params) == (representation_size is not None)
  assert ('head' in params) == bool(num_classes)


@pytest.mark.slow
def test_head_is_zero_initialised_with_configured_bias():
  model = get_model('ti16', num_classes=7, head_bias_init=-10., **SMALL)
  params = init(model)
  chex.assert_trees_all_equal(params['head']['kernel'], jnp.zeros((32, 7)))
  chex.assert_trees_all_equal(params['head']['bias'], jnp.full((7,), -10.))
  logits = model.apply({'params': params}, images_for(model))
  chex.assert_trees_all_close(logits, jnp.full((2, 7), -10.))


def test_position_embedding_init_and_sincos():
  model = get_model('ti16', num_classes=3, **{**SMALL, 'num_layers': 1})
  pe = init(model)['Transformer']['posembed_input']['pos_embedding']
  chex.assert_shape(pe, (1, 1 + 16, 32))
  assert 0.015 < float(jnp.std(pe)) < 0.025
  fixed = get_model('ti16', num_classes=3, posemb='sincos2d', **{**SMALL, 'num_layers': 1})
  params = init(fixed)
  assert 'posembed_input' not in params['Transformer']
  chex.assert_tree_all_finite(fixed.apply({'params': params}, images_for(fixed)))


def test_initialisation_is_deterministic():
  model = get_model('ti16', num_classes=5, **SMALL)
  chex.assert_trees_all_equal(init(model, seed=3), init(model, seed=3))
  a, b = init(model, seed=3), init(model, seed=4)
  assert not np.allclose(a['embedding']['kernel'], b['embedding']['kernel'])


@pytest.mark.slow
@pytest.mark.parametrize('option', [dict(dropout_rate=0.2), dict(attention_dropout_rate=0.2),
                                    dict(stochastic_depth=0.5)])
def test_dropout_only_when_training(option):
  model = get_model('ti16', num_classes=4, head_bias_init=0., **SMALL, **option)
  plain = get_model('ti16', num_classes=4, **SMALL)
  params = init(model)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), (32, 4))
  x = images_for(model, batch=16)  # Enough examples for drop-path masks to differ.
  evaluate = lambda m: m.apply({'params': params}, x, train=False)
  train = lambda seed: model.apply({'params': params}, x, train=True,
                                   rngs={'dropout': jax.random.key(seed)})
  chex.assert_trees_all_equal(evaluate(model), evaluate(plain))
  assert not np.allclose(train(0), evaluate(model), atol=1e-4)
  assert not np.allclose(train(0), train(1), atol=1e-4)
  chex.assert_trees_all_equal(train(0), train(0))


@pytest.mark.slow
def test_bfloat16_compute_is_finite_and_close_to_float32():
  f32 = get_model('ti16', num_classes=10, **SMALL)
  bf16 = get_model('ti16', num_classes=10, dtype='bfloat16', **SMALL)
  params = init(f32)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), (32, 10)) * 0.1
  chex.assert_trees_all_equal_dtypes(params, init(bf16))  # Parameters stay float32.
  x = images_for(f32)
  a = f32.apply({'params': params}, x)
  b = bf16.apply({'params': params}, x)
  chex.assert_type(b, jnp.float32)
  chex.assert_tree_all_finite(b)
  chex.assert_trees_all_close(a, b, atol=0.05, rtol=0.05)


@pytest.mark.slow
@pytest.mark.parametrize('remat_policy', ['none', 'full', 'dots'])
def test_scanned_and_unrolled_give_the_same_logits(remat_policy):
  unrolled = get_model('ti16', num_classes=6, **SMALL)
  scanned = get_model('ti16', num_classes=6, scan=True, remat_policy=remat_policy, **SMALL)
  params = init(unrolled)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), (32, 6))
  stacked = layout.to_model_layout(params, scanned=True)
  chex.assert_trees_all_equal_shapes(stacked, init(scanned))
  chex.assert_shape(stacked['Transformer']['encoderblock']['MlpBlock_3']['Dense_0']['kernel'],
                    (2, 32, 64))
  x = images_for(unrolled)
  chex.assert_trees_all_close(unrolled.apply({'params': params}, x),
                              scanned.apply({'params': stacked}, x), atol=1e-5, rtol=1e-5)
  # Gradients flow the same through both layouts (remat included).
  loss = lambda m, p: jnp.sum(m.apply({'params': p}, x) ** 2)
  g_unrolled = jax.grad(lambda p: loss(unrolled, p))(params)
  g_scanned = jax.grad(lambda p: loss(scanned, p))(stacked)
  chex.assert_trees_all_close(layout.to_model_layout(g_unrolled, scanned=True), g_scanned,
                              atol=1e-3, rtol=1e-4)  # Gradients reach ~1e2: float32 rounding.


@pytest.mark.parametrize('impl', ['xla'])
def test_fused_attention_matches_einsum(impl):
  einsum = get_model('ti16', num_classes=6, **SMALL)
  fused = get_model('ti16', num_classes=6, attention_impl=impl, **SMALL)
  params = init(einsum)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), (32, 6))
  x = images_for(einsum)
  chex.assert_trees_all_close(einsum.apply({'params': params}, x),
                              fused.apply({'params': params}, x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_even_length_padding_leaves_attention_unchanged():
  """cuDNN's path pads odd token counts by one masked token (``fused_attention``): the same
  outputs and gradients as unpadded attention, here through the XLA implementation."""
  from vit_jax.models.layers import fused_attention

  keys = jax.random.split(jax.random.key(0), 3)
  k, v = (jax.random.normal(key, (2, 17, 4, 8)) for key in keys[1:])
  for tokens in (17, 1):  # Every token; the last block's class token alone.
    q = jax.random.normal(keys[0], (2, tokens, 4, 8))
    f = lambda q, k, v, even: jnp.sum(jnp.sin(fused_attention(q, k, v, 'xla', even)))
    padded, plain = (jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v, even)
                     for even in (True, False))
    chex.assert_trees_all_close(padded, plain, atol=1e-5, rtol=1e-5)
    chex.assert_shape(fused_attention(q, k, v, 'xla', True), (2, tokens, 4, 8))


def test_auto_attention_is_cudnn_only_where_it_applies():
  from vit_jax.models.layers import attention_for

  gpu = dict(dropout=False, recording=False, cudnn=True)
  assert attention_for(jnp.bfloat16, 64, **gpu) == 'cudnn'
  assert attention_for(jnp.float16, 80, **gpu) == 'cudnn'  # H/14's heads.
  assert attention_for(jnp.float32, 64, **gpu) == 'einsum'  # cuDNN takes 16-bit inputs.
  assert attention_for(jnp.bfloat16, 12, **gpu) == 'einsum'  # Not a multiple of 8.
  assert attention_for(jnp.bfloat16, 512, **gpu) == 'einsum'
  assert attention_for(jnp.bfloat16, 64, **{**gpu, 'dropout': True}) == 'einsum'
  assert attention_for(jnp.bfloat16, 64, **{**gpu, 'recording': True}) == 'einsum'
  assert attention_for(jnp.bfloat16, 64, **{**gpu, 'cudnn': False}) == 'einsum'
  # Here (no GPU): the einsum, the same logits as asking for it.
  assert attention_for(jnp.bfloat16, 64, dropout=False, recording=False) == 'einsum'
  auto = get_model('ti16', num_classes=6, dtype='bfloat16', **SMALL)
  assert auto.attention_impl == 'auto'
  params = init(auto)
  x = images_for(auto)
  chex.assert_trees_all_equal(auto.apply({'params': params}, x),
                              auto.clone(attention_impl='einsum').apply({'params': params}, x))


def test_attention_weights_are_recorded_without_changing_logits():
  model = get_model('ti16', num_classes=6, **SMALL)
  params = init(model)
  x = images_for(model)
  logits, state = model.apply({'params': params}, x, mutable='intermediates')
  chex.assert_trees_all_close(logits, model.apply({'params': params}, x), atol=1e-6)
  for block in ('encoderblock_0', 'encoderblock_1'):  # The last block's too: every token's.
    (weights,) = state['intermediates']['Transformer'][block][
        'MultiHeadDotProductAttention_1']['attention_weights']
    chex.assert_shape(weights, (2, 4, 17, 17))
    chex.assert_trees_all_close(weights.sum(-1), jnp.ones((2, 4, 17)), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('options', [{}, {'matmul_dtype': 'bfloat16'}, {'attention_impl': 'xla'},
                                     {'remat_policy': 'dots'}])
def test_last_block_computes_only_the_class_token(options):
  model = get_model('ti16', num_classes=6, **SMALL, **options)
  assert model.head_tokens == 1
  params = init(model)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), (32, 6))
  x = images_for(model, batch=4)
  fast = lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, x)))
  # Collecting the attention weights makes every block compute every token.
  full = lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, x, mutable='intermediates')[0]))
  (loss, grads), (full_loss, full_grads) = (jax.value_and_grad(f)(params) for f in (fast, full))
  chex.assert_trees_all_close(loss, full_loss, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(grads, full_grads, atol=1e-4, rtol=1e-4)  # Up to ~10: rounding.
  # The other tokens' work is really gone: XLA's count of the compiled forward and backward
  # falls by at least the matmul FLOPs that forward_flops says are saved (x3 for a step);
  # the rest of the saving is their LayerNorm, GELU and softmax.
  xla_flops = lambda f: jax.jit(jax.grad(f)).lower(params).compile().cost_analysis()['flops']
  saved = 3 * 4 * (model.forward_flops(all_tokens=True) - model.forward_flops())
  assert saved > 0
  assert saved <= xla_flops(full) - xla_flops(fast) <= 1.5 * saved


@pytest.mark.parametrize('options', [{'scan': True}, {'pool': 'gap'}, {'pool': 'map'}])
def test_every_token_is_computed_where_the_head_reads_more_than_the_class_token(options):
  model = get_model('ti16', num_classes=6, **SMALL, **options)
  assert model.head_tokens is None
  assert model.forward_flops() == model.forward_flops(all_tokens=True)


@pytest.mark.parametrize('name, tokens, channels', [('r50_b16', 196, 1024), ('r26_s32', 49, 2048),
                                                     ('r_ti16', 49, 64)])
def test_hybrid_shapes(name, tokens, channels):
  model = get_model(name, num_classes=3)
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)['params']
  assert model.grid[0] * model.grid[1] == tokens
  chex.assert_shape(params['Transformer']['posembed_input']['pos_embedding'],
                    (1, tokens + 1, model.hidden_size))
  chex.assert_shape(params['embedding']['kernel'], (*model.patch_size, channels, model.hidden_size))
  assert {'conv_root', 'gn_root'} <= set(params)
  chex.assert_shape(jax.eval_shape(model.apply, {'params': params}, x), (1, 3))


@pytest.mark.slow
def test_hybrid_runs():
  # A small BiT stem (two 1-unit stages) and a 1-block encoder, run for real.
  model = get_model('r26_s32', num_classes=3, image_size=64, num_layers=1, resnet_layers=(1, 1))
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 64, 64, 3)))['params']
  unit = params['block2']['unit1']
  assert {'conv1', 'conv2', 'conv3', 'gn1', 'gn2', 'gn3', 'conv_proj', 'gn_proj'} == set(unit)
  chex.assert_shape(unit['conv2']['kernel'], (3, 3, 128, 128))
  out = jax.jit(model.apply)({'params': params}, images_for(model, batch=1))
  chex.assert_shape(out, (1, 3))
  chex.assert_tree_all_finite(out)


def test_hybrid_logits_match_an_independent_bit_stem(tmp_path):
  """Guards the hybrids' stem: weight-standardised convolutions, GroupNorm, max-pool,
  bottleneck units (strides, projections), against numpy_bit on the same release file.

  A plain convolution in place of the standardised one (or another eps, a stride on the
  wrong 1x1, an unprojected shortcut) changes the logits by far more than the tolerance.
  """
  # Two stages: the first unit of each projects its shortcut, the second one strides 2.
  units, rng = (1, 2), np.random.default_rng(0)
  model = get_model('r26_s32', num_classes=5, image_size=32, resnet_layers=units, num_layers=2,
                    hidden_size=32, mlp_dim=64, num_heads=4)
  flat = numpy_bit.random_hybrid_params(rng, units=units, width=32, depth=2, heads=4, mlp=64,
                                        grid=model.grid, classes=5)
  np.savez(tmp_path / 'hybrid.npz', **flat)
  params = release.load_npz(tmp_path / 'hybrid.npz')
  chex.assert_trees_all_equal_shapes(params, jax.eval_shape(lambda: init(model, 1)))
  x = np.asarray(images_for(model, batch=2))
  expected = numpy_bit.forward(flat, x)
  assert expected.std() > 0.1  # Logits that differ between classes and images.
  chex.assert_trees_all_close(jax.jit(model.apply)({'params': params}, x),
                              expected.astype(np.float32), atol=2e-4, rtol=2e-4)


@pytest.mark.slow
def test_non_square_images():
  model = get_model('ti16', num_classes=2, **{**SMALL, 'image_size': (32, 48)})
  params = init(model)
  assert model.grid == (4, 6)
  chex.assert_shape(params['Transformer']['posembed_input']['pos_embedding'], (1, 25, 32))
  chex.assert_shape(model.apply({'params': params}, images_for(model)), (2, 2))


def test_bad_inputs_get_clear_errors():
  with pytest.raises(ValueError, match=r"Unknown model 'b17x'.*Known models"):
    get_model('b17x', num_classes=10)
  with pytest.raises(ValueError, match="Did you mean .*ViT-B_16"):
    get_model('ViT-Q_16', num_classes=10)
  with pytest.raises(ValueError, match=r"Unknown model option\(s\) \['hidden'\]"):
    get_model('b16', num_classes=10, hidden=3)
  with pytest.raises(ValueError, match="pool='cls' is not one of"):
    get_model('b16', num_classes=10, pool='cls')
  with pytest.raises(ValueError, match="dtype='fp8' is not one of"):
    get_model('b16', num_classes=10, dtype='fp8')
  with pytest.raises(ValueError, match="norm='batchnorm' is not one of"):
    get_model('b16', num_classes=10, norm='batchnorm')
  model = get_model('ti16', num_classes=2, **SMALL)
  params = init(model)
  with pytest.raises(ValueError, match=r'expects NHWC images of shape \(batch, 32, 32, 3\).*'
                                       r'got \(2, 64, 64, 3\)'):
    model.apply({'params': params}, jnp.zeros((2, 64, 64, 3)))
  with pytest.raises(ValueError, match=r'got \(2, 32, 32, 1\)'):
    model.apply({'params': params}, jnp.zeros((2, 32, 32, 1)))
  with pytest.raises(ValueError, match=r'got \(32, 32, 3\)'):
    model.apply({'params': params}, jnp.zeros((32, 32, 3)))


def test_forward_flops_match_the_published_counts():
  # REFERENCE.md: B/16 at 224 px about 17.6 GMACs (35 GFLOP); Ti/16 about 1.26 G
  # multiply-adds. timm lists S/16 at 4.61 GMACs. forward_flops counts 2 per MAC.
  for name, gmacs in (('b16', 17.6), ('ti16', 1.26), ('s16', 4.61)):
    model = get_model(name, num_classes=1000)
    assert model.forward_flops(all_tokens=True) / 2e9 == pytest.approx(gmacs, rel=0.01), name
    # This model's last block computes the class token only: 11 full blocks and a bit.
    assert model.forward_flops() / model.forward_flops(all_tokens=True) == pytest.approx(
        0.931, abs=0.001)
  # The token count drives the attention term: 384 px costs more than (384/224)^2 x.
  b16, b16_384 = (get_model('b16', num_classes=1000, image_size=s).forward_flops()
                  for s in (224, 384))
  assert b16_384 > (384 / 224)**2 * b16
  # gap has no class token: one token fewer in every block, so fewer FLOPs, all computed.
  gap = get_model('ti16', num_classes=1000, pool='gap').forward_flops()
  assert gap < get_model('ti16', num_classes=1000).forward_flops(all_tokens=True)
  assert get_model('r50_b16', num_classes=1000).forward_flops() is None


@pytest.mark.parametrize('name, overrides, expected', [
    ('b16', {}, 'ViT-B_16'),
    ('ViT-L/16', {'image_size': 384, 'pool': 'gap'}, 'ViT-L_16'),  # Not part of the name.
    ('ti16', {'patch_size': 4}, 'ViT-Ti_4'),  # A zoo size with any patch.
    ('b16', {'hidden_size': 384, 'mlp_dim': 1536, 'num_heads': 6}, 'ViT-S_16'),  # S's shape.
    ('g14', {}, 'ViT-g_14'), ('G14', {}, 'ViT-G_14'), ('r50_b16', {}, 'R50+ViT-B_16'),
    ('r_ti16', {}, 'R+ViT-Ti_16'),
    # configs/quickstart.py: ti16 made narrow and shallow is no ViT-Ti_16.
    ('ti16', {'patch_size': 4, 'hidden_size': 64, 'mlp_dim': 128, 'num_heads': 4,
              'num_layers': 4}, 'ViT (4 layers, width 64, MLP 128, 4 heads, patch 4)'),
    ('ti16', {'patch_size': (4, 2)}, 'ViT (12 layers, width 192, MLP 768, 3 heads, patch 4x2)'),
    ('r50_b16', {'num_layers': 6},
     'ViT (6 layers, width 768, MLP 3072, 12 heads, patch 1 on a BiT stem (3, 4, 9))'),
    ('b16', {'model_name': 'mine'}, 'mine'),
])
def test_model_named_by_its_shape(name, overrides, expected):
  assert get_model(name, num_classes=10, **overrides).model_name == expected


# timm 1.0.31's own counts (1000 classes; deit3 at 224 px, reg4 at 256): the same models.
@pytest.mark.parametrize('name, image_size, expected', [
    ('deit3_b16', 224, 86_585_320), ('deit3_s16', 224, 22_059_496),
    ('b16_reg4_gap', 256, 86_615_272)])
def test_timm_family_parameter_counts(name, image_size, expected):
  model = get_model(name, num_classes=1000, image_size=image_size, scan=True)
  assert count_params(model, image_size) == expected
  assert canonical_name(release_name(name)) == name == model.model_name


def test_options_of_timm_families_add_parameters_beside_the_releases():
  model = get_model('ti16', num_classes=6, layer_scale=0.5, num_registers=3, class_token=True,
                    pool='gap', prefix_posemb=False, fc_norm=True, **SMALL)
  params = jax.jit(model.init)(jax.random.key(0), images_for(model))['params']
  chex.assert_shape(params['registers'], (1, 3, 32))
  chex.assert_shape(params['cls'], (1, 1, 32))
  chex.assert_shape(params['Transformer']['posembed_input']['pos_embedding'], (1, 16, 32))
  chex.assert_trees_all_equal(params['Transformer']['encoderblock_1']['ls2'],
                              jnp.full((32,), 0.5))
  assert 'fc_norm' in params and 'encoder_norm' not in params['Transformer']
  assert model.num_prefix_tokens == 4 and model.posemb_prefix_rows == 0
  chex.assert_shape(jax.jit(model.apply)({'params': params}, images_for(model)), (2, 6))


def test_options_compute_what_they_say():
  """Each option against the same computation spelled out with the release's model."""
  base = get_model('ti16', num_classes=None, **SMALL)
  params = init(base)
  x = images_for(base)
  apply = lambda model, p: model.apply({'params': p}, x)
  # A class token without position embedding = one whose row is zero.
  no_row = jax.tree.map(lambda v: v, params)
  pe = params['Transformer']['posembed_input']['pos_embedding']
  no_row['Transformer'] = {**params['Transformer'], 'posembed_input': {'pos_embedding': pe[:, 1:]}}
  zero_row = {**params, 'Transformer': {**params['Transformer'], 'posembed_input': {
      'pos_embedding': pe.at[:, 0].set(0.)}}}
  chex.assert_trees_all_close(apply(base.clone(prefix_posemb=False), no_row),
                              apply(base, zero_row), atol=1e-6)
  # Layer scale of one: the release's block.
  blocks = {k: {**v, 'ls1': jnp.ones(32), 'ls2': jnp.ones(32)}
            for k, v in params['Transformer'].items() if k.startswith('encoderblock')}
  scaled = {**params, 'Transformer': {**params['Transformer'], **blocks}}
  chex.assert_trees_all_close(apply(base.clone(layer_scale=1.), scaled), apply(base, params),
                              atol=1e-6)
  # fc_norm with the class token: the same LayerNorm on the one token that is read.
  norm = params['Transformer']['encoder_norm']
  moved = {**params, 'fc_norm': norm, 'Transformer': {
      k: v for k, v in params['Transformer'].items() if k != 'encoder_norm'}}
  chex.assert_trees_all_close(apply(base.clone(fc_norm=True), moved), apply(base, params),
                              atol=1e-6)
  # The exact GELU and another epsilon change the outputs (a little).
  for option in ({'activation': 'gelu'}, {'norm_epsilon': 1e-3}):
    assert jnp.abs(apply(base.clone(**option), params) - apply(base, params)).max() > 1e-6


def test_gap_averages_the_patches_not_the_registers():
  model = get_model('ti16', num_classes=None, pool='gap', num_registers=2, **SMALL)
  params = init(model)
  x = images_for(model)
  _, state = model.apply({'params': params}, x, capture_intermediates=True)
  tokens = state['intermediates']['Transformer']['encoder_norm']['__call__'][0]
  chex.assert_shape(tokens, (2, 18, 32))
  chex.assert_trees_all_close(model.apply({'params': params}, x), tokens[:, 2:].mean(1),
                              atol=1e-6)


def test_register_tokens_are_counted_by_forward_flops():
  plain, registers = (get_model('b16', num_classes=1000, pool='gap', class_token=False,
                                num_registers=r) for r in (0, 4))
  t, d, m = 196, 768, 3072
  block = lambda tokens: 8 * tokens * d * d + 4 * tokens * tokens * d + 4 * tokens * d * m
  assert registers.forward_flops() - plain.forward_flops() == 12 * (block(t + 4) - block(t))
  deit3 = get_model('deit3_b16', num_classes=1000)
  assert deit3.forward_flops() == get_model('b16', num_classes=1000).forward_flops()


def test_bad_options_are_refused():
  with pytest.raises(ValueError, match="pool='token' pools the class token"):
    get_model('ti16', num_classes=1, class_token=False, **SMALL)
  with pytest.raises(ValueError, match="activation='relu' is not one of .*'quick_gelu', 'silu'"):
    get_model('ti16', num_classes=1, activation='relu', **SMALL)
  with pytest.raises(ValueError, match='num_registers=-1 must be >= 0'):
    get_model('ti16', num_classes=1, num_registers=-1, **SMALL)
