"""Tests of benchmarks: real runs of the train-step, timm and input benchmarks' CLIs."""

import importlib.util
import json
import os
import subprocess
import sys

import chex
import numpy as np
import pytest

from benchmarks import timm_step
from vit_jax.base.cpu import host_cpu, host_memory

from runs import ROOT, env
from tpu_probe import probe

# A Python with torch, torchvision and timm: a venv of their own, as the README sets it up
# (VIT_JAX_TIMM_PYTHON=/tmp/timmenv/bin/python), or this one if timm is installed here.
TIMM_PYTHON = os.environ.get('VIT_JAX_TIMM_PYTHON') or (
    sys.executable if importlib.util.find_spec('timm') else None)


@pytest.fixture(scope='module')
def sweep(tmp_path_factory):
  out = tmp_path_factory.mktemp('bench') / 'train.json'
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.train', '--model=ti16', '--image_size=32',
       '--batch_size=8', '--steps=3', '--warmup=1', '--peak_size=256', '--peak_repeats=3',
       '--sweep=scan=false,true', f'--out={out}'],
      capture_output=True, text=True, env=env(devices=2), timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_sweep_prints_a_table_and_writes_every_cell(sweep):
  stdout, result = sweep
  assert [(c['scan'], c['cpu_devices']) for c in result['cells']] == [(False, 0), (True, 0)]
  assert 'scan=False' in stdout and 'scan=True' in stdout
  assert 'MFU f32' in stdout
  assert result['command'].startswith('python -m benchmarks.train --model=ti16')
  assert len(result['load_average_at_start']) == 3
  assert result['cpu'] == host_cpu.cpu_info()
  assert f'CPU: {host_cpu.describe(result["cpu"])}' in stdout


@pytest.mark.slow
def test_each_cell_measures_consistently(sweep):
  _, result = sweep
  # Ti/16 at 32 px: 4 patches + the class token, q of them queries: all in every block
  # but an unrolled model's last, which computes the class token only.
  t, d, m, layers = 5, 192, 768, 12
  block = lambda q: 4 * t * d * d + 4 * q * d * d + 4 * q * t * d + 4 * q * d * m
  rest = 2 * 4 * 16 * 16 * 3 * d + (layers - 1) * block(t) + 2 * d * 1000
  peaks = result['peak_flops_all_devices']
  for cell in result['cells']:
    devices = 2  # The test environment's CPU devices.
    assert cell['devices'] == devices and cell['backend'] == 'cpu'
    assert len(cell['step_s_all']) == 3 and cell['compile_s'] > 0
    assert cell['images_per_s'] == pytest.approx(8 / cell['step_s_median'])
    assert cell['images_per_s_per_device'] == pytest.approx(cell['images_per_s'] / devices)
    assert cell['peak_flops_float32'] > 1e8 and cell['peak_flops_bfloat16'] > 1e8
    forward = rest + block(t if cell['scan'] else 1)
    assert cell['analytic_flops_per_image'] == 3 * forward
    assert cell['analytic_flops_all_tokens_per_image'] == 3 * (rest + block(t))
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


def small_run(out, *flags, devices=1) -> subprocess.CompletedProcess:
  """The train benchmark on Ti/16 at 32 px, a few steps, with ``flags``; JSON to ``out``."""
  return subprocess.run(
      [sys.executable, '-m', 'benchmarks.train', '--model=ti16', '--image_size=32',
       '--steps=2', '--warmup=1', '--peak_size=256', '--peak_repeats=3', *flags,
       f'--out={out}'],
      capture_output=True, text=True, env=env(devices=devices), timeout=600, check=False)


@pytest.mark.slow
@pytest.mark.skipif(TIMM_PYTHON is None, reason='needs a Python with torch, torchvision and '
                    'timm (not vit_jax dependencies): set VIT_JAX_TIMM_PYTHON')
def test_timm_cells_join_the_run_with_the_same_model_flops(tmp_path):
  out = tmp_path / 'train.json'
  done = small_run(out, '--batch_size=8', f'--timm_python={TIMM_PYTHON}')
  assert done.returncode == 0, done.stderr[-3000:]
  ours, timm = json.loads(out.read_text())['cells']
  assert timm['framework'] == 'timm' and timm['timm_model'] == 'vit_tiny_patch16_224'
  assert timm['parameters'] == 5_717_416 - (197 - 5) * 192  # Position embeddings: 5 rows.
  # timm computes every token's output in the last block, vit_jax the class token's only.
  assert timm['analytic_flops_per_image'] == ours['analytic_flops_all_tokens_per_image'] > (
      ours['analytic_flops_per_image'])
  assert ours['vs_timm'] == pytest.approx(ours['images_per_s'] / timm['images_per_s'])


