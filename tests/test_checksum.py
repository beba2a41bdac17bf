"""Checksums of arrays: the same on any mesh and on the host, changed by any changed word."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax.base import sharding
from vit_jax.checkpoints.run import checksum


def test_the_same_sharded_over_8_devices_and_on_the_host():
  rng = np.random.default_rng(0)
  tree = {'kernel': rng.normal(size=(16, 24)).astype(np.float32),
          'count': np.int32(7), 'key': np.asarray(jax.random.PRNGKey(3)),
          'mu': rng.normal(size=(8, 3)).astype(jnp.bfloat16)}
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 4})
  specs = {'kernel': P('fsdp', 'data'), 'count': P(), 'key': P(), 'mu': P('data')}
  sharded = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)
  on_host = checksum.of(tree)
  assert checksum.of(sharded) == on_host
  assert set(on_host) == {'kernel', 'count', 'key', 'mu'}
  assert all(len(v) == 16 and int(v, 16) for v in on_host.values())


@pytest.mark.parametrize('dtype', [np.float32, jnp.bfloat16, np.int32, np.uint8, np.bool_])
def test_any_changed_word_changes_it(dtype):
  rng = np.random.default_rng(1)
  x = rng.integers(0, 2, size=(5, 7)).astype(dtype)
  reference = checksum.of({'x': x})['x']
  for index in [(0, 0), (2, 3), (4, 6)]:
    changed = x.copy()
    changed[index] = 1 - changed[index] if dtype == np.bool_ else changed[index] + 1
    assert checksum.of({'x': changed})['x'] != reference
  swapped = x.copy()
  swapped[0, 0], swapped[0, 1] = x[0, 1], x[0, 0]
  if x[0, 0] != x[0, 1]:
    assert checksum.of({'x': swapped})['x'] != reference
  if dtype == np.float32:  # The bit pattern counts, not the value: -0.0 is not 0.0.
    zeros = np.zeros(3, np.float32)
    assert checksum.of({'x': zeros}) != checksum.of({'x': -zeros})
