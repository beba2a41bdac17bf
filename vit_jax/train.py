"""Training: the state, the step, and the loop, from a config.

Read top to bottom: ``TrainState`` is the whole state of a run; ``validate``
checks a config before anything compiles; ``make_train_step`` builds the pure
step (``jax.jit`` with explicit shardings, or ``shard_map``, explicit over the batch
axes); ``train_and_evaluate`` runs it with evaluation, logging,
Orbax checkpoints and exact resume.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from etils import epath
from jax.sharding import PartitionSpec as P

from vit_jax import checkpoint, checkpoint_manager, config_base, evaluate, host_cpu, optim, sharding
from vit_jax import workdir as workdir_lib
from vit_jax.data import loader, preprocess, sources
from vit_jax.models import canonical_name, get_model


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to continue: with the step, the data position too."""

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # Base key; step s uses fold_in(rng, s), so nothing else to save.


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a validated config resolves to."""

  config: ml_collections.ConfigDict  # Complete: every field of config_base there.
  model: nn.Module
  train_source: Any
  eval_source: Any
  num_classes: int
  total_steps: int
  warmup_steps: int
  mesh: jax.sharding.Mesh
  pp_train: Callable
  pp_eval: Callable


# ---------------------------------------------------------------------------
# Config validation: every error names the field, before anything compiles.


def validate(config: ml_collections.ConfigDict) -> Plan:
  """Checks a config and resolves it; raises ValueError naming the bad field.

  Fields the config leaves out take ``config_base``'s defaults.
  """
  config = config_base.complete(config)
  name, options = config_base.model_options(config.model)
  try:
    canonical_name(name)
  except ValueError as e:
    raise ValueError(f'config.model.name: {e}') from None
  data_dir = config.dataset.data_dir
  if data_dir and not config.dataset.prepare and not epath.Path(data_dir).exists():
    raise FileNotFoundError(f'config.dataset.data_dir={config.dataset.data_dir} does not exist.')
  init_from, init_step = config.init_from, config.init_step
  if init_from:
    if workdir_lib.is_workdir(init_from):
      workdir_lib.resolve_step(init_from, init_step)  # Raises, naming the steps there.
    elif not epath.Path(init_from).is_file():
      raise FileNotFoundError(
          f'config.init_from={init_from} is neither a release .npz file nor the workdir of '
          'an earlier run (a directory with checkpoints/).')
  if config.loss not in ('softmax_xent', 'sigmoid_xent'):
    raise ValueError(f"config.loss={config.loss!r} is not 'softmax_xent' or 'sigmoid_xent'.")
  pp_train = preprocess.parse(config.dataset.pp_train)
  pp_eval = preprocess.parse(config.dataset.pp_eval)

  if config.eval_batch_size is None:
    config.eval_batch_size = config.batch_size
  mesh = sharding.make_mesh(config.mesh)
  # The devices that split the batch; those along 'tensor' share their rows.
  devices = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  accum = int(config.grad_accum_steps)
  for field in ('batch_size', 'eval_batch_size'):
    size = int(config[field])
    if size % devices:
      raise ValueError(f'config.{field}={size} is not divisible by the {devices} devices that '
                       f'split it (config.mesh data x fsdp). Use a multiple of {devices}.')
  if (config.batch_size // devices) % accum:
    raise ValueError(f'config.grad_accum_steps={accum} does not divide the per-device batch '
                     f'{config.batch_size // devices}.')
  if config.step_impl not in ('jit', 'shard_map'):
    raise ValueError(f"config.step_impl={config.step_impl!r} is not 'jit' or 'shard_map'.")

  try:
    train_source = sources.get_source(config.dataset, config.dataset.train_split)
    eval_source = sources.get_source(config.dataset, config.dataset.eval_split)
  except ValueError as e:
    raise ValueError(f'config.dataset ({config.dataset.name!r}): {e}') from None
  num_classes = int(config.dataset.num_classes or train_source.num_classes)
  if num_classes != train_source.num_classes:
    raise ValueError(f'config.dataset.num_classes={num_classes}, but the data has '
                     f'{train_source.num_classes} classes.')
  try:
    model = get_model(name, num_classes=num_classes, **options)
  except ValueError as e:
    raise ValueError(f'config.model: {e}') from None
  total, warmup = optim.resolve_steps(config, len(train_source))
  return Plan(config, model, train_source, eval_source, num_classes, total, warmup, mesh, pp_train,
              pp_eval)


# ---------------------------------------------------------------------------
# State and step.


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, seed: int,
                       mesh: jax.sharding.Mesh) -> tuple[TrainState, Any]:
  """Initialises the state directly in its shardings (never gathered on one host)."""
  images = jnp.zeros((1, *model.image_size, 3), jnp.float32)

  def init(rng: jax.Array) -> TrainState:
    init_rng, state_rng = jax.random.split(rng)
    params = model.init({'params': init_rng}, images, train=False)['params']
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), state_rng)

  rng = jax.random.PRNGKey(seed)
  shardings = sharding.shardings_for(jax.eval_shape(init, rng), mesh)
  return jax.jit(init, out_shardings=shardings)(rng), shardings


def loss_and_grads(model: nn.Module, config: ml_collections.ConfigDict, params: Any,
                   batch: dict[str, jax.Array], rng: jax.Array,
                   constrain: Callable = lambda x: x,
                   gather: Callable = lambda p: p) -> tuple[jax.Array, Any]:
  """Mean loss and its gradients, over ``grad_accum_steps`` micro-batches in sequence.

  ``gather`` maps ``params`` to what the model takes, inside the differentiated
  function (the shard_map step gathers its parameter shards there).
  """
  smoothing = config.label_smoothing

  def mean_loss(p: Any, images: jax.Array, labels: jax.Array, key: jax.Array) -> jax.Array:
    logits = model.apply({'params': gather(p)}, images, train=True, rngs={'dropout': key})
    return optim.loss_fn(config.loss, logits, labels, smoothing).mean()

  grad_fn = jax.value_and_grad(mean_loss)
  if config.mixup_alpha:
    batch = mixup(batch, jax.random.fold_in(rng, 0x6D697875), config.mixup_alpha)  # 'mixu'
  k = int(config.grad_accum_steps)
  if k == 1:
    return grad_fn(params, batch['image'], batch['label'], rng)
  # Micro-batch i takes rows i, i + k, ...: every device keeps its rows.
  micro = jax.tree.map(
      lambda x: constrain(x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)), batch)

  def accumulate(carry: Any, xs: Any) -> tuple[Any, None]:
    i, mb = xs
    loss, grads = grad_fn(params, mb['image'], mb['label'], jax.random.fold_in(rng, i))
    return jax.tree.map(jnp.add, carry, (loss, grads)), None

  zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
  (loss, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(k), micro))
  return loss / k, jax.tree.map(lambda g: g / k, grads)


def mixup(batch: dict[str, jax.Array], rng: jax.Array, alpha: float) -> dict[str, jax.Array]:
  """Mixes each example with its neighbour: p * x + (1 - p) * roll(x), p ~ Beta(a, a), p >= 0.5.

  Labels are mixed alike (one-hot or multi-hot). Zhang et al., 2018.
  """
  p = jax.random.beta(rng, alpha, alpha)
  p = jnp.maximum(p, 1. - p)
  mix = lambda x: (p * x + (1. - p) * jnp.roll(x, 1, axis=0)).astype(x.dtype)
  return {**batch, 'image': mix(batch['image']), 'label': mix(batch['label'])}


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, config: ml_collections.ConfigDict,
                    mesh: jax.sharding.Mesh, state_shardings: Any) -> Callable:
  """The jitted (state, batch) -> (state, metrics) step; the input state is donated.

  'jit': one program for the whole mesh, laid out by XLA (GSPMD) from the state's
  shardings and the model's activation constraints (``sharding.constrain``).
  'shard_map': explicit over the batch axes ('data', 'fsdp'): each device computes the
  loss and gradients of its own rows, with its fsdp parameter shards gathered where
  they are used (autodiff turns each gather into a reduce-scatter of the gradients),
  then averages them over the batch axes; the 'tensor' axis stays with XLA inside it.
  The optimizer update then runs on the sharded state, outside the shard_map.
  """

  def apply_grads(state: TrainState, loss: jax.Array, grads: Any) -> tuple[TrainState, Any]:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': loss, 'grad_norm': optax.tree.norm(grads),
               'learning_rate': schedule(state.step)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  batch_sharding = sharding.batch_sharding(mesh)
  replicated = sharding.replicated(mesh)

  if config.step_impl == 'jit':
    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
      rng = jax.random.fold_in(state.rng, state.step)
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # For sharding.constrain.
        loss, grads = loss_and_grads(model, config, state.params, batch, rng,
                                     lambda x: sharding.constrain(x, 'micro_batches'))
      return apply_grads(state, loss, grads)
  else:
    # The parameters' specs over the batch axes: each device gets its fsdp shards.
    specs = jax.tree.map(lambda s: P(*(a if a == 'fsdp' else None for a in s.spec)),
                         state_shardings.params)
    devices = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)

    def gather(params: Any) -> Any:
      return jax.tree.map(lambda p, spec: jax.lax.all_gather(
          p, 'fsdp', axis=spec.index('fsdp'), tiled=True) if 'fsdp' in spec else p,
          params, specs)

    def per_device(params: Any, batch: dict[str, jax.Array],
                   rng: jax.Array) -> tuple[jax.Array, Any]:
      # Each device: its own rows of the batch (and dropout key). A gradient of fsdp
      # shards is already summed over 'fsdp' (the gather's reduce-scatter); the rest is
      # summed here, then everything divided by the number of devices: the mean.
      rng = jax.random.fold_in(rng, jax.lax.axis_index(sharding.BATCH_AXES))
      loss, grads = loss_and_grads(model, config, params, batch, rng, gather=gather)
      grads = jax.tree.map(
          lambda g, spec: jax.lax.psum(g, tuple(a for a in sharding.BATCH_AXES
                                                if a not in spec)) / devices, grads, specs)
      return jax.lax.pmean(loss, sharding.BATCH_AXES), grads

    grads_fn = jax.shard_map(per_device, mesh=mesh,
                             in_specs=(specs, P(sharding.BATCH_AXES), P()),
                             out_specs=(P(), specs), axis_names=set(sharding.BATCH_AXES),
                             check_vma=False)

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
      loss, grads = grads_fn(state.params, batch, jax.random.fold_in(state.rng, state.step))
      return apply_grads(state, loss, grads)

  return jax.jit(step, in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, replicated), donate_argnums=0)


# ---------------------------------------------------------------------------
# The loop.


class _MetricsLog:
  """TensorBoard (clu) and a JSON-lines file in the workdir; process 0 only.

  Local files are appended to. Object stores (``gs://``) cannot append, so there the
  file is rewritten whole at each write, after reading what a resumed run left.
  """

  def __init__(self, workdir: str, append: bool | None = None):
    from clu import metric_writers

    self.main = jax.process_index() == 0
    self.writer = metric_writers.create_default_writer(workdir, just_logging=not self.main)
    self.jsonl = epath.Path(workdir) / 'metrics.jsonl'
    self.append = '://' not in str(workdir) if append is None else append
    self.lines: list[str] = []
    if self.main and not self.append and self.jsonl.exists():
      self.lines = self.jsonl.read_text().splitlines(keepends=True)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    self.writer.write_scalars(step, scalars)
    if not self.main:
      return
    line = json.dumps({'step': step, **{k: float(v) for k, v in scalars.items()}}) + '\n'
    if self.append:
      with self.jsonl.open('a') as f:
        f.write(line)
    else:
      self.lines.append(line)
      self.jsonl.write_text(''.join(self.lines))

  def close(self) -> None:
    self.writer.close()


class _Preemption:
  """SIGTERM (a preempted TPU VM) asks the loop to save and stop at the next step."""

  def __init__(self):
    self.requested = False
    if jax.process_count() == 1:  # Multi-process: jax.distributed's own notifier.
      self.previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum: int, frame: Any) -> None:
    logging.warning('SIGTERM: saving a checkpoint at the next step, then exiting.')
    self.requested = True

  def close(self) -> None:
    if jax.process_count() == 1:
      signal.signal(signal.SIGTERM, self.previous)

  def reached(self, manager: Any, step: int) -> bool:
    return self.requested or (jax.process_count() > 1 and manager.reached_preemption(step))


def _check_finite(pending: list[tuple[int, Any]], manager: Any) -> None:
  for step, metrics in pending:
    loss = float(jax.device_get(metrics['loss']))
    if not math.isfinite(loss):
      latest = manager.latest_step()
      raise FloatingPointError(
          f'Non-finite loss ({loss}) at step {step}. The run stopped; the last good '
          f'checkpoint is step {latest}. Lower the learning rate or check the input.')


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains (resuming from ``workdir`` if it holds a checkpoint) and evaluates."""
  plan = validate(config)
  config, model, mesh, total_steps = plan.config, plan.model, plan.mesh, plan.total_steps
  matmul_dtype = model.matmul_dtype and jnp.dtype(model.matmul_dtype).name
  if warning := host_cpu.emulated_bf16_warning(jax.default_backend(), matmul_dtype,
                                               host_cpu.cpu_info()):
    logging.warning(warning)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  metric_name = 'prec@1' if config.loss == 'sigmoid_xent' else 'accuracy'

  schedule = optim.make_schedule(config.schedule, total_steps, plan.warmup_steps)
  tx = optim.make_optimizer(config.optimizer, schedule)
  state, state_shardings = create_train_state(model, tx, config.seed, mesh)

  checkpoint_every = config.checkpoint_every_steps
  manager = checkpoint_manager.make_manager(workdir, every_steps=checkpoint_every,
                                            keep=config.keep_checkpoints)
  if manager.latest_step() is None and config.init_from:
    # Fine-tuning: only the parameters of an earlier run or a release file, adapted
    # to this model, placed on this run's mesh; a fresh optimizer state and step.
    init_params = jax.tree.map(checkpoint.to_host, state.params)
    params = workdir_lib.init_params_from(
        config.init_from, init_params, model, step=config.init_step,
        keep_head=config.init_keep_head)
    state = state.replace(params=jax.device_put(params, state_shardings.params))
    logging.info('Initialised from %s.', config.init_from)
  if manager.latest_step() is not None:
    abstract = checkpoint_manager.abstract_like(state, state_shardings)
    state = checkpoint_manager.restore(manager, abstract)
    logging.info('Resumed from %s at step %d.', manager.directory, int(state.step))
  start_step = int(jax.device_get(state.step))

  log = _MetricsLog(workdir)
  if log.main:  # What this workdir holds, for the tools that read it later.
    workdir_lib.write_run_info(workdir, config, plan.num_classes,
                               tuple(getattr(plan.train_source, 'class_names', ())))
  if start_step == 0 and log.main:
    from clu import parameter_overview
    # Shapes and shardings: statistics would copy every parameter to this host, and
    # cannot read the shards that only other processes hold.
    logging.info('Parameters of %s:\n%s', model.model_name,
                 parameter_overview.get_parameter_overview(state.params,
                                                           include_stats='sharding'))
    log.writer.write_hparams({k: str(v) for k, v in config.items()})

  train_step = make_train_step(model, tx, schedule, config, mesh, state_shardings)
  eval_step = evaluate.make_eval_step(model, config.loss, state_shardings.params,
                                      sharding.batch_sharding(mesh), sharding.replicated(mesh))
  train_loader = loader.TrainLoader(
      plan.train_source, plan.pp_train, global_batch_size=config.batch_size,
      seed=config.seed, sharding=sharding.batch_sharding(mesh),
      num_classes=plan.num_classes, num_workers=config.input_workers)

  def run_eval(step: int) -> dict[str, float]:
    batches = loader.eval_batches(
        plan.eval_source, plan.pp_eval, global_batch_size=config.eval_batch_size,
        sharding=sharding.batch_sharding(mesh), num_classes=plan.num_classes,
        num_workers=config.input_workers)
    result = evaluate.evaluate(eval_step, state.params, batches, metric_name)
    log.write(step, {f'eval/{k}': v for k, v in result.items()})
    logging.info('eval at step %d: %s %.4f, loss %.4f (%d examples)', step, metric_name,
                 result[metric_name], result['loss'], result['examples'])
    return result

  preemption = _Preemption()
  log_every = config.log_every_steps
  eval_every = config.eval_every_steps
  profile = tuple(config.profile_steps or ())
  pending: list[tuple[int, Any]] = []
  result: dict[str, float] = {}
  timer_step, timer = start_step, time.perf_counter()
  batches = train_loader.iterate(start_step)
  try:
    for step in range(start_step + 1, total_steps + 1):
      if profile and step == profile[0]:
        jax.profiler.start_trace(str(epath.Path(workdir) / 'profile'))
      _, batch = next(batches)
      state, metrics = train_step(*sharding.inputs_ready((state, batch)))
      pending.append((step, metrics))
      if profile and step == profile[1]:
        jax.profiler.stop_trace()

      if step % log_every == 0 or step == total_steps:
        _check_finite(pending, manager)
        scalars = {f'train/{k}': float(v) for k, v in jax.device_get(metrics).items()}
        elapsed = time.perf_counter() - timer
        images_per_s = (step - timer_step) * config.batch_size / elapsed
        scalars.update({'train/images_per_s': images_per_s,
                        'train/images_per_s_per_device': images_per_s / mesh.size})
        log.write(step, scalars)
        eta = (total_steps - step) * elapsed / max(step - timer_step, 1)
        logging.info('step %d/%d  loss %.4f  lr %.2e  %.1f img/s (%.1f/device)  ETA %s',
                     step, total_steps, scalars['train/loss'], scalars['train/learning_rate'],
                     images_per_s, images_per_s / mesh.size, _duration(eta))
        pending, timer_step, timer = [], step, time.perf_counter()

      if preemption.reached(manager, step):
        _check_finite(pending, manager)
        checkpoint_manager.save(manager, step, state, force=True)
        manager.wait_until_finished()
        logging.warning('Preempted: saved step %d; restart with the same workdir to resume.',
                        step)
        return result
      if step % checkpoint_every == 0 or step == total_steps:
        _check_finite(pending, manager)
        pending = []
        checkpoint_manager.save(manager, step, state, force=True)
      if (eval_every and step % eval_every == 0) or step == total_steps:
        result = run_eval(step)
    if start_step >= total_steps:
      logging.info('The run in %s is already complete (step %d).', workdir, start_step)
      result = run_eval(start_step)
  finally:
    preemption.close()
    batches.close()
    manager.wait_until_finished()
    manager.close()
    log.close()
  return result


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s'

