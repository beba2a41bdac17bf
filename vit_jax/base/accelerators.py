"""The accelerators vit_jax plans for: Cloud TPU slices by name, and published chip figures.

Cloud TPU names a slice by generation and size: ``v3-8``, ``v4-32`` and ``v5p-128`` count
TensorCores, ``v5litepod-16`` and ``v6e-256`` count chips. ``tpu_slice`` maps such a name to
its chips and to the topology that libtpu compiles for (``v3:2x2``, ``v4:2x2x1``, ...), so
that ``vit_jax.tools.aot`` can compile for a slice with no TPU attached. The figures are the
published ones (cloud.google.com/tpu/docs, per chip; NVIDIA's data sheets, dense).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per chip."""

  name: str  # As in Cloud TPU's slice names: 'v3', 'v5litepod'.
  hbm_bytes: int
  bf16_flops: float  # Published peak, bfloat16 inputs.
  cores: int  # TensorCores.
  devices: int  # JAX devices: one per core (v2, v3), or one per chip (megacore, v5e, v6e).
  libtpu_name: str  # The generation in libtpu's topology names.
  dims: int  # Torus dimensions: 2 or 3.
  sized_by: str  # What the number in the slice name counts: 'cores' or 'chips'.
  device_kind: str  # How JAX names its devices ('TPU v5' is v5p's).


CHIPS: dict[str, Chip] = {c.name: c for c in (
    Chip('v2', 16 * GiB, 45e12, 2, 2, 'v2', 2, 'cores', 'TPU v2'),
    Chip('v3', 32 * GiB, 123e12, 2, 2, 'v3', 2, 'cores', 'TPU v3'),
    Chip('v4', 32 * GiB, 275e12, 2, 1, 'v4', 3, 'cores', 'TPU v4'),
    Chip('v5p', 95 * GiB, 459e12, 2, 1, 'v5', 3, 'cores', 'TPU v5'),
    Chip('v5litepod', 16 * GiB, 197e12, 1, 1, 'v5e', 2, 'chips', 'TPU v5 lite'),
    Chip('v6e', 32 * GiB, 918e12, 1, 1, 'v6e', 2, 'chips', 'TPU v6 lite'),
)}
_ALIASES = {'v5e': 'v5litepod', 'v6': 'v6e'}

# Published dense bfloat16 peaks per JAX device, by the start of its ``device_kind`` (for
# MFU): a v2 or v3 device is one TensorCore, half a chip.
PEAK_BF16_FLOPS: dict[str, float] = {
    **{c.device_kind: c.bf16_flops / c.devices for c in CHIPS.values()},
    'NVIDIA A100': 312e12, 'NVIDIA H100 PCIe': 756e12, 'NVIDIA H100': 989e12,
    'NVIDIA H200': 989e12,
}


def peak_bf16_flops(device_kind: str) -> float | None:
  """The published bfloat16 peak of one device of this kind (None: not published here)."""
  known = [k for k in PEAK_BF16_FLOPS if device_kind.startswith(k)]
  return PEAK_BF16_FLOPS[max(known, key=len)] if known else None


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """A Cloud TPU slice: its chips and the libtpu topology to compile for."""

  name: str
  chip: Chip
  chips: int
  shape: tuple[int, ...]  # Chips along each torus dimension.

  @property
  def topology(self) -> str:
    """libtpu's name: 'v3:2x2', 'v4:2x2x1'."""
    return f'{self.chip.libtpu_name}:{"x".join(map(str, self.shape))}'

  @property
  def devices(self) -> int:
    return self.chips * self.chip.devices

  @property
  def cores(self) -> int:
    return self.chips * self.chip.cores

  @property
  def hbm_per_device(self) -> int:
    return self.chip.hbm_bytes // self.chip.devices

  @property
  def peak_flops_per_device(self) -> float:
    return self.chip.bf16_flops / self.chip.devices

  def compile_devices(self) -> list:
    """Compile-only JAX devices of this slice (libtpu; no TPU needed)."""
    from jax.experimental import topologies

    # Compile-only: take no TPU (also beside a run on a TPU VM), ask no metadata server,
    # and tell libtpu the slice and host that it would otherwise look up (and log errors
    # about not finding); the devices are get_topology_desc's either way.
    for key, value in (('ALLOW_MULTIPLE_LIBTPU_LOAD', '1'), ('TPU_SKIP_MDS_QUERY', '1'),
                       ('TPU_ACCELERATOR_TYPE', self.name),
                       ('TPU_WORKER_HOSTNAMES', 'localhost')):
      os.environ.setdefault(key, value)
    megacore = self.chip.devices < self.chip.cores  # One device drives both cores.
    return list(topologies.get_topology_desc(
        platform='tpu', topology_name=self.topology,
        chip_config_name='megacore' if megacore else 'default').devices)