# A big_vision checkout (google-research/big_vision; not a dependency) for its ViT's cells.
BIG_VISION = os.environ.get('VIT_JAX_BIG_VISION')


@pytest.mark.slow
@pytest.mark.skipif(not BIG_VISION, reason='needs a big_vision checkout (not a vit_jax '
                    'dependency): set VIT_JAX_BIG_VISION')
def test_big_vision_cell_joins_the_run_with_every_tokens_flops(tmp_path):
  out = tmp_path / 'train.json'
  done = small_run(out, '--batch_size=8', f'--big_vision={BIG_VISION}')
  assert done.returncode == 0, done.stderr[-3000:]
  ours, theirs = json.loads(out.read_text())['cells']
  assert theirs['framework'] == 'big_vision' and theirs['matmul_dtype'] == 'bfloat16'
  assert theirs['analytic_flops_per_image'] == ours['analytic_flops_all_tokens_per_image'] > (
      ours['analytic_flops_per_image'])
  assert np.isfinite(theirs['loss']) and theirs['images_per_s'] > 0
  assert 'big_vision dtype_mm=bfloat16' in done.stdout


@pytest.mark.slow
def test_a_failed_cell_leaves_the_others_measured(tmp_path):
  """Batch 3 over 2 devices cannot split: that cell fails, the other is measured, the run
  says so and exits 1."""
  out = tmp_path / 'train.json'
  done = small_run(out, '--sweep=batch_size=3,4', devices=2)
  assert done.returncode == 1, done.stderr[-3000:]
  result = json.loads(out.read_text())
  assert [c['batch_size'] for c in result['cells']] == [4]
  (failed,) = result['failed']
  assert failed['batch_size'] == 3 and 'not divisible by the 2 devices' in failed['error']
  assert 'batch_size=3: failed' in done.stdout and 'not divisible' in done.stderr


@pytest.mark.slow
def test_input_benchmark_measures_both_pipelines_at_both_stages(shared_data, tmp_path):
  out = tmp_path / 'input.json'
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.input',
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


@pytest.mark.slow
def test_input_benchmark_measures_each_recipes_pipeline_by_its_string(shared_data, tmp_path):
  """``--recipes``: one entry per distinct training pipeline (two configs share the base one),
  keyed as vit_jax.tools.feeding looks a config's rate up, with the configs' mixup."""
  from vit_jax.config import cli as config_cli
  from vit_jax.tools import feeding

  out = tmp_path / 'input_recipes.json'
  recipes = ['configs/vit_b16_i1k.py', 'configs/vit_l16_i21k.py', 'configs/vit_i1k_augreg.py:s16']
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.input',
       f'--data={shared_data / "imagenette_224"}', '--split=val', f'--work_dir={tmp_path}',
       '--images=64', '--batch_size=32', '--repeats=1', f'--recipes={",".join(recipes)}',
       f'--out={out}'],
      capture_output=True, text=True, env=env(devices=1), timeout=600, check=False, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-3000:]
  rates = feeding.load_rates(out)
  configs = [config_cli.load(str(ROOT / r)) for r in recipes]
  assert set(rates) == {feeding.pipeline_key(c.dataset.pp_train) for c in configs}
  assert len(rates) == 2
  cores = sorted({1, len(os.sched_getaffinity(0))})
  for spec, config in zip(recipes, configs, strict=True):
    entry = rates[feeding.pipeline_key(config.dataset.pp_train)]
    assert entry['pipeline'] == config.dataset.pp_train
    recipe = next(r for r in entry['recipes'] if r['config'] == spec)
    assert recipe['mixup_alpha'] == config.mixup_alpha
    assert [c['cores'] for c in entry['cells']] == cores
    for cell in entry['cells']:
      assert cell['images_per_second'] > 0 and cell['images_per_cpu_second'] > 0
      assert cell['images_per_second_per_core'] == cell['images_per_second'] / cell['cores']
    assert entry['images_per_second_per_core'] == min(
        c['images_per_cpu_second'] for c in entry['cells'])
    assert feeding.rate_for(config, rates, None)[0] == entry['images_per_second_per_core']
  assert 'randaug(2, 15)' in done.stdout and 'img/s/core' in done.stdout


