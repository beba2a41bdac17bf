r"""Training throughput and MFU of the real train step, on the devices of this machine.

    python -m benchmarks.train --model=ti16 --batch_size=32 --out=results/train.json
    python -m benchmarks.train --model=ti16 --batch_size=32 \
        --sweep=dtype=float32,bfloat16 --sweep=attention=einsum,xla

Each cell (one combination of options) runs in its own process and times
``vit_jax.training.step.make_train_step`` on random images already on the devices: compile
time, median step time, model and XLA FLOPs, MFU over the run's best measured matmul peak,
memory, page faults. ``--big_vision=PATH`` (a checkout) and ``--timm_python=PATH`` add
big_vision's and timm's step of the same model as cells of the same run. Every column, and
the results: results/RESULTS.md ("Training step").
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import resource
import shutil
import sys
import time
from typing import Any

from absl import app, flags

from benchmarks import results, timm_step
from vit_jax.base import paths
from vit_jax.base.cpu import host_cpu, host_memory
from vit_jax.training import mfu

DTYPES = ('float32', 'bfloat16')
SWEEP_KEYS = ('dtype', 'matmul_dtype', 'attention', 'remat', 'scan', 'batch_size',
              'cpu_devices', 'step_impl', 'xla_flags', 'malloc')

_MODEL = flags.DEFINE_string('model', 'ti16', 'Model name (vit_jax.models).')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', 224, 'Input resolution.')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Global batch size.')
_DTYPE = flags.DEFINE_string('dtype', 'float32', 'Compute dtype: float32 or bfloat16.')
_MATMUL_DTYPE = flags.DEFINE_string('matmul_dtype', 'none', 'Matmul operand dtype with float32 '
                                    'accumulation (bfloat16), or none: the compute dtype.')
_ATTENTION = flags.DEFINE_string('attention', 'auto', 'Attention: auto (cuDNN on NVIDIA GPUs '
                                 'where it applies, else einsum), einsum, xla or cudnn.')
_REMAT = flags.DEFINE_string('remat', 'none', 'Rematerialisation policy of the blocks.')
_SCAN = flags.DEFINE_bool('scan', False, 'nn.scan over the blocks.')
_CPU_DEVICES = flags.DEFINE_integer('cpu_devices', 0, 'Split a CPU host into this many devices '
                                    '(vit_jax.main --cpu_devices); 0: jax\'s default.')
_STEP_IMPL = flags.DEFINE_string('step_impl', 'jit', 'jit or shard_map.')
_XLA_FLAGS = flags.DEFINE_string('xla_flags', '', 'Extra XLA_FLAGS for the cell ("none": '
                                 'none), space-separated.')
_MALLOC = flags.DEFINE_enum('malloc', 'as_main', ('as_main', *host_memory.MODES),
                            'glibc malloc tunables of the cell: vit_jax.main\'s VIT_JAX_MALLOC '
                            '(vit_jax.base.cpu.host_memory); as_main: what vit_jax.main picks for '
                            'the cell\'s cpu_devices (keep_freed for 2 or more, else huge_pages).')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps per cell.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps after compilation.')
_PEAK_SIZE = flags.DEFINE_integer('peak_size', 0, 'n of the n x n peak matmul (0: 2048 on '
                                  'CPU, 8192 on accelerators).')
_PEAK_REPEATS = flags.DEFINE_integer('peak_repeats', 10, 'Matmuls timed for the peak.')
_SWEEP = flags.DEFINE_multi_string(
    'sweep', [], 'KEY=V1,V2,...: run every combination of these values (keys: dtype, '
    'matmul_dtype, attention, remat, scan, batch_size, cpu_devices, step_impl, xla_flags, '
    'malloc).')
_BIG_VISION = paths.DEFINE_path('big_vision', '', 'A big_vision checkout: adds its ViT '
                                 '(dtype_mm=bfloat16) in the same step as a cell.')
_TIMM_PYTHON = flags.DEFINE_string(
    'timm_python', '', 'A Python with torch, torchvision and timm: adds timm\'s train step '
    'of the same model to the run (benchmarks.timm_step), one cell per '
    '--timm_autocast, and a "vs timm" column.')
_TIMM_AUTOCAST = flags.DEFINE_list('timm_autocast', ['none'],
                                   'timm cells: none (float32) and/or bfloat16 autocast.')
_OUT = paths.DEFINE_path('out', '', 'JSON file for the results.')
_CELL = flags.DEFINE_string('cell', '', 'Internal: one cell as JSON, measured in this process.')


def _memory(compiled: Any, device: Any) -> dict[str, int | None]:
  stats = device.memory_stats() or {}
  analysis = compiled.memory_analysis()
  sizes = {}
  for name in ('argument_size_in_bytes', 'output_size_in_bytes', 'temp_size_in_bytes',
               'generated_code_size_in_bytes'):
    sizes[name] = getattr(analysis, name, None) if analysis is not None else None
  return {'peak_bytes_in_use': stats.get('peak_bytes_in_use'), **sizes}


def measure(cell: dict[str, Any]) -> dict[str, Any]:
  """Measures one cell in this process; returns its row of the results."""
  import jax
  import ml_collections
  import numpy as np

  from vit_jax.base import accelerators, sharding
  from vit_jax.models import get_model
  from vit_jax.training import optim
  from vit_jax.training import step as train_step

  if cell['cpu_devices']:
    jax.config.update('jax_num_cpu_devices', cell['cpu_devices'])
  devices = jax.devices()
  backend = jax.default_backend()
  n = cell['peak_size'] or (2048 if backend == 'cpu' else 8192)
  peaks = {dtype: mfu.matmul_peak(dtype, n, cell['peak_repeats']) for dtype in DTYPES}

  if cell['framework'] == 'big_vision':
    from benchmarks import big_vision

    model = big_vision.vit(cell['path'], cell['model'], cell['image_size'])
  else:
    model = get_model(cell['model'], num_classes=1000, image_size=cell['image_size'],
                      dtype=cell['dtype'], attention_impl=cell['attention'],
                      matmul_dtype=None if cell['matmul_dtype'] == 'none'
                      else cell['matmul_dtype'], remat_policy=cell['remat'], scan=cell['scan'])
  options = train_step.StepOptions(impl=cell['step_impl'])  # Softmax cross-entropy.
  schedule = optim.make_schedule(
      ml_collections.ConfigDict(dict(base_lr=1e-3, warmup_steps=1, decay='cosine')),
      total_steps=1_000_000, warmup_steps=1)
  tx = optim.make_optimizer(ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999, weight_decay=1e-4, grad_clip_norm=1.0)), schedule)
  mesh = sharding.make_mesh(None)
  batch_size = cell['batch_size']
  if batch_size % mesh.size:
    raise ValueError(f'--batch_size={batch_size} is not divisible by the {mesh.size} devices.')
  state, shardings = train_step.create_train_state(model, tx, 0, mesh)
  step = train_step.make_train_step(model, tx, schedule, options, mesh, shardings)

  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (batch_size, *model.image_size, 3)).astype(np.float32)
  labels = np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, batch_size)]
  batch = jax.device_put({'image': images, 'label': labels}, sharding.batch_sharding(mesh))

  start = time.perf_counter()
  lowered = step.lower(state, batch)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start

  for _ in range(cell['warmup']):
    state, metrics = compiled(state, batch)
  jax.block_until_ready((state, metrics))
  times = []
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(cell['steps']):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  if not np.isfinite(float(metrics['loss'])):
    raise FloatingPointError(f'Non-finite loss in cell {cell}.')

  step_s = float(np.median(times))
  images_per_s = batch_size / step_s
  analytic = mfu.analytic_train_flops(model)
  xla_flops = mfu.cost(compiled).get('flops')  # Of one device's share of the step.
  xla_per_image = xla_flops * len(devices) / batch_size if xla_flops else None
  flops_per_image = mfu.train_flops_per_image(model, compiled, len(devices), batch_size)
  achieved = flops_per_image * images_per_s if flops_per_image else None
  return {
      **cell,
      'backend': backend, 'device_kind': devices[0].device_kind, 'devices': len(devices),
      'peak_flops_float32': peaks['float32'], 'peak_flops_bfloat16': peaks['bfloat16'],
      'published_peak_flops_bfloat16': accelerators.peak_bf16_flops(devices[0].device_kind),
      'peak_matmul_size': n,
      'compile_s': compile_s, 'step_s_median': step_s, 'step_s_all': times,
      'images_per_s': images_per_s, 'images_per_s_per_device': images_per_s / len(devices),
      'analytic_flops_per_image': analytic, 'xla_flops_per_image': xla_per_image,
      'analytic_flops_all_tokens_per_image': mfu.analytic_train_flops(model, all_tokens=True),
      'xla_over_analytic': (xla_per_image / analytic) if analytic and xla_per_image else None,
      'achieved_flops': achieved,  # MFU: in main(), over the best peak of all cells.
      'memory': _memory(compiled, devices[0]),
      # Host memory faulted in per step and the process's peak (vit_jax.base.cpu.host_memory),
      # and the glibc tunables in force.
      'page_faults_per_step': faults / cell['steps'],
      'max_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      'glibc_tunables': os.environ.get('GLIBC_TUNABLES', ''),
      'loss': float(metrics['loss']),
  }


def _bool(value: str) -> bool:
  return value.lower() in ('1', 'true')


def cells_from_flags() -> list[dict[str, Any]]:
  """The cells of this run: the flags' values, crossed with every --sweep, then big_vision's
  and timm's."""
  base = dict(framework='vit_jax', model=_MODEL.value, image_size=_IMAGE_SIZE.value,
              batch_size=_BATCH.value, dtype=_DTYPE.value, matmul_dtype=_MATMUL_DTYPE.value,
              attention=_ATTENTION.value, remat=_REMAT.value, scan=_SCAN.value,
              cpu_devices=_CPU_DEVICES.value, step_impl=_STEP_IMPL.value,
              xla_flags=_XLA_FLAGS.value, malloc=_MALLOC.value, steps=_STEPS.value,
              warmup=_WARMUP.value, peak_size=_PEAK_SIZE.value,
              peak_repeats=_PEAK_REPEATS.value)
  axes = []
  for item in _SWEEP.value:
    key, _, values = item.partition('=')
    if key not in SWEEP_KEYS or not values:
      raise app.UsageError(f'--sweep={item!r}: expected KEY=V1,V2,... with KEY one of '
                           f'{SWEEP_KEYS}.')
    parse = {'batch_size': int, 'cpu_devices': int,
             'scan': _bool}.get(key, str)
    if key == 'malloc' and not set(values.split(',')) <= set(host_memory.MODES):
      raise app.UsageError(f'--sweep={item!r}: malloc takes {host_memory.MODES}.')
    axes.append([(key, parse(v)) for v in values.split(',')])
  cells = [{**base, **dict(combo)} for combo in itertools.product(*axes)]
  if _BIG_VISION.value:
    from benchmarks import big_vision

    if why := big_vision.not_a_checkout(_BIG_VISION.value):
      raise app.UsageError(why)
    cells.append({**base, 'framework': 'big_vision', 'path': _BIG_VISION.value,
                  'dtype': 'float32', 'matmul_dtype': 'bfloat16', 'attention': 'einsum'})
  for cell in cells:  # Recorded as the mode itself.
    if cell['malloc'] == 'as_main':
      cell['malloc'] = host_memory.default_mode(cell['cpu_devices'])
  if _TIMM_PYTHON.value:
    if shutil.which(_TIMM_PYTHON.value) is None:
      raise app.UsageError(f'--timm_python={_TIMM_PYTHON.value}: no such executable; give the '
                           'python of a venv with torch, torchvision and timm.')
    try:
      timm_model = timm_step.timm_name(_MODEL.value)
    except ValueError as e:
      raise app.UsageError(f'--timm_python: {e}') from None
    for autocast in _TIMM_AUTOCAST.value:
      if autocast not in timm_step.AUTOCASTS:
        raise app.UsageError(f'--timm_autocast={autocast!r}: expected {timm_step.AUTOCASTS}.')
      cells.append(dict(framework='timm', model=_MODEL.value, timm_model=timm_model,
                        autocast=autocast, python=_TIMM_PYTHON.value,
                        image_size=_IMAGE_SIZE.value, batch_size=_BATCH.value,
                        steps=_STEPS.value, warmup=_WARMUP.value))
  return cells


