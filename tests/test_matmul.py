"""Tests of vit_jax.models.matmul: bfloat16 products with float32 accumulation, both ways."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import get_model
from vit_jax.models.matmul import einsum_specs, mixed_dot_general

DENSE = (((2,), (0,)), ((), ()))            # (b, t, D) x (D, M) -> (b, t, M)
DENSE_GENERAL_OUT = (((2, 3), (0, 1)), ((), ()))  # (b, t, h, d) x (h, d, D)
ATTENTION = (((3,), (3,)), ((0, 1), (0, 1)))  # (b, h, q, d) x (b, h, k, d) -> (b, h, q, k)

CASES = {
    'dense': (DENSE, (2, 5, 8), (8, 6)),
    'dense_general_out': (DENSE_GENERAL_OUT, (2, 5, 3, 4), (3, 4, 8)),
    'attention': (ATTENTION, (2, 3, 5, 4), (2, 3, 7, 4)),
}


def test_einsum_specs():
  assert einsum_specs(3, 2, DENSE) == ('bca', 'ad', 'bcd')
  assert einsum_specs(4, 4, ATTENTION) == ('abdc', 'abec', 'abde')


def _round(x):
  return x.astype(jnp.bfloat16).astype(jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(CASES))
def test_forward_and_gradients_are_float32_products_of_bfloat16_operands(case):
  dims, lhs_shape, rhs_shape = CASES[case]
  lhs = jax.random.normal(jax.random.key(0), lhs_shape)
  rhs = jax.random.normal(jax.random.key(1), rhs_shape)
  dot = mixed_dot_general('bfloat16')
  out, vjp = jax.vjp(lambda a, b: dot(a, b, dims), lhs, rhs)
  g = jax.random.normal(jax.random.key(2), out.shape)
  grads = vjp(g)

  # Reference: float32 products of the operands (and cotangent) rounded to bfloat16.
  hi = jax.lax.Precision.HIGHEST
  ref_out, ref_vjp = jax.vjp(lambda a, b: jax.lax.dot_general(a, b, dims, precision=hi),
                             _round(lhs), _round(rhs))
  chex.assert_type([out, *grads], jnp.float32)
  chex.assert_trees_all_close(out, ref_out, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(grads, ref_vjp(_round(g)), rtol=1e-5, atol=1e-5)
  # ... and close to the plain float32 product, to bfloat16's precision.
  assert not np.array_equal(out, jax.lax.dot_general(lhs, rhs, dims, precision=hi))
  chex.assert_trees_all_close(out, jax.lax.dot_general(lhs, rhs, dims), rtol=0.05, atol=0.05)


def _dot_operand_types(hlo: str) -> list[str]:
  return re.findall(r'stablehlo\.dot_general.*?: \((tensor<[^>]*>), (tensor<[^>]*>)\)', hlo)


@pytest.mark.slow
def test_every_product_of_the_training_step_takes_bfloat16_operands():
  """Forward and backward: what plain autodiff of a float32-accumulating dot misses."""
  model = get_model('ti16', num_classes=10, hidden_size=32, mlp_dim=64, num_heads=4,
                    num_layers=2, patch_size=8, image_size=32, matmul_dtype='bfloat16')
  x = jnp.zeros((2, 32, 32, 3))
  params = model.init(jax.random.key(0), x)['params']
  loss = lambda p: model.apply({'params': p}, x).sum()
  hlo = jax.jit(jax.grad(loss)).lower(params).as_text()
  operands = _dot_operand_types(hlo)
  mixed = [(a, b) for a, b in operands if 'bf16' in a and 'bf16' in b]
  plain = [(a, b) for a, b in operands if 'bf16' not in a + b]
  # 2 layers x 8 products (q, k, v, out, the two of attention, the two of the MLP),
  # each once forward and twice backward. Only the head's products (10 classes) are
  # float32; the patch embedding is a convolution.
  assert len(mixed) == 2 * 8 * 3, operands
  assert plain and all('x10x' in a + b for a, b in plain), plain

  grads = jax.grad(loss)(params)
  chex.assert_trees_all_equal_dtypes(grads, params)  # Float32 gradients.


def _compiled_dot_operand_types(hlo: str) -> list[tuple[str, str, str]]:
  """(lhs type, rhs type, lhs shape) of every dot of a compiled (XLA) HLO module."""
  types = dict(re.findall(r'(%[\w.\-]+) = (\w+\[[\d,]*\])', hlo))
  dots = re.findall(r' dot\((%[\w.\-]+), (%[\w.\-]+)\)', hlo)
  return [(types[a].split('[')[0], types[b].split('[')[0], types[a]) for a, b in dots]


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='XLA:CPU\'s product kernels')
def test_xla_cpu_keeps_every_product_of_the_training_step_in_bfloat16():
  """After XLA's passes too: XLA:CPU computes bfloat16 products that its kernels do not
  take in float32 (transposed operands such as the heads-first q, k and v; contractions
  over the left operand's leading dimensions such as the attention's key and value
  gradients), which _product rules out."""
  model = get_model('ti16', num_classes=10, hidden_size=64, mlp_dim=128, num_heads=2,
                    num_layers=2, patch_size=8, image_size=32, matmul_dtype='bfloat16')
  x = jnp.zeros((4, 32, 32, 3))
  params = model.init(jax.random.key(0), x)['params']
  loss = lambda p: model.apply({'params': p}, x).sum()
  hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  dots = _compiled_dot_operand_types(hlo)
  mixed = [d for d in dots if d[:2] == ('bf16', 'bf16')]
  plain = [d for d in dots if d[:2] == ('f32', 'f32')]
  assert len(mixed) + len(plain) == len(dots), dots
  # 2 blocks x 8 products (q, k, v, logits, weights x values, out, 2 MLP), forward and 2
  # backward, but for the last block's attention products: that block computes the class
  # token only (models.vit.VisionTransformer.head_tokens), one query row per image and head.
  assert len(mixed) == 2 * 8 * 3 - 2 * 3, dots
  # float32: the head's products (2-D, one row per image), and 4 of those one-query
  # attention products, matrix-vector products that XLA:CPU upcasts: (batch x heads, 17
  # keys or 32 features, 1).
  head = [d for d in plain if d[2] in ('f32[4,10]', 'f32[4,64]')]
  one_query = [d for d in plain if d[2] in ('f32[8,17,1]', 'f32[8,32,1]')]
  assert len(head) == 2 and len(one_query) == 4 and len(plain) == 6, plain


@pytest.mark.slow
def test_model_with_bfloat16_matmuls_is_close_to_float32():
  kw = dict(num_classes=10, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2,
            patch_size=8, image_size=32)
  f32 = get_model('ti16', **kw)
  mixed = get_model('ti16', matmul_dtype='bfloat16', **kw)
  x = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3), minval=-1, maxval=1)
  y = jax.nn.one_hot(jnp.arange(4), 10)
  params = f32.init(jax.random.key(0), x)['params']
  chex.assert_trees_all_equal_shapes_and_dtypes(params, mixed.init(jax.random.key(0), x)['params'])
  params['head']['kernel'] = 0.1 * jax.random.normal(jax.random.key(2), (32, 10))

  def loss_and_grads(model):
    loss = lambda p: -jnp.sum(jax.nn.log_softmax(model.apply({'params': p}, x)) * y)
    return jax.value_and_grad(loss)(params)

  (l0, g0), (l1, g1) = loss_and_grads(f32), loss_and_grads(mixed)
  assert l1 != l0
  np.testing.assert_allclose(l1, l0, rtol=1e-2)
  norm = lambda t: float(jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree.leaves(t))))
  assert norm(jax.tree.map(jnp.subtract, g1, g0)) < 0.03 * norm(g0)


def test_matmul_dtype_is_validated():
  with pytest.raises(ValueError, match='matmul_dtype'):
    get_model('ti16', num_classes=10, matmul_dtype='bf16')
