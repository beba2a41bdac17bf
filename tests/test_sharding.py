"""Tests of vit_jax.base.sharding: the mesh, the partitioning rules, the activation constraints."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax.base import sharding
from vit_jax.models import get_model

from runs import TINY_MODEL

GIANT_BLOCK = dict(parallel_block=True, qk_norm=True, qkv_bias=False, norm='rmsnorm')


def test_mesh_axes_from_config():
  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=2, tensor=1)))
  assert dict(mesh.shape) == {'data': 4, 'fsdp': 2, 'tensor': 1}
  assert dict(sharding.make_mesh({'fsdp': 2, 'tensor': 2}).shape) == {
      'data': 2, 'fsdp': 2, 'tensor': 2}
  assert dict(sharding.make_mesh(None).shape) == {'data': 8, 'fsdp': 1, 'tensor': 1}
  with pytest.raises(ValueError, match='data=3 x fsdp=2 x tensor=1 does not cover the 8 devices'):
    sharding.make_mesh({'data': 3, 'fsdp': 2})
  with pytest.raises(ValueError, match='data=0 x fsdp=1 x tensor=16 does not cover'):
    sharding.make_mesh({'tensor': 16})


def param_specs(model, mesh):
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *model.image_size, 3)))
  return jax.tree.map(lambda s: s.spec, sharding.shardings_for(shapes['params'], mesh))


@pytest.mark.parametrize('scan', [False, True])
def test_rules_shard_the_large_matrices_over_fsdp(scan):
  mesh = sharding.make_mesh({'fsdp': 4})
  specs = param_specs(get_model('s16', num_classes=1000, scan=scan), mesh)
  block = specs['Transformer']['encoderblock' if scan else 'encoderblock_0']
  lead = (None,) if scan else ()
  assert block['MultiHeadDotProductAttention_1']['query']['kernel'] == P(*lead, 'fsdp', None,
                                                                           None)
  assert block['MultiHeadDotProductAttention_1']['out']['kernel'] == P(*lead, None, None, 'fsdp')
  assert block['MlpBlock_3']['Dense_0']['kernel'] == P(*lead, 'fsdp', None)
  assert block['MlpBlock_3']['Dense_1']['kernel'] == P(*lead, None, 'fsdp')
  assert block['LayerNorm_0']['scale'] == P()
  assert specs['head']['kernel'] == P('fsdp', None)
  assert specs['cls'] == P()


@pytest.mark.parametrize('options', [{}, {'scan': True, **GIANT_BLOCK, 'pool': 'map'}])
def test_rules_split_heads_and_mlp_units_over_tensor(options):
  """Megatron: q, k, v and the first MLP layer split by outputs, their partners by inputs."""
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 2})
  specs = param_specs(get_model('s16', num_classes=10, **options), mesh)
  scan = options.get('scan', False)
  blocks = [((None,) * scan, specs['Transformer']['encoderblock' if scan else 'encoderblock_0'])]
  if options.get('pool') == 'map':  # The MAP head's attention and MLP: the same rules.
    head = specs['MAPHead_0']
    blocks.append(((), {'MultiHeadDotProductAttention_1': head['MultiHeadDotProductAttention_0'],
                        'MlpBlock_3': head['MlpBlock_0']}))
  for lead, block in blocks:
    attention, mlp = block['MultiHeadDotProductAttention_1'], block['MlpBlock_3']
    for name in ('query', 'key', 'value'):
      assert attention[name]['kernel'] == P(*lead, 'fsdp', 'tensor', None)  # (D, heads, hd)
      assert ('bias' in attention[name]) == ('qkv_bias' not in options)
    assert attention['out']['kernel'] == P(*lead, 'tensor', None, 'fsdp')  # (heads, hd, D)
    assert attention['out']['bias'] == P()
    assert mlp['Dense_0']['kernel'] == P(*lead, 'fsdp', 'tensor')  # (D, mlp)
    assert mlp['Dense_0']['bias'] == P(*lead, 'tensor')
    assert mlp['Dense_1']['kernel'] == P(*lead, 'tensor', 'fsdp')  # (mlp, D)
    assert mlp['Dense_1']['bias'] == P()
  block = blocks[0][1]
  if options:  # ViT-22B's block: one norm, scale only; per-head query and key norms.
    assert 'LayerNorm_2' not in block and set(block['LayerNorm_0']) == {'scale'}
    assert block['MultiHeadDotProductAttention_1']['query_ln']['scale'] == P()
  else:
    assert block['MultiHeadDotProductAttention_1']['query']['bias'] == P('tensor', None)
  assert specs['embedding']['kernel'] == P(None, None, None, 'fsdp')


def test_an_axis_that_does_not_divide_its_dimension_is_left_out():
  mesh = sharding.make_mesh({'fsdp': 8})
  assert sharding.spec_for('head/kernel', (36, 10), mesh) == P()
  assert sharding.spec_for('head/kernel', (64, 10), mesh) == P('fsdp', None)
  # Optimizer state mirrors the parameter paths.
  assert sharding.spec_for('opt_state/1/0/mu/head/kernel', (64, 10), mesh) == P('fsdp', None)
  # Ti's 3 heads do not split over 2 tensor devices; its width still splits over fsdp.
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 2})
  assert sharding.spec_for('x/query/kernel', (192, 3, 64), mesh) == P('fsdp', None, None)
  assert sharding.spec_for('x/Dense_0/kernel', (192, 768), mesh) == P('fsdp', 'tensor')


def collectives(model, mesh):
  """The collective operations of the compiled forward pass, one per line of HLO."""
  x = jax.ShapeDtypeStruct((8, *model.image_size, 3), jnp.float32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)['params']

  def forward(params, images):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return model.apply({'params': params}, images)

  hlo = jax.jit(forward, in_shardings=(sharding.shardings_for(shapes, mesh),
                                       sharding.batch_sharding(mesh))).lower(shapes, x)
  ops = r'(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?'
  return [m.group(1) for line in hlo.compile().as_text().splitlines()
          if (m := re.search(rf' {ops}\(', line))]


@pytest.mark.parametrize('options, per_block', [({}, 2), (GIANT_BLOCK, 1)])
def test_tensor_parallel_blocks_all_reduce_once_per_sub_block(options, per_block):
  """Each attention and each MLP ends in one all-reduce of its output, and nothing else
  moves: activations stay split inside the sub-blocks. XLA joins a parallel block's two
  all-reduces into one (ViT-22B's "one all-reduce per block")."""
  model = get_model(num_classes=10, **{**TINY_MODEL, **options})
  assert collectives(model, sharding.make_mesh({'data': 2, 'tensor': 4})) == (
      ['all-reduce'] * per_block * TINY_MODEL['num_layers'])


def test_constrain_is_a_no_op_outside_a_mesh():
  x = jnp.ones((4, 3, 8))
  assert sharding.constrain(x, 'hidden') is x


def test_the_stored_state_is_split_over_the_data_axis_too():
  mesh = sharding.make_mesh({'data': 4, 'fsdp': 2})
  stored = lambda path, shape: sharding.spec_for(path, shape, mesh, stored=True)
  assert stored('encoderblock_0/MlpBlock_3/Dense_0/kernel', (64, 128)) == P('fsdp', 'data')
  assert sharding.spec_for('encoderblock_0/MlpBlock_3/Dense_0/kernel', (64, 128),
                           mesh) == P('fsdp', None)  # As the step computes with it.
  assert stored('opt_state/1/0/nu/encoderblock_0/LayerNorm_0/scale', (64,)) == P('data')
  assert stored('Transformer/encoderblock/LayerNorm_0/scale', (12, 64)) == P('data', None)
  assert stored('cls', (1, 1, 64)) == P(None, None, 'data')
  assert stored('head/bias', (10,)) == P()  # 4 does not divide 10: replicated.
  assert stored('step', ()) == P()
  one_data = sharding.make_mesh({'data': 1, 'fsdp': 8})
  assert sharding.spec_for('cls', (1, 1, 64), one_data, stored=True) == P()