def test_timm_names_of_the_plain_vits():
  assert timm_step.timm_name('ti16') == 'vit_tiny_patch16_224'
  assert timm_step.timm_name('ViT-B/16') == timm_step.timm_name('ViT-B_16') == (
      'vit_base_patch16_224')
  assert timm_step.timm_name('h14') == 'vit_huge_patch14_224'
  with pytest.raises(ValueError, match='only the plain ViTs'):
    timm_step.timm_name('r50_b16')


@pytest.mark.slow
def test_train_benchmark_checks_the_timm_python_first(tmp_path):
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.train', f'--timm_python={tmp_path}/python'],
      capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2
  assert done.stderr.startswith(f'error: --timm_python={tmp_path}/python: no such executable')


@pytest.mark.slow
def test_timm_step_rejects_a_wrong_autocast_before_importing_torch():
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.timm_step', '--autocast=none,float16'],
      capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 2
  assert "--autocast='float16': expected a comma-separated list of ('none', 'bfloat16')" in (
      done.stderr)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('timm') is not None,
                    reason='timm is installed here: the benchmark would run')
def test_timm_step_without_timm_says_how_to_install_it():
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.timm_step', '--autocast=none'],
      capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 1
  assert 'autocast=none failed' in done.stderr
  assert 'needs torch, torchvision and timm, which vit_jax does not depend on' in done.stderr


def tpu_step(*args: str) -> subprocess.CompletedProcess:
  """A run of the benchmarks.tpu_step CLI on one CPU device."""
  return subprocess.run([sys.executable, '-m', 'benchmarks.tpu_step', *args],
                        capture_output=True, text=True, env=env(devices=1), cwd=ROOT,
                        timeout=600, check=False)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason='compiling for a TPU needs libtpu (the [tpu] extra)')
def test_tpu_step_prints_and_writes_its_cells(tmp_path):
  out = tmp_path / 'tpu_step.json'
  done = tpu_step('--topology=v3-8', '--cells=ti16:64', '--depth=2',
                  '--sweep=mesh.shard_state=False', f'--json={out}')
  assert done.returncode == 0, done.stderr[-3000:]
  cells = json.loads(out.read_text())['cells']
  assert [c['cell'] for c in cells] == [
      'ti16 @ 64, 224 px, 2 blocks vit_jax (configs/vit_b16_i1k.py)',
      'ti16 @ 64, 224 px, 2 blocks vit_jax mesh.shard_state=False']
  assert all(c['fits'] and c['step_seconds'] > 0 for c in cells)
  # The shipped setting stores the state split over the 8 devices: less HBM each.
  assert cells[0]['hbm_bytes_per_device'] < cells[1]['hbm_bytes_per_device']
  assert 'ti16 @ 64, 224 px, 2 blocks vit_jax mesh.shard_state=False' in done.stdout
  assert ' µs ' in done.stdout or ' ms ' in done.stdout
  assert all(0 < c['mfu'] < 1 and c['image_size'] == 224 for c in cells)


