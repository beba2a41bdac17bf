"""Tests of vit_jax.checkpoints.run.workdir and vit_jax.tools.export: fine-tunes from an earlier
run.

The source run trains on 8 simulated devices; the fine-tune starts from its
Orbax checkpoint at another resolution, in another layout (scanned) and on 2
devices, exactly as a user runs it; its export loads back with the same logits.
"""

import json
import logging
import pathlib
import re
import subprocess
import sys
import uuid

import chex
import jax
import numpy as np
import pytest
import scipy.ndimage

from vit_jax import checkpoints, main
from vit_jax.base import errors, sharding
from vit_jax.base.cpu import host_memory
from vit_jax.checkpoints.formats import layout, release
from vit_jax.checkpoints.run import workdir
from vit_jax.models import get_model
from vit_jax.tools import export
from vit_jax.training import plan as plan_lib

from runs import TINY_MODEL, TINY_RUN, env, main_command, read_metrics, restore_state, tiny_config

POSEMB = layout.POSEMB_KEY


@pytest.fixture
def source_run(tiny_run):
  """A tiny run with a class token, trained 10 steps on 8 devices (checkpoints 5, 10)."""
  return tiny_run


def bilinear_reference(posemb, old_grid, new_grid, prefix):
  """The releases' resize: scipy.ndimage.zoom with order=1 on the patch grid."""
  grid = scipy.ndimage.zoom(posemb[0, prefix:].reshape(*old_grid, -1).astype(np.float64),
                            (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1), order=1)
  return np.concatenate([posemb[:, :prefix], grid.reshape(1, -1, grid.shape[-1])], axis=1)


def test_run_info_and_params_read_back(source_run):
  assert workdir.steps(source_run) == [5, 10]
  config = workdir.load_config(source_run)
  assert config.dataset.num_classes == 10 and config.model.pool == 'token'
  assert workdir.load_class_names(source_run) == tuple(str(i) for i in range(10))
  loaded = workdir.load_run(source_run, step=5)
  assert loaded.source == f'{source_run} (step 5)'
  chex.assert_shape(loaded.params['head']['kernel'], (32, 10))
  images = np.zeros((2, 16, 16, 3), np.float32)
  chex.assert_shape(loaded.model.apply({'params': loaded.params}, images), (2, 10))


def test_params_restore_onto_a_smaller_mesh(source_run):
  on_host, step = workdir.restore_params(source_run)
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 1}, devices=jax.devices()[:2])
  on_mesh, _ = workdir.restore_params(source_run, step, mesh=mesh)
  assert step == 10
  for leaf in jax.tree.leaves(on_mesh):
    assert leaf.sharding.mesh.devices.size == 2
  chex.assert_trees_all_equal(jax.device_get(on_mesh), on_host)


