"""The planner behind ``python -m vit_jax.tools.aot``: a config's train and eval steps compiled
for a TPU slice with libtpu (no TPU attached) or for this host, and what the compiler says of
them (memory per device, the cost model's time), the report (speed, fit, cost), the largest
global batch that fits, what would fit a plan that does not, and their tables. It imports jax:
the command imports it once, after its command line is checked. ``num_train_examples``: the
training examples of a schedule in epochs (``aot.train_examples``), 0 or None where
``total_steps`` sets it."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp

from vit_jax.base import accelerators, console, errors, sharding
from vit_jax.base.sizes import pair
from vit_jax.data import loader
from vit_jax.evals import classification
from vit_jax.evals import mpp as mpp_eval
from vit_jax.training import mfu
from vit_jax.training import plan as plan_lib

DAY = 86_400.
progress_every = 30.  # Seconds between the progress lines of a trace or compile (aot's flag).


def _target(topology: str) -> tuple[list, Any]:
  """The devices to compile for and the TPU slice (None for 'cpu': this host's)."""
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
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def lower_steps(config: Any, devices: list, num_train_examples: int, model: Any = None
                ) -> tuple[dict[str, Any], dict[str, Any]]:
  """The config's train and eval steps as ``vit_jax.main`` builds them, lowered for
  ``devices`` on abstract inputs: (facts about the run, {'train': Lowered, 'eval': Lowered}).

  ``model``: another Linen classifier in the same steps (a benchmark's reference), with
  the config's model's ``image_size``, ``scan`` and ``forward_flops``.
  """
  plan = plan_lib.validate(config, devices=devices, num_train_examples=num_train_examples)
  plan = dataclasses.replace(plan, model=model or plan.model)
  config, model, mesh = plan.config, plan.model, plan.mesh
  state, shardings = plan.train_state(abstract=True)
  batch_sharding = sharding.batch_sharding(mesh)

  def batch(size: int, train: bool, **extra: tuple[int, ...]) -> dict[str, jax.ShapeDtypeStruct]:
    # As the loader gives it: images or patch sequences (packed in training where the run
    # packs); no classes (masked patch prediction): the loader's (size, 1) placeholder labels.
    shapes = loader.batch_shapes(plan.pp_train if train else plan.pp_eval, size,
                                 pair(model.image_size), plan.num_classes or 1,
                                 plan.packing if train else None)
    shapes |= {k: jax.ShapeDtypeStruct(v, jnp.float32) for k, v in extra.items()}
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
            for k, v in shapes.items()}

  options = plan.step_options
  train_step = plan.train_step(shardings)
  # Training's own evaluation (the classifier's, or masked patch prediction's).
  eval_step = (mpp_eval.make_eval_step(model, options.mpp, mesh) if options.mpp else
               classification.make_eval_step(model, config.loss, mesh))
  facts = {'total_steps': plan.total_steps, 'num_classes': plan.num_classes,
           'batch_size': config.batch_size, 'eval_batch_size': config.eval_batch_size,
           'params_bytes_per_device': _tree_bytes_per_device(state.params),
           'opt_state_bytes_per_device': _tree_bytes_per_device(state.opt_state),
           # Model FLOPs as the training log and the benchmark count them (vit_jax.training.mfu).
           'train_flops_per_image': mfu.analytic_train_flops(
               model, teacher=plan.teacher and plan.teacher.model),
           'scan': model.scan, 'grad_accum_steps': int(config.grad_accum_steps)}
  eval_batch = batch(config.eval_batch_size, False, mask=(config.eval_batch_size,))
  return facts, {'train': train_step.lower(state, batch(config.batch_size, True)),
                 'eval': eval_step.lower(state.params, eval_batch)}


