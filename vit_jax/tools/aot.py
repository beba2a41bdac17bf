r"""Plan a run before renting the slice: compile its steps for a TPU topology, here.

    python -m vit_jax.tools.aot --config=configs/vit_l16_i21k.py --topology=v3-128
    python -m vit_jax.tools.aot --config=configs/vit_b16_i1k.py --topology=v4-32 \
        --config.batch_size=2048 --json=/tmp/b16.json
    python -m vit_jax.tools.aot --config=configs/quickstart.py --topology=cpu

Builds the train step and the eval step that ``vit_jax.main`` would run for the config
(the same model, optimizer, mesh and shardings; no data is read, only shapes) and
compiles them ahead of time for the named Cloud TPU slice with libtpu, no TPU attached
(``pip install -e ".[tpu]"``). The compiled program says how much HBM each device needs
(exact buffer assignment) and, from the TPU compiler's cost model, how long a step takes;
from these come images/s, MFU against the chip's published bfloat16 peak, and the whole
schedule's cost in chip-hours and core-days. ``--max_batch`` finds the largest global batch
that fits. ``--topology=cpu`` compiles for this host's devices (sizes only: XLA:CPU has no
cost model).

The cost model counts the body of a loop once: the step time of a scanned model
(``model.scan=True``), and the train step's with micro-batches (``grad_accum_steps>1``),
are not estimated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import types
from typing import Any

from absl import app, flags, logging

from vit_jax import errors
from vit_jax.tools import feeding


def _define_flags() -> types.SimpleNamespace:
  """The command line's flags (defined when run as a program, so that the functions below
  can be imported beside other programs' flags)."""
  from vit_jax import config_cli

  names = types.SimpleNamespace(
      feeding=feeding.define_flags(),
      config=config_cli.DEFINE_config('config', 'Training config file.'),
      topology=flags.DEFINE_string(
          'topology', None, 'A Cloud TPU slice (v3-8, v4-32, v5p-128, v5litepod-16, v6e-256), '
          'a libtpu topology (v4:2x2x1), or "cpu" (this host\'s devices).'),
      json=flags.DEFINE_string('json', None, 'Also write the report as JSON to this file.'),
      max_batch=flags.DEFINE_bool('max_batch', False,
                                  'Find the largest global batch that fits.'),
      max_batch_memory=flags.DEFINE_float(
          'max_batch_memory', None, 'With --max_batch: the memory per device (GiB) the train '
          'step may take. Needed on --topology=cpu (XLA:CPU compiles any batch); on a TPU, a '
          'cap below its HBM (default: the HBM, as the compiler decides).'),
      examples=flags.DEFINE_integer(
          'num_train_examples', None, 'Training examples per epoch, for schedules in epochs '
          '(default: the dataset\'s, where it is known here: TRAIN_EXAMPLES).'))
  flags.mark_flags_as_required(['topology'])
  return names


# Training examples of the datasets the shipped configs name, for schedules in epochs.
TRAIN_EXAMPLES = {
    'imagenet2012': 1_281_167,
    # The release's fall11_whole.tar holds 14,197,122 images of 21,841 classes; the converter
    # keeps 2% for validation by default (vit_jax.data.convert --val_fraction).
    'imagenet21k': 13_913_180,
    'cifar10': 50_000, 'cifar100': 50_000, 'oxford_iiit_pet': 3_680, 'oxford_flowers102': 1_020,
}
DAY = 86_400.


def train_examples(config: Any, given: int | None) -> int:
  """Examples in ``dataset.train_split``: ``given``, or the dataset's known size, sliced."""
  if given:
    return given
  total = TRAIN_EXAMPLES.get(config.dataset.name)
  if total is None:
    raise ValueError(f'The size of dataset {config.dataset.name!r} is not known here: pass '
                     '--num_train_examples (or set config.total_steps).')
  import tensorflow_datasets as tfds

  split = config.dataset.train_split  # A TFDS split, sliced as TFDS slices it ('train[:99%]').
  base = re.match(r'\w+', split).group(0)
  info = {base: types.SimpleNamespace(num_examples=total)}
  parts = tfds.core.ReadInstruction.from_spec(split).to_absolute(info)
  return sum((total if i.to is None else i.to) - (i.from_ or 0) for i in parts)


