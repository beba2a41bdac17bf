"""The device mesh and every partitioning rule, in one place.

The mesh has two axes: ``data`` (plain data parallelism: parameters replicated)
and ``fsdp`` (fully-sharded data parallelism: the batch is split over it too,
and the large weight matrices are split along one dimension, gathered by XLA
when used). ``config.mesh.fsdp = 1`` (the default) is pure data parallelism;
``fsdp > 1`` is for models that do not fit replicated.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax import errors

BATCH_AXES = ('data', 'fsdp')

# Parameter (and optimizer-state) names -> partition specs, first match wins. Specs
# are written for the unrolled layout; a scanned model's leading layer axis is left
# unsharded. A dimension that the fsdp axis does not divide stays replicated.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r'(query|key|value)/kernel$', P('fsdp', None, None)),  # (D, heads, head_dim)
    (r'out/kernel$', P(None, None, 'fsdp')),  # (heads, head_dim, D)
    (r'Dense_0/kernel$', P('fsdp', None)),  # (D, mlp)
    (r'Dense_1/kernel$', P(None, 'fsdp')),  # (mlp, D)
    (r'embedding/kernel$', P(None, None, None, 'fsdp')),  # (P, P, C, D)
    (r'pos_embedding$', P(None, None, 'fsdp')),  # (1, N, D)
    (r'(head|pre_logits)/kernel$', P('fsdp', None)),  # (D, classes)
    (r'.*', P()),  # Biases, norms, class token, step counters: replicated.
)

# Activations: the batch dimension over every data-parallel axis.
ACTIVATION_RULES: dict[str, P] = {
    'batch': P(BATCH_AXES),
    'replicated': P(),
}


def make_mesh(mesh_config: Any = None, devices: list[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp') mesh over all devices; ``data=-1`` takes what fsdp leaves."""
  devices = devices if devices is not None else jax.devices()
  fsdp = int((mesh_config or {}).get('fsdp', 1))
  data = int((mesh_config or {}).get('data', -1))
  if data == -1:
    data = len(devices) // fsdp
  if data * fsdp != len(devices):
    raise errors.ConfigError(f'config.mesh: data={data} x fsdp={fsdp} does not cover the '
                             f'{len(devices)} devices. Make their product {len(devices)} '
                             '(data=-1 fills in the rest).')
  return jax.make_mesh((data, fsdp), BATCH_AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, ACTIVATION_RULES['batch'])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, ACTIVATION_RULES['replicated'])


def path_name(key_path: tuple) -> str:
  """'params/head/kernel' for a pytree key path (dict keys, attributes, indices alike)."""
  parts = []
  for k in key_path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return '/'.join(parts)


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
  """The partition spec of one array, by the first rule that matches its path."""
  spec = next(spec for pattern, spec in PARAM_RULES if re.search(pattern, path))
  if not spec or len(spec) > len(shape):
    return P()
  spec = P(*([None] * (len(shape) - len(spec)) + list(spec)))  # Scanned: layer axis first.
  for dim, axis in zip(shape, spec, strict=True):
    if axis is not None and dim % mesh.shape[axis]:
      return P()
  return spec


def shardings_for(tree: Any, mesh: Mesh) -> Any:
  """NamedShardings for a pytree of arrays (or shapes), following PARAM_RULES."""
  return jax.tree_util.tree_map_with_path(
      lambda kp, x: NamedSharding(mesh, spec_for(path_name(kp), tuple(np.shape(x)), mesh)), tree)


def waits_for_inputs() -> bool:
  """Whether ``inputs_ready`` waits: multi-process runs on XLA:CPU."""
  return jax.process_count() > 1 and jax.default_backend() == 'cpu'


def inputs_ready(tree: Any) -> Any:
  """``tree``, waited for when XLA:CPU runs collectives across processes.

  XLA:CPU runs a multi-process run's gloo collectives on the same threads as the
  copies and computations they wait for, so a program dispatched before its inputs
  are ready can deadlock (seen at random steps of 2-process runs). Call it on a
  step's inputs; elsewhere it returns at once and accelerators keep dispatching ahead.
  """
  if waits_for_inputs():
    jax.block_until_ready(tree)
  return tree
