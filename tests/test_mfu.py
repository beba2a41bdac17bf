"""The CPU's matmul peak, the denominator of MFU there: measured once, kept, read back."""

import json

import jax
import pytest

from vit_jax.training import mfu


@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  mfu.device_peak.cache_clear()
  yield tmp_path / 'vit_jax' / 'matmul_peak.json'
  mfu.device_peak.cache_clear()


def test_cpu_peak_measured_once_then_read_from_the_file(cache, monkeypatch):
  devices = jax.devices()
  key = mfu.peak_key('cpu', devices[0].device_kind, len(devices), 'float32')
  assert 'cores' in key and key.endswith(f'{len(devices)} cpu devices; float32')
  peak, how = mfu.device_peak('float32')
  assert peak > 1e8 and f'measured now (kept in {cache})' in how
  assert json.loads(cache.read_text())[key]['flops'] == peak

  def measure(*args, **kwargs):
    raise AssertionError('measured again')

  monkeypatch.setattr(mfu, 'matmul_peak', measure)
  mfu.device_peak.cache_clear()
  assert mfu.device_peak('float32')[0] == peak
  # A peak written by hand (or measured on an idle day) is the one used, and said.
  cache.write_text(json.dumps({key: {'flops': 2.5e10, 'measured': '2026-01-02'}}))
  mfu.device_peak.cache_clear()
  peak, how = mfu.device_peak('float32')
  assert peak == 2.5e10
  assert how == (f'the float32 matmul peak of {len(devices)} cpu devices, 25 GFLOP/s, '
                 f'measured 2026-01-02 (kept in {cache})')


def test_a_damaged_file_is_measured_again_and_replaced(cache):
  cache.parent.mkdir(parents=True)
  cache.write_text('{"cut sh')
  peak, how = mfu.device_peak('float32')
  assert 'measured now' in how
  assert list(json.loads(cache.read_text()).values())[0]['flops'] == peak