def test_tpu_step_fine_tuning_cell_is_the_papers_step_at_its_resolution():
  """A fine-tuning cell (MODEL:BATCH:IMAGE_SIZE with the fine-tuning config) lowers the
  paper's fine-tuning step: SGD with momentum (no Adam moments), clipping at global norm 1,
  and the position embedding of the cell's image size ((384 / 16)^2 + 1 = 577 tokens)."""
  import jax
  import optax

  from benchmarks import tpu_step
  from vit_jax.config import cli as config_cli
  from vit_jax.tools import planner

  setting = config_cli.load('configs/vit_b16_finetune.py:imagenet2012', [('model.scan', 'False')])
  model, batch, pixels = tpu_step.parse_cell('ti16:8:384')
  config = tpu_step.cell_config(setting, model, batch, pixels, depth=1)
  assert (config.optimizer.name, config.optimizer.momentum) == ('sgd', 0.9)
  assert config.optimizer.grad_clip_norm == 1.0 and not config.model.scan
  _, lowered = planner.lower_steps(config, jax.devices()[:1], 0)
  state = lowered['train'].args_info[0][0]
  chex.assert_equal(state.params['Transformer']['posembed_input']['pos_embedding'].shape,
                    (1, 577, 192))
  kinds = {type(s) for s in jax.tree.leaves(
      state.opt_state, is_leaf=lambda x: isinstance(x, tuple) and hasattr(x, '_fields'))}
  assert optax.TraceState in kinds and optax.ScaleByAdamState not in kinds, kinds


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason='compiling for a TPU needs libtpu (the [tpu] extra)')
def test_tpu_step_extrapolated_from_two_depths_is_the_compiled_step(tmp_path):
  """--depths=2,3 --depth=4 against the 4-block step compiled whole: the same FLOPs, the
  same time within 1%, the same HBM within 15% (the buffer assignment is not exactly
  affine in the depth)."""
  cell = ['--topology=v3-8', '--cells=ti16:64', '--set=model.scan=False', '--depth=4',
          '--setting=configs/vit_b16_finetune.py:imagenet2012']
  done = tpu_step(*cell, '--depths=2,3', f'--json={tmp_path / "two.json"}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert tpu_step(*cell, f'--json={tmp_path / "whole.json"}').returncode == 0
  (guess,), (whole,) = (json.loads((tmp_path / f).read_text())['cells']
                        for f in ('two.json', 'whole.json'))
  assert [r['num_layers'] for r in guess['extrapolated_from']] == [2, 3]
  assert guess['num_layers'] == whole['num_layers'] == 4 and guess['fits']
  assert guess['train_flops_per_image'] == pytest.approx(whole['train_flops_per_image'])
  assert guess['step_seconds'] == pytest.approx(whole['step_seconds'], rel=0.01)
  assert guess['hbm_bytes_per_device'] == pytest.approx(whole['hbm_bytes_per_device'], rel=0.15)
  assert 'ti16 @ 64, 224 px, 4 blocks from 2 and 3 vit_jax' in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize('depths', ['2', '2,2', '0,2', '2,x'])
def test_tpu_step_refuses_malformed_depths(depths):
  done = tpu_step(f'--depths={depths}')
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith(f'error: --depths={depths} is not '
                                                         'two different positive block counts')


@pytest.mark.skipif(not BIG_VISION, reason='needs a big_vision checkout (not a vit_jax '
                    'dependency): set VIT_JAX_BIG_VISION')
def test_big_vision_unrolled_remat_is_its_model_rematerialised():
  """big_vision's ViT with each block rematerialised (its unrolled loop has no remat): the
  same parameters and gradients as without, and a remat in the program."""
  import jax
  import jax.numpy as jnp

  from benchmarks import big_vision

  images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  plain, remat = (big_vision.vit(BIG_VISION, 'ti16', 32, 2, remat_policy=policy)
                  for policy in ('none', 'full'))
  params = plain.init(jax.random.key(1), images)
  chex.assert_trees_all_equal_structs(params, remat.init(jax.random.key(1), images))
  loss = lambda model: lambda p: jnp.sum(model.apply(p, images, train=True) ** 2)
  chex.assert_trees_all_close(jax.grad(loss(remat))(params), jax.grad(loss(plain))(params),
                              rtol=1e-5, atol=1e-6)
  programs = [str(jax.make_jaxpr(loss(m))(params)) for m in (plain, remat)]
  assert 'remat' not in programs[0] and 'remat' in programs[1]


@pytest.mark.slow
@pytest.mark.parametrize('cells', ['b16', 'b16:0', 'b16:512:x', 'b16:1:2:3'])
def test_tpu_step_refuses_a_malformed_cell(cells):
  done = tpu_step(f'--cells={cells}')
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith('error: --cells=') and (
      'MODEL:BATCH[:IMAGE_SIZE]' in done.stderr) and 'Traceback' not in done.stderr


# The tiny recipe's model (tests/runs.py: TINY) for the fault benchmark's runs.
TINY_FAULT_RUN = ['model.hidden_size=32', 'model.mlp_dim=64', 'model.num_layers=2',
                  'batch_size=32', 'eval_batch_size=32', 'schedule.warmup_steps=2']


@pytest.mark.slow
def test_fault_benchmark_survives_kills_on_the_tiny_recipe(tmp_path):
  """The README's reliability figure ("10 kills: 10 survived, no data lost") is this
  script's output: here one kill on an 8-step tiny run."""
  out = tmp_path / 'faults.json'
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.faults', '--runs=1', '--steps=8',
       '--checkpoint_every=2', f'--work_dir={tmp_path / "runs"}', f'--out={out}',
       *(f'--set={s}' for s in TINY_FAULT_RUN)],
      capture_output=True, text=True, env=env(devices=2), cwd=ROOT, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  r = json.loads(out.read_text())
  assert (r['faults_tried'], r['survived'], r['data_lost']) == (1, 1, 0), r
  assert r['final_state_bitwise_equal'] and r['loss_mismatches'] == 0
  for fault in r['faults']:  # Each restart resumed from the newest complete checkpoint.
    assert fault['resumed_at'] == fault['newest_complete_checkpoint'] > 0, fault
    assert fault['killed_after_step'] >= fault['resumed_at']
  assert 'faults tried 1' in done.stdout and 'data lost 0' in done.stdout