def _examples(config: Any, given: int | None) -> int:
  """Training examples for the config's schedule: ``given``; 0 where ``total_steps`` sets
  it; else the dataset's (``train_examples``)."""
  return given or (0 if config.get('total_steps') else train_examples(config, None))


def _target(topology: str) -> tuple[list, Any]:
  """The devices to compile for and the TPU slice (None for 'cpu': this host's)."""
  import jax

  from vit_jax import accelerators

  if topology == 'cpu':
    return jax.devices('cpu'), None
  tpu = accelerators.tpu_slice(topology)
  return tpu.compile_devices(), tpu


def _oom(error: Exception) -> dict[str, Any] | None:
  """A compile-time out-of-memory error as figures (the HBM required and available); None
  for any other error."""
  text = str(error)
  if 'RESOURCE_EXHAUSTED' not in text and 'HbmOom' not in text:
    return None
  sizes = {k: float(v) * 2**30 for k, v in re.findall(
      r'(required|available)[^(]*\(([\d.]+)G\)', text)}
  return {'fits': False, 'required_bytes': sizes.get('required'),
          'available_bytes': sizes.get('available')}


def _tree_bytes_per_device(tree: Any) -> int:
  import jax

  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def lower_steps(config: Any, devices: list, num_train_examples: int, model: Any = None
                ) -> tuple[dict[str, Any], dict[str, Any]]:
  """The config's train and eval steps as ``vit_jax.main`` builds them, lowered for
  ``devices`` on abstract inputs: (facts about the run, {'train': Lowered, 'eval': Lowered}).

  ``model``: another Linen classifier in the same steps (a benchmark's reference), with
  the config's model's ``image_size``, ``scan`` and ``forward_flops``.
  """
  import jax
  import jax.numpy as jnp

  from vit_jax import evaluate, mfu, optim, sharding, train

  plan = train.validate(config, devices=devices, num_train_examples=num_train_examples)
  config, model, mesh = plan.config, model or plan.model, plan.mesh
  schedule = optim.make_schedule(config.schedule, plan.total_steps, plan.warmup_steps)
  tx = optim.make_optimizer(config.optimizer, schedule)
  state, shardings = train.create_train_state(model, tx, config.seed, mesh,
                                              shard_state=plan.shard_state, abstract=True)
  batch_sharding = sharding.batch_sharding(mesh)

  def batch(size: int, **extra: tuple[int, ...]) -> dict[str, jax.ShapeDtypeStruct]:
    # No classes (masked patch prediction): the loader's (size, 1) placeholder labels.
    shapes = {'image': (size, *model.image_size, 3), 'label': (size, plan.num_classes or 1),
              **extra}
    return {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=batch_sharding)
            for k, v in shapes.items()}

  train_step = train.make_train_step(model, tx, schedule, config, mesh, shardings)
  # Training's own evaluation (the classifier's, or masked patch prediction's).
  eval_step = evaluate.make_evaluator(dataclasses.replace(plan, model=model),
                                      shardings.params).step
  facts = {'total_steps': plan.total_steps, 'num_classes': plan.num_classes,
           'batch_size': config.batch_size, 'eval_batch_size': config.eval_batch_size,
           'params_bytes_per_device': _tree_bytes_per_device(state.params),
           'opt_state_bytes_per_device': _tree_bytes_per_device(state.opt_state),
           # Model FLOPs as the training log and the benchmark count them (vit_jax.mfu).
           'train_flops_per_image': mfu.analytic_train_flops(model),
           'scan': model.scan, 'grad_accum_steps': int(config.grad_accum_steps)}
  eval_batch = batch(config.eval_batch_size, mask=(config.eval_batch_size,))
  return facts, {'train': train_step.lower(state, batch(config.batch_size)),
                 'eval': eval_step.lower(state.params, eval_batch)}