@pytest.mark.slow
def test_fine_tune_on_2_devices_at_a_higher_resolution(source_run, tmp_path):
  # 16 px (4x4 grid) -> 24 px (6x6 grid), unrolled -> scanned, 8 devices -> 2. The
  # warm-up starts at a learning rate of 0: after step 1 the parameters are exactly the
  # adapted ones.
  pp = 'to_rgb|resize(24)|value_range(-1, 1)'
  command = main_command(tmp_path / 'ft', **{
      **TINY_RUN, 'init_from': source_run, 'init_step': 5, 'model.image_size': 24,
      'model.scan': True, 'dataset.pp_train': pp, 'dataset.pp_eval': pp,
      'schedule.warmup_steps': 1, 'total_steps': 2,
      'checkpoint_every_steps': 1, 'batch_size': 16, 'eval_batch_size': 16})
  # --cpu_devices overrides the environment's device count.
  result = subprocess.run(command + ['--cpu_devices=2'], env=env(devices=8),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  log = result.stderr
  assert '2 local / 2 global devices' in log
  # Split into 2 devices, the process keeps the memory a step frees (host_memory).
  tuned = host_memory.tuned_environ({}, host_memory.glibc_version(), host_memory.thp_mode(),
                                    'keep_freed') or {}
  tunables = tuned.get('GLIBC_TUNABLES', '')
  assert (f'XLA:CPU: malloc keep_freed (VIT_JAX_MALLOC; GLIBC_TUNABLES={tunables!r})'
          in (tmp_path / 'ft' / 'log.txt').read_text())  # The log file's line only.
  assert f'{POSEMB} resized (1, 17, 32) -> (1, 37, 32)' in log
  assert 'head: new zero-initialised classifier (32, 10)' in log

  source, _ = workdir.restore_params(source_run, 5)
  tuned, _ = workdir.restore_params(tmp_path / 'ft', 1)
  assert layout.is_scanned(tuned) and not layout.is_scanned(source)
  source, tuned = (layout.flatten(layout.to_release(p)) for p in (source, tuned))
  chex.assert_trees_all_close(tuned.pop(POSEMB),
                              bilinear_reference(source.pop(POSEMB), (4, 4), (6, 6), 1),
                              atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_equal(tuned.pop('head/kernel'), np.zeros((32, 10), np.float32))
  chex.assert_trees_all_equal(tuned.pop('head/bias'), np.zeros(10, np.float32))
  del source['head/kernel'], source['head/bias']
  chex.assert_trees_all_equal(tuned, source)  # Bit-identical.


@pytest.mark.slow
def test_init_from_errors_name_the_field(source_run, tmp_path):
  config = tiny_config(init_from=str(source_run), init_step=7)
  with pytest.raises(FileNotFoundError, match=r'no checkpoint at step 7; it has steps \[5, 10\]'):
    plan_lib.validate(config)
  config = tiny_config(init_from=str(tmp_path / 'missing'))
  with pytest.raises(FileNotFoundError, match='config.init_from=.*missing is neither'):
    plan_lib.validate(config)
  wider = get_model(num_classes=10, **{**TINY_MODEL, 'pool': 'token', 'hidden_size': 64})
  init_params = wider.init(jax.random.key(0), np.zeros((1, 16, 16, 3)))['params']
  with pytest.raises(errors.CheckpointMismatchError,
                     match=r'(?s)shape mismatch.*embedding/kernel: \(4, 4, 3, 32\) vs '
                           r'\(4, 4, 3, 64\).*width 32, 2 layers'):
    workdir.init_params_from(str(source_run), init_params, wider)


def test_a_run_loads_and_fine_tunes_at_another_patch_size(source_run):
  """checkpoints.load(WORKDIR, patch_size=P) and a fine-tune whose model has another patch
  size: the patch embedding resampled (FlexiViT), the position embeddings resized to the
  new grid, each from the run's recorded grid."""
  from vit_jax import checkpoints
  from vit_jax.checkpoints.formats import fit

  loaded = workdir.load_run(source_run)
  ph, _ = loaded.model.patch_size
  coarse = checkpoints.load(str(source_run), patch_size=2 * ph)
  assert coarse.model.image_size == loaded.model.image_size
  assert coarse.model.grid == tuple(g // 2 for g in loaded.model.grid)
  source, flexi = (layout.flatten(layout.to_release(p)) for p in (loaded.params, coarse.params))
  chex.assert_trees_all_close(flexi['embedding/kernel'],
                              fit.resample_patchemb(source['embedding/kernel'], 2 * ph),
                              atol=1e-6, rtol=0)
  chex.assert_trees_all_close(flexi[POSEMB], bilinear_reference(
      source[POSEMB], loaded.model.grid, coarse.model.grid, 1), atol=1e-6, rtol=1e-6)
  assert checkpoints.load(str(source_run), patch_size=ph).model == loaded.model
  assert coarse.config.model.patch_size == 2 * ph
  assert loaded.config.model.patch_size == ph  # The run's own, unchanged.
  init = coarse.model.init(jax.random.key(0), np.zeros((1, *loaded.model.image_size, 3)))
  tuned = workdir.init_params_from(str(source_run), init['params'], coarse.model)
  tuned = layout.flatten(layout.to_release(tuned))
  chex.assert_trees_all_close(tuned['embedding/kernel'], flexi['embedding/kernel'], atol=1e-6,
                              rtol=0)
  chex.assert_trees_all_close(tuned[POSEMB], flexi[POSEMB], atol=1e-6, rtol=0)


def test_export_loads_back_with_identical_logits(source_run, tmp_path):
  out = tmp_path / 'exported.npz'
  assert export.export(str(source_run), str(out)) == 10
  loaded = workdir.load_run(source_run)
  images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32)
  expected = loaded.model.apply({'params': loaded.params}, images)
  from_file = loaded.model.apply({'params': release.load_npz(out)}, images)
  chex.assert_trees_all_equal(from_file, expected)


@pytest.mark.slow
def test_export_command_evaluates_both_alike(source_run, tmp_path):
  out = tmp_path / 'cli.npz'
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.export', f'--workdir={source_run}', f'--out={out}',
       '--evaluate', '--progress_every=0'], env=env(devices=1), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  for name in ('checkpoint', 'exported .npz'):  # Progress lines with an ETA, then the total.
    assert re.search(f'evaluating the {name} \\(eval\\): [\\d,]+/359 images \\(\\d+%\\), '
                     '[\\d,]+/s, ETA', result.stderr)
    assert re.search(f'evaluating the {name} \\(eval\\): 359/359 images, [\\d,]+/s, in',
                     result.stderr)
  assert 'checkpoint_manager.py' not in result.stderr  # Orbax's INFO lines: --verbosity.
  lines = [line for line in result.stdout.splitlines() if 'accuracy' in line]
  assert len(lines) == 2 and out.exists()
  assert lines[0].split(':', 1)[1] == lines[1].split(':', 1)[1], lines


@pytest.mark.slow
def test_export_to_and_fine_tune_from_a_non_local_release_file(source_run, tmp_path):
  # ram:// is TensorFlow's in-memory filesystem, through epath's gfile backend as gs:// is;
  # os.path and open() cannot see it (it lives in this process: the run is in-process).
  remote = f'ram://{uuid.uuid4().hex}/exports/tiny.npz'
  assert export.export(str(source_run), remote, step=5) == 5
  export.export(str(source_run), str(tmp_path / 'local.npz'), step=5)
  local = layout.flatten(release.load_npz(tmp_path / 'local.npz'))
  chex.assert_trees_all_equal(layout.flatten(release.load_npz(remote)), local)

  # The warm-up starts at a learning rate of 0: after step 1 the parameters are exactly
  # the file's, with a new zero head.
  config = tiny_config(**{**TINY_RUN, 'init_from': remote, 'schedule.warmup_steps': 1,
                          'total_steps': 2, 'checkpoint_every_steps': 1, 'batch_size': 16,
                          'eval_batch_size': 16})
  main.train_and_evaluate(config, str(tmp_path / 'ft'))
  tuned = layout.flatten(layout.to_release(workdir.restore_params(tmp_path / 'ft', 1)[0]))
  chex.assert_trees_all_equal(tuned.pop('head/kernel'), np.zeros((32, 10), np.float32))
  chex.assert_trees_all_equal(tuned.pop('head/bias'), np.zeros(10, np.float32))
  del local['head/kernel'], local['head/bias']
  chex.assert_trees_all_equal(tuned, local)

  missing = remote.replace('tiny', 'absent')
  with pytest.raises(errors.MissingFileError, match=f'init_from={missing} is neither'):
    plan_lib.validate(tiny_config(init_from=missing))
  with pytest.raises(errors.MissingFileError, match="cannot read s3://bucket/b16.npz: .*'s3'"):
    plan_lib.validate(tiny_config(init_from='s3://bucket/b16.npz'))


@pytest.mark.slow
def test_a_missing_remote_init_from_is_one_error_line(tmp_path):
  result = subprocess.run(main_command(tmp_path / 'run', init_from='ram://absent/ViT-B_16.npz'),
                          env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: config.init_from=ram://absent/ViT-B_16.npz is neither')
  assert 'Traceback' not in result.stderr and 'Training steps' not in result.stderr


@pytest.fixture(scope='module')
def ema_run(tiny_run, tmp_path_factory):
  """tiny_run fine-tuned 5 steps at a small rate, its head kept, with a weight EMA; saved
  every 3 steps (5 is not a multiple)."""
  directory = tmp_path_factory.mktemp('ema_run')
  config = tiny_config(**{**TINY_RUN, 'init_from': str(tiny_run), 'init_keep_head': True,
                          'optimizer.ema_decay': 0.9, 'schedule.base_lr': 1e-4,
                          'schedule.warmup_steps': 1, 'total_steps': 5,
                          'checkpoint_every_steps': 3})
  main.train_and_evaluate(config, str(directory))
  return directory


@pytest.mark.slow
def test_the_last_step_is_saved_where_the_interval_does_not_divide_it(ema_run):
  assert workdir.steps(ema_run) == [3, 5]


@pytest.mark.slow
def test_init_from_ema_starts_at_the_loaded_weights(tiny_run, ema_run):
  # 5 Adam steps of at most ~1e-4 each: the weights and their average stay within 1e-3
  # of the loaded ones. An average started from the random init would still hold
  # 0.9 ** 5 = 59% of it.
  loaded = layout.flatten(workdir.restore_params(tiny_run)[0])
  weights = layout.flatten(workdir.restore_params(ema_run)[0])
  ema = layout.flatten(workdir.restore_params(ema_run, ema=True)[0])
  for key, value in ema.items():
    chex.assert_type(value, np.float32)
    chex.assert_trees_all_close(value, loaded[key], atol=1e-3, rtol=0)
  assert any(not np.array_equal(ema[k], weights[k]) for k in ema)  # An average, not a copy.
  # Evaluated: the average does what the weights do (to 2 of the 359 examples).
  final = read_metrics(ema_run)[-1]
  assert abs(final['eval/ema/accuracy'] - final['eval/accuracy']) < 0.006, final
  assert abs(final['eval/ema/loss'] - final['eval/loss']) < 0.01, final


@pytest.mark.slow
def test_ema_export_differs_from_the_weights_and_equals_the_ema_arrays(ema_run, tmp_path):
  plain, ema_file = tmp_path / 'plain.npz', tmp_path / 'ema.npz'
  assert export.export(str(ema_run), str(plain)) == 5
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.export', f'--workdir={ema_run}', f'--out={ema_file}',
       '--ema'], env=env(devices=1), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'the moving average of the parameters' in result.stdout
  # The reference: the optimizer state's average, from the whole train state restored.
  state = restore_state(ema_run, workdir.load_config(ema_run))
  expected = layout.flatten(layout.to_release(jax.device_get(state.ema_params)))
  with np.load(ema_file) as f, np.load(plain) as g:
    exported, weights = dict(f), dict(g)
  chex.assert_trees_all_equal(exported, expected)
  assert sorted(weights) == sorted(exported)
  assert any(not np.array_equal(weights[k], exported[k]) for k in weights)
  # load_run (predict, inspect, evaluation) reads the same arrays.
  loaded = workdir.load_run(ema_run, ema=True)
  assert loaded.source == f'{ema_run} (step 5, EMA)'
  chex.assert_trees_all_equal(layout.flatten(loaded.params), expected)


@pytest.mark.slow
def test_ema_where_there_is_none_is_refused(tiny_run, tmp_path):
  with pytest.raises(errors.CheckpointMismatchError, match='keeps no moving average'):
    workdir.restore_params(tiny_run, ema=True)
  with pytest.raises(errors.ConfigError, match='init_ema is true, but the checkpoint of'):
    plan_lib.validate(tiny_config(init_from=str(tiny_run), init_ema=True))
  with pytest.raises(errors.ConfigError, match='init_ema given without config.init_from'):
    plan_lib.validate(tiny_config(init_ema=True))
  model = get_model(num_classes=10, **TINY_MODEL)
  init_params = model.init(jax.random.key(0), np.zeros((1, 16, 16, 3)))['params']
  release.save_npz(tmp_path / 'x.npz', init_params)
  with pytest.raises(errors.ConfigError, match='is a .npz file: it holds one set of weights'):
    workdir.init_params_from(str(tmp_path / 'x.npz'), init_params, model, ema=True)
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.export', f'--workdir={tiny_run}',
       f'--out={tmp_path / "e.npz"}', '--ema'], env=env(devices=1), capture_output=True,
      text=True, timeout=300)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and 'keeps no moving average' in lines[-1]
  assert 'Traceback' not in result.stderr


