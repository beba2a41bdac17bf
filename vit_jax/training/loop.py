"""The training loop: a plan, a workdir and evaluators in; a trained, evaluated run out.

Resumes from the workdir's newest good checkpoint (else starts from ``config.init_from``,
else from scratch), compiles the step before the first batch, then steps, logs, saves and
evaluates; SIGTERM or Ctrl-C saves and stops (exit status 75: run again to resume; a
second Ctrl-C stops at once, exit status 130: ``_Preemption``); a non-finite
loss, gradient norm or state stops (exit status 65) or rewinds (``divergence``), and is
never saved.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from vit_jax import config as config_lib
from vit_jax.base import console, cpu, errors, sharding
from vit_jax.checkpoints.formats import layout
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.checkpoints.run import workdir as workdir_lib
from vit_jax.data import loader
from vit_jax.training import divergence, mfu
from vit_jax.training.metrics import MetricsLog
from vit_jax.training.plan import Plan
from vit_jax.training.step import PatchSizeSteps, TrainState


def train_and_evaluate(plan: Plan, workdir: str, evaluators: Sequence[Any] = ()
                       ) -> dict[str, float]:
  """Trains ``plan`` in ``workdir`` (resuming from its checkpoints) and runs ``evaluators``
  (``vit_jax.evals``) when each is due, for the weights and for their moving average;
  returns the last metrics. On SIGTERM or Ctrl-C it saves and raises ``errors.Preempted``; at a
  non-finite loss, gradient norm or state, it stops (``errors.Diverged``) or rewinds, as
  ``config.on_divergence`` says (``vit_jax.training.divergence``)."""
  clock = _Clock()
  config, model, total_steps = plan.config, plan.model, plan.total_steps
  for warning in cpu.warnings(_matmul_dtype(model)):
    logging.warning(warning)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)

  # The state: resumed, fine-tuned from config.init_from, or fresh.
  state, state_shardings = plan.train_state()
  abstract = manager_lib.abstract_like(state, state_shardings)  # What a rewind restores.
  manager = manager_lib.make_manager(workdir, every_steps=config.checkpoint_every_steps,
                                     keep=config.keep_checkpoints)
  state = _starting_state(state, state_shardings, manager, plan)
  if plan.teacher:  # Loaded from its SOURCE by every start: never saved with the state.
    logging.info('Distilling from %s: its hard labels train the distillation head.',
                 config.distill.teacher)
  start_step = int(jax.device_get(state.step))
  guard = divergence.Guard(config, workdir)
  guard.start(start_step)

  log = MetricsLog(workdir, start_step)
  if log.main and start_step < total_steps:  # What it trains with, for the tools.
    workdir_lib.write_run_info(workdir, config, plan.num_classes, plan.class_names)
    if start_step == 0:
      _parameter_overview(model, state.params, workdir)
      log.write_hparams({k: str(v) for k, v in config.items()})
  for phase in config_lib.phases(config):
    logging.info("Schedule phase '%s': to step %d, %s from %.3g to %.3g after %d warm-up "
                 'steps.', phase['name'], phase['total_steps'], phase['decay'],
                 phase['base_lr'], phase['end_lr'], phase['warmup_steps'])

  # The program and the data.
  train_step = plan.train_step(state_shardings)
  train_loader = loader.TrainLoader(
      plan.train_source, plan.pp_train, global_batch_size=config.batch_size,
      seed=config.seed, sharding=sharding.batch_sharding(plan.mesh),
      num_classes=plan.num_classes, num_workers=config.input_workers,
      repeats=config.dataset.repeats, packing=plan.packing)
  stream = batches = guard.stream(train_loader, start_step)
  preemption = _Preemption()
  profile = tuple(config.profile_steps or ())
  speed, result = None, {}
  try:
    clock.loop = time.perf_counter()
    if start_step < total_steps:  # The step compiled for the first batch, before the loop.
      first = next(stream)
      speed = _compile(_step_at(train_step, start_step + 1),
                       sharding.inputs_ready((state, first[1])), plan, clock)
      batches = itertools.chain([first], stream)

    pending: list[tuple[int, Any]] = []  # The steps since the last log line, their metrics.
    step, interval_step, interval_time = start_step, start_step, clock.training()
    while step < total_steps:
      step += 1
      if profile and step == profile[0]:
        jax.profiler.start_trace(str(epath.Path(workdir) / 'profile'))
      _, batch = next(batches)
      state, metrics = _step_at(train_step, step)(*sharding.inputs_ready((state, batch)))
      pending.append((step, metrics))
      manager_lib.check_saves(manager)  # A background save that failed stops the run now.
      if profile and step == profile[1]:
        jax.profiler.stop_trace()

      try:  # Every read of the metrics checks them; every save, the state.
        if step % config.log_every_steps == 0 or step == total_steps:
          host = divergence.check(pending)
          elapsed = clock.training() - interval_time
          eta = (total_steps - step) * elapsed / (step - interval_step)
          _log_interval(step, host, (step - interval_step) * config.batch_size / elapsed, eta,
                        speed, plan, log)
          pending, interval_step, interval_time = [], step, clock.training()
        if preemption.reached(manager, step):
          divergence.check(pending)
          guard.save(manager, step, state)
          manager.wait_until_finished()
          # A stop asked for: what was saved and how to resume, the summary in the log file.
          _summary(step, start_step, plan, clock, speed, evaluators, log, manager,
                   extra=console.FILE_ONLY)
          logging.warning('Preempted: saved step %d in %s; run the same command again to '
                          'resume.', step, manager.directory)
          raise errors.Preempted(step)  # Exit status 75: run again to resume.
        if step % config.checkpoint_every_steps == 0 or step == total_steps:
          divergence.check(pending)
          guard.save(manager, step, state)
        due = [e for e in evaluators if e.due(step, total_steps, config.eval_every_steps)]
        if due:
          divergence.check(pending)
        result.update(_evaluate(due, state, step, log, clock))
      except divergence.Spike as spike:  # Stops (errors.Diverged), or rewinds:
        rewind = guard.diverged(spike, manager)
        state = manager_lib.restore(manager, abstract, rewind.to_step)
        log.truncate(rewind.to_step)
        stream.close()
        stream = batches = guard.stream(train_loader, rewind.to_step)
        step = interval_step = rewind.to_step
        pending, interval_time = [], clock.training()
    if start_step >= total_steps:
      logging.info('The run in %s is already complete (step %d).', workdir, start_step)
      result.update(_evaluate(evaluators, state, start_step, log, clock))
    manager.wait_until_finished()
    _summary(max(start_step, total_steps), start_step, plan, clock, speed, evaluators, log,
             manager)
  finally:
    preemption.close()
    stream.close()
    manager.wait_until_finished()
    manager.close()
    log.close()
  return result


def _step_at(train_step: Any, step: int) -> Callable:
  """The program of training step ``step``: the run's one, or (FlexiViT, ``config.flexi``)
  the one of the patch size drawn for it, compiled when first drawn."""
  return train_step.at(step) if isinstance(train_step, PatchSizeSteps) else train_step


def _starting_state(state: TrainState, state_shardings: Any, manager: Any,
                    plan: Plan) -> TrainState:
  """The state the run starts from: its newest good checkpoint, else ``config.init_from``'s
  parameters adapted to this model (fine-tuning: step 0, and an optimizer state initialised
  from them, so that the weights' EMA starts there too), else ``state`` as initialised."""
  config = plan.config
  if manager.latest_step() is not None:
    # The newest checkpoint that passes its checksums; damaged ones are moved aside.
    state = manager_lib.resume(manager, manager_lib.abstract_like(state, state_shardings))
    logging.info('Resumed from %s at step %d.', manager.directory, int(state.step))
  elif config.init_from:
    init_params = jax.tree.map(layout.to_host, state.params)
    params = workdir_lib.init_params_from(
        config.init_from, init_params, plan.model, step=config.init_step,
        keep_head=config.init_keep_head, ema=config.init_ema,
        source_grid=config.init_source_grid, source_pool=config.init_source_pool)
    params = jax.device_put(params, state_shardings.params)
    opt_state = jax.jit(plan.tx.init, out_shardings=state_shardings.opt_state)(params)
    state = state.replace(params=params, opt_state=opt_state)
    logging.info('Initialised from %s.', config.init_from)
  return state


def _evaluate(evaluators: Sequence[Any], state: TrainState, step: int, log: MetricsLog,
              clock: _Clock) -> dict[str, float]:
  """Each evaluator's metrics of the weights as '<name>/<metric>', and of their moving
  average (where the run keeps one) as '<name>/ema/<metric>', logged at ``step`` (a finished
  run evaluated again adds no row)."""
  result = {}
  for evaluator in evaluators:
    started = time.perf_counter()
    line = f'{evaluator.name} at step {step}:'
    for prefix, params in (('', state.params), ('ema/', state.ema_params)):
      if params is None:
        continue
      metrics = evaluator.run(params)
      result.update({f'{evaluator.name}/{prefix}{k}': v for k, v in metrics.items()})
      line += f'{"; EMA" if prefix else ""} {evaluator.describe(metrics)}'
    keys = [k for k in result if k.startswith(f'{evaluator.name}/')]
    if not all(log.has(step, k) for k in keys):
      log.write(step, {k: result[k] for k in keys})
    seconds = time.perf_counter() - started
    logging.info('%s [%.1fs]', line, seconds)
    clock.eval += seconds
  return result


class _Preemption:
  """SIGTERM (a preempted TPU VM) and Ctrl-C ask the loop to save and stop at the next step;
  a second Ctrl-C stops at once (``KeyboardInterrupt``: ``vit_jax.main`` says what was saved,
  in one line). Multi-process, SIGTERM is jax.distributed's (its notifier makes every process
  save the same step), and a Ctrl-C is passed on to it as a SIGTERM. A Ctrl-C that the process
  ignores (a launcher's background process: the launcher passes it on as SIGTERM) stays
  ignored."""

  def __init__(self):
    self.requested = self.interrupted = False
    self.previous = {}
    if jax.process_count() == 1:  # Multi-process: jax.distributed's own notifier.
      self.previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
      self.previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)

  def _terminate(self, signum: int, frame: Any) -> None:
    logging.warning('SIGTERM: saving a checkpoint at the next step, then exiting.')
    self.requested = True

  def _interrupt(self, signum: int, frame: Any) -> None:
    if self.interrupted:
      raise KeyboardInterrupt
    self.interrupted = True
    logging.warning('Ctrl-C: saving a checkpoint at the next step, then exiting (Ctrl-C again '
                    'stops at once, saving nothing).')
    if jax.process_count() > 1:
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self.requested = True

  def close(self) -> None:
    for signum, previous in self.previous.items():
      signal.signal(signum, previous)

  def reached(self, manager: Any, step: int) -> bool:
    return self.requested or (jax.process_count() > 1 and manager.reached_preemption(step))