def compiled_figures(compiled: Any, loops: bool) -> dict[str, Any]:
  """What a compiled program says of itself: HBM per device, cost-model time (not where
  the step ``loops``: the cost model counts a loop's body once), FLOPs."""
  from vit_jax import mfu

  memory = compiled.memory_analysis()
  cost = mfu.cost(compiled)
  seconds = cost.get('optimal_seconds')
  return {
      'fits': True,
      'hbm_bytes_per_device': (memory.argument_size_in_bytes + memory.output_size_in_bytes
                               - memory.alias_size_in_bytes + memory.temp_size_in_bytes),
      'argument_bytes': memory.argument_size_in_bytes,
      'output_bytes': memory.output_size_in_bytes, 'alias_bytes': memory.alias_size_in_bytes,
      'temp_bytes': memory.temp_size_in_bytes, 'code_bytes': memory.generated_code_size_in_bytes,
      # libtpu 0.0.52's cost model for TPU v4 returns negative times: none, then.
      'step_seconds': None if loops or not seconds or seconds <= 0 else seconds,
      'cost_model_seconds': seconds,
      'xla_flops_per_device': cost.get('flops')}


def compile_steps(config: Any, devices: list, num_train_examples: int,
                  only_train: bool = False, model: Any = None) -> dict[str, Any]:
  """Compiles the config's steps for ``devices``; the facts and what the compiler says."""
  facts, lowered = lower_steps(config, devices, num_train_examples, model)
  for name in ('train',) if only_train else ('train', 'eval'):
    start = time.perf_counter()
    try:
      loops = facts['scan'] or (name == 'train' and facts['grad_accum_steps'] > 1)
      figures = compiled_figures(lowered[name].compile(), loops)
    except Exception as e:  # noqa: BLE001 - the compiler's out-of-memory is an answer.
      if (figures := _oom(e)) is None:
        raise
    facts[name] = {**figures, 'compile_seconds': time.perf_counter() - start}
  if facts['train_flops_per_image'] is None and facts['train'].get('xla_flops_per_device'):
    # Hybrids: XLA's count of the compiled step (vit_jax.mfu).
    facts['train_flops_per_image'] = (facts['train']['xla_flops_per_device'] * len(devices)
                                      / facts['batch_size'])
  return facts


def report(config: Any, topology: str, num_train_examples: int | None = None) -> dict[str, Any]:
  """Compiles the config for ``topology`` and derives speed, fit and cost (the JSON)."""
  devices, tpu = _target(topology)
  compiled = compile_steps(config, devices, _examples(config, num_train_examples))
  train_ = compiled['train']
  out: dict[str, Any] = {
      'topology': tpu.name if tpu else 'cpu', 'libtpu_topology': tpu and tpu.topology,
      'devices': len(devices), 'device_kind': devices[0].device_kind,
      'chips': tpu.chips if tpu else None, 'cores': tpu.cores if tpu else None,
      **{k: v for k, v in compiled.items() if k not in ('train', 'eval')},
      'hbm_capacity_bytes': tpu.hbm_per_device if tpu else None,
      'fits': train_['fits'] and compiled['eval']['fits'],
      'hbm_bytes_per_device': train_.get('hbm_bytes_per_device'),
      'step_seconds': train_.get('step_seconds'),
      'compile_seconds': train_['compile_seconds'] + compiled['eval']['compile_seconds'],
      'train': train_, 'eval': compiled['eval']}
  step, flops = out['step_seconds'], compiled['train_flops_per_image']
  out.update(dict.fromkeys(('images_per_second', 'images_per_second_per_chip', 'mfu',
                            'run_days', 'chip_hours', 'core_days')))
  if tpu and step:
    images, run = config.batch_size / step, compiled['total_steps'] * step
    out.update({
        'images_per_second': images, 'images_per_second_per_chip': images / tpu.chips,
        'mfu': flops * images / (tpu.peak_flops_per_device * len(devices)) if flops else None,
        'run_days': run / DAY, 'chip_hours': run * tpu.chips / 3600,
        'core_days': run * tpu.cores / DAY})
  return out


