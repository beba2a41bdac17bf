"""vit_jax.tools.aot: the steps of a run compiled ahead of time, for this host or a TPU slice."""

import importlib.util
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import optax
import pytest

from vit_jax import config_cli, evaluate, mpp, optim, sharding, train
from vit_jax.tools import aot

from runs import QUICKSTART, env, tiny_config
from tpu_probe import probe

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                                  reason='compiling for a TPU needs libtpu (the [tpu] extra)')


def lowered_by_train(config, devices):
  """The train step as vit_jax.train builds it, lowered on abstract inputs."""
  plan = train.validate(config, devices=devices, num_train_examples=1000)
  schedule = optim.make_schedule(plan.config.schedule, plan.total_steps, plan.warmup_steps)
  tx = optim.make_optimizer(plan.config.optimizer, schedule)
  state, shardings = train.create_train_state(
      plan.model, tx, 0, plan.mesh, shard_state=plan.shard_state, abstract=True)
  step = train.make_train_step(plan.model, tx, schedule, plan.config, plan.mesh, shardings)
  batch = {'image': (config.batch_size, *plan.model.image_size, 3),
           'label': (config.batch_size, plan.num_classes or 1)}
  batch = {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sharding.batch_sharding(plan.mesh))
           for k, v in batch.items()}
  return step.lower(state, batch), plan


@pytest.mark.parametrize('objective', ['classification', 'mpp'])
def test_aot_lowers_the_step_that_training_runs(objective):
  # No classes given for masked patch prediction: it needs none.
  config = tiny_config(objective=objective,
                       **({'dataset.num_classes': 0} if objective == 'mpp' else {}))
  facts, lowered = aot.lower_steps(config, jax.devices(), 1000)
  ours, plan = lowered_by_train(config, jax.devices())
  assert lowered['train'].as_text() == ours.as_text()
  assert evaluate.make_eval_step  # The eval step is evaluate's own (lower_steps calls it).
  # The eval step train_and_evaluate builds: masked patch prediction has its own.
  state, shardings = train.create_train_state(
      plan.model, optax.sgd(0.1), 0, plan.mesh, shard_state=plan.shard_state, abstract=True)
  batch_sharding = sharding.batch_sharding(plan.mesh)
  args = (plan.model, plan.config if objective == 'mpp' else plan.config.loss, shardings.params,
          batch_sharding, sharding.replicated(plan.mesh))
  eval_step = (mpp if objective == 'mpp' else evaluate).make_eval_step(*args)
  size = plan.config.eval_batch_size
  batch = {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=batch_sharding)
           for k, v in {'image': (size, *plan.model.image_size, 3),
                        'label': (size, plan.num_classes or 1), 'mask': (size,)}.items()}
  assert lowered['eval'].as_text() == eval_step.lower(state.params, batch).as_text()
  if objective == 'mpp':  # No classifier: the mask embedding and the per-patch head.
    assert plan.model.mpp_outputs == mpp.COLORS and facts['num_classes'] == 0


def test_cpu_report_sizes_only():
  config = tiny_config()
  r = aot.report(config, 'cpu')
  assert (r['topology'], r['devices'], r['fits']) == ('cpu', 8, True)
  assert r['step_seconds'] is None and r['core_days'] is None  # XLA:CPU has no cost model.
  params = jax.eval_shape(train.validate(config).model.init, jax.random.key(0),
                          jnp.zeros((1, 16, 16, 3)))
  params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  # Stored split over the 8 devices (config.mesh.shard_state), but for the arrays that 8
  # does not divide (the 10-class head's bias).
  assert params_bytes / 8 < r['params_bytes_per_device'] < params_bytes / 8 + 10 * 4
  assert r['opt_state_bytes_per_device'] > 2 * params_bytes / 8  # Adam: two moments.
  batch_bytes = 4 * 8 * (16 * 16 * 3 + 10)  # The 64-image batch's eighth, float32.
  assert r['train']['argument_bytes'] >= r['params_bytes_per_device'] + batch_bytes
  assert r['hbm_bytes_per_device'] == r['train']['hbm_bytes_per_device'] > params_bytes


@needs_libtpu
@pytest.mark.parametrize('topology, devices, cores', [('v3-8', 8, 8), ('v4-8', 4, 8)])
def test_tpu_report_is_the_compiled_programs(topology, devices, cores):
  answer = probe('report', topology, json.dumps({'model.dtype': 'bfloat16',
                                                 'total_steps': 1000}))
  r, step = answer['report'], answer['step_seconds']
  assert (r['devices'], r['cores'], r['fits']) == (devices, cores, True)
  assert r['hbm_capacity_bytes'] == answer['hbm_per_device']
  assert r['hbm_bytes_per_device'] == answer['hbm_bytes_per_device']
  assert r['step_seconds'] == pytest.approx(step) and step > 0
  assert r['images_per_second'] == pytest.approx(64 / step)  # The tiny recipe's batch.
  assert r['train_flops_per_image'] == answer['train_flops_per_image']
  assert r['mfu'] == pytest.approx(answer['train_flops_per_image'] * 64 / step
                                   / (answer['peak_flops_per_device'] * devices))
  assert r['chip_hours'] == pytest.approx(1000 * step * answer['chips'] / 3600)
  assert r['core_days'] == pytest.approx(1000 * step * cores / 86_400)
  assert r['eval']['fits'] and r['eval']['step_seconds'] > 0


