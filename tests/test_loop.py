"""vit_jax.training.loop through vit_jax.main.train_and_evaluate: whole runs, resumed bit for
bit, stopped at a non-finite state, fine-tuned from a release file and from the backbones'
folders (CLIP, SigLIP, distilled DeiT with a teacher)."""

import itertools
import json
import logging
import os
import re
import shutil
import signal

import chex
import jax
import numpy as np
import pytest
import scipy.ndimage

from vit_jax import evals, main
from vit_jax.base import errors, sharding
from vit_jax.base.cpu import host_cpu
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.data import loader
from vit_jax.models import get_model
from vit_jax.training import loop, mfu
from vit_jax.training import plan as plan_lib

from runs import TINY_MODEL, read_metrics, restore_state, tiny_config


@pytest.mark.slow
def test_a_run_warns_where_the_cpu_emulates_bfloat16_products_or_its_peak_is_too_low(
    tmp_path, caplog, monkeypatch):
  """The kept peak planted far below any CPU's (as one measured on a busy machine might be):
  every MFU is over 100%, said once, with the peak and its file."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  kept = tmp_path / 'cache' / 'vit_jax' / 'matmul_peak.json'
  kept.parent.mkdir(parents=True)
  devices = jax.devices()
  key = mfu.peak_key('cpu', devices[0].device_kind, len(devices), 'bfloat16')
  kept.write_text(json.dumps({key: {'flops': 1e6, 'measured': '2026-01-02'}}))
  mfu.device_peak.cache_clear()
  config = tiny_config(**{'model.matmul_dtype': 'bfloat16', 'total_steps': 2,
                          'schedule.warmup_steps': 1,
                          'checkpoint_every_steps': 2, 'log_every_steps': 1})
  try:
    main.train_and_evaluate(config, str(tmp_path / 'run'))
  finally:
    mfu.device_peak.cache_clear()
  warned = [r for r in caplog.records if 'has no bfloat16 instructions' in r.getMessage()]
  assert len(warned) == (0 if host_cpu.cpu_info()['native_bf16'] else 1)
  assert all(m['train/mfu'] > 1 for m in read_metrics(tmp_path / 'run') if 'train/mfu' in m)
  over = [r.getMessage() for r in caplog.records if 'is over 100%' in r.getMessage()]
  assert len(over) == 1, over
  assert f'measured 2026-01-02 (kept in {kept}). A peak measured while the machine was busy' \
      in over[0]


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_run(tmp_path, caplog):
  """With DeiT's ingredients: timm's RandAugment, random erasing, repeated augmentation,
  mixup or CutMix, layer-wise learning-rate decay, and the weights' moving average
  (checkpointed, and evaluated too)."""
  caplog.set_level(logging.INFO)
  config = tiny_config(**{
      'dataset.pp_train': "to_rgb|resize(16)|pad_crop(2)|rand_augment('rand-m9-mstd0.5-inc1')|"
                          'value_range(-1, 1)|random_erase(0.5)',
      'dataset.repeats': 3,
      'mixup_alpha': 0.8, 'cutmix_alpha': 1.0, 'optimizer.layer_decay': 0.75,
      'optimizer.ema_decay': 0.9})
  result = main.train_and_evaluate(config, str(tmp_path / 'a'))
  assert result['eval/examples'] == 359  # Every held-out example, once (6 padded batches).
  assert result['eval/ema/loss'] != result['eval/loss']
  # Each set of numbers is its own weights': the step-20 checkpoint's weights and their
  # average, evaluated here, give what the run logged.
  state = restore_state(tmp_path / 'a', config)
  plan = plan_lib.validate(config)
  (evaluator,) = evals.from_config(plan)
  for prefix, params in (('', state.params), ('ema/', state.ema_params)):
    metrics = evaluator.run(params)
    assert {k: result[f'eval/{prefix}{k}'] for k in metrics} == pytest.approx(metrics, rel=1e-6)
  steps = sorted(int(p.name) for p in (tmp_path / 'a' / 'checkpoints').iterdir())
  assert steps == [10, 20]
  # The closing summary: steps, time, the evaluations, where everything is.
  assert re.search(r'Done: step 20/20, 20 trained in 0h\d\dm\d\ds \(compiling \d+s, '
                   r'evaluating \d+s\), [\d,]+ img/s, MFU \d+\.\d%', caplog.text)
  assert f'eval/accuracy: final {result["eval/accuracy"]:.4f} (step 20), best' in caplog.text
  assert f'eval/ema/accuracy: final {result["eval/ema/accuracy"]:.4f} (step 20)' in caplog.text
  assert re.search(r'eval at step 20: accuracy [\d.]+, loss [\d.]+ \(359 examples\); EMA '
                   r'accuracy [\d.]+, loss [\d.]+ \(359 examples\) \[[\d.]+s\]', caplog.text)
  assert f'Checkpoints: {tmp_path / "a" / "checkpoints"} (steps 10, 20). Logs: ' \
         f'{tmp_path / "a" / "metrics.jsonl"}' in caplog.text

  a = read_metrics(tmp_path / 'a')
  assert [m['step'] for m in a] == [5, 10, 15, 20, 20]
  assert set(a[-1]) == {'step', 'eval/accuracy', 'eval/loss', 'eval/examples',
                        'eval/ema/accuracy', 'eval/ema/loss', 'eval/ema/examples'}
  # MFU: the model's FLOPs of a training image at the logged speed, over the peak.
  peak, how = mfu.device_peak('float32')
  assert 'float32 matmul peak of 8 cpu devices' in how
  assert a[0]['train/mfu'] == pytest.approx(
      3 * plan.model.forward_flops() * a[0]['train/images_per_s'] / peak)

  # A second run that had the step-10 checkpoint when it was restarted, and the log
  # lines of the steps after it (the first run stopped after logging them); it logs
  # every step.
  import shutil
  (tmp_path / 'b' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'a' / 'checkpoints' / '10', tmp_path / 'b' / 'checkpoints' / '10')
  shutil.copy(tmp_path / 'a' / 'metrics.jsonl', tmp_path / 'b' / 'metrics.jsonl')
  config.log_every_steps = 1
  resumed = main.train_and_evaluate(config, str(tmp_path / 'b'))
  b = read_metrics(tmp_path / 'b')
  assert [m['step'] for m in b] == [5, 10, *range(11, 21), 20]  # None twice.
  assert b[:2] == a[:2] and b[-1] == a[-1]
  # Each line's loss is the mean since the last line: a's at 15 and 20 are the means of
  # the losses of b's steps 11-15 and 16-20, which are a's steps, bit for bit.
  losses = [m['train/loss'] for m in b[2:-1]]
  assert len(set(losses)) == 10
  assert a[2]['train/loss'] == pytest.approx(np.mean(losses[:5]), rel=1e-6)
  assert a[3]['train/loss'] == pytest.approx(np.mean(losses[5:]), rel=1e-6)
  chex.assert_trees_all_equal(state, restore_state(tmp_path / 'b', config))
  assert resumed == result
  # A finished run, started again: nothing to train, the same evaluation, no new row.
  assert main.train_and_evaluate(config, str(tmp_path / 'a')) == result
  assert read_metrics(tmp_path / 'a') == a


def test_a_state_that_turns_non_finite_after_finite_metrics_is_never_saved(tmp_path):
  """Step 1 trains at 1e-3 (finite, saved); then a phase at an infinite rate: step 2's loss
  and gradients are finite but its update is not. Its save is refused, and the run stops
  naming step 1, the last good checkpoint."""
  phase = {'name': 'infinite', 'total_steps': 3, 'base_lr': float('inf'), 'decay': 'constant'}
  config = tiny_config(**{'schedule.decay': 'constant', 'schedule.warmup_steps': 0,
                          'schedule.phases': (phase,), 'optimizer.grad_clip_norm': None,
                          'optimizer.name': 'sgd', 'total_steps': 1, 'evals.eval': None,
                          'checkpoint_every_steps': 1, 'log_every_steps': 1,
                          'keep_checkpoints': 1})
  with pytest.raises(errors.Diverged, match=(
      r'^The training diverged at step 2: a non-finite state \(params/Transformer/encoder_norm/'
      r'bias, .* and \d+ more\) after finite losses and gradient norms\. Nothing after step 1 '
      r'was saved: the last good checkpoint is .*/checkpoints/1 ')):
    main.train_and_evaluate(config, str(tmp_path))
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()) == [1]
  assert manager_lib.good(manager_lib.recorded(tmp_path / 'checkpoints' / '1')) is True
  restored = jax.device_get(restore_state(tmp_path, config, 1))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(restored))


@pytest.mark.slow
def test_fine_tune_starts_from_a_release_file(tmp_path):
  from vit_jax.checkpoints.formats import release

  # A "pre-trained" 16 px model with 7 classes and a pre-logits layer...
  source = get_model(num_classes=7, **{**TINY_MODEL, 'representation_size': 32})
  source_params = source.init(jax.random.key(3), np.zeros((1, 16, 16, 3)))['params']
  release.save_npz(tmp_path / 'pretrained.npz', source_params)
  # ... fine-tuned at 24 px on 10 classes. The warm-up starts at a learning rate of 0,
  # so the parameters after step 1 are exactly the adapted ones.
  config = tiny_config(**{'init_from': str(tmp_path / 'pretrained.npz'), 'model.image_size': 24,
                          'dataset.pp_train': 'to_rgb|resize(24)|value_range(-1, 1)',
                          'dataset.pp_eval': 'to_rgb|resize(24)|value_range(-1, 1)',
                          'total_steps': 2, 'schedule.warmup_steps': 1,
                          'checkpoint_every_steps': 1, 'optimizer.name': 'sgd'})
  main.train_and_evaluate(config, str(tmp_path / 'run'))
  final = jax.device_get(restore_state(tmp_path / 'run', config, step=1).params)
  # Expected, without load_pretrained: the source's encoder as it is, no pre-logits, a
  # fresh zero head for 10 classes, and the 4x4 position grid resized to 6x6 as the
  # releases resize it (scipy.ndimage.zoom, order 1; TINY_MODEL pools 'gap': no class token).
  expected = jax.tree.map(np.asarray, {k: v for k, v in source_params.items()
                                       if k not in ('pre_logits', 'head')})
  grid = expected['Transformer']['posembed_input']['pos_embedding'].reshape(4, 4, 32)
  resized = scipy.ndimage.zoom(grid.astype(np.float64), (1.5, 1.5, 1), order=1)
  expected['Transformer'] = {**expected['Transformer'], 'posembed_input': {
      'pos_embedding': resized.reshape(1, 36, 32).astype(np.float32)}}
  expected['head'] = {'kernel': np.zeros((32, 10), np.float32), 'bias': np.zeros(10, np.float32)}
  chex.assert_trees_all_close(final, expected, atol=1e-6, rtol=1e-6)

  config.init_from = str(tmp_path / 'missing.npz')
  with pytest.raises(FileNotFoundError,
                     match='config.init_from=.*missing.npz is neither a release .npz file'):
    plan_lib.validate(config)


@pytest.mark.slow  # A whole training run: its compilations.
def test_fine_tune_starts_from_a_timm_checkpoint_on_the_hub(tmp_path, offline_hub):
  """config.init_from=hf-hub:ORG/NAME, found in the client's cache offline: a DeiT III
  written by timm (layer scale, no class-token position embedding, exact GELU)."""
  import pathlib

  from vit_jax import checkpoints

  fixture = pathlib.Path(__file__).resolve().parent / 'data' / 'hub' / 'timm_deit3'
  offline_hub('test-org/tiny-deit3', fixture)
  pp = 'to_rgb|resize(32)|value_range(-1, 1)'
  config = tiny_config(**{
      'init_from': 'hf-hub:test-org/tiny-deit3', 'model.name': 'deit3_s16',
      'model.image_size': 32, 'model.patch_size': 4, 'model.hidden_size': 32,
      'model.num_layers': 2, 'model.num_heads': 2, 'model.mlp_dim': 64, 'model.pool': 'token',
      'dataset.pp_train': pp, 'dataset.pp_eval': pp, 'total_steps': 2,
      'schedule.warmup_steps': 1, 'checkpoint_every_steps': 1, 'optimizer.name': 'sgd'})
  main.train_and_evaluate(config, str(tmp_path / 'run'))
  final = jax.device_get(restore_state(tmp_path / 'run', config, step=1).params)
  # The warm-up starts at a learning rate of 0: timm's arrays as they are, a new zero head.
  expected = dict(checkpoints.load(str(fixture)).params)
  expected['head'] = {'kernel': np.zeros((32, 10), np.float32), 'bias': np.zeros(10, np.float32)}
  chex.assert_trees_all_close(final, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.slow  # Three short fine-tunes and a resume: their compilations.
def test_fine_tunes_from_clip_siglip_and_distilled_deit_folders_train_and_resume(tmp_path):
  """timm's CLIP (pre-norm), SigLIP (MAP head) and distilled DeiT folders (tests/data/hub:
  tiny, random weights) fine-tuned on the digits with a fresh head and their own mean/std:
  the loss falls and the accuracy ends far above chance (0.1). The DeiT learns from a teacher,
  the CLIP run's workdir (its inputs rescaled from ImageNet's mean/std to OpenAI's); resumed
  from its step-90 checkpoint, it reloads the teacher and ends where the uninterrupted run
  did, bit for bit; a resume with another teacher is refused."""
  import pathlib
  import shutil

  from vit_jax import checkpoints, vtab
  from vit_jax.checkpoints.run import record

  hub = pathlib.Path(__file__).resolve().parent / 'data' / 'hub'

  def config(name, **more):
    folder = str(hub / name)
    spec = checkpoints.load(folder).preprocessing
    pp = f'to_rgb|resize(32)|normalize({list(spec.mean)}, {list(spec.std)})'
    model = {'pool': 'token', 'image_size': 32, **vtab.model_fields(folder)}
    return tiny_config(**{f'model.{k}': v for k, v in model.items()}, **{
        'init_from': folder, 'dataset.pp_train': pp, 'dataset.pp_eval': pp, 'total_steps': 100,
        'schedule.warmup_steps': 3, 'log_every_steps': 10, 'checkpoint_every_steps': 45,
        **more})

  runs = {'clip': config('timm_clip'), 'siglip': config('timm_siglip_map'),
          'deit': config('timm_deit_distilled', **{'distill.teacher': str(tmp_path / 'clip')})}
  for name, run in runs.items():
    result = main.train_and_evaluate(run, str(tmp_path / name))
    losses = [m['train/loss'] for m in read_metrics(tmp_path / name) if 'train/loss' in m]
    assert losses[-1] < 0.75 * losses[0] and result['eval/accuracy'] > 0.4, (name, losses,
                                                                             result)
  (tmp_path / 'resumed' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'deit' / 'checkpoints' / '90',
                  tmp_path / 'resumed' / 'checkpoints' / '90')
  assert main.train_and_evaluate(runs['deit'], str(tmp_path / 'resumed')) == result
  chex.assert_trees_all_equal(restore_state(tmp_path / 'resumed', runs['deit']),
                              restore_state(tmp_path / 'deit', runs['deit']))
  runs['deit'].distill.teacher = str(tmp_path / 'siglip')
  with pytest.raises(errors.ConfigError, match=r'config.distill.teacher=.*siglip.* \(.*clip'):
    record.check_resume(tmp_path / 'resumed', runs['deit'])


@pytest.mark.slow  # A fine-tune and a resume: their compilations.
def test_a_dinov3_folder_fine_tunes_at_another_grid_and_resumes_bit_for_bit(tmp_path):
  """timm's DINOv3 (tests/data/hub/timm_dinov3: rotary positions, no position embeddings,
  registers, layer scale), saved for 32 px (config 256 px), fine-tuned on the digits at 48 px
  (a 6x6 grid): nothing is resized, the rotary coordinates follow the grid. The loss falls,
  the accuracy ends far above chance, and a resume from step 30 ends bit for bit where the
  uninterrupted run did."""
  import pathlib
  import shutil

  from vit_jax import vtab

  folder = str(pathlib.Path(__file__).resolve().parent / 'data' / 'hub' / 'timm_dinov3')
  pp = 'to_rgb|resize(48)|normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])'
  model = {**vtab.model_fields(folder), 'image_size': 48, 'pool': 'token'}
  assert model['rope'] == 'dinov3' and model['posemb'] == 'none'
  config = tiny_config(**{f'model.{k}': v for k, v in model.items()}, **{
      'init_from': folder, 'dataset.pp_train': pp, 'dataset.pp_eval': pp, 'total_steps': 60,
      'schedule.warmup_steps': 3, 'log_every_steps': 10, 'checkpoint_every_steps': 30})
  result = main.train_and_evaluate(config, str(tmp_path / 'run'))
  losses = [m['train/loss'] for m in read_metrics(tmp_path / 'run') if 'train/loss' in m]
  assert losses[-1] < 0.75 * losses[0] and result['eval/accuracy'] > 0.4, (losses, result)
  (tmp_path / 'resumed' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'run' / 'checkpoints' / '30',
                  tmp_path / 'resumed' / 'checkpoints' / '30')
  assert main.train_and_evaluate(config, str(tmp_path / 'resumed')) == result
  chex.assert_trees_all_equal(restore_state(tmp_path / 'resumed', config),
                              restore_state(tmp_path / 'run', config))


def test_ctrl_c_asks_for_a_save_and_a_second_one_stops_at_once(caplog):
  """Real SIGINTs to this process: the first asks the loop to save at its next step (as
  SIGTERM does), the second raises KeyboardInterrupt at once (vit_jax.main's one line); a
  Ctrl-C ignored (a launcher's background process) stays ignored. (The whole command:
  tests/test_main.py.)"""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # As from a terminal.
  try:
    preemption = loop._Preemption()
    try:
      os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
      pytest.fail('the first Ctrl-C stopped the run at once, saving nothing')
    assert preemption.requested
    assert 'Ctrl-C: saving a checkpoint at the next step, then exiting' in caplog.text
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
    preemption.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preemption = loop._Preemption()
    os.kill(os.getpid(), signal.SIGINT)
    assert not preemption.requested
    preemption.close()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow  # Two runs (one resumed), each compiling a step per patch size; evaluations.
def test_flexivit_trains_at_a_patch_size_drawn_per_step_and_resumes_bit_for_bit(tmp_path, caplog):
  """config.flexi: each step at 4- or 8-pixel patches (one program each, compiled when first
  drawn); the base parameters (4-pixel patches, the release layout) learn at both, evaluated
  as any run's are (evaluate --patch_sizes); a resume draws the same sizes and ends with the
  same state, bit for bit."""
  from vit_jax import evaluation
  from vit_jax.models import flexi

  caplog.set_level(logging.INFO)
  config = tiny_config(**{'flexi.patch_sizes': (4, 8), 'total_steps': 30, 'log_every_steps': 15,
                          'schedule.base_lr': 1e-2, 'checkpoint_every_steps': 20})
  main.train_and_evaluate(config, str(tmp_path / 'a'))
  drawn = [flexi.draw(config.seed, s, (4, 8)) for s in range(1, 31)]
  firsts = sorted({drawn.index(p) + 1 for p in (4, 8)})
  compiled = re.findall(r'FlexiViT: step (\d+) draws patch size (\d+)', caplog.text)
  assert compiled == [(str(s), str(drawn[s - 1])) for s in firsts]  # Each once, when drawn.
  state = restore_state(tmp_path / 'a', config)
  assert state.params['embedding']['kernel'].shape == (4, 4, 3, 32)
  model = plan_lib.validate(config).model  # MFU: the FLOPs' mean over the draw.
  mean = np.mean([mfu.analytic_train_flops(model.clone(patch_size=p)) for p in (4, 8)])
  assert f'MFU: {mean / 1e6:.4g} MFLOP a training image' in caplog.text
  losses = [m['train/loss'] for m in read_metrics(tmp_path / 'a') if 'train/loss' in m]
  assert losses[1] < losses[0] - 0.1, losses  # As a run at 4 alone: 2.29, then 2.14.

  import shutil
  (tmp_path / 'b' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'a' / 'checkpoints' / '20', tmp_path / 'b' / 'checkpoints' / '20')
  main.train_and_evaluate(config, str(tmp_path / 'b'))
  chex.assert_trees_all_equal(state, restore_state(tmp_path / 'b', config))

  rows = evaluation.at_patch_sizes(config, str(tmp_path / 'a'), None, [4, 8], source=False)
  accuracy = {r['patch_size']: r['metrics']['eval'][1]['accuracy'] for r in rows}
  logging.info('FlexiViT test: losses %s, accuracy at each patch size %s', losses, accuracy)
  # Ten classes: chance is 0.1 (one standard deviation over 359 images: 0.016).
  assert min(accuracy.values()) > 0.15, accuracy


def mixed_aspect_dataset(root):
  """A local-format dataset of PNGs at mixed aspect ratios (sides 6 to 40 px): two classes,
  dark and light noise, 48 training and 16 test images."""
  from PIL import Image

  from vit_jax.data import convert

  rng = np.random.default_rng(0)
  for split, count in (('train', 48), ('test', 16)):
    for label, name in enumerate(('dark', 'light')):
      folder = root / 'folder' / split / name
      folder.mkdir(parents=True)
      for i in range(count // 2):
        height, width = rng.integers(6, 41, 2)
        pixels = rng.normal(70 + 110 * label, 40, (height, width, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f'{i}.png')
  convert.convert(str(root / 'folder'), str(root / 'data'), shards=2, workers=1)
  return root / 'data'


@pytest.mark.slow  # Two short runs and their compilations.
def test_a_packed_naflex_run_on_mixed_aspect_ratios_resumes_bit_for_bit_and_evaluates(tmp_path):
  """NaViT packing (2 images a row of 24 tokens) of NaFlex sequences (at most 16 patches of
  4x4): the loop trains on the packed batches (its first loss is the packed step's), a run
  resumed from its step-3 checkpoint ends bit for bit as the uninterrupted one, and the
  classification and few-shot evaluators score every test image (one a sequence, unpacked),
  the weights and their moving average alike."""
  naflex = 'decode|naflex(4, 16)|value_range(-1, 1)'
  config = tiny_config(**{
      'dataset.name': 'mixed', 'dataset.num_classes': 0, 'dataset.pp_train': naflex,
      'dataset.pp_eval': naflex,
      'dataset.eval_split': 'test', 'packing.images_per_row': 2, 'packing.seq_len': 24,
      'batch_size': 16, 'eval_batch_size': 8, 'total_steps': 6, 'schedule.warmup_steps': 1,
      'log_every_steps': 1, 'checkpoint_every_steps': 3, 'optimizer.ema_decay': 0.5,
      'model.hidden_size': 16, 'model.mlp_dim': 32, 'model.num_layers': 1,
      'model.num_heads': 2, 'input_workers': 2})
  data = mixed_aspect_dataset(tmp_path)
  with config.unlocked():
    config.dataset.data_dir = str(data)
    config.evals.fewshot = dict(type='fewshot', datasets=(f'mixed,train,test,{data}',),
                                shots=(2,), seeds=1)
  result = main.train_and_evaluate(config, str(tmp_path / 'a'))
  assert result['eval/examples'] == 16 and result['eval/ema/examples'] == 16
  assert 0 <= result['fewshot/mixed_2shot'] <= 1 and 'fewshot/ema/mixed_2shot' in result
  assert result['eval/ema/loss'] != result['eval/loss']
  a = read_metrics(tmp_path / 'a')

  # The loop's steps are the plan's step on the loader's packed batches (the first three:
  # the first's loss is log 2 whatever the batch, the head starting at zero).
  plan = plan_lib.validate(config)
  assert plan.packing is not None
  train_loader = loader.TrainLoader(
      plan.train_source, plan.pp_train, global_batch_size=16, seed=config.seed,
      sharding=sharding.batch_sharding(plan.mesh), num_classes=2, num_workers=1,
      packing=plan.packing)
  state, shardings = plan.train_state()
  step, losses = plan.train_step(shardings), []
  for _, batch in itertools.islice(train_loader.iterate(), 3):
    assert batch['label'].shape == (8, 2, 2)
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
  assert not batch['image_mask'].all()  # Some dropped: the rows bind.
  assert [m['train/loss'] for m in a[:3]] == pytest.approx(losses, rel=1e-6)

  # Resumed from the step-3 checkpoint: the same state, the same evaluation.
  (tmp_path / 'b' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'a' / 'checkpoints' / '3', tmp_path / 'b' / 'checkpoints' / '3')
  assert main.train_and_evaluate(config, str(tmp_path / 'b')) == result
  final = restore_state(tmp_path / 'a', config)
  chex.assert_trees_all_equal(final, restore_state(tmp_path / 'b', config))
  assert [m['train/loss'] for m in read_metrics(tmp_path / 'b') if m['step'] > 3 and
          'train/loss' in m] == [m['train/loss'] for m in a if m['step'] > 3 and
                                 'train/loss' in m]
  # The evaluator, run again on the final weights and their average, gives what was logged.
  (evaluator,) = evals.from_config(plan, ['eval'])
  for prefix, params in (('', final.params), ('ema/', final.ema_params)):
    metrics = evaluator.run(params)
    assert {k: result[f'eval/{prefix}{k}'] for k in metrics} == pytest.approx(metrics, rel=1e-6)