def compiled_figures(compiled: Any, loops: bool) -> dict[str, Any]:
  """What a compiled program says of itself: HBM per device, cost-model time (not where
  the step ``loops``: the cost model counts a loop's body once), FLOPs."""
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
                  only_train: bool = False, model: Any = None,
                  compiled: dict[str, Any] | None = None) -> dict[str, Any]:
  """Compiles the config's steps for ``devices``; the facts and what the compiler says.

  ``compiled``: figures of steps already compiled for this config (``{'train': ...}``, as
  ``--max_batch`` keeps its answer's), taken as they are instead of compiling them again.
  """
  target = f'{len(devices)} x {devices[0].device_kind}'
  with console.working(f'aot: tracing the steps of {config.model.name} for {target}',
                       progress_every):
    facts, lowered = lower_steps(config, devices, num_train_examples, model)
  for name in ('train',) if only_train else ('train', 'eval'):
    if compiled and name in compiled:
      facts[name] = compiled[name]
      continue
    start = time.perf_counter()
    try:
      loops = facts['scan'] or (name == 'train' and facts['grad_accum_steps'] > 1)
      with console.working(f'aot: compiling the {name} step of {config.model.name}, batch '
                           f'{facts["batch_size" if name == "train" else "eval_batch_size"]}, '
                           f'for {target}', progress_every):
        program = lowered[name].compile()
      figures = compiled_figures(program, loops)
    except Exception as e:  # noqa: BLE001 - the compiler's out-of-memory is an answer.
      if (figures := _oom(e)) is None:
        raise
    facts[name] = {**figures, 'compile_seconds': time.perf_counter() - start}
  if facts['train_flops_per_image'] is None and facts['train'].get('xla_flops_per_device'):
    # Hybrids: XLA's count of the compiled step (vit_jax.training.mfu).
    facts['train_flops_per_image'] = (facts['train']['xla_flops_per_device'] * len(devices)
                                      / facts['batch_size'])
  return facts


def needed_bytes(figures: dict[str, Any]) -> float | None:
  """The memory per device a compiled step takes, or (out of memory) needs; None: unknown."""
  return figures.get('hbm_bytes_per_device') if figures['fits'] else figures.get(
      'required_bytes')


def within(figures: dict[str, Any], limit: float | None) -> bool:
  """Whether a compiled step fits: the compiler placed it, in ``limit`` bytes per device."""
  return figures['fits'] and (limit is None or figures['hbm_bytes_per_device'] <= limit)