def largest_batch(config: Any, topology: str, num_train_examples: int | None,
                  memory_per_device: float | None = None) -> int | None:
  """The largest global batch whose train step fits (bisection over multiples of the
  devices x grad_accum_steps); None if not even the smallest does.

  ``memory_per_device``: bytes a device may use (as the compiler counts them), besides
  the compiler's own out-of-memory; the only limit there is on 'cpu'.
  """
  devices, _ = _target(topology)
  unit = len(devices) * int(config.get('grad_accum_steps') or 1)
  examples = _examples(config, num_train_examples)

  def fits(units: int) -> bool:
    probe = config.copy_and_resolve_references()
    with probe.unlocked():
      probe.batch_size = probe.eval_batch_size = units * unit
    figures = compile_steps(probe, devices, examples, only_train=True)['train']
    ok = figures['fits'] and (memory_per_device is None
                              or figures['hbm_bytes_per_device'] <= memory_per_device)
    logging.info('global batch %d: %s', units * unit, 'fits' if ok else 'does not fit')
    return ok

  return bisect_largest(fits, max(config.batch_size // unit, 1)) * unit or None


def bisect_largest(fits: Any, start: int) -> int:
  """The largest n >= 1 with ``fits(n)`` (0 if none), for a ``fits`` true up to some n:
  doubling from ``start`` until it fails, then bisecting."""
  low, high = 0, start  # fits(low) holds (0 trivially); fits(high) is not known yet.
  while fits(high):
    low, high = high, high * 2
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if fits(mid) else (low, mid)
  return low


def gib(n: float | None) -> str:
  """Bytes for a table: GiB, MiB below one GiB, '-' for none."""
  if n is None:
    return '-'
  return f'{n / 2**30:.2f} GiB' if n >= 2**30 else f'{n / 2**20:.1f} MiB'


def ms(seconds: float | None) -> str:
  """Seconds for a table, in milliseconds; '-' for none."""
  return '-' if seconds is None else f'{1e3 * seconds:.1f} ms'


def format_report(r: dict[str, Any], config_name: str) -> str:
  """The report as a table for the terminal."""
  train_, eval_ = r['train'], r['eval']
  where = (f'{r["topology"]} ({r["libtpu_topology"]}: {r["devices"]} x {r["device_kind"]})'
           if r['libtpu_topology'] else f'this host ({r["devices"]} x {r["device_kind"]})')
  per = lambda b: f'{b} ({b // r["devices"]} per device)'
  lines = [f'{config_name} on {where}',
           f'global batch {per(r["batch_size"])}; eval batch {per(r["eval_batch_size"])}',
           f'{"":28}{"train step":>14}{"eval step":>14}']

  def row(label: str, key: str, fmt=gib) -> None:
    lines.append(f'{label:28}{fmt(train_.get(key)):>14}{fmt(eval_.get(key)):>14}')

  memory = 'HBM' if r['libtpu_topology'] else 'memory'
  if train_['fits']:
    lines.append(f'{memory + " per device":28}{gib(train_["hbm_bytes_per_device"]):>14}'
                 f'{gib(eval_.get("hbm_bytes_per_device")):>14}')
    lines.append(f'{"  parameters":28}{gib(r["params_bytes_per_device"]):>14}'
                 f'{gib(r["params_bytes_per_device"]):>14}')
    lines.append(f'{"  optimizer state":28}{gib(r["opt_state_bytes_per_device"]):>14}')
    row('  temporaries', 'temp_bytes')
    row('program code (apart)', 'code_bytes')
  else:
    row(f'{memory} needed per device', 'required_bytes')
  if r['hbm_capacity_bytes']:
    cap, used = r['hbm_capacity_bytes'], train_.get('hbm_bytes_per_device')
    verdict = (f'fits: {gib(cap - used)} to spare' if r['fits'] and used is not None else
               'DOES NOT FIT' + (f' (the compiler can use {gib(train_.get("available_bytes"))})'
                                 if train_.get('available_bytes') else ''))
    lines.append(f'{"HBM per device (chip)":28}{gib(cap):>14}  {verdict}')
  row('step time (cost model)', 'step_seconds', ms)
  if r.get('images_per_second'):
    lines += [f'{"images/s":28}{r["images_per_second"]:>14,.0f}  '
              f'({r["images_per_second_per_chip"]:,.0f} per chip)']
    if r.get('mfu'):
      lines.append(f'{"MFU (bf16 peak)":28}{100 * r["mfu"]:>13.1f}%  '
                   f'(model FLOPs: {r["train_flops_per_image"] / 1e9:.1f} GFLOP a training '
                   'image)')
    lines.append(f'{"schedule":28}{r["total_steps"]:>14,} steps: {r["run_days"]:.2f} days, '
                 f'{r["chip_hours"]:,.0f} chip-hours, {r["core_days"]:,.1f} '
                 f'{r["device_kind"]}-core-days')
  elif r['libtpu_topology'] and r['scan']:
    lines.append('step time: not estimated for model.scan=True (the cost model counts a '
                 "loop's body once); compile it unrolled (--config.model.scan=False), or, "
                 'where that is too large to compile here, 1 and 2 blocks of it unrolled '
                 '(--config.model.num_layers=1, then 2) and extrapolate.')
  elif r['libtpu_topology'] and (train_.get('cost_model_seconds') or 1) <= 0:
    lines.append(f'step time: the cost model of this libtpu gives none for {r["device_kind"]} '
                 f'(it answers {train_.get("cost_model_seconds")} s); try another generation.')
  elif r['libtpu_topology'] and r['grad_accum_steps'] > 1:
    k = r['grad_accum_steps']
    lines.append(f'train step time: not estimated for grad_accum_steps={k} (the cost model '
                 "counts a loop's body once); one micro-batch's is about 1/k of it: "
                 f'--config.grad_accum_steps=1 --config.batch_size={r["batch_size"] // k}.')
  lines.append(f'{"compile time":28}{train_["compile_seconds"]:>13.0f}s'
               f'{eval_["compile_seconds"]:>13.0f}s')
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  topology = _FLAGS.topology.value.strip().lower()
  if topology != 'cpu':
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # Never this host's TPU: only libtpu's compiler.
    import importlib.util

    if importlib.util.find_spec('libtpu') is None:
      raise errors.UserError('compiling for a TPU needs libtpu: pip install -e ".[tpu]" (or '
                             'use --topology=cpu).')
  feeding.check_flags(_FLAGS.feeding)
  limit = _FLAGS.max_batch_memory.value
  if limit is not None and (not _FLAGS.max_batch.value or limit <= 0):
    raise errors.UserError(f'--max_batch_memory={limit} is for --max_batch, and positive '
                           '(GiB per device).')
  if _FLAGS.max_batch.value and topology == 'cpu' and limit is None:
    raise errors.UserError('--max_batch on --topology=cpu needs --max_batch_memory=GIB: '
                           'XLA:CPU compiles any batch, so nothing else bounds it.')
  config, examples = _FLAGS.config.value, _FLAGS.examples.value
  if _FLAGS.max_batch.value:
    best = largest_batch(config, topology, examples, limit and limit * 2**30)
    if best is None:
      raise errors.UserError(f'not even the smallest global batch fits on {topology}'
                             + (f' in {limit} GiB per device.' if limit else '.'))
    print(f'Largest global batch that fits on {topology}: {best}.')
    config = config.copy_and_resolve_references()
    with config.unlocked():
      config.batch_size = best
  r = report(config, topology, examples)
  print(format_report(r, _FLAGS.config.file.value))
  if fed := feeding.check(config, r, _FLAGS.feeding):  # Can the hosts feed the chips?
    print('\n'.join(fed['lines']))
    r['feeding'] = fed
  if _FLAGS.json.value:
    from etils import epath

    epath.Path(_FLAGS.json.value).write_text(json.dumps(r, indent=1))


if __name__ == '__main__':
  from vit_jax import config_cli

  _FLAGS = _define_flags()
  config_cli.run(main)