@pytest.mark.slow
def test_non_square_npz_source_in_a_run_needs_its_grid(tmp_path):
  # A .npz trained at 16x24 (a 4x6 grid) into a run at 24x16: one error line that names
  # the field (before the train step compiles); with the field, it loads transposed.
  source = get_model(num_classes=10, **{**TINY_MODEL, 'image_size': (16, 24)})
  source_params = source.init(jax.random.key(1), np.zeros((1, 16, 24, 3)))['params']
  release.save_npz(tmp_path / 'wide.npz', source_params)
  pp = 'to_rgb|resize((24, 16))|value_range(-1, 1)'
  overrides = {'init_from': tmp_path / 'wide.npz', 'model.image_size': '(24, 16)',
               'dataset.pp_train': pp, 'dataset.pp_eval': pp, 'total_steps': 2,
               'schedule.warmup_steps': 1, 'checkpoint_every_steps': 1}
  result = subprocess.run(main_command(tmp_path / 'run', **overrides), env=env(devices=1),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and 'config.init_source_grid' in lines[-1]
  assert 'Traceback' not in result.stderr and 'Training steps' not in result.stderr
  with pytest.raises(errors.ConfigError, match=r'init_source_grid=\(4, 0\) is not a'):
    plan_lib.validate(tiny_config(init_from=str(tmp_path / 'wide.npz'), init_source_grid=(4, 0)))
  with pytest.raises(errors.ConfigError, match='init_source_grid given without'):
    plan_lib.validate(tiny_config(init_source_grid=(4, 6)))
  target = get_model(num_classes=10, **{**TINY_MODEL, 'image_size': (24, 16)})
  init_params = target.init(jax.random.key(0), np.zeros((1, 24, 16, 3)))['params']
  params = workdir.init_params_from(str(tmp_path / 'wide.npz'), init_params, target,
                                    source_grid=(4, 6))
  chex.assert_trees_all_close(
      params['Transformer']['posembed_input']['pos_embedding'],
      bilinear_reference(np.asarray(source_params['Transformer']['posembed_input'][
          'pos_embedding']), (4, 6), (6, 4), 0), atol=1e-6)


HUB = pathlib.Path(__file__).resolve().parent / 'data' / 'hub'


def _shapes(model):
  return jax.eval_shape(model.init, jax.random.key(0),
                        np.zeros((1, *model.image_size, 3)))['params']


def test_init_params_from_every_kind_of_checkpoint(offline_hub, caplog):
  """A fine-tune's start from a timm folder, a transformers one, hf-hub: and big_vision's
  tensorstore folder: the checkpoint's arrays, adapted as a release file's are."""
  from vit_jax import checkpoints

  deit3 = get_model('deit3_s16', num_classes=10, image_size=32, patch_size=4, hidden_size=32,
                    num_layers=2, num_heads=2, mlp_dim=64)
  source = checkpoints.load(str(HUB / 'timm_deit3'))
  offline_hub('test-org/deit3', HUB / 'timm_deit3')
  for name in (str(HUB / 'timm_deit3'), 'hf-hub:test-org/deit3'):
    tuned = workdir.init_params_from(name, deit3.init(jax.random.key(0), np.zeros(
        (1, 32, 32, 3)))['params'], deit3)
    chex.assert_trees_all_equal(tuned['head']['kernel'], np.zeros((32, 10), np.float32))
    expected = {k: v for k, v in source.params.items() if k != 'head'}
    chex.assert_trees_all_equal({k: v for k, v in tuned.items() if k != 'head'}, expected)

  tanh = get_model('ti16', num_classes=5, image_size=32, patch_size=8, hidden_size=32,
                   num_layers=2, num_heads=2, mlp_dim=64, scan=True)
  with caplog.at_level(logging.WARNING):
    tuned = workdir.init_params_from(str(HUB / 'hf_vit_cls'), _shapes(tanh), tanh,
                                     keep_head=True)
  assert "computes with activation='gelu', the model with 'gelu_tanh'" in caplog.text
  assert "norm_epsilon=1e-12, the model with 1e-06" in caplog.text
  chex.assert_shape(tuned['Transformer']['encoderblock']['LayerNorm_0']['scale'], (2, 32))

  gap = get_model('ti16', num_classes=5, image_size=(16, 24), patch_size=4, hidden_size=16,
                  num_layers=2, num_heads=2, mlp_dim=32, pool='gap')
  tuned = workdir.init_params_from(str(HUB / 'bv_gap_scan'), _shapes(gap), gap, step=3,
                                   keep_head=True, source_grid=(4, 6), source_pool='gap')
  bv = checkpoints.load(str(HUB / 'bv_gap_scan'), pool='gap', image_size=(16, 24),
                        source_grid=(4, 6))
  chex.assert_trees_all_equal(tuned, bv.params)

  with pytest.raises(errors.ConfigError, match=r'init_source_grid=\(4, 4\), but .* trained at '
                     'the 8x8 grid'):
    workdir.init_params_from(str(HUB / 'timm_deit3'), _shapes(deit3), deit3, source_grid=(4, 4))
  with pytest.raises(errors.ConfigError, match='init_step=3 is given, but .* is a timm'):
    workdir.init_params_from(str(HUB / 'timm_deit3'), _shapes(deit3), deit3, step=3)
  config = tiny_config(init_from=str(HUB / 'timm_deit3'), init_source_pool='gap')
  with pytest.raises(errors.ConfigError, match="init_source_pool='gap', but .* is a timm "
                     'checkpoint: it records its model'):
    workdir.check_init_from(config)


def test_export_command_converts_any_checkpoint(tmp_path):
  """--source: a transformers folder written as timm's, read back with the same logits."""
  out = tmp_path / 'timm'
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.export', f'--source={HUB / "hf_vit_cls_tanh"}',
       '--format=timm', f'--out={out}', '--evaluate'], env=env(devices=1),
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'Wrote {out} (timm)' in result.stdout
  difference = float(re.search(r'max relative difference (\S+)', result.stdout).group(1))
  assert difference <= 1e-6
  config = json.loads((out / 'config.json').read_text())
  assert config['model_args']['act_layer'] == 'gelu_tanh' and config['label_names'][0] == 'tench'


