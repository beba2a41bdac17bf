"""Training: the state, the step, and the loop, from a config.

Read top to bottom: ``TrainState`` is the whole state of a run; ``validate``
checks a config before anything compiles; ``make_train_step`` builds the pure
step (``jax.jit`` with explicit shardings, or ``shard_map``, explicit over the batch
axes); ``train_and_evaluate`` runs it with evaluation, logging,
Orbax checkpoints and exact resume.
"""

from __future__ import annotations

import dataclasses
import itertools
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
import numpy as np
import optax
from absl import logging
from etils import epath
from jax.sharding import PartitionSpec as P

from vit_jax import config as config_lib
from vit_jax import evaluate, fewshot, imagenet_evals
from vit_jax.base import console, cpu, errors, paths, sharding
from vit_jax.checkpoints import manager as manager_lib
from vit_jax.checkpoints import release
from vit_jax.checkpoints import workdir as workdir_lib
from vit_jax.data import loader, preprocess, sources
from vit_jax.models import canonical_name, get_model, mpp
from vit_jax.models.vit import pair
from vit_jax.training import mfu, optim, tensorboard_events


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to continue: with the step, the data position too."""

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # Base key; step s uses fold_in(rng, s), so nothing else to save.

  @property
  def ema_params(self) -> Any:
    """The weights' moving average (``config.optimizer.ema_decay``), or None.

    Kept in the optimizer state (``optim.weight_ema``): saved, restored and sharded
    with it, and the state of a run without one is what it always was.
    """
    return optim.ema_params(self.opt_state)


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

  @property
  def shard_state(self) -> bool:
    """Whether the train state is stored split over the data axis (``sharding``): as
    ``config.mesh.shard_state`` says; where it says None, on TPUs and GPUs but not on CPUs
    (``cpu_backend``)."""
    if self.config.mesh.shard_state is None:
      return cpu.shards_state_by_default(self.mesh.devices.flat[0].platform)
    return self.config.mesh.shard_state


# ---------------------------------------------------------------------------
# Config validation: every error names the field, before anything compiles.


def validate(config: ml_collections.ConfigDict, *, devices: list[jax.Device] | None = None,
             num_train_examples: int | None = None) -> Plan:
  """Checks a config and resolves it; raises ``errors.UserError`` naming the bad field.

  Fields the config leaves out take ``config_base``'s defaults. Every check runs before
  anything compiles; the preprocessing pipelines run once, on the first example of their
  split, to compare the size they make with the model's. ``devices``: the mesh's (default:
  all of this run's). With ``num_train_examples`` no data or file is opened (planning ahead
  of time, ``vit_jax.tools.aot``): the plan has no sources, and ``dataset.num_classes`` must be set.
  """
  config = config_lib.complete(config)
  config_lib.check(config)  # Types, None, ranges: vit_jax/config/__init__.py's SCHEMA.
  name, options = config_lib.model_options(config.model)
  try:
    canonical_name(name)
  except ValueError as e:
    raise errors.ConfigError(f'config.model.name: {e}') from None
  for field in ('image_size', 'patch_size'):
    if field in options and not _is_size(options[field]):
      raise errors.ConfigError(f'config.model.{field}={options[field]!r} is not a positive int '
                               'or a (height, width) pair of them.')
  self_supervised = mpp.is_on(config)  # Masked patch prediction: no label is read.
  with_data = num_train_examples is None
  data_dir = config.dataset.data_dir
  if with_data and data_dir and not config.dataset.prepare and not paths.exists(data_dir):
    raise errors.MissingFileError(
        f'config.dataset.data_dir={config.dataset.data_dir} does not exist.')
  init_from, init_step = config.init_from, config.init_step
  if with_data and init_from:
    if workdir_lib.is_workdir(init_from):
      workdir_lib.resolve_step(init_from, init_step)  # Raises, naming the steps there.
    elif not paths.is_file(init_from):  # Local or remote (gs://): vit_jax.base.paths.
      raise errors.MissingFileError(
          f'config.init_from={init_from} is neither a release .npz file nor the workdir of '
          'an earlier run (a directory with checkpoints/).')
  if with_data:
    workdir_lib.check_init_from(config)  # init_ema, init_source_grid, init_source_pool.
  if config.loss not in ('softmax_xent', 'sigmoid_xent'):
    raise errors.ConfigError(
        f"config.loss={config.loss!r} is not 'softmax_xent' or 'sigmoid_xent'.")
  for field in ('base_lr', 'end_lr'):
    lr = config.schedule[field]
    if lr < 0 or (field == 'base_lr' and lr == 0):
      raise errors.ConfigError(
          f'config.schedule.{field}={lr} must be {"positive" if field == "base_lr" else ">= 0"}'
          ' (e.g. 1e-3): a negative rate climbs the loss, a zero one trains nothing.')
  repeats = config.dataset.repeats
  if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
    raise errors.ConfigError(f'config.dataset.repeats={repeats!r} must be an integer >= 1 '
                             '(3: DeiT repeated augmentation; 1: off).')
  pipelines = {}
  for field in ('pp_train', 'pp_eval'):
    try:
      pipelines[field] = preprocess.parse(config.dataset[field])
    except ValueError as e:
      raise errors.ConfigError(f'config.dataset.{field}: {e}') from None

  if config.eval_batch_size is None:
    config.eval_batch_size = config.batch_size
  mesh = sharding.make_mesh(config.mesh, devices)
  # The devices that split the batch; those along 'tensor' share their rows.
  devices = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  accum = int(config.grad_accum_steps)
  for field in ('batch_size', 'eval_batch_size'):
    size = int(config[field])
    if size < devices:
      raise errors.ConfigError(
          f'config.{field}={size} is smaller than the {devices} devices: each device needs at '
          f'least one example. Use a multiple of {devices} (or fewer devices: --cpu_devices, '
          'config.mesh).')
    if size % devices:
      raise errors.ConfigError(f'config.{field}={size} is not divisible by the {devices} '
                               'devices that split it (config.mesh data x fsdp). Use a '
                               f'multiple of {devices}.')
  if (config.batch_size // devices) % accum:
    raise errors.ConfigError(f'config.grad_accum_steps={accum} does not divide the per-device '
                             f'batch {config.batch_size // devices}.')
  if config.step_impl not in ('jit', 'shard_map'):
    raise errors.ConfigError(
        f"config.step_impl={config.step_impl!r} is not 'jit' or 'shard_map'.")

  train_source = eval_source = None
  num_classes = int(config.dataset.num_classes)
  if with_data:
    try:
      train_source = sources.get_source(config.dataset, config.dataset.train_split)
      eval_source = sources.get_source(config.dataset, config.dataset.eval_split)
    except FileNotFoundError as e:
      raise errors.MissingFileError(f'config.dataset ({config.dataset.name!r}): {e}') from None
    except ValueError as e:
      raise errors.ConfigError(f'config.dataset ({config.dataset.name!r}): {e}') from None
    num_classes = num_classes or train_source.num_classes
    if not self_supervised and not train_source.num_classes:
      raise errors.ConfigError(
          f'config.dataset: {config.dataset.data_dir or config.dataset.name} has no labels. '
          "Pre-train on it without labels (config.objective='mpp'), or convert labelled data.")
    if not self_supervised and num_classes != train_source.num_classes:
      raise errors.ConfigError(f'config.dataset.num_classes={num_classes}, but the data has '
                               f'{train_source.num_classes} classes.')
    num_train_examples = len(train_source)
  elif not num_classes and not self_supervised:
    raise errors.ConfigError('config.dataset.num_classes is 0 (the data\'s): set it to plan '
                             'without the data.')
  if self_supervised:  # Labels ignored: a per-patch head instead of the classifier.
    num_classes = 0
  try:
    model = get_model(name, num_classes=num_classes, **options)
  except ValueError as e:
    raise errors.ConfigError(f'config.model: {e}') from None
  if self_supervised:
    model = mpp.pretraining_model(config, model)  # Checks config.mpp against the model.
  _check_image_size(model, config.model.image_size)
  if with_data:
    for field, split, source in (('pp_train', config.dataset.train_split, train_source),
                                 ('pp_eval', config.dataset.eval_split, eval_source)):
      _check_pipeline_size(field, pipelines[field], split, source, model.image_size)
  total, warmup = optim.resolve_steps(config, num_train_examples)
  optim.make_optimizer(config.optimizer, optim.make_schedule(config.schedule, total, warmup))
  return Plan(config, model, train_source, eval_source, num_classes, total, warmup, mesh,
              pipelines['pp_train'], pipelines['pp_eval'])


def _is_size(value: Any) -> bool:
  """A positive int, or a (height, width) pair of them."""
  sides = value if isinstance(value, (tuple, list)) and len(value) == 2 else (value,)
  return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sides)


def _check_image_size(model: nn.Module, configured: Any) -> None:
  """Every image side a multiple of the patch (times the hybrid stem's stride)."""
  stride = model.stem_stride
  for side, patch in zip(pair(model.image_size), pair(model.patch_size), strict=True):
    unit = patch * stride
    if side % unit:
      lower = side // unit * unit
      sizes = f'{lower} or {lower + unit}' if lower else f'{unit}'
      unit_text = f'{patch} x the BiT stem\'s stride {stride} = {unit}' if stride > 1 else unit
      raise errors.ConfigError(
          f'config.model.image_size={configured or model.image_size}: {side} px is not a '
          f'multiple of the patch size ({unit_text} px), so the last {side % unit} px would be '
          f'dropped. Use {sizes}.')


def _check_pipeline_size(field: str, pipeline: preprocess.Pipeline, split: str, source: Any,
                         size: tuple[int, int]) -> None:
  """The pipeline's output on the split's first example is the model's input size."""
  expected = (*size, 3)
  try:
    shape = pipeline(source[0]['image'], np.random.default_rng(0)).shape
  except Exception as e:  # Any failure of the user's pipeline on the user's data.
    raise errors.ConfigError(f'config.dataset.{field}={pipeline.spec!r} fails on the first '
                             f'{split!r} example: {type(e).__name__}: {e}') from None
  if tuple(shape) != expected:
    got = 'x'.join(map(str, shape))
    raise errors.ConfigError(
        f'config.dataset.{field}={pipeline.spec!r} makes {got} images (on the first {split!r} '
        f'example), but the model takes {size[0]}x{size[1]}x3 (config.model.image_size). End '
        f'the pipeline with resize({size[0] if size[0] == size[1] else size}) or a crop to it, '
        f'or change the image size'
        f'{" (and add to_rgb)" if len(shape) != 3 or shape[-1] != 3 else ""}.')


# ---------------------------------------------------------------------------
# State and step.


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, seed: int,
                       mesh: jax.sharding.Mesh, *, shard_state: bool = False,
                       abstract: bool = False) -> tuple[TrainState, Any]:
  """Initialises the state directly in its shardings (never gathered on one host).

  ``shard_state``: stored split over the data axis too (``vit_jax.base.sharding``;
  ``Plan.shard_state`` says where a config asks for it).
  ``abstract``: only its shapes and shardings (``jax.ShapeDtypeStruct``s), nothing computed.
  """
  images = jnp.zeros((1, *model.image_size, 3), jnp.float32)

  def init(rng: jax.Array) -> TrainState:
    init_rng, state_rng = jax.random.split(rng)
    params = model.init({'params': init_rng}, images, train=False)['params']
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), state_rng)

  rng = jax.random.PRNGKey(seed)
  shapes = jax.eval_shape(init, rng)
  shardings = sharding.shardings_for(shapes, mesh, stored=shard_state)
  if abstract:
    return manager_lib.abstract_like(shapes, shardings), shardings
  return jax.jit(init, out_shardings=shardings)(rng), shardings


