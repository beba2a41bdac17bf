"""vit_jax.tools.aot: the steps of a run compiled ahead of time, for this host or a TPU slice."""

import importlib.util
import json
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import optax
import pytest

from vit_jax.base import sharding
from vit_jax.config import cli as config_cli
from vit_jax.evals import classification
from vit_jax.evals import mpp as mpp_eval
from vit_jax.models import mpp
from vit_jax.tools import aot, planner
from vit_jax.training import plan as plan_lib
from vit_jax.training import step as step_lib

from runs import QUICKSTART, env, tiny_config
from tpu_probe import probe

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                                  reason='compiling for a TPU needs libtpu (the [tpu] extra)')


def lowered_by_train(config, devices):
  """The train step as the training loop builds it, lowered on abstract inputs."""
  plan = plan_lib.validate(config, devices=devices, num_train_examples=1000)
  state, shardings = plan.train_state(abstract=True)
  step = plan.train_step(shardings)
  batch = {'image': (config.batch_size, *plan.model.image_size, 3),
           'label': (config.batch_size, plan.num_classes or 1)}
  batch = {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sharding.batch_sharding(plan.mesh))
           for k, v in batch.items()}
  return step.lower(state, batch), plan


@pytest.mark.slow
@pytest.mark.parametrize('objective', ['classification', 'mpp'])
def test_aot_lowers_the_step_that_training_runs(objective):
  # No classes given for masked patch prediction: it needs none.
  config = tiny_config(objective=objective,
                       **({'dataset.num_classes': 0} if objective == 'mpp' else {}))
  facts, lowered = planner.lower_steps(config, jax.devices(), 1000)
  ours, plan = lowered_by_train(config, jax.devices())
  assert lowered['train'].as_text() == ours.as_text()
  # The step of the run's own evaluator ('eval'): masked patch prediction has its own.
  state, shardings = step_lib.create_train_state(
      plan.model, optax.sgd(0.1), 0, plan.mesh, shard_state=plan.shard_state, abstract=True)
  batch_sharding = sharding.batch_sharding(plan.mesh)
  eval_step = (mpp_eval.make_eval_step(plan.model, plan.step_options.mpp, plan.mesh)
               if objective == 'mpp' else
               classification.make_eval_step(plan.model, plan.config.loss, plan.mesh))
  size = plan.config.eval_batch_size
  batch = {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=batch_sharding)
           for k, v in {'image': (size, *plan.model.image_size, 3),
                        'label': (size, plan.num_classes or 1), 'mask': (size,)}.items()}
  assert lowered['eval'].as_text() == eval_step.lower(state.params, batch).as_text()
  if objective == 'mpp':  # No classifier: the mask embedding and the per-patch head.
    assert plan.model.mpp_outputs == mpp.COLORS and facts['num_classes'] == 0


@pytest.mark.slow
def test_cpu_report_sizes_only():
  config = tiny_config()
  r = planner.report(config, 'cpu')
  assert (r['topology'], r['devices'], r['fits']) == ('cpu', 8, True)
  assert r['step_seconds'] is None and r['core_days'] is None  # XLA:CPU has no cost model.
  params = jax.eval_shape(plan_lib.validate(config).model.init, jax.random.key(0),
                          jnp.zeros((1, 16, 16, 3)))
  params_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  # Stored split over the 8 devices (config.mesh.shard_state), but for the arrays that 8
  # does not divide (the 10-class head's bias).
  assert params_bytes / 8 < r['params_bytes_per_device'] < params_bytes / 8 + 10 * 4
  assert r['opt_state_bytes_per_device'] > 2 * params_bytes / 8  # Adam: two moments.
  batch_bytes = 4 * 8 * (16 * 16 * 3 + 10)  # The 64-image batch's eighth, float32.
  assert r['train']['argument_bytes'] >= r['params_bytes_per_device'] + batch_bytes
  assert r['hbm_bytes_per_device'] == r['train']['hbm_bytes_per_device'] > params_bytes


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@needs_libtpu
def test_no_step_time_where_the_step_loops():
  # The cost model counts a loop's body once: micro-batches (and a scanned model) get none.
  r = probe('aot', 'v3-8', json.dumps({'model.dtype': 'bfloat16', 'grad_accum_steps': 2}))[
      'report']
  assert r['fits'] and r['step_seconds'] is None and r['core_days'] is None
  assert r['eval']['step_seconds'] > 0  # The eval step has no loop.
  assert 'not estimated for grad_accum_steps=2' in planner.format_report(r, 'tiny')