@dataclasses.dataclass
class _Clock:
  """The run's wall time, and the loop's: compiling, evaluating, training (the rest)."""

  start: float = dataclasses.field(default_factory=time.perf_counter)
  loop: float = 0.  # When the loop started.
  compile: float = 0.
  eval: float = 0.

  def training(self) -> float:
    return time.perf_counter() - self.loop - self.compile - self.eval


@dataclasses.dataclass
class _Speed:
  """The model FLOPs of a training image and the devices' peak: the MFU of a rate. An MFU
  over 100% says the peak is too low (one measured on a busy machine): a warning, once."""

  flops_per_image: float | None  # None where the compiler gives no count.
  peak: float  # FLOP/s of all the run's devices.
  peak_source: str
  warned: bool = False

  def mfu(self, images_per_s: float) -> float | None:
    if not self.flops_per_image:
      return None
    mfu_ = self.flops_per_image * images_per_s / self.peak
    if mfu_ > 1 and not self.warned:
      self.warned = True
      logging.warning('MFU %.0f%% is over 100%%: this run computes faster than its peak, %s. '
                      'A peak measured while the machine was busy is too low: delete its '
                      'entry to measure it again.', 100 * mfu_, self.peak_source)
    return mfu_


def _compile(train_step: Callable, inputs: Any, plan: Plan, clock: _Clock) -> _Speed:
  """Compiles the step for ``inputs`` ahead of the loop (its first call reuses the program)
  and reads its FLOPs; the time goes to ``clock.compile``."""
  started = time.perf_counter()
  compiled = train_step.lower(*inputs).compile()
  clock.compile = time.perf_counter() - started
  model, config = plan.model, plan.config
  flops = mfu.train_flops_per_image(model, compiled, plan.mesh.size, config.batch_size,
                                    plan.teacher and plan.teacher.model,
                                    tuple(config.flexi.patch_sizes),
                                    tuple(config.flexi.probabilities))
  dtypes = (jnp.dtype(model.dtype).name, _matmul_dtype(model))
  peak, how = mfu.device_peak('bfloat16' if 'bfloat16' in dtypes else 'float32')
  logging.info('Training steps %d-%d, batch %d. MFU: %.4g MFLOP a training image (model '
               'FLOPs) over %s.', int(jax.device_get(inputs[0].step)) + 1, plan.total_steps,
               config.batch_size, (flops or 0) / 1e6, how)
  return _Speed(flops, peak, how)