def loss_and_grads(model: nn.Module, config: ml_collections.ConfigDict, params: Any,
                   batch: dict[str, jax.Array], rng: jax.Array,
                   constrain: Callable = lambda x: x,
                   gather: Callable = lambda p: p, mixed: bool = False) -> tuple[jax.Array, Any]:
  """Mean loss and its gradients, over ``grad_accum_steps`` micro-batches in sequence.

  ``gather`` maps ``params`` to what the model takes, inside the differentiated
  function (the shard_map step gathers its parameter shards there). ``mixed``: the
  batch has had its mixup/CutMix already (``mix_global_batch``), not to be mixed again.
  """
  smoothing = config.label_smoothing

  def mean_loss(p: Any, images: jax.Array, labels: jax.Array, key: jax.Array) -> jax.Array:
    if config.objective == 'mpp':  # Self-supervised: the labels are not read.
      return mpp.loss(model, config, gather(p), images, key)
    logits = model.apply({'params': gather(p)}, images, train=True, rngs={'dropout': key})
    return optim.loss_fn(config.loss, logits, labels, smoothing).mean()

  grad_fn = jax.value_and_grad(mean_loss)
  if not mixed:
    batch = mix_global_batch(batch, rng, config)
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
  blend = lambda x: (p * x + (1. - p) * jnp.roll(x, 1, axis=0)).astype(x.dtype)
  return {**batch, 'image': blend(batch['image']), 'label': blend(batch['label'])}