@pytest.mark.slow
@needs_libtpu
def test_a_negative_cost_model_time_is_no_time():
  # libtpu 0.0.52's cost model answers negative times for TPU v4 programs like this one.
  r = probe('aot', 'v4-8', json.dumps({
      'model.name': 'l16', 'model.image_size': 64, 'model.patch_size': 16,
      'model.hidden_size': 1024, 'model.mlp_dim': 4096, 'model.num_heads': 16,
      'model.num_layers': 1, 'model.dtype': 'bfloat16', 'batch_size': 16,
      'eval_batch_size': 16}))['report']
  assert r['fits'] and r['train']['cost_model_seconds'] < 0
  assert r['step_seconds'] is None and r['mfu'] is None and r['core_days'] is None
  assert 'the cost model of this libtpu gives none' in planner.format_report(r, 'l16')


@pytest.mark.slow
@needs_libtpu
def test_a_batch_that_does_not_fit_is_reported_not_raised():
  r = probe('aot', 'v3-8', json.dumps({
      'model.name': 'b16', 'model.image_size': 384, 'model.patch_size': 16,
      'model.hidden_size': 768, 'model.mlp_dim': 3072, 'model.num_heads': 12,
      'model.num_layers': 2, 'batch_size': 4096, 'eval_batch_size': 8}))['report']
  assert not r['fits'] and not r['train']['fits']
  assert r['train']['required_bytes'] > r['train']['available_bytes'] > 15 * 2**30
  assert r['step_seconds'] is None


def test_train_examples_follow_the_split():
  config = tiny_config(**{'dataset.name': 'imagenet2012', 'dataset.train_split': 'train[:99%]'})
  assert aot.train_examples(config, None) == round(1_281_167 * 0.99)  # As TFDS slices it.
  assert aot.train_examples(config, 1234) == 1234
  with pytest.raises(ValueError, match='pass --num_train_examples'):
    aot.train_examples(tiny_config(**{'dataset.name': 'jft_like'}), None)


@pytest.mark.slow
def test_command_line_writes_the_json(tmp_path):
  out = tmp_path / 'plan.json'
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}', '--topology=cpu',
       f'--json={out}', '--config.model.num_layers=1', '--progress_every=0.02'],
      env=env(2), capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  # What is compiled, a line while it compiles (the compile holds no Python), and its time.
  lines = [ln for ln in run.stderr.splitlines() if ln.startswith('aot: ')]
  assert lines[0] == 'aot: tracing the steps of ti16 for 2 x cpu ...', run.stderr[-2000:]
  for step, batch in (('train', 128), ('eval', 128)):
    what = f'aot: compiling the {step} step of ti16, batch {batch}, for 2 x cpu'
    assert f'{what} ...' in lines and any(re.fullmatch(f'{what}: 0h00m0\\ds so far', ln)
                                          for ln in lines), lines
    assert any(re.fullmatch(f'{what}: done in 0h00m\\d\\ds', ln) for ln in lines), lines
  assert 'on this host (2 x cpu)' in run.stdout and 'memory per device' in run.stdout
  r = json.loads(out.read_text())
  for key in ('topology', 'devices', 'hbm_bytes_per_device', 'hbm_capacity_bytes', 'fits',
              'step_seconds', 'images_per_second', 'mfu', 'core_days', 'compile_seconds'):
    assert key in r
  assert (r['devices'], r['fits']) == (2, True)


def aot_command(*flags, layers=1):
  """`python -m vit_jax.tools.aot` of the quickstart recipe with ``layers`` blocks, on 2
  CPU devices."""
  return subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}',
       f'--config.model.num_layers={layers}', *flags],
      env=env(2), capture_output=True, text=True, timeout=600)


def train_bytes(overrides, devices=2):
  """The train step's memory per device of the one-block quickstart recipe, compiled here."""
  config = config_cli.load(str(QUICKSTART), [('model.num_layers', '1'), *overrides])
  return planner.compile_steps(config, jax.devices()[:devices], 0,
                           only_train=True)['train']['hbm_bytes_per_device']


