"""Tests of vit_jax.sharding: the mesh and the partitioning rules."""

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax import sharding
from vit_jax.models import get_model


def test_mesh_axes_from_config():
  mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=2)))
  assert dict(mesh.shape) == {'data': 4, 'fsdp': 2}
  assert dict(sharding.make_mesh(None).shape) == {'data': 8, 'fsdp': 1}
  with pytest.raises(ValueError, match='data=3 x fsdp=2 does not cover the 8 devices'):
    sharding.make_mesh({'data': 3, 'fsdp': 2})


@pytest.mark.parametrize('scan', [False, True])
def test_rules_shard_the_large_matrices_over_fsdp(scan):
  mesh = sharding.make_mesh({'fsdp': 4})
  model = get_model('s16', num_classes=1000, scan=scan)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  specs = jax.tree.map(lambda s: s.spec, sharding.shardings_for(shapes['params'], mesh))
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


def test_indivisible_dimension_stays_replicated():
  mesh = sharding.make_mesh({'fsdp': 8})
  assert sharding.spec_for('head/kernel', (36, 10), mesh) == P()
  assert sharding.spec_for('head/kernel', (64, 10), mesh) == P('fsdp', None)
  # Optimizer state mirrors the parameter paths.
  assert sharding.spec_for('opt_state/1/0/mu/head/kernel', (64, 10), mesh) == P('fsdp', None)


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