def cutmix(batch: dict[str, jax.Array], rng: jax.Array, alpha: float) -> dict[str, jax.Array]:
  """Pastes a box of each example's neighbour (``roll(x)``) into it. Yun et al., 2019.

  p ~ Beta(a, a); the box (one for the batch, as timm's) has sides sqrt(1 - p) of the
  image's around a uniform centre, clipped to the image. Labels are weighted by the
  areas as pasted: (1 - box share) own, box share the neighbour's.
  """
  height, width = batch['image'].shape[1:3]
  k_p, k_y, k_x = jax.random.split(rng, 3)
  side = jnp.sqrt(1. - jax.random.beta(k_p, alpha, alpha))

  def span(key: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    centre, half = jax.random.uniform(key, (), maxval=size), side * size / 2
    return (jnp.clip(jnp.round(centre - half), 0, size).astype(jnp.int32),
            jnp.clip(jnp.round(centre + half), 0, size).astype(jnp.int32))

  (top, bottom), (left, right) = span(k_y, height), span(k_x, width)
  rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
  box = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
  share = (bottom - top) * (right - left) / (height * width)
  image = jnp.where(box[None, :, :, None], jnp.roll(batch['image'], 1, axis=0), batch['image'])
  label = ((1. - share) * batch['label']
           + share * jnp.roll(batch['label'], 1, axis=0)).astype(batch['label'].dtype)
  return {**batch, 'image': image, 'label': label}


def mix_global_batch(batch: dict[str, jax.Array], step_rng: jax.Array,
                     config: ml_collections.ConfigDict) -> dict[str, jax.Array]:
  """``mix`` on the whole global batch with the step's key: both train steps call it
  there, so one lambda (or box) is drawn per step and each example is mixed with its
  neighbour in the global batch, whatever the mesh or ``step_impl``."""
  return mix(batch, jax.random.fold_in(step_rng, 0x6D697875), config)  # 'mixu'


def mix(batch: dict[str, jax.Array], rng: jax.Array,
        config: ml_collections.ConfigDict) -> dict[str, jax.Array]:
  """Mixup and/or CutMix as configured; with both, each batch takes CutMix with
  probability ``mixup_switch_prob``, else mixup (DeiT's switch)."""
  mixup_alpha, cutmix_alpha = config.mixup_alpha, config.cutmix_alpha
  if mixup_alpha and cutmix_alpha:
    k_switch, k_mix = jax.random.split(rng)
    return jax.lax.cond(jax.random.bernoulli(k_switch, config.mixup_switch_prob),
                        lambda b: cutmix(b, k_mix, cutmix_alpha),
                        lambda b: mixup(b, k_mix, mixup_alpha), batch)
  if cutmix_alpha:
    return cutmix(batch, rng, cutmix_alpha)
  return mixup(batch, rng, mixup_alpha) if mixup_alpha else batch


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
      # Parameters stored split over the data axis are gathered once, for the whole step;
      # their gradients are reduce-scattered back to the stored layout.
      params = jax.lax.with_sharding_constraint(
          state.params, sharding.shardings_for(state.params, mesh))
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # For sharding.constrain.
        loss, grads = loss_and_grads(model, config, params, batch, rng,
                                     lambda x: sharding.constrain(x, 'micro_batches'))
      grads = jax.lax.with_sharding_constraint(grads, state_shardings.params)
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
      # Each device: its own rows of the batch, and its own dropout and stochastic-depth
      # key (the step's, folded with its index: no two devices draw the same masks; mixup
      # already happened on the global batch, outside). A gradient of fsdp
      # shards is already summed over 'fsdp' (the gather's reduce-scatter); the rest is
      # summed here, then everything divided by the number of devices: the mean.
      rng = jax.random.fold_in(rng, jax.lax.axis_index(sharding.BATCH_AXES))
      loss, grads = loss_and_grads(model, config, params, batch, rng, gather=gather, mixed=True)
      grads = jax.tree.map(
          lambda g, spec: jax.lax.psum(g, tuple(a for a in sharding.BATCH_AXES
                                                if a not in spec)) / devices, grads, specs)
      return jax.lax.pmean(loss, sharding.BATCH_AXES), grads

    grads_fn = jax.shard_map(per_device, mesh=mesh,
                             in_specs=(specs, P(sharding.BATCH_AXES), P()),
                             out_specs=(P(), specs), axis_names=set(sharding.BATCH_AXES),
                             check_vma=False)

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
      rng = jax.random.fold_in(state.rng, state.step)
      # Mixup/CutMix as the jit step: on the global batch, before it is split (issue 32).
      batch = mix_global_batch(batch, rng, config)
      loss, grads = grads_fn(state.params, batch, rng)
      return apply_grads(state, loss, grads)

  return jax.jit(step, in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, replicated), donate_argnums=0)


