"""Tests of vit_jax.benchmarks: real runs of the train-step and input benchmarks' CLIs."""

import json
import subprocess
import sys

import pytest

from vit_jax import host_memory

from runs import env


@pytest.fixture(scope='module')
def sweep(tmp_path_factory):
  out = tmp_path_factory.mktemp('bench') / 'train.json'
  done = subprocess.run(
      [sys.executable, '-m', 'vit_jax.benchmarks.train', '--model=ti16', '--image_size=32',
       '--batch_size=8', '--steps=3', '--warmup=1', '--peak_size=256', '--peak_repeats=3',
       '--sweep=scan=false,true', '--sweep=cpu_devices=0,1', f'--out={out}'],
      capture_output=True, text=True, env=env(devices=2), timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout, json.loads(out.read_text())


def test_sweep_prints_a_table_and_writes_every_cell(sweep):
  stdout, result = sweep
  assert [(c['scan'], c['cpu_devices']) for c in result['cells']] == [
      (False, 0), (False, 1), (True, 0), (True, 1)]
  assert 'scan=False cpu_devices=0' in stdout and 'scan=True cpu_devices=1' in stdout
  assert 'MFU f32' in stdout
  assert result['command'].startswith('python -m vit_jax.benchmarks.train --model=ti16')
  assert len(result['load_average_at_start']) == 3


def test_each_cell_measures_consistently(sweep):
  _, result = sweep
  peaks = result['peak_flops_all_devices']
  for cell in result['cells']:
    # The test environment makes 2 CPU devices; --cpu_devices=1 overrides it.
    devices = cell['cpu_devices'] or 2
    assert cell['devices'] == devices and cell['backend'] == 'cpu'
    assert len(cell['step_s_all']) == 3 and cell['compile_s'] > 0
    assert cell['images_per_s'] == pytest.approx(8 / cell['step_s_median'])
    assert cell['images_per_s_per_device'] == pytest.approx(cell['images_per_s'] / devices)
    assert cell['peak_flops_float32'] > 1e8 and cell['peak_flops_bfloat16'] > 1e8
    # Ti/16 at 32 px: 4 patches + the class token.
    t, d, m, layers = 5, 192, 768, 12
    forward = 2 * 4 * 16 * 16 * 3 * d + layers * (8 * t * d * d + 4 * t * t * d + 4 * t * d * m)
    forward += 2 * d * 1000
    assert cell['analytic_flops_per_image'] == 3 * forward
    assert cell['achieved_flops'] == pytest.approx(3 * forward * cell['images_per_s'])
    # One denominator for the table: the best peak of all devices together.
    assert peaks['float32'] >= devices * cell['peak_flops_float32']
    assert cell['mfu_float32'] == pytest.approx(cell['achieved_flops'] / peaks['float32'])
    assert cell['memory']['temp_size_in_bytes'] > 0
    # Cells run as vit_jax.main does by default: with huge pages where they apply.
    assert cell['malloc'] == 'huge_pages' and cell['page_faults_per_step'] >= 0
    assert cell['max_rss_bytes'] > 0
    tuned = host_memory.tuned_environ({}, host_memory.glibc_version(), host_memory.thp_mode())
    ours = set(host_memory.HUGE_PAGES + host_memory.KEEP_FREED)
    assert ours & set(cell['glibc_tunables'].split(':')) == set(
        (tuned or {}).get('GLIBC_TUNABLES', '').split(':')) - {''}
  # Unrolled, XLA's count of the compiled step agrees with the model's: it adds only
  # element-wise work and the optimizer (large next to a 5-token model, so a loose bound).
  unrolled = result['cells'][0]
  assert 1.0 <= unrolled['xla_over_analytic'] < 1.5


def test_input_benchmark_measures_both_pipelines_at_both_stages(shared_data, tmp_path):
  out = tmp_path / 'input.json'
  done = subprocess.run(
      [sys.executable, '-m', 'vit_jax.benchmarks.input',
       f'--data={shared_data / "imagenette_224"}', '--split=val', f'--work_dir={tmp_path}',
       '--images=128', '--batch_size=64', '--repeats=1', '--pipelines=train',
       f'--out={out}'],
      capture_output=True, text=True, env=env(devices=1), timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(out.read_text())
  cells = {(r['pipeline'], r['cores'], r['stage']) for r in result['rows']}
  assert {('train', 1, 'host'), ('train', 1, 'device')} <= cells
  for row in result['rows']:
    assert row['vit_jax_images_per_s'] > 0 and row['tf_data_images_per_s'] > 0
    assert row['ratio'] == pytest.approx(row['vit_jax_images_per_s'] / row['tf_data_images_per_s'])
  assert 'vit_jax img/s' in done.stdout and 'device' in done.stdout