def label(cell: dict[str, Any], varying: list[str]) -> str:
  """The options that tell this cell from the others of its sweep."""
  if cell['framework'] == 'timm':
    return f'timm autocast={cell["autocast"]}'
  if cell['framework'] == 'big_vision':
    return 'big_vision dtype_mm=bfloat16'
  return ' '.join(f'{k}={cell[k]}' for k in varying) or cell['dtype']


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
  """Measures ``cell`` in a fresh process of its own; returns its row. vit_jax's runs with the
  cell's XLA flags and glibc tunables, timm's with glibc's defaults, as its users run it."""
  env = host_memory.without_tuning(os.environ)
  if cell['framework'] == 'timm':
    command = [cell['python'], timm_step.__file__, f'--model={cell["timm_model"]}',
               f'--image_size={cell["image_size"]}', f'--batch_size={cell["batch_size"]}',
               f'--steps={cell["steps"]}', f'--warmup={cell["warmup"]}',
               f'--cell={cell["autocast"]}']
  else:
    extra = '' if cell['xla_flags'] in ('', 'none') else cell['xla_flags']
    env['XLA_FLAGS'] = f'{env.get("XLA_FLAGS", "")} {extra}'.strip()
    env.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    env = host_memory.tuned_environ(env, host_memory.glibc_version(), host_memory.thp_mode(),
                                    cell['malloc']) or env
    command = [sys.executable, '-m', 'benchmarks.train', f'--cell={json.dumps(cell)}']
  return {**cell, **results.run_cell(command, f'cell {cell}', env)}