# ---------------------------------------------------------------------------
# The loop.


class _MetricsLog:
  """TensorBoard events and ``metrics.jsonl`` in the workdir; process 0 only.

  The JSON-lines file keeps the rows up to the step the run starts from: a resumed
  run writes the rows after it again (the same training, bit for bit), so nothing is
  there twice, and a finished run started again adds no row. Local files are
  appended to; object stores (``gs://``) cannot append, so there the file is
  rewritten whole at each write.
  """

  def __init__(self, workdir: str, start_step: int = 0, append: bool | None = None):
    self.main = jax.process_index() == 0
    self.workdir = workdir
    self.jsonl = epath.Path(workdir) / 'metrics.jsonl'
    self.append = '://' not in str(workdir) if append is None else append
    self.lines: list[str] = []
    self.evals: dict[int, dict[str, float]] = {}  # Step -> its eval row.
    self.writer = None
    if not self.main:
      return
    self.writer = tensorboard_events.writer(workdir)  # clu's, or one without TensorFlow.
    if self.jsonl.exists():
      old = self.jsonl.read_text().splitlines(keepends=True)
      for line in old:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # A line cut short by a crash.
          continue
        if row['step'] <= start_step:
          self.lines.append(line)
          self._note(row)
      if self.lines != old:
        tmp = self.jsonl.parent / f'.{self.jsonl.name}.tmp'
        tmp.write_text(''.join(self.lines))
        tmp.replace(self.jsonl)

  def _note(self, row: dict[str, float]) -> None:
    if any(k.startswith('eval/') for k in row):
      self.evals[int(row['step'])] = row

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.main:
      return
    self.writer.write_scalars(step, scalars)
    row = {'step': step, **{k: float(v) for k, v in scalars.items()}}
    self._note(row)
    line = json.dumps(row) + '\n'
    if self.append:
      with self.jsonl.open('a') as f:
        f.write(line)
    else:
      self.lines.append(line)
      self.jsonl.write_text(''.join(self.lines))

  def close(self) -> None:
    if self.writer:
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


