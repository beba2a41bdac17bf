"""The device mesh and every partitioning rule, in one place.

The mesh has three axes (``config.mesh``; docs/scale.md): ``data`` (the batch is split),
``fsdp`` (the batch too, and the large weight matrices along one dimension, gathered where they
are used) and ``tensor`` (Megatron-style: the q/k/v and first MLP kernels split by their
outputs, the attention-out and second MLP kernels by their inputs, one all-reduce a sub-block).
Over ``data`` the train state is also *stored* split (``config.mesh.shard_state``, on for TPUs and
GPUs): the step gathers the parameters once and reduce-scatters the gradients, and each device
updates 1/N of the optimizer state (ZeRO-2, PyTorch FSDP's SHARD_GRAD_OP).
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax.base import sizes

AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')

# Parameter (and optimizer-state) names -> partition specs, first match wins. Specs
# are written for the unrolled layout; a scanned model's leading layer axis is left
# unsharded. An axis that does not divide its dimension is left out (replicated there).
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r'(query|key|value)/kernel$', P('fsdp', 'tensor', None)),  # (D, heads, head_dim)
    (r'(query|key|value)/bias$', P('tensor', None)),  # (heads, head_dim)
    (r'out/kernel$', P('tensor', None, 'fsdp')),  # (heads, head_dim, D)
    (r'Dense_0/kernel$', P('fsdp', 'tensor')),  # (D, mlp)
    (r'Dense_0/bias$', P('tensor')),  # (mlp,)
    (r'Dense_1/kernel$', P('tensor', 'fsdp')),  # (mlp, D)
    (r'embedding/kernel$', P(None, None, None, 'fsdp')),  # (P, P, C, D)
    (r'pos_embedding$', P(None, None, 'fsdp')),  # (1, N, D)
    (r'(head|pre_logits)/kernel$', P('fsdp', None)),  # (D, classes)
    (r'.*', P()),  # Other biases, norms, class token, step counters: replicated.
)

# Activations, by the names the model and the step constrain them with
# (``constrain``): the batch dimension over every data-parallel axis; between blocks
# every tensor device holds the whole width, inside them its heads / hidden units.
ACTIVATION_RULES: dict[str, P] = {
    'batch': P(BATCH_AXES),  # Input batches (batch, ...).
    'micro_batches': P(None, BATCH_AXES),  # Gradient accumulation (steps, batch, ...).
    'tokens': P(BATCH_AXES, None, None),  # The residual stream (batch, tokens, D).
    'heads': P(BATCH_AXES, None, 'tensor', None),  # q, k, v (batch, tokens, heads, head_dim).
    'hidden': P(BATCH_AXES, None, 'tensor'),  # The MLP's hidden units (batch, tokens, mlp).
    'replicated': P(),
}


def make_mesh(mesh_config: Any = None, devices: list[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over all devices; ``data=-1`` takes what is left."""
  devices = devices if devices is not None else jax.devices()
  data, fsdp, tensor = sizes.mesh_shape(mesh_config, len(devices))
  # jax.make_mesh's placement on the device torus, but splitting a torus axis where a mesh
  # axis is not a product of whole ones (jax.make_mesh refuses (1, 64, 2) on a 4x4x8 v4).
  grid = mesh_utils.create_device_mesh((data, fsdp, tensor), devices,
                                       allow_split_physical_axes=True)
  return Mesh(grid, AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, ACTIVATION_RULES['batch'])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, ACTIVATION_RULES['replicated'])


def path_name(key_path: tuple) -> str:
  """'params/head/kernel' for a pytree key path (dict keys, attributes, indices alike)."""
  return jax.tree_util.keystr(key_path, simple=True, separator='/')


def fit(spec: list[Any], shape: tuple[int, ...], mesh_shape: dict[str, int],
        skip: frozenset[str] = frozenset()) -> P:
  """A spec (one entry per dimension of ``shape``) without the axes that have size 1,
  are in ``skip``, or do not divide their dimension. P() where nothing is left."""
  out = []
  for dim, entry in zip(shape, spec, strict=True):
    axes = [a for a in ((entry,) if isinstance(entry, str) else entry or ())
            if mesh_shape[a] > 1 and a not in skip]
    size = int(np.prod([mesh_shape[a] for a in axes]))
    out.append(None if not axes or dim % size else axes[0] if len(axes) == 1 else tuple(axes))
  return P(*out) if any(out) else P()


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, stored: bool = False) -> P:
  """The partition spec of one array, by the first rule that matches its path.

  ``stored``: as the train state stores it, split over the ``data`` axis too, along its
  first dimension that the rule leaves whole and ``data`` divides.
  """
  rule = next(spec for pattern, spec in PARAM_RULES if re.search(pattern, path))
  spec = [None] * len(shape)
  if len(rule) <= len(shape):
    spec[len(shape) - len(rule):] = rule  # A scanned model's layer axis comes first.
  fitted = fit(spec, shape, dict(mesh.shape))
  if not stored or mesh.shape['data'] == 1:
    return fitted
  spec = list(fitted) + [None] * (len(shape) - len(fitted))
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


def constrain(x: jax.Array, name: str) -> jax.Array:
  """``x`` laid out as ``ACTIVATION_RULES[name]`` on the mesh being traced for.

  The model calls this; the train and eval steps trace it under their mesh
  (``jax.sharding.use_abstract_mesh``). Outside any mesh (a plain ``model.apply``) or
  on one device it returns ``x`` as it is, and inside ``shard_map`` it constrains only
  the axes that are not manual there.
  """
  mesh = jax.sharding.get_abstract_mesh()
  manual = frozenset(mesh.manual_axes)
  if all(size == 1 or axis in manual for axis, size in mesh.shape.items()):
    return x  # No mesh, or nothing left to lay out (one device, or all axes manual).
  spec = ACTIVATION_RULES[name]
  spec = fit(list(spec) + [None] * (x.ndim - len(spec)), x.shape, dict(mesh.shape), manual)
  return jax.lax.with_sharding_constraint(x, spec)


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
