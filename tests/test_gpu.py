"""Tests that need an NVIDIA GPU: the cuDNN attention path against the einsum one.

Skipped elsewhere (CI has no GPU). On a GPU machine, from the repository root:

    JAX_PLATFORMS=cuda python -m pytest tests/test_gpu.py
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import get_model

pytestmark = pytest.mark.skipif(
    jax.default_backend() != 'gpu',
    reason='needs a GPU: JAX_PLATFORMS=cuda python -m pytest tests/test_gpu.py')

# B/16's heads (12 x 64) on a 2-block encoder at 224 px: 197 tokens, the last block's
# query the class token alone (197 keys), as in training.
B16_HEADS = dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=2)


def relative_error(x, reference):
  x, reference = (np.asarray(t, np.float64) for t in (x, reference))
  return np.linalg.norm(x - reference) / np.linalg.norm(reference)


def test_cudnn_attention_matches_einsum_in_logits_and_gradients():
  einsum = get_model('b16', num_classes=10, dtype='bfloat16', **B16_HEADS)
  cudnn = einsum.clone(attention_impl='cudnn')
  exact = einsum.clone(dtype='float32')  # The reference: float32 throughout.
  x = jax.random.uniform(jax.random.key(1), (8, 224, 224, 3), minval=-1, maxval=1)
  params = einsum.init(jax.random.key(0), x[:1])['params']
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), (768, 10)) * 0.1
  labels = jax.random.randint(jax.random.key(3), (8,), 0, 10)

  def loss(model):
    def f(p):
      logits = model.apply({'params': p}, x)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))
    return jax.jit(jax.value_and_grad(f))

  # The fused kernel is what runs: cuDNN's attention call is in the compiled step.
  hlo = loss(cudnn).lower(params).compile().as_text()
  assert '__cudnn$fmha' in hlo
  assert '__cudnn$fmha' not in loss(einsum).lower(params).compile().as_text()

  (ref_loss, ref_grads), (e_loss, e_grads), (c_loss, c_grads) = (
      loss(m)(params) for m in (exact, einsum, cudnn))
  for grads in (e_grads, c_grads):
    chex.assert_trees_all_equal_shapes(grads, ref_grads)
  # bfloat16 operands: both within the same ~1e-2 of the float32 step, and of each other.
  flat = lambda g: np.concatenate([np.ravel(np.asarray(t, np.float32))
                                   for t in jax.tree.leaves(g)])
  e_err, c_err = relative_error(flat(e_grads), flat(ref_grads)), relative_error(
      flat(c_grads), flat(ref_grads))
  assert abs(float(c_loss) - float(ref_loss)) < 2e-2 * abs(float(ref_loss))
  assert e_err < 3e-2 and c_err < 3e-2, (e_err, c_err)
  assert c_err < 2 * e_err + 1e-3, (e_err, c_err)
  assert relative_error(flat(c_grads), flat(e_grads)) < 3e-2


def test_auto_attention_is_cudnn_in_bfloat16_and_einsum_in_float32():
  x = jnp.zeros((2, 224, 224, 3))
  for dtype, expected in (('bfloat16', True), ('float32', False)):
    model = get_model('b16', num_classes=10, dtype=dtype, **B16_HEADS)
    assert model.attention_impl == 'auto'
    params = model.init(jax.random.key(0), x)['params']
    hlo = jax.jit(model.apply).lower({'params': params}, x).compile().as_text()
    assert ('__cudnn$fmha' in hlo) == expected, dtype