def _host_metrics(pending: list[tuple[int, Any]], manager: Any) -> list[dict[str, float]]:
  """The metrics of ``pending`` steps on the host; raises at the first non-finite loss."""
  host = jax.device_get([metrics for _, metrics in pending])
  for (step, _), metrics in zip(pending, host, strict=True):
    loss = float(metrics['loss'])
    if not math.isfinite(loss):
      raise FloatingPointError(
          f'Non-finite loss ({loss}) at step {step}. The run stopped; the last good '
          f'checkpoint is step {manager.latest_step()}. Lower the learning rate or check '
          'the input.')
  return host


@dataclasses.dataclass
class _Clock:
  """The run's wall time, and the loop's: compiling, evaluating, training (the rest)."""

  start: float = dataclasses.field(default_factory=time.perf_counter)
  loop: float = 0.  # When the loop started.
  compile: float = 0.
  eval: float = 0.

  def training(self) -> float:
    return time.perf_counter() - self.loop - self.compile - self.eval


@dataclasses.dataclass(frozen=True)
class _Speed:
  """The model FLOPs of a training image and the devices' peak: the MFU of a rate."""

  flops_per_image: float | None  # None where the compiler gives no count.
  peak: float  # FLOP/s of all the run's devices.
  peak_source: str

  def mfu(self, images_per_s: float) -> float | None:
    return self.flops_per_image * images_per_s / self.peak if self.flops_per_image else None