@needs_libtpu
def test_tpu_report_plans_masked_patch_prediction():
  # No classes given: the self-supervised configs need none (vit_b16_mpp.py).
  answer = probe('report', 'v3-8', json.dumps({'objective': 'mpp', 'model.dtype': 'bfloat16',
                                               'total_steps': 1000, 'dataset.num_classes': 0}))
  r = answer['report']
  assert r['fits'] and r['eval']['fits'] and r['step_seconds'] > 0
  assert r['hbm_bytes_per_device'] == answer['hbm_bytes_per_device']
  assert r['step_seconds'] == pytest.approx(answer['step_seconds'])
  # The per-patch head's FLOPs in the model's count: 16 patches x 32 x 512, 3x per image.
  assert r['train_flops_per_image'] == answer['train_flops_per_image']
  classifier = probe('report', 'v3-8', json.dumps({'model.dtype': 'bfloat16',
                                                   'total_steps': 1000}))['report']
  assert r['params_bytes_per_device'] > classifier['params_bytes_per_device']


@needs_libtpu
def test_no_step_time_where_the_step_loops():
  # The cost model counts a loop's body once: micro-batches (and a scanned model) get none.
  r = probe('report', 'v3-8', json.dumps({'model.dtype': 'bfloat16', 'grad_accum_steps': 2}))[
      'report']
  assert r['fits'] and r['step_seconds'] is None and r['core_days'] is None
  assert r['eval']['step_seconds'] > 0  # The eval step has no loop.
  assert 'not estimated for grad_accum_steps=2' in aot.format_report(r, 'tiny')


@needs_libtpu
def test_a_negative_cost_model_time_is_no_time():
  # libtpu 0.0.52's cost model answers negative times for TPU v4 programs like this one.
  r = probe('report', 'v4-8', json.dumps({
      'model.name': 'l16', 'model.image_size': 224, 'model.patch_size': 16,
      'model.hidden_size': 1024, 'model.mlp_dim': 4096, 'model.num_heads': 16,
      'model.num_layers': 1, 'model.dtype': 'bfloat16', 'batch_size': 64,
      'eval_batch_size': 64}))['report']
  assert r['fits'] and r['train']['cost_model_seconds'] < 0
  assert r['step_seconds'] is None and r['mfu'] is None and r['core_days'] is None
  assert 'the cost model of this libtpu gives none' in aot.format_report(r, 'l16')


@needs_libtpu
def test_a_batch_that_does_not_fit_is_reported_not_raised():
  r = probe('report', 'v3-8', json.dumps({
      'model.name': 'b16', 'model.image_size': 384, 'model.patch_size': 16,
      'model.hidden_size': 768, 'model.mlp_dim': 3072, 'model.num_heads': 12,
      'model.num_layers': 2, 'batch_size': 4096, 'eval_batch_size': 8}))['report']
  assert not r['fits'] and not r['train']['fits']
  assert r['train']['required_bytes'] > r['train']['available_bytes'] > 15 * 2**30
  assert r['step_seconds'] is None


def test_largest_batch_bisects():
  calls = []

  def fits(units):
    calls.append(units)
    return units <= 37

  assert aot.bisect_largest(fits, start=4) == 37
  assert len(calls) < 12
  assert aot.bisect_largest(lambda units: False, start=4) == 0


def test_train_examples_follow_the_split():
  config = tiny_config(**{'dataset.name': 'imagenet2012', 'dataset.train_split': 'train[:99%]'})
  assert aot.train_examples(config, None) == round(1_281_167 * 0.99)  # As TFDS slices it.
  assert aot.train_examples(config, 1234) == 1234
  with pytest.raises(ValueError, match='pass --num_train_examples'):
    aot.train_examples(tiny_config(**{'dataset.name': 'jft_like'}), None)


def test_command_line_writes_the_json(tmp_path):
  out = tmp_path / 'plan.json'
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}', '--topology=cpu',
       f'--json={out}', '--config.model.num_layers=1'],
      env=env(2), capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  assert 'on this host (2 x cpu)' in run.stdout and 'memory per device' in run.stdout
  r = json.loads(out.read_text())
  for key in ('topology', 'devices', 'hbm_bytes_per_device', 'hbm_capacity_bytes', 'fits',
              'step_seconds', 'images_per_second', 'mfu', 'core_days', 'compile_seconds'):
    assert key in r
  assert (r['devices'], r['fits']) == (2, True)


def test_max_batch_on_cpu_finds_the_largest_batch_under_the_memory_given(tmp_path):
  """``--max_batch`` as the README runs it, on --topology=cpu with a memory per device: the
  batch it reports fits, the next multiple of the devices does not (compiled here)."""
  limit_gib = 1.15 / 1024  # Between the 8- and the 16-image train steps of this model.
  out = tmp_path / 'plan.json'
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}', '--topology=cpu',
       '--max_batch', f'--max_batch_memory={limit_gib}', f'--json={out}',
       '--config.model.num_layers=1', '--config.batch_size=8'],
      env=env(2), capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  r = json.loads(out.read_text())
  best = r['batch_size']
  assert f'Largest global batch that fits on cpu: {best}.' in run.stdout
  assert 8 <= best < 16 and best % 2 == 0
  assert r['train']['hbm_bytes_per_device'] <= limit_gib * 2**30
  over = config_cli.load(str(QUICKSTART), [('model.num_layers', '1'),
                                             ('batch_size', str(best + 2))])
  figures = aot.compile_steps(over, jax.devices()[:2], 0, only_train=True)['train']
  assert figures['hbm_bytes_per_device'] > limit_gib * 2**30


@pytest.mark.parametrize('flags, message', [
    (['--max_batch'], '--max_batch on --topology=cpu needs --max_batch_memory=GIB'),
    (['--max_batch_memory=2'], '--max_batch_memory=2.0 is for --max_batch'),
])
def test_max_batch_flags_are_checked_first(flags, message):
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}', '--topology=cpu',
       *flags], env=env(2), capture_output=True, text=True, timeout=120)
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1].startswith(f'error: {message}')