def _torus(chips: int, dims: int) -> tuple[int, ...]:
  """The torus shape Cloud TPU gives a slice of ``chips`` chips (a power of two).

  2-D (v2, v3, v5e, v6e): 1x1, 1x2, 2x2, 2x4, 4x4, 4x8, ...; 3-D (v4, v5p): 2x2x1, then
  2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...: each doubling doubles one dimension, the last
  one first, in turn.
  """
  if chips < 1 or chips & (chips - 1):
    raise ValueError(f'{chips} chips: only slices of a power of two chips are known here.')
  if dims == 3 and chips < 8:
    if chips != 4:
      raise ValueError(f'{chips} chips: 3-D slices start at 4 chips (2x2x1).')
    return (2, 2, 1)
  shape = [1, 1] if dims == 2 else [2, 2, 2]
  for i in range(int(math.log2(chips // math.prod(shape)))):
    shape[dims - 1 - i % dims] *= 2
  return tuple(shape)


def tpu_slice(name: str) -> TpuSlice:
  """A Cloud TPU slice by its name (``v3-8``, ``v4-32``, ``v5p-128``, ``v5litepod-16``,
  ``v6e-256``), or by libtpu's topology name (``v4:2x2x1``)."""
  name = name.strip()
  if m := re.fullmatch(r'(v\w+?):(\d+(?:x\d+)+)', name):
    gen, shape = m.group(1), tuple(int(s) for s in m.group(2).split('x'))
    chip = next((c for c in CHIPS.values() if c.libtpu_name == gen), None)
    if chip is None or len(shape) != chip.dims:
      raise ValueError(f'Unknown TPU topology {name!r}: known generations '
                       f'{", ".join(c.libtpu_name for c in CHIPS.values())}, with '
                       '2 (v2, v3, v5e, v6e) or 3 (v4, v5p) dimensions, e.g. v4:2x2x1.')
    chips = math.prod(shape)
    return TpuSlice(f'{chip.name}-{chips * (chip.cores if chip.sized_by == "cores" else 1)}',
                    chip, chips, shape)
  m = re.fullmatch(r'(v\w+?)-(\d+)', name)
  gen = m and _ALIASES.get(m.group(1), m.group(1))
  if not m or gen not in CHIPS:
    raise ValueError(f'Unknown TPU slice {name!r}. Use Cloud TPU names such as v3-8, v4-32, '
                     'v5p-128, v5litepod-16, v6e-256 (generations: '
                     f'{", ".join(CHIPS)}), or libtpu topologies such as v4:2x2x1.')
  chip, count = CHIPS[gen], int(m.group(2))
  if chip.sized_by == 'cores':
    if count % chip.cores:
      raise ValueError(f'{name}: {gen} slices are named by TensorCores, {chip.cores} per '
                       f'chip, and {count} is not a multiple of {chip.cores}.')
    count //= chip.cores
  try:
    shape = _torus(count, chip.dims)
  except ValueError as e:
    raise ValueError(f'{name}: {e}') from None
  return TpuSlice(f'{gen}-{m.group(2)}', chip, count, shape)