def _compile(train_step: Callable, inputs: Any, plan: Plan, clock: _Clock) -> _Speed:
  """Compiles the step for ``inputs`` ahead of the loop (its first call reuses the program)
  and reads its FLOPs; the time goes to ``clock.compile``."""
  started = time.perf_counter()
  compiled = train_step.lower(*inputs).compile()
  clock.compile = time.perf_counter() - started
  model, config = plan.model, plan.config
  flops = mfu.train_flops_per_image(model, compiled, plan.mesh.size, config.batch_size)
  dtypes = (jnp.dtype(model.dtype).name, _matmul_dtype(model))
  peak, how = mfu.device_peak('bfloat16' if 'bfloat16' in dtypes else 'float32')
  logging.info('Training steps %d-%d, batch %d. MFU: %.4g MFLOP a training image (model '
               'FLOPs) over %s.', int(jax.device_get(inputs[0].step)) + 1, plan.total_steps,
               config.batch_size, (flops or 0) / 1e6, how)
  return _Speed(flops, peak, how)


def _matmul_dtype(model: nn.Module) -> str | None:
  return model.matmul_dtype and jnp.dtype(model.matmul_dtype).name


def _starting_state(state: TrainState, state_shardings: Any, tx: optax.GradientTransformation,
                    manager: Any, plan: Plan) -> TrainState:
  """The state the run starts from: its newest good checkpoint, else ``config.init_from``'s
  parameters adapted to this model (fine-tuning: step 0, and an optimizer state initialised
  from them, so that the weights' EMA starts there too), else ``state`` as initialised."""
  config = plan.config
  if manager.latest_step() is not None:
    # The newest checkpoint that passes its checksums; damaged ones are moved aside.
    state = manager_lib.resume(manager, manager_lib.abstract_like(state, state_shardings))
    logging.info('Resumed from %s at step %d.', manager.directory, int(state.step))
  elif config.init_from:
    init_params = jax.tree.map(release.to_host, state.params)
    params = workdir_lib.init_params_from(
        config.init_from, init_params, plan.model, step=config.init_step,
        keep_head=config.init_keep_head, ema=config.init_ema,
        source_grid=config.init_source_grid, source_pool=config.init_source_pool)
    params = jax.device_put(params, state_shardings.params)
    opt_state = jax.jit(tx.init, out_shardings=state_shardings.opt_state)(params)
    state = state.replace(params=params, opt_state=opt_state)
    logging.info('Initialised from %s.', config.init_from)
  return state