@pytest.mark.slow
def test_a_plan_that_does_not_fit_exits_3_and_says_what_fits(tmp_path):
  """Made not to fit by the memory given (4 MiB; the 128-image train step takes ~7.5): exit
  status 3, one closing line, and suggestions that fit when applied (run again)."""
  limit = 4 / 1024
  out = tmp_path / 'plan.json'
  run = aot_command('--topology=cpu', f'--memory_per_device={limit}', f'--json={out}')
  assert run.returncode == aot.DOES_NOT_FIT_STATUS == 3, run.stderr[-2000:]
  assert 'Traceback' not in run.stderr and 'error:' not in run.stderr
  assert run.stderr.strip().splitlines()[-1].startswith(
      'does not fit: the train step needs 7.')
  r = json.loads(out.read_text())
  assert not r['fits'] and r['memory_limit_bytes'] == limit * 2**30
  fitting = {s['kind']: s for s in r['suggestions'] if s['fits']}
  assert set(fitting) == {'largest batch', 'gradient accumulation'}, r['suggestions']
  assert all(s['how'] == 'checked' for s in r['suggestions'])
  for s in r['suggestions']:  # Each printed as its override and how it was found.
    assert s['override'] in run.stdout
  assert 'checked: compiled' in run.stdout
  # The largest batch: proven (the next multiple of the 2 devices was compiled and failed).
  best = fitting['largest batch']
  assert best['proven_largest'] and best['override'].startswith('--config.batch_size=')
  size = int(best['override'].split('=')[1])
  # Applied, each fits (the largest batch: aot run again with it); the next batch does not.
  again = aot_command('--topology=cpu', f'--memory_per_device={limit}', best['override'])
  assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
  assert re.search(r'memory limit per device +4.0 MiB  fits: ', again.stdout)
  assert train_bytes([('batch_size', str(size + 2))]) > limit * 2**30
  k = fitting['gradient accumulation']['override'].split('=')[1]
  assert train_bytes([('grad_accum_steps', k)]) <= limit * 2**30
  # The compiles that checked it: as many progress lines as compiles, each with its figures.
  progress = [ln for ln in run.stdout.splitlines() if re.match(r'compile \d+/8: ', ln)]
  assert progress and all(re.fullmatch(
      r'compile \d/8: global batch \d+: [\d.]+ MiB per device, (fits|does not fit) \(\d+s\)',
      ln) for ln in progress), progress


def search(limit_mib, max_compiles=8, **overrides):
  """A BatchSearch of the one-block tiny recipe on this process's 8 CPU devices."""
  config = tiny_config(**{'model.num_layers': 1, **overrides})
  return planner.BatchSearch(config, 'cpu', 1000, limit_mib * 2**20, max_compiles,
                         log=lambda *a, **k: None)


