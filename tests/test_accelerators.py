"""Cloud TPU slice names -> chips, libtpu topologies and published figures."""

import importlib.util

import pytest

from vit_jax.base import accelerators

from tpu_probe import probe


@pytest.mark.parametrize('name, topology, chips, devices, cores', [
    ('v2-8', 'v2:2x2', 4, 8, 8),
    ('v3-8', 'v3:2x2', 4, 8, 8),
    ('v3-32', 'v3:4x4', 16, 32, 32),
    ('v3-128', 'v3:8x8', 64, 128, 128),
    ('v3-256', 'v3:8x16', 128, 256, 256),
    ('v4-8', 'v4:2x2x1', 4, 4, 8),
    ('v4-16', 'v4:2x2x2', 8, 8, 16),
    ('v4-32', 'v4:2x2x4', 16, 16, 32),
    ('v4-64', 'v4:2x4x4', 32, 32, 64),
    ('v4-128', 'v4:4x4x4', 64, 64, 128),
    ('v4-4096', 'v4:8x16x16', 2048, 2048, 4096),
    ('v5p-128', 'v5:4x4x4', 64, 64, 128),
    ('v5litepod-1', 'v5e:1x1', 1, 1, 1),
    ('v5litepod-16', 'v5e:4x4', 16, 16, 16),
    ('v5e-8', 'v5e:2x4', 8, 8, 8),
    ('v6e-256', 'v6e:16x16', 256, 256, 256),
    ('v4:2x2x1', 'v4:2x2x1', 4, 4, 8),
])
def test_slice_names_map_to_libtpu_topologies(name, topology, chips, devices, cores):
  s = accelerators.tpu_slice(name)
  assert (s.topology, s.chips, s.devices, s.cores) == (topology, chips, devices, cores)


def test_published_figures_per_device():
  v3, v4 = accelerators.tpu_slice('v3-8'), accelerators.tpu_slice('v4-8')
  assert (v3.hbm_per_device, v3.peak_flops_per_device) == (16 * 2**30, 61.5e12)  # Per core.
  assert (v4.hbm_per_device, v4.peak_flops_per_device) == (32 * 2**30, 275e12)  # Megacore.
  assert accelerators.peak_bf16_flops('TPU v3') == v3.peak_flops_per_device
  assert accelerators.peak_bf16_flops('TPU v5 lite') == 197e12  # Not v5p's 459e12.
  assert accelerators.peak_bf16_flops('NVIDIA H100 PCIe') == 756e12
  assert accelerators.peak_bf16_flops('NVIDIA H100 80GB HBM3') == 989e12
  assert accelerators.peak_bf16_flops('cpu') is None


@pytest.mark.parametrize('name, message', [
    ('v3-6', r'v3-6: 3 chips'),
    ('v3-7', r'v3-7: v3 slices are named by TensorCores, 2 per chip'),
    ('v9-8', r"Unknown TPU slice 'v9-8'"),
    ('v4:2x2', r"Unknown TPU topology 'v4:2x2'"),
])
def test_bad_names_are_explained(name, message):
  with pytest.raises(ValueError, match=message):
    accelerators.tpu_slice(name)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None, reason='needs libtpu')
@pytest.mark.parametrize('name, kind', [('v3-8', 'TPU v3'), ('v4-8', 'TPU v4'),
                                        ('v5litepod-4', 'TPU v5 lite')])
def test_compile_devices_are_the_slices(name, kind):
  found = probe('devices', name)  # libtpu in a process of its own (tests/tpu_probe.py).
  assert found == {'count': accelerators.tpu_slice(name).devices, 'kinds': [kind]}