def matmul_precision(row: dict[str, Any]) -> str:
  """'bfloat16' where a jax row's products take bfloat16 operands (``dtype`` or
  ``matmul_dtype``; float32 accumulation either way), else 'none': timm's autocast names."""
  return 'bfloat16' if 'bfloat16' in (row['dtype'], row['matmul_dtype']) else 'none'


def compare_with_timm(rows: list[dict[str, Any]]) -> None:
  """Gives timm's rows the model FLOPs of the same model with every token computed (timm's
  last block computes them all), and every other row its images/s over timm's with the
  same matmul precision (``matmul_precision`` == autocast)."""
  jax_rows = [r for r in rows if r['framework'] != 'timm']
  timm = {r['autocast']: r for r in rows if r['framework'] == 'timm'}
  flops = jax_rows[0]['analytic_flops_all_tokens_per_image']
  for r in timm.values():
    r.update(devices=1, images_per_s_per_device=r['images_per_s'],
             analytic_flops_per_image=flops, xla_flops_per_image=None,
             achieved_flops=flops * r['images_per_s'] if flops else None)
  for r in jax_rows:
    reference = timm.get(matmul_precision(r))
    r['vs_timm'] = r['images_per_s'] / reference['images_per_s'] if reference else None


def format_table(rows: list[dict[str, Any]], varying: list[str]) -> str:
  """The results as a fixed-width table, one row per cell."""
  def num(value: float | None, fmt: str, unit: str = '') -> str:
    return 'n/a' if value is None else format(value, fmt) + unit

  def percent(value: float | None, width: int) -> str:
    return f'{num(value and 100 * value, ".1f", "%"):>{width}}'

  with_timm = any(r['framework'] == 'timm' for r in rows)
  with_published = any(r['mfu_published_bfloat16'] for r in rows)
  labels = [label(r, varying).replace('--xla_cpu_', '') for r in rows]
  width = max(len(x) for x in labels + ['cell']) + 2
  header = (f'{"cell":{width}}{"compile s":>10}{"step ms":>9}{"img/s":>8}{"img/s/dev":>10}'
            f'{"GFLOP/img":>10}{"XLA/model":>10}{"TFLOP/s":>9}{"MFU f32":>8}{"MFU bf16":>9}'
            + (f'{"MFU pub":>8}' if with_published else '')
            + f'{"peak mem":>10}{"faults/step":>12}{"host RSS":>10}'
            + (f'{"vs timm":>9}' if with_timm else ''))
  lines = [header]
  for name, r in zip(labels, rows, strict=True):
    flops = r['analytic_flops_per_image'] or r['xla_flops_per_image']
    memory = r.get('memory', {})
    memory = memory.get('peak_bytes_in_use') or memory.get('temp_size_in_bytes')
    lines.append(
        f'{name:{width}}{num(r.get("compile_s"), ".1f"):>10}{1e3 * r["step_s_median"]:>9.1f}'
        f'{r["images_per_s"]:>8.1f}{r["images_per_s_per_device"]:>10.1f}'
        f'{num(flops and flops / 1e9, ".2f"):>10}{num(r.get("xla_over_analytic"), ".3f"):>10}'
        f'{num(r["achieved_flops"] and r["achieved_flops"] / 1e12, ".3f"):>9}'
        f'{percent(r["mfu_float32"], 8)}{percent(r["mfu_bfloat16"], 9)}'
        + (percent(r['mfu_published_bfloat16'], 8) if with_published else '') +
        f'{num(memory and memory / 2**20, ".0f", " MiB"):>10}{r["page_faults_per_step"]:>12.0f}'
        f'{r["max_rss_bytes"] / 2**20:>6.0f} MiB'
        + (f'{num(r.get("vs_timm"), ".2f", "x"):>9}' if with_timm else ''))
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  del argv
  if _CELL.value:
    print(json.dumps(measure(json.loads(_CELL.value))))
    return
  load = os.getloadavg()  # Other work on the machine skews every figure: recorded.
  cpu = host_cpu.cpu_info()
  cells = cells_from_flags()
  varying = [k for k in SWEEP_KEYS
             if len({str(c[k]) for c in cells if c['framework'] == 'vit_jax'}) > 1]
  rows, failed = [], []
  for i, cell in enumerate(cells):
    print(f'[{i + 1}/{len(cells)}] {label(cell, varying)} ...', flush=True)
    try:
      rows.append(run_cell(cell))
    except RuntimeError as e:  # The other cells still run (an out-of-memory batch, say).
      print(e, file=sys.stderr, flush=True)
      failed.append({**cell, 'error': str(e)})
  jax_rows = [r for r in rows if r['framework'] != 'timm']
  if not jax_rows:
    sys.exit(f'error: every jax cell failed ({len(failed)}); their errors are above.')
  compare_with_timm(rows)
  # One denominator for the whole table: the best peak of all devices together that
  # any cell measured (XLA flags can speed up the matmul too, and MFU must not rise
  # merely because the peak fell).
  peaks = {dtype: max(r[f'peak_flops_{dtype}'] * r['devices'] for r in jax_rows)
           for dtype in DTYPES}
  first = jax_rows[0]
  published = first['published_peak_flops_bfloat16']
  for r in rows:
    achieved = r['achieved_flops']
    for dtype in DTYPES:
      r[f'mfu_{dtype}'] = achieved / peaks[dtype] if achieved else None
    r['mfu_published_bfloat16'] = (achieved / (published * r['devices'])
                                   if achieved and published else None)
  devices = sorted({r['devices'] for r in jax_rows})
  print(f'\n{first["model"]} at {first["image_size"]} px, batch {first["batch_size"]}, on '
        f'{"/".join(map(str, devices))} x {first["device_kind"]} ({first["backend"]}); '
        f'median of {first["steps"]} steps. Peak matmul (n={first["peak_matmul_size"]}, '
        f'best of the cells, all devices together): float32 {peaks["float32"] / 1e9:.0f} '
        f'GFLOP/s, bfloat16 {peaks["bfloat16"] / 1e9:.0f} GFLOP/s. MFU: model FLOPs '
        '(3 x forward, 2 per multiply-add) per second over that peak'
        + (f'; "MFU pub": over the published bfloat16 peak, {published / 1e12:.0f} TFLOP/s a '
           'device' if published else '') + '.\n'
        f'CPU: {host_cpu.describe(cpu)}')
  print(format_table(rows, varying))
  for cell in failed:
    print(f'{label(cell, varying)}: failed (its error is above)')
  if _OUT.value:
    results.write(_OUT.value, 'benchmarks.train', cpu, load,
                  peak_flops_all_devices=peaks, machine=platform.machine(),
                  cpus=os.cpu_count(), cells=rows, failed=failed)
  if failed:
    sys.exit(1)


if __name__ == '__main__':
  from vit_jax.base import errors

  errors.run(main)  # Flag mistakes and user errors as one line, exit status 2.