def _evaluate(evaluator: evaluate.Evaluator, state: TrainState, step: int, log: _MetricsLog,
              clock: _Clock, extra_evals: list[Any] = ()) -> dict[str, float]:
  """The weights' metrics, and the moving average's as 'ema/...', logged at ``step``; the
  weights' ImageNet ReaL and v2 metrics as 'real/...' and 'v2/...' (``extra_evals``)."""
  started = time.perf_counter()
  result, line = {}, f'eval at step {step}:'
  for prefix, params in (('', state.params), ('ema/', state.ema_params)):
    if params is None:
      continue
    metrics = evaluator(params)
    result.update({prefix + k: v for k, v in metrics.items() if not prefix or k != 'examples'})
    line += (f'{"; EMA" if prefix else ""} {evaluator.metric} {metrics[evaluator.metric]:.4f}, '
             f'loss {metrics["loss"]:.4f}')
  if extra_evals:  # vit_jax/imagenet_evals.py, beside the top-1.
    extra, text = imagenet_evals.evaluate_all(extra_evals, evaluator, state.params)
    result.update(extra)
    line += text
  if step not in log.evals:  # A finished run evaluated again adds no row.
    log.write(step, {f'eval/{k}': v for k, v in result.items()})
  logging.info('%s (%d examples)', line, result['examples'])
  clock.eval += time.perf_counter() - started
  return result


def _fewshot(fewshot_eval: fewshot.Evaluator, state: TrainState, step: int, log: _MetricsLog,
             clock: _Clock) -> dict[str, float]:
  """Few-shot linear accuracy (vit_jax/fewshot.py), logged as fewshot/<dataset>_<k>shot."""
  started = time.perf_counter()
  metrics = fewshot_eval.run(state.params)
  log.write(step, metrics)
  seconds = time.perf_counter() - started
  logging.info('few-shot at step %d (%.1fs): %s', step, seconds,
               ', '.join(f'{k.split("/")[1]} {v:.4f}' for k, v in metrics.items()))
  clock.eval += seconds
  return metrics