@pytest.mark.slow
def test_max_batch_finds_the_largest_batch_in_few_compiles():
  s = search(4.0)
  best, proven = s.largest(64 // 8)
  assert proven and best > 0 and best % 8 == 0
  # The answer fits, the next multiple of the 8 devices does not: compiled here on their own.
  config = tiny_config(**{'model.num_layers': 1})
  for size, fits in ((best, True), (best + 8, False)):
    probe = planner._variant(config, batch_size=size)
    figures = planner.compile_steps(probe, jax.devices(), 1000, only_train=True)['train']
    assert (figures['hbm_bytes_per_device'] <= 4 * 2**20) == fits, (size, figures)
  # The line of memory against the batch: few compiles, far fewer than doubling and
  # bisecting from 64 images would take.
  assert s.compiles <= 4, s.figures.keys()


@pytest.mark.slow
def test_max_batch_stops_at_its_cap_and_says_so():
  s = search(64.0, max_compiles=2)  # Far above the start: the cap ends it, unproven.
  best, proven = s.largest(1)
  assert s.compiles == 2 and not proven and best >= 8


@pytest.mark.slow
def test_max_batch_does_not_compile_its_answer_again(monkeypatch):
  compiles = []
  real = jax.stages.Lowered.compile

  def counted(self, *args, **kwargs):
    compiles.append(1)
    return real(self, *args, **kwargs)

  monkeypatch.setattr(jax.stages.Lowered, 'compile', counted)
  lines = []
  config = tiny_config(**{'model.num_layers': 1})
  config, r = planner.largest_batch_report(config, 'cpu', 1000, 4 * 2**20, 8,
                                       log=lambda *a, **k: lines.append(a[0]))
  searched = r['max_batch']['compiles']
  assert len(compiles) == searched + 1  # The search's train steps, then one eval step.
  assert sum(bool(re.match(r'compile \d+/8: ', ln)) for ln in lines) == searched
  assert r['fits'] and r['batch_size'] == config.batch_size == r['max_batch']['batch_size']


def test_flop_units():
  assert [planner.flop(n) for n in (950, 2.5e4, 3.1e6, 356.7e9, 1.2e13, 4e15)] == [
      '950 FLOP', '25.0 kFLOP', '3.1 MFLOP', '356.7 GFLOP', '12.0 TFLOP', '4.0 PFLOP']
  assert planner.ms(0.2681) == '268.1 ms' and planner.ms(3.5e-5) == '35.0 µs'


@pytest.mark.slow
@needs_libtpu
def test_names_per_generation():
  """A v3 device is a core (16 GiB, half a chip), a v5p device a chip: the report says so,
  and prices chip-hours by generation."""
  overrides = json.dumps({'model.dtype': 'bfloat16', 'total_steps': 1000})
  v3 = planner.format_report(probe('report', 'v3-8', overrides)['report'], 'tiny')
  assert 'v3-8 (v3:2x2: 8 x TPU v3 cores, 4 chips)' in v3
  assert re.search(r'\nHBM per device \(core\) +16.00 GiB  fits', v3)
  assert ' v3-chip-hours, ' in v3 and ' v3-core-days' in v3
  r = probe('aot', 'v5p-8', overrides)['report']
  v5p = planner.format_report(r, 'tiny')
  assert r['chip'] == 'TPU v5p' and r['device_is'] == 'chip'
  assert 'v5p-8 (v5:2x2x1: 4 x TPU v5p chips)' in v5p
  assert re.search(r'\nHBM per device \(chip\) +95.00 GiB  fits', v5p)
  assert ' v5p-chip-hours' in v5p and 'core-days' not in v5p and 'TPU v5 ' not in v5p
  # The tiny model's FLOPs a training image, in a unit that shows them.
  flops = r['train_flops_per_image']
  assert 1e6 < flops < 1e9 and f'(model FLOPs: {planner.flop(flops)} a training' in v5p
  assert 'MFLOP' in planner.flop(flops)


@pytest.mark.slow
@pytest.mark.parametrize('flags, message', [
    (['--topology=cpu', '--max_batch'],
     '--max_batch on --topology=cpu needs --memory_per_device=GIB'),
    (['--topology=cpu', '--max_batch_memory=0'], '--memory_per_device=0.0 must be a positive'),
    (['--topology=v3-8', '--memory_per_device=-2'], '--memory_per_device=-2.0 must be'),
    (['--topology=v3-8', '--max_compiles=1'], '--max_compiles=1 must be at least 2'),
    (['--topology=v9-8'], "--topology=v9-8: Unknown TPU slice 'v9-8'. Use Cloud TPU names"),
    (['--topology=v3-7'], '--topology=v3-7: v3-7: v3 slices are named by TensorCores'),
    (['--topology=v4:2x2'], "--topology=v4:2x2: Unknown TPU topology 'v4:2x2'"),
    (['--topology=cpu', '--json=/no/such/folder/plan.json'], '--json=/no/such/folder/plan.json'),
])
def test_bad_flags_are_one_line_before_jax(flags, message):
  run = aot_command(*flags)
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines() == [run.stderr.strip()]  # One line, no libtpu's.
  assert run.stderr.startswith(f'error: {message}')


@pytest.mark.slow
def test_flags_are_checked_without_jax():
  code = ('import sys\nfrom vit_jax.base import errors\nfrom vit_jax.tools import aot\n'
          'try:\n  aot.check_flags("v9-8", None, False, 8, None, None)\n'
          'except errors.UserError as e:\n  print("jax" in sys.modules, e)\n')
  run = subprocess.run([sys.executable, '-c', code], env=env(2), capture_output=True,
                       text=True, timeout=120)
  assert run.stdout.startswith('False --topology=v9-8: Unknown TPU slice'), run.stderr[-2000:]
  for generation in ('v2', 'v3', 'v4', 'v5p', 'v5litepod', 'v6e'):
    assert generation in run.stdout


def _feeding(topology, images_per_second, per_core=None, rates=None, **overrides):
  """tools.feeding's figures for a slice by name, the tiny recipe's config."""
  from vit_jax.base import accelerators
  from vit_jax.tools import feeding

  tpu = accelerators.tpu_slice(topology)
  config = tiny_config(**overrides)
  return feeding.feeding(config, images_per_second, tpu.chip.name, tpu.chips, rates or {},
                         per_core)


def test_feeding_counts_hosts_and_cores_from_the_cloud_tpu_host_facts():
  """Worked by hand from Cloud TPU's hosts: v5p-8 is 4 chips on 1 host of 208 vCPUs; v3-128
  is 64 chips on 16 hosts of 4 chips and 96 vCPUs; v5e's slices of 16 chips are 8-chip VMs
  of 224 vCPUs, its 4-chip slice one VM of 112; v6e's vCPUs are not known here."""
  f = _feeding('v5p-8', 10_365., per_core=100., **{'input_workers': 32})
  assert (f.hosts, f.chips_per_host, f.vcpus_per_host) == (1, 4, 208)
  assert f.per_host == pytest.approx(10_365.)
  assert f.cores_needed == pytest.approx(103.65) and f.keeps_up is True

  f = _feeding('v3-128', 51_017., per_core=25.)
  assert (f.hosts, f.chips_per_host, f.vcpus_per_host) == (16, 4, 96)
  assert f.per_host == pytest.approx(3_188.5625)
  assert f.cores_needed == pytest.approx(127.5425) and f.keeps_up is False

  assert (_feeding('v5litepod-16', 1., 1.).hosts, _feeding('v5litepod-16', 1., 1.).vcpus_per_host
          ) == (2, 224)
  assert (_feeding('v5litepod-4', 1., 1.).hosts, _feeding('v5litepod-4', 1., 1.).vcpus_per_host
          ) == (1, 112)
  f = _feeding('v6e-256', 256_000., per_core=100.)
  assert (f.hosts, f.vcpus_per_host, f.keeps_up) == (32, None, None)
  assert f.cores_needed == pytest.approx(80.)


def test_feeding_lines_warn_where_the_host_cannot_keep_up():
  from vit_jax.tools import feeding

  pipeline = 'decode|inception_crop(224)|flip_lr|value_range(-1, 1)'
  fits = feeding.report_lines(_feeding('v5p-8', 10_365., per_core=100.), pipeline, 'v5p', False)
  assert re.search(r'host cores needed +103\.7  of 208 vCPUs per v5p host', '\n'.join(fits))
  assert not any(line.startswith('WARNING') for line in fits)
  # input_workers (2 in the tiny recipe) caps the cores the loader uses.
  assert fits[-1].startswith('note: config.input_workers=2 loader threads per host')

  short = feeding.report_lines(_feeding('v3-128', 51_017., per_core=25.), pipeline, 'v3', True)
  text = '\n'.join(short)
  assert re.search(r'hosts in the slice +16  \(4 chips per host\)', text)
  assert re.search(r'images/s per host +3,189\n', text)
  assert 'mixup/CutMix' in text  # On the chips: said, not counted.
  assert ('WARNING: the hosts cannot keep up: each needs 128 cores for 3,189 images/s but has '
          '96 vCPUs, at most 2,400 images/s (75% of the step\'s rate)') in text

  unknown = feeding.report_lines(_feeding('v5p-8', 10_365.), pipeline, 'v5p', False)
  assert unknown[-1].startswith('WARNING: no input rate measured for this pipeline')


def test_feeding_finds_the_measured_rate_of_the_configs_pipeline(tmp_path):
  """The rates file is keyed by the pipeline string (whitespace aside), not by config file."""
  from vit_jax.tools import feeding

  pipeline = "decode|inception_crop(224)|flip_lr|randaug(2, 15)|value_range(-1, 1)"
  rates = tmp_path / 'rates.json'
  rates.write_text(json.dumps({'pipelines': {feeding.pipeline_key(pipeline): {
      'pipeline': pipeline, 'images_per_second_per_core': 250., 'cores_measured': '1/2',
      'data_name': 'imagenette_224 (train)'}}}))
  config = tiny_config(**{'dataset.pp_train': pipeline.replace('|', ' | ')})
  names = types.SimpleNamespace(per_core=types.SimpleNamespace(value=None),
                                rates=types.SimpleNamespace(value=str(rates)))
  report = {'libtpu_topology': 'v3:8x8', 'topology': 'v3-128', 'images_per_second': 51_017.}
  fed = feeding.check(config, report, names)
  assert fed['images_per_second_per_core'] == 250. and fed['hosts'] == 16
  assert fed['host_cores_needed'] == pytest.approx(51_017. / 16 / 250.)
  assert fed['keeps_up'] is True and 'imagenette_224 (train)' in fed['rate_source']
  # Another pipeline: not measured, said so.
  other = tiny_config(**{'dataset.pp_train': 'decode|inception_crop(224)|value_range(-1, 1)'})
  assert feeding.check(other, report, names)['images_per_second_per_core'] is None
  assert feeding.check(config, {'libtpu_topology': None}, names) is None  # cpu: no slice.


@pytest.mark.slow
@needs_libtpu
def test_command_line_says_whether_the_hosts_feed_the_slice(tmp_path):
  """aot on a v5p-8 with a per-core rate given too small for any host: the feeding lines and
  the warning, and the same figures in the JSON."""
  out = tmp_path / 'plan.json'
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}', '--topology=v5p-8',
       '--host_images_per_core=1', f'--json={out}', '--config.model.num_layers=1',
       '--config.batch_size=64', '--config.eval_batch_size=64'],
      env=env(8), capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  r = json.loads(out.read_text())
  fed = r['feeding']
  assert (fed['hosts'], fed['vcpus_per_host'], fed['keeps_up']) == (1, 208, False)
  assert fed['host_cores_needed'] == pytest.approx(r['images_per_second'])  # 1 image/s a core.
  assert re.search(r'hosts in the slice +1  \(4 chips per host\)', run.stdout)
  assert 'WARNING: the hosts cannot keep up' in run.stdout