@pytest.mark.slow  # Trains (a step, 40 s on 2 cores).
def test_a_fine_tune_of_a_timm_dinov2_exports_as_dinov2_with_its_classes(tmp_path):
  """A step from timm's DINOv2 folder: tools.export names the architecture the run started
  from (timm builds the run's model from it and the run's classes), and the run's own
  preprocessing (DINOv2's normalisation, taken by init_normalization)."""
  dinov2 = HUB / 'timm_dinov2'
  config = tiny_config(**{
      'model.hidden_size': 32, 'model.num_layers': 2, 'model.num_heads': 2, 'model.mlp_dim': 128,
      'model.patch_size': 8, 'model.image_size': 32, 'model.pool': 'token',
      'model.layer_scale': 1e-5, 'model.activation': 'gelu', 'init_from': str(dinov2),
      'dataset.pp_train': 'to_rgb|resize(32)|value_range(-1, 1)',
      'dataset.pp_eval': 'to_rgb|resize(32)|value_range(-1, 1)',
      'total_steps': 1, 'checkpoint_every_steps': 1, 'schedule.warmup_steps': 0,
      'log_every_steps': 1, 'evals.eval': None})
  run = tmp_path / 'run'
  main.train_and_evaluate(config, str(run))
  theirs = json.loads((dinov2 / 'config.json').read_text())
  for fmt in ('timm', 'transformers'):
    export.export(str(run), str(tmp_path / fmt), format=fmt)
  written = json.loads((tmp_path / 'timm' / 'config.json').read_text())
  classes = json.loads((run / 'classes.json').read_text())
  assert written['architecture'] == 'vit_small_patch14_dinov2'
  assert written['model_args'] == dict(theirs['model_args'], num_classes=10)
  assert written['label_names'] == classes and len(classes) == 10
  for key in ('mean', 'std'):
    np.testing.assert_allclose(written['pretrained_cfg'][key], theirs['pretrained_cfg'][key],
                               rtol=1e-6)
  hf = json.loads((tmp_path / 'transformers' / 'config.json').read_text())
  assert (hf['model_type'], hf['architectures']) == ('dinov2', ['Dinov2ForImageClassification'])
  processor = json.loads((tmp_path / 'transformers' / 'preprocessor_config.json').read_text())
  np.testing.assert_allclose(processor['image_mean'], theirs['pretrained_cfg']['mean'], rtol=1e-6)
  # The run as load returned it (its pp_eval, its init_from's architecture) exports alike.
  loaded = workdir.load_run(str(run))
  checkpoints.export(loaded, tmp_path / 'loaded', 'timm')
  assert json.loads((tmp_path / 'loaded' / 'config.json').read_text()) == written