def _matmul_dtype(model: nn.Module) -> str | None:
  return model.matmul_dtype and jnp.dtype(model.matmul_dtype).name


def _log_interval(step: int, host: list[dict[str, float]], images_per_s: float, eta: float,
                  speed: _Speed, plan: Plan, log: MetricsLog) -> None:
  """The training line: metrics averaged since the last line, speed, MFU and ETA."""
  scalars = {'train/loss': np.mean([m['loss'] for m in host]),
             'train/grad_norm': np.mean([m['grad_norm'] for m in host]),
             'train/learning_rate': host[-1]['learning_rate'],
             'train/images_per_s': images_per_s,
             'train/images_per_s_per_device': images_per_s / plan.mesh.size}
  if (mfu_ := speed.mfu(images_per_s)) is not None:
    scalars['train/mfu'] = mfu_
  log.write(step, scalars)
  logging.info('step %d/%d  loss %.4f  lr %.2e  %s img/s%s  ETA %s', step, plan.total_steps,
               scalars['train/loss'], scalars['train/learning_rate'], f'{images_per_s:,.0f}',
               f'  MFU {100 * mfu_:.1f}%' if mfu_ is not None else '', console.duration(eta))


def _summary(step: int, start_step: int, plan: Plan, clock: _Clock, speed: _Speed | None,
             evaluators: Sequence[Any], log: MetricsLog, manager: Any,
             extra: dict[str, Any] | None = None) -> None:
  """The closing lines: steps trained, time and speed, each evaluator's final and best
  (``extra``: the log records', ``console.FILE_ONLY`` for the log file only)."""
  trained = step - start_step
  line = f'Done: step {step}/{plan.total_steps}'
  if trained:
    images_per_s = trained * plan.config.batch_size / max(clock.training(), 1e-9)
    line += (f', {trained} trained in {console.duration(time.perf_counter() - clock.start)} '
             f'(compiling {clock.compile:.0f}s, evaluating {clock.eval:.0f}s), '
             f'{images_per_s:,.0f} img/s')
    if speed and (mfu_ := speed.mfu(images_per_s)) is not None:
      line += f', MFU {100 * mfu_:.1f}%'
  logging.info('%s.', line, extra=extra)
  for evaluator in evaluators:
    for prefix in ('', 'ema/'):
      key = f'{evaluator.name}/{prefix}{evaluator.metric}'
      if values := log.history(key):
        best, final = max(values, key=values.get), max(values)
        logging.info('%s: final %.4f (step %d), best %.4f (step %d).', key, values[final],
                     final, values[best], best, extra=extra)
  logging.info('Checkpoints: %s (steps %s). Logs: %s, TensorBoard events in %s.',
               manager.directory, ', '.join(map(str, manager.all_steps())) or 'none',
               log.jsonl, log.workdir, extra=extra)


def _parameter_overview(model: nn.Module, params: Any, workdir: str) -> None:
  """One line for the log; the per-array table into workdir/parameters.txt."""
  from clu import parameter_overview

  path = epath.Path(workdir) / 'parameters.txt'
  # Shapes and shardings: statistics would copy every parameter to this host, and cannot
  # read the shards that only other processes hold.
  path.write_text(parameter_overview.get_parameter_overview(params, include_stats='sharding')
                  + '\n')
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  logging.info('%s: %s parameters in %d arrays (table: %s).', model.model_name, f'{count:,}',
               len(jax.tree.leaves(params)), path)