@pytest.mark.slow
@pytest.mark.parametrize('flag, message', [
    ('--host_images_per_core=0', '--host_images_per_core=0.0 must be positive'),
    ('--input_rates=/nonexistent/rates.json', '--input_rates=/nonexistent/rates.json is not a '
     'file of input rates'),
    (f'--input_rates={QUICKSTART}', f'--input_rates={QUICKSTART} is not a file of input rates'),
])
def test_bad_input_rate_flags_are_refused_first(flag, message):
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.aot', f'--config={QUICKSTART}', '--topology=cpu',
       flag], env=env(2), capture_output=True, text=True, timeout=120)
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1].startswith(f'error: {message}')


def test_aot_lowers_a_packed_naflex_run_for_the_batches_its_loader_gives():
  """A NaFlex run with NaViT packing is planned on the patch sequences its loader gives the
  step (packed rows of seq_len tokens; each image's own sequence to evaluate), not images."""
  pp = 'to_rgb|naflex(4, 4)|value_range(-1, 1)'
  config = tiny_config(**{'dataset.pp_train': pp, 'dataset.pp_eval': pp, 'model.pool': 'gap',
                          'packing.images_per_row': 2, 'packing.seq_len': 8})
  _, lowered = planner.lower_steps(config, jax.devices(), 1000)
  batch = lowered['train'].args_info[0][1]
  rows = config.batch_size // 2
  assert {k: v.shape for k, v in batch.items()} == {
      'image': (rows, 8, 48), 'patch_coords': (rows, 8, 2), 'patch_mask': (rows, 8),
      'segment_ids': (rows, 8), 'patch_grid': (rows, 2, 2), 'image_mask': (rows, 2),
      'label': (rows, 2, 10)}
  evaluated = lowered['eval'].args_info[0][1]
  assert evaluated['image'].shape == (config.eval_batch_size, 4, 48)
