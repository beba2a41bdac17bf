"""Image, patch and grid sizes (an int for a square, or a (height, width) pair), and the
device mesh's and the batches' sizes over a number of devices (no jax)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vit_jax.base import errors


def pair(x: int | Sequence[int]) -> tuple[int, int]:
  """Returns ``(x, x)`` for an int, ``tuple(x)`` for a pair."""
  if isinstance(x, int):
    return (x, x)
  h, w = x
  return (int(h), int(w))


def mesh_shape(mesh_config: Any, devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) of ``config.mesh`` over ``devices`` devices (``data=-1``: what
  fsdp and tensor leave); a ConfigError where they do not cover them. No jax: a command
  checks it before jax starts where it knows the device count (a CPU run)."""
  mesh_config = mesh_config or {}
  fsdp, tensor = int(mesh_config.get('fsdp', 1)), int(mesh_config.get('tensor', 1))
  data = int(mesh_config.get('data', -1))
  if data == -1:
    data = devices // (fsdp * tensor)
  if min(data, fsdp, tensor) < 1 or data * fsdp * tensor != devices:
    raise errors.ConfigError(
        f'config.mesh: data={data} x fsdp={fsdp} x tensor={tensor} does not cover the '
        f'{devices} devices. Make their product {devices} (data=-1 fills in the rest).')
  return data, fsdp, tensor


def check_batches(config: Any, devices: int) -> None:
  """Both of ``config``'s batches split evenly over the ``devices`` that split them (data x
  fsdp: those along 'tensor' share their rows), and into micro-batches; a ConfigError if not."""
  for field in ('batch_size', 'eval_batch_size'):
    if config[field] is None:  # eval_batch_size: batch_size's.
      continue
    size = int(config[field])
    if size < devices:
      raise errors.ConfigError(
          f'config.{field}={size} is smaller than the {devices} devices: each device needs at '
          f'least one example. Use a multiple of {devices} (or fewer devices: --cpu_devices, '
          'config.mesh).')
    if size % devices:
      raise errors.ConfigError(f'config.{field}={size} is not divisible by the {devices} '
                               'devices that split it (config.mesh data x fsdp). Use a '
                               f'multiple of {devices}.')
  accum = int(config.grad_accum_steps)
  if (config.batch_size // devices) % accum:
    raise errors.ConfigError(f'config.grad_accum_steps={accum} does not divide the per-device '
                             f'batch {config.batch_size // devices}.')