def report(config: Any, topology: str, num_train_examples: int | None = None,
           memory_per_device: float | None = None,
           compiled: dict[str, Any] | None = None) -> dict[str, Any]:
  """Compiles the config for ``topology`` and derives speed, fit and cost (the JSON).

  ``memory_per_device``: bytes a device may use (as the compiler counts them) for the plan
  to fit, besides the compiler's own out-of-memory; the only limit there is on 'cpu'.
  ``compiled``: steps already compiled (``compile_steps``).
  """
  devices, tpu = _target(topology)
  compiled = compile_steps(config, devices, num_train_examples or 0,
                           compiled=compiled)
  train_ = compiled['train']
  limit = memory_per_device
  out: dict[str, Any] = {
      'topology': tpu.name if tpu else 'cpu', 'libtpu_topology': tpu and tpu.topology,
      'devices': len(devices), 'device_kind': devices[0].device_kind,
      # The generation as Cloud TPU's documents name it (v5e: the v5litepod's); what one JAX
      # device is: a 'core' (v2, v3: two a chip) or a 'chip' (v4, v5p: megacore; v5e, v6e).
      'chip': f'TPU {({"v5litepod": "v5e"}).get(tpu.chip.name, tpu.chip.name)}' if tpu else None,
      'device_is': ('core' if tpu.chip.devices > 1 else 'chip') if tpu else None,
      'chips': tpu.chips if tpu else None, 'cores': tpu.cores if tpu else None,
      **{k: v for k, v in compiled.items() if k not in ('train', 'eval')},
      'hbm_capacity_bytes': tpu.hbm_per_device if tpu else None,
      'memory_limit_bytes': limit,
      'fits': within(train_, limit) and within(compiled['eval'], limit),
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


class BatchSearch:
  """The largest global batch whose train step fits, in few compiles, each one logged.

  Memory per device grows about linearly with the batch: the parameters and optimizer
  state, plus activations per example. The first estimate of the slope comes from one
  compile and the state's size (``lower_steps``); then the line through the compiles
  nearest the limit proposes the next batch, inside the bounds the compiles have set (the
  largest that fits, the smallest that does not); where the line is of no help (three
  compiles in a row on the same side, no memory figure), the interval is bisected.
  Batches are multiples of the devices that split the batch times ``grad_accum_steps``
  ("units"). At most
  ``max_compiles`` compiles; every compiled train step is kept (``figures``), so the answer
  is never compiled twice.
  """
  def __init__(self, config: Any, topology: str, num_train_examples: int | None,
               memory_per_device: float | None, max_compiles: int,
               log: Any = print) -> None:
    self.config, self.limit, self.max_compiles, self.log = (
        config, memory_per_device, max_compiles, log)
    self.devices, self.tpu = _target(topology)
    split = len(self.devices) // int(config.mesh.tensor)
    self.unit = split * int(config.get('grad_accum_steps') or 1)
    self.examples = num_train_examples or 0
    self.figures: dict[int, dict[str, Any]] = {}  # Units -> the train step's figures.
    self.state_bytes: float | None = None  # Parameters and optimizer state per device.
    self.compiles, self.start = 0, time.perf_counter()

  def ok(self, units: int) -> bool:
    return within(self.figures[units], self.limit)

  def compile(self, units: int) -> bool:
    """Compiles the train step at ``units`` x ``unit`` images (logged); whether it fits."""
    probe = self.config.copy_and_resolve_references()
    with probe.unlocked():
      probe.batch_size = units * self.unit
    facts = compile_steps(probe, self.devices, self.examples, only_train=True)
    self.state_bytes = facts['params_bytes_per_device'] + facts['opt_state_bytes_per_device']
    self.compiles += 1
    self.figures[units] = facts['train']
    memory = needed_bytes(facts['train'])
    self.log(f'compile {self.compiles}/{self.max_compiles}: global batch {units * self.unit}: '
             f'{gib(memory)} per device, {"fits" if self.ok(units) else "does not fit"} '
             f'({time.perf_counter() - self.start:.0f}s)', flush=True)
    return self.ok(units)

  def bounds(self) -> tuple[int, int | None]:
    """The largest units known to fit (0: none), the smallest known not to (None: none)."""
    good = [n for n in self.figures if self.ok(n)]
    bad = [n for n in self.figures if not self.ok(n)]
    return max(good, default=0), min(bad, default=None)

  def cap(self) -> float | None:
    """The bytes a device may use: the limit given, or the least the compiler said it had."""
    said = [f['available_bytes'] for f in self.figures.values() if f.get('available_bytes')]
    caps = [c for c in (self.limit, self.tpu and self.tpu.hbm_per_device, *said) if c]
    return min(caps, default=None)

  def line(self) -> tuple[float, float] | None:
    """(bytes at 0 units, bytes per unit) through the two compiles nearest the bounds, or
    through one compile and the parameters and optimizer state; None: no memory known."""
    known = sorted((n, needed_bytes(f)) for n, f in self.figures.items()
                   if needed_bytes(f) is not None)
    if not known:
      return None
    low, high = self.bounds()
    near = sorted(known, key=lambda p: min(abs(p[0] - low), abs(p[0] - (high or low))))[:2]
    if len(near) == 2 and near[0][0] != near[1][0]:
      (n0, m0), (n1, m1) = near
      slope = (m1 - m0) / (n1 - n0)
      if slope > 0:
        return m0 - slope * n0, slope
    n0, m0 = known[-1]
    base = min(self.state_bytes or 0., m0)
    return (base, (m0 - base) / n0) if m0 > base else None

  def next_units(self, sides: list[bool]) -> int:
    """The next batch to compile (units), strictly between the bounds."""
    low, high = self.bounds()
    line, cap = self.line(), self.cap()
    # The line approaching from one side only (three compiles alike): bisect instead.
    stuck = len(sides) >= 3 and len(set(sides[-3:])) == 1
    if line and cap and not (stuck and high is not None):
      guess = math.floor((cap - line[0]) / line[1])
    elif high is None:
      guess = 2 * max(low, 1)
    else:
      guess = (low + high) // 2
    guess = max(guess, low + 1)
    return guess if high is None else min(guess, high - 1)

  def largest(self, start: int) -> tuple[int, bool]:
    """(The largest batch found to fit, 0 if none; whether it is proven the largest: the
    next multiple does not fit), starting from ``start`` units if nothing is known yet."""
    sides: list[bool] = []
    if not self.figures:
      sides.append(self.compile(max(start, 1)))
    while True:
      low, high = self.bounds()
      if high is not None and high - low <= 1:
        return low * self.unit, True
      if self.compiles >= self.max_compiles:
        return low * self.unit, False
      sides.append(self.compile(self.next_units(sides)))

  def at(self, batch: int) -> dict[str, Any] | None:
    """The train step's figures at a global batch, if compiled."""
    return self.figures.get(batch // self.unit) if batch % self.unit == 0 else None


def _variant(config: Any, **fields: Any) -> Any:
  """The config with dotted ``fields`` set."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.update_from_flattened_dict(fields)
  return config


def _check(config: Any, devices: list, examples: int, limit: float | None, kind: str,
           override: str, log: Any) -> dict[str, Any]:
  """The train step of ``config`` (``override`` applied) compiled, logged: the suggestion."""
  figures = compile_steps(config, devices, examples, only_train=True)['train']
  fits, need = within(figures, limit), needed_bytes(figures)
  log(f'check: {override}: {gib(need)} per device, {"fits" if fits else "does not fit"}',
      flush=True)
  return {'kind': kind, 'override': override, 'bytes_per_device': need, 'how': 'checked',
          'fits': fits}


def advise(config: Any, topology: str, r: dict[str, Any], num_train_examples: int | None,
           memory_per_device: float | None, max_compiles: int,
           log: Any = print) -> list[dict[str, Any]]:
  """What would fit, for a plan ``r`` that does not: each suggestion's command-line
  override, what it needs per device, and whether a compile checked it ('checked') or it is
  an estimate ('estimate'). Those a compile found not to fit come too (``fits`` False), so
  that the user need not try them."""
  out: list[dict[str, Any]] = []
  batch, accum = int(config.batch_size), int(config.get('grad_accum_steps') or 1)
  devices, tpu = _target(topology)
  examples = num_train_examples or 0
  limit = memory_per_device
  train_, eval_ = r['train'], r['eval']

  if not within(eval_, limit):  # The eval step alone: its memory is about proportional.
    need, cap = needed_bytes(eval_), limit or (tpu and tpu.hbm_per_device)
    split = len(devices) // int(config.mesh.tensor)
    if need and cap:
      size = int(config.eval_batch_size * cap / need) // split * split
      if size >= split:
        out.append({'kind': 'eval batch', 'override': f'--config.eval_batch_size={size}',
                    'bytes_per_device': need * size / config.eval_batch_size,
                    'how': 'estimate', 'fits': True})
  if within(train_, limit):
    return out

  search = BatchSearch(config, topology, num_train_examples, limit, max_compiles, log)
  search.figures[batch // search.unit] = train_  # The report's compile: not compiled again.
  best, proven = search.largest(batch // search.unit)
  if best:
    out.append({'kind': 'largest batch', 'override': f'--config.batch_size={best}',
                'bytes_per_device': search.at(best)['hbm_bytes_per_device'], 'how': 'checked',
                'fits': True, 'proven_largest': proven,
                'note': '' if proven else f'--max_compiles={search.compiles} reached: a larger '
                'one may fit'})

  # Gradient accumulation: the same batch in k micro-batches, each no larger than fits.
  split = search.unit // accum
  tried = 0
  for k in range(accum * 2, batch // split + 1):
    if tried == 2 or not best:
      break
    if batch % (k * split) or batch * accum > best * k:
      continue
    tried += 1
    out.append(_check(_variant(config, grad_accum_steps=k), devices, examples, limit,
                      'gradient accumulation', f'--config.grad_accum_steps={k}', log))
    if out[-1]['fits']:
      break

  # FSDP: the parameters, gradients and optimizer state split over all the batch devices.
  if int(config.mesh.fsdp) == 1 and split > 1:
    out.append(_check(_variant(config, **{'mesh.fsdp': split, 'mesh.data': -1}), devices,
                      examples, limit, 'FSDP', f'--config.mesh.fsdp={split}', log))

  # A bigger slice of the same generation (not compiled: an estimate from the line).
  line, need = search.line(), needed_bytes(train_)
  if tpu and line and need:
    cap = search.cap()
    # What stays per device on a bigger slice (the gathered parameters, code), and what
    # splits over its devices: the examples' activations, the stored state (split over the
    # batch devices unless mesh.shard_state=False).
    state = 0. if config.mesh.get('shard_state') is False else (search.state_bytes or 0.)
    fixed = max(line[0] - state, 0.)
    size = tpu.cores if tpu.chip.sized_by == 'cores' else tpu.chips
    for times in (2 ** i for i in range(1, 12)):
      name = f'{tpu.chip.name}-{size * times}'
      try:
        bigger = accelerators.tpu_slice(name)
      except ValueError:
        break
      if batch % (bigger.devices // int(config.mesh.tensor) * accum):
        break
      estimate = fixed + (need - fixed) / times
      if estimate <= cap:
        out.append({'kind': 'bigger slice', 'override': f'--topology={name}',
                    'bytes_per_device': estimate, 'how': 'estimate', 'fits': True})
        break
  return out


def gib(n: float | None) -> str:
  """Bytes for a table: GiB, MiB below one GiB, '-' for none."""
  if n is None:
    return '-'
  return f'{n / 2**30:.2f} GiB' if n >= 2**30 else f'{n / 2**20:.1f} MiB'


def ms(seconds: float | None) -> str:
  """Seconds for a table: in milliseconds, microseconds below one; '-' for none."""
  if seconds is None:
    return '-'
  return f'{1e3 * seconds:.1f} ms' if seconds >= 1e-3 else f'{1e6 * seconds:.1f} µs'


def flop(n: float) -> str:
  """A count of FLOPs in the unit that fits it: 12.3 kFLOP ... 4.5 PFLOP."""
  for power, prefix in ((15, 'P'), (12, 'T'), (9, 'G'), (6, 'M'), (3, 'k')):
    if n >= 10**power:
      return f'{n / 10**power:.1f} {prefix}FLOP'
  return f'{n:.0f} FLOP'


def format_report(r: dict[str, Any], config_name: str) -> str:
  """The report as a table for the terminal."""
  train_, eval_ = r['train'], r['eval']
  if r['libtpu_topology']:
    gen = r['chip'].removeprefix('TPU ')
    units = (f'{r["devices"]} x {r["chip"]} cores, {r["chips"]} chips'
             if r['device_is'] == 'core' else f'{r["devices"]} x {r["chip"]} chips')
    where = f'{r["topology"]} ({r["libtpu_topology"]}: {units})'
  else:
    where = f'this host ({r["devices"]} x {r["device_kind"]})'
  per = lambda b: f'{b} ({b // r["devices"]} per device)'
  lines = [f'{config_name} on {where}',
           f'global batch {per(r["batch_size"])}; eval batch {per(r["eval_batch_size"])}',
           f'{"":28}{"train step":>14}{"eval step":>14}']

  def row(label: str, key: str, fmt=gib) -> None:
    lines.append(f'{label:28}{fmt(train_.get(key)):>14}{fmt(eval_.get(key)):>14}')

  memory = 'HBM' if r['libtpu_topology'] else 'memory'
  if train_['fits']:
    lines.append(f'{memory + " per device":28}{gib(train_["hbm_bytes_per_device"]):>14}'
                 f'{gib(needed_bytes(eval_)):>14}')
    lines.append(f'{"  parameters":28}{gib(r["params_bytes_per_device"]):>14}'
                 f'{gib(r["params_bytes_per_device"]):>14}')
    lines.append(f'{"  optimizer state":28}{gib(r["opt_state_bytes_per_device"]):>14}')
    row('  temporaries', 'temp_bytes')
    row('program code (apart)', 'code_bytes')
  else:
    lines.append(f'{memory + " needed per device":28}{gib(train_.get("required_bytes")):>14}'
                 f'{gib(needed_bytes(eval_)):>14}')
  cap = r.get('memory_limit_bytes') or r['hbm_capacity_bytes']
  if cap:
    used = train_.get('hbm_bytes_per_device')
    verdict = (f'fits: {gib(cap - used)} to spare' if r['fits'] and used is not None else
               'DOES NOT FIT' + (f' (the compiler can use {gib(train_.get("available_bytes"))})'
                                 if train_.get('available_bytes') else ''))
    label = (f'HBM per device ({r["device_is"]})' if not r.get('memory_limit_bytes') else
             'memory limit per device')
    lines.append(f'{label:28}{gib(cap):>14}  {verdict}')
  row('step time (cost model)', 'step_seconds', ms)
  if r.get('images_per_second'):
    lines += [f'{"images/s":28}{r["images_per_second"]:>14,.0f}  '
              f'({r["images_per_second_per_chip"]:,.0f} per chip)']
    if r.get('mfu'):
      lines.append(f'{"MFU (bf16 peak)":28}{100 * r["mfu"]:>13.1f}%  '
                   f'(model FLOPs: {flop(r["train_flops_per_image"])} a training image)')
    # Cloud TPU prices chip-hours; the paper counts TPUv3-core-days (a core is a device
    # only on v2 and v3).
    cores = (f', {r["core_days"]:,.1f} {gen}-core-days' if r['device_is'] == 'core' else '')
    lines.append(f'{"schedule":28}{r["total_steps"]:>14,} steps: {r["run_days"]:.2f} days, '
                 f'{r["chip_hours"]:,.0f} {gen}-chip-hours{cores}')
  elif r['libtpu_topology'] and r['scan']:
    lines.append('step time: not estimated for model.scan=True (the cost model counts a '
                 "loop's body once); compile it unrolled (--config.model.scan=False), or, "
                 'where that is too large to compile here, 1 and 2 blocks of it unrolled '
                 '(--config.model.num_layers=1, then 2) and extrapolate.')
  elif r['libtpu_topology'] and (train_.get('cost_model_seconds') or 1) <= 0:
    lines.append(f'step time: the cost model of this libtpu gives none for {r["chip"]} '
                 f'(it answers {train_.get("cost_model_seconds")} s); try another generation.')
  elif r['libtpu_topology'] and r['grad_accum_steps'] > 1:
    k = r['grad_accum_steps']
    lines.append(f'train step time: not estimated for grad_accum_steps={k} (the cost model '
                 "counts a loop's body once); one micro-batch's is about 1/k of it: "
                 f'--config.grad_accum_steps=1 --config.batch_size={r["batch_size"] // k}.')
  lines.append(f'{"compile time":28}{train_["compile_seconds"]:>13.0f}s'
               f'{eval_["compile_seconds"]:>13.0f}s')
  return '\n'.join(lines)


def largest_batch_report(config: Any, topology: str, num_train_examples: int | None,
                         memory_per_device: float | None, max_compiles: int,
                         log: Any = print) -> tuple[Any, dict[str, Any]]:
  """``--max_batch``: the config at the largest global batch that fits, and its report
  (the search's compile of that train step reused; only the eval step compiled more)."""
  search = BatchSearch(config, topology, num_train_examples, memory_per_device, max_compiles,
                       log)
  best, proven = search.largest(config.batch_size // search.unit)
  if not best:
    raise errors.UserError(f'not even the smallest global batch ({search.unit}) fits on '
                           f'{topology}' + (f' in {gib(memory_per_device)} per device.'
                                            if memory_per_device else '.'))
  log(f'Largest global batch that fits on {topology}: {best}' + (
      '.' if proven else f' (of {search.compiles} compiles, the cap --max_compiles: a '
      'larger one may fit).'))
  config = _variant(config, batch_size=best)
  r = report(config, topology, num_train_examples, memory_per_device,
             compiled={'train': search.at(best)})
  r['max_batch'] = {'batch_size': best, 'proven_largest': proven, 'compiles': search.compiles}
  return config, r


def format_advice(suggestions: list[dict[str, Any]]) -> str:
  """The suggestions as lines: the override, the memory per device, checked or estimated."""
  if not suggestions:
    return 'No suggestion fits: try a smaller model, or a bigger slice.'
  lines = ['What would fit (each on its own, added to the same command):']
  for s in suggestions:
    how = ('checked: compiled' if s['how'] == 'checked' else 'estimate, not compiled')
    note = f'; {s["note"]}' if s.get('note') else ''
    if s['fits']:
      lines.append(f'  {s["override"]:36} {s["kind"]}: {gib(s["bytes_per_device"])} per '
                   f'device ({how}{note})')
    else:
      lines.append(f'  ({s["override"]}: {s["kind"]} alone does not fit either, '
                   f'{gib(s["bytes_per_device"])} per device; {how})')
  return '\n'.join(lines)