def _log_interval(step: int, host: list[dict[str, float]], images_per_s: float, eta: float,
                  speed: _Speed, plan: Plan, log: _MetricsLog) -> None:
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
             metric: str, log: _MetricsLog, manager: Any) -> None:
  """The closing lines: steps trained, time and speed, final and best evaluations."""
  trained = step - start_step
  line = f'Done: step {step}/{plan.total_steps}'
  if trained:
    images_per_s = trained * plan.config.batch_size / max(clock.training(), 1e-9)
    line += (f', {trained} trained in {console.duration(time.perf_counter() - clock.start)} '
             f'(compiling {clock.compile:.0f}s, evaluating {clock.eval:.0f}s), '
             f'{images_per_s:,.0f} img/s')
    if speed and (mfu_ := speed.mfu(images_per_s)) is not None:
      line += f', MFU {100 * mfu_:.1f}%'
  logging.info('%s.', line)
  for name in ('', 'EMA '):
    key = f'eval/{"ema/" if name else ""}{metric}'
    if evals := {s: row[key] for s, row in log.evals.items() if key in row}:
      best, final = max(evals, key=evals.get), max(evals)
      logging.info('%seval %s: final %.4f (step %d), best %.4f (step %d).', name, metric,
                   evals[final], final, evals[best], best)
  logging.info('Checkpoints: %s (steps %s). Logs: %s, TensorBoard events in %s.',
               manager.directory, ', '.join(map(str, manager.all_steps())) or 'none',
               log.jsonl, log.workdir)


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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains (resuming from ``workdir`` if it holds a checkpoint) and evaluates; returns the
  last evaluation. On SIGTERM it saves and raises ``errors.Preempted`` (exit status 75)."""
  clock = _Clock()
  plan = validate(config)
  config, model, mesh, total_steps = plan.config, plan.model, plan.mesh, plan.total_steps
  # config.evals (docs/evaluation.md): opened and checked here, before anything compiles.
  fewshot_eval = fewshot.from_config(config, model.image_size)
  extra_evals = imagenet_evals.from_config(
      config, plan.num_classes, tuple(getattr(plan.train_source, 'class_names', ())),
      model.image_size, plan.pp_eval)
  for warning in cpu.warnings(_matmul_dtype(model)):
    logging.warning(warning)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)

  # The state: resumed, fine-tuned from config.init_from, or fresh.
  schedule = optim.make_schedule(config.schedule, total_steps, plan.warmup_steps)
  tx = optim.make_optimizer(config.optimizer, schedule)
  state, state_shardings = create_train_state(model, tx, config.seed, mesh,
                                              shard_state=plan.shard_state)
  manager = manager_lib.make_manager(workdir, every_steps=config.checkpoint_every_steps,
                                     keep=config.keep_checkpoints)
  state = _starting_state(state, state_shardings, tx, manager, plan)
  start_step = int(jax.device_get(state.step))

  log = _MetricsLog(workdir, start_step)
  if log.main:  # What this workdir holds, for the tools that read it later.
    workdir_lib.write_run_info(workdir, config, plan.num_classes,
                               tuple(getattr(plan.train_source, 'class_names', ())))
    if start_step == 0:
      _parameter_overview(model, state.params, workdir)
      log.writer.write_hparams({k: str(v) for k, v in config.items()})

  # The programs and the data.
  train_step = make_train_step(model, tx, schedule, config, mesh, state_shardings)
  evaluator = evaluate.make_evaluator(plan, state_shardings.params)
  if fewshot_eval:
    fewshot_eval.bind(model, state_shardings.params, sharding.batch_sharding(mesh))
  train_loader = loader.TrainLoader(
      plan.train_source, plan.pp_train, global_batch_size=config.batch_size,
      seed=config.seed, sharding=sharding.batch_sharding(mesh),
      num_classes=plan.num_classes, num_workers=config.input_workers,
      repeats=config.dataset.repeats)
  stream = batches = train_loader.iterate(start_step)
  preemption = _Preemption()
  profile = tuple(config.profile_steps or ())
  speed, result = None, {}
  try:
    clock.loop = time.perf_counter()
    if start_step < total_steps:  # The step compiled for the first batch, before the loop.
      first = next(stream)
      speed = _compile(train_step, sharding.inputs_ready((state, first[1])), plan, clock)
      batches = itertools.chain([first], stream)

    pending: list[tuple[int, Any]] = []  # The steps since the last log line, their metrics.
    interval_step, interval_time = start_step, clock.training()
    for step in range(start_step + 1, total_steps + 1):
      if profile and step == profile[0]:
        jax.profiler.start_trace(str(epath.Path(workdir) / 'profile'))
      _, batch = next(batches)
      state, metrics = train_step(*sharding.inputs_ready((state, batch)))
      pending.append((step, metrics))
      manager_lib.check_saves(manager)  # A background save that failed stops the run now.
      if profile and step == profile[1]:
        jax.profiler.stop_trace()

      if step % config.log_every_steps == 0 or step == total_steps:
        host = _host_metrics(pending, manager)
        elapsed = clock.training() - interval_time
        eta = (total_steps - step) * elapsed / (step - interval_step)
        _log_interval(step, host, (step - interval_step) * config.batch_size / elapsed, eta,
                      speed, plan, log)
        pending, interval_step, interval_time = [], step, clock.training()
      if preemption.reached(manager, step):
        _host_metrics(pending, manager)
        manager_lib.save(manager, step, state, force=True)
        manager.wait_until_finished()
        logging.warning('Preempted: saved step %d; restart with the same workdir to resume.',
                        step)
        _summary(step, start_step, plan, clock, speed, evaluator.metric, log, manager)
        raise errors.Preempted(step)  # Exit status 75: run again to resume.
      if step % config.checkpoint_every_steps == 0 or step == total_steps:
        _host_metrics(pending, manager)
        manager_lib.save(manager, step, state, force=True)
      if (config.eval_every_steps and step % config.eval_every_steps == 0
          or step == total_steps):
        result = _evaluate(evaluator, state, step, log, clock, extra_evals)
      if fewshot_eval and fewshot_eval.due(step, total_steps, config.eval_every_steps):
        result.update(_fewshot(fewshot_eval, state, step, log, clock))
    if start_step >= total_steps:
      logging.info('The run in %s is already complete (step %d).', workdir, start_step)
      result = _evaluate(evaluator, state, start_step, log, clock, extra_evals)
    manager.wait_until_finished()
    _summary(max(start_step, total_steps), start_step, plan, clock, speed, evaluator.metric,
             log, manager)
  finally:
    preemption.close()
    stream.close()
    manager.wait_until_finished()
    manager.close()
    log.close()
  return result