@pytest.mark.slow
def test_fault_benchmark_refuses_a_bad_override(tmp_path):
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.faults', '--set=model.num_layer=2',
       f'--work_dir={tmp_path}'], capture_output=True, text=True, env=env(devices=1), cwd=ROOT,
      timeout=120, check=False)
  assert done.returncode == 2 and 'Traceback' not in done.stderr, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith('error: ')
  assert 'num_layer' in done.stderr and not list(tmp_path.iterdir())  # Nothing started.


@pytest.mark.slow
def test_integrity_benchmark_times_the_models_train_state(tmp_path):
  """The checksum cost of docs/reliability.md is this script's output: here for ViT-Ti/16's
  state (its 5,717,416 parameters and Adam's two moments, float32), once each way."""
  out = tmp_path / 'integrity.json'
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.integrity', '--model=ti16', '--repeats=1',
       f'--work_dir={tmp_path / "ckpt"}', f'--out={out}'],
      capture_output=True, text=True, env=env(devices=2), cwd=ROOT, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r['model'] == 'ViT-Ti_16' and r['devices'] == 2
  params_and_moments = 3 * 4 * 5_717_416
  assert params_and_moments <= r['state_bytes'] <= params_and_moments + 1024  # + step counters
  for cell in ('save_blocking', 'save', 'restore'):
    row = r[cell]
    assert row['with_checksums_s'] > 0 and row['orbax_alone_s'] > 0
    assert row['added_s'] == pytest.approx(row['with_checksums_s'] - row['orbax_alone_s'],
                                           abs=0.011)
    assert len(r['runs']['True'][cell]) == len(r['runs']['False'][cell]) == 1
  assert r['checksums_s'] > 0 and 'checksums alone' in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason='compiling for a TPU needs libtpu (the [tpu] extra)')
def test_tpu_attention_pads_for_the_kernels_and_shows_what_the_cost_model_counts():
  """The Pallas kernels take the keys padded to their 128-token blocks; the cost model
  counts the einsum attention's products but not what runs inside the splash kernel."""
  measured = probe('tpu_attention')  # libtpu in a process of its own (tests/tpu_probe.py).
  einsum, splash = measured['einsum'], measured['splash']
  assert 'error' not in splash, splash.get('error')
  assert (einsum['length'], splash['length']) == (130, 256)
  assert 0.5 < einsum['flops_counted'] / einsum['product_flops'] < 1.5, einsum
  assert splash['flops_counted'] / splash['product_flops'] < 0.1, splash
  assert einsum['cost_model_seconds'] > 0 and splash['temp_bytes'] > 0


@pytest.mark.slow
def test_packing_benchmark_packs_more_images_a_step_than_padding(tmp_path):
  """A real run on a mixed-size local dataset (small images against the budget): the packed
  cells' steps hold more images than the padded cell's one a row, with less padding; the
  JSON holds every cell."""
  from PIL import Image

  rng = np.random.default_rng(0)
  for split, count in (('train', 24), ('val', 4)):
    for i in range(count):
      folder = tmp_path / 'images' / split / f'c{i % 2}'
      folder.mkdir(parents=True, exist_ok=True)
      h, w = rng.integers(8, 33, 2)
      Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8)).save(folder / f'{i}.png')
  subprocess.run([sys.executable, '-m', 'vit_jax.data.convert',
                  f'--source={tmp_path / "images"}', f'--out={tmp_path / "data"}'],
                 check=True, capture_output=True, env=env(devices=1))
  out = tmp_path / 'packing.json'
  done = subprocess.run(
      [sys.executable, '-m', 'benchmarks.packing', f'--data={tmp_path / "data"}',
       '--patch_size=8', '--budget=16', '--images_per_row=3', '--rows=2', '--steps=1',
       '--topology=none', f'--out={out}'],
      capture_output=True, text=True, env=env(devices=1), cwd=ROOT, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  pad, pack = json.loads(out.read_text())['cpu_cells']
  assert pad['images_per_step'] == 2 and pad['dropped_share'] == 0
  assert pack['images_per_step'] > 2 and pack['padding_share'] < pad['padding_share']
  assert 'pack 3' in done.stdout and 'this CPU' in done.stdout
