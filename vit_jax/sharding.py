"""The device mesh and every partitioning rule, in one place.

The mesh has two axes: ``data`` (data parallelism) and ``fsdp`` (fully-sharded data
parallelism: the batch is split over it too, and the large weight matrices are split
along one dimension, gathered by XLA where each is used). ``config.mesh.fsdp = 1`` (the
default) is data parallelism; ``fsdp > 1`` is for models whose parameters do not fit
on a device, not even for the length of a step.

Over the ``data`` axis the train state is *stored* split as well
(``config.mesh.shard_state``, on by default): each device keeps 1/N of the parameters and
of the optimizer state and updates only its part; the step gathers the parameters once,
at its start, for its forward and backward passes, and reduce-scatters the gradients
(ZeRO stage 2, PyTorch FSDP's SHARD_GRAD_OP). The communication is that of an all-reduce
of the gradients; the optimizer's memory and work fall N-fold (TPU v3-8, ViT-L/16 at
batch 256: 7.87 -> 5.46 GiB per core, 249.6 -> 234.2 ms per step, cost model;
benchmarks/RESULTS.md).
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


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, stored: bool = False) -> P:
  """The partition spec of one array, by the first rule that matches its path.

  ``stored``: as the train state stores it, split over the ``data`` axis too, along its
  first dimension that the rule leaves whole and ``data`` divides.
  """
  rule = next(spec for pattern, spec in PARAM_RULES if re.search(pattern, path))
  spec = [None] * len(shape)
  if len(rule) <= len(shape):
    spec[len(shape) - len(rule):] = rule  # Scanned: the layer axis first, unsharded.
  if any(axis and dim % mesh.shape[axis] for dim, axis in zip(shape, spec, strict=True)):
    spec = [None] * len(shape)
  spec = [axis if axis and mesh.shape[axis] > 1 else None for axis in spec]
  if stored and mesh.shape['data'] > 1:
    free = [i for i, (dim, axis) in enumerate(zip(shape, spec, strict=True))
            if axis is None and dim % mesh.shape['data'] == 0]
    if free:
      spec[free[0]] = 'data'
  return P(*spec) if any(spec) else P()


def shardings_for(tree: Any, mesh: Mesh, stored: bool = False) -> Any:
  """NamedShardings for a pytree of arrays (or shapes), following PARAM_RULES; ``stored``:
  as the train state stores them (see the module's docstring)."""
  return jax.tree_util.tree_map_with_path(
      lambda kp, x: NamedSharding(mesh, spec_for(path_name(kp), tuple(np.shape(x)), mesh,
                                                 stored)), tree)


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
