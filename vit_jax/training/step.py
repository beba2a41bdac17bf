"""The train state and the pure step that advances it: ``(state, batch) -> (state, metrics)``.

``make_train_step`` compiles it over a device mesh, either as one ``jax.jit`` program laid
out by XLA from the state's shardings, or with ``jax.shard_map`` explicit over the batch
axes; the step needs only the few options of ``StepOptions``, not the whole config.
``PatchSizeSteps``: FlexiViT's training, one such step per patch size, drawn per step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from jax.sharding import PartitionSpec as P

from vit_jax.base import sharding
from vit_jax.base.sizes import pair
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.models import flexi, mpp, naflex
from vit_jax.training import mixing, optim


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to continue: with the step, the data position too."""

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # Base key; step s uses fold_in(rng, s), so nothing else to save.

  @property
  def ema_params(self) -> Any:
    """The weights' moving average (``config.optimizer.ema_decay``, kept in the optimizer
    state: saved, restored and sharded with it), or None."""
    return optim.ema_params(self.opt_state)


@flax.struct.dataclass
class Teacher:
  """DeiT's teacher (Touvron et al., 2021, hard-label distillation): a frozen classifier
  whose hard labels, the argmax of its logits on the step's own (augmented and mixed) images,
  the distillation head learns. An argument of the jitted step: never trained, not in the
  optimizer state, not saved (re-loaded from its SOURCE, ``config.distill.teacher``)."""

  params: Any
  model: nn.Module = flax.struct.field(pytree_node=False)
  # (a, b) per channel: the teacher's input is a * x + b of the run's (None: x).
  rescale: tuple[tuple[float, ...], tuple[float, ...]] | None = flax.struct.field(
      pytree_node=False, default=None)

  def inputs(self, images: jax.Array) -> jax.Array:
    """The run's ``images`` as the teacher takes them: rescaled, resized (bilinear)."""
    if self.rescale:
      images = images * jnp.asarray(self.rescale[0]) + jnp.asarray(self.rescale[1])
    size = pair(self.model.image_size)
    if images.shape[1:3] == size:
      return images
    return jax.image.resize(images, (images.shape[0], *size, 3), 'bilinear')

  def labels(self, images: jax.Array) -> jax.Array:
    """Its one-hot hard labels of the run's ``images``."""
    logits = self.model.apply({'params': jax.lax.stop_gradient(self.params)},
                              self.inputs(images))
    return jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """What the step reads of a config."""

  impl: str = 'jit'  # 'jit' or 'shard_map'.
  loss: str = 'softmax_xent'
  label_smoothing: float = 0.
  grad_accum_steps: int = 1
  mix: mixing.MixOptions = mixing.MixOptions()
  mpp: mpp.Options | None = None  # Masked patch prediction instead of the labels.

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> StepOptions:
    return cls(config.step_impl, config.loss, config.label_smoothing,
               int(config.grad_accum_steps), mixing.MixOptions.from_config(config),
               mpp.Options.from_config(config))


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, seed: int,
                       mesh: jax.sharding.Mesh, *, shard_state: bool = False,
                       abstract: bool = False) -> tuple[TrainState, Any]:
  """Initialises the state directly in its shardings (never gathered on one host).

  ``shard_state``: stored split over the data axis too (``vit_jax.base.sharding``).
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


def packed_loss(options: StepOptions, logits: jax.Array, labels: jax.Array,
                image_mask: jax.Array) -> jax.Array:
  """The mean loss of a packed batch's real images: ``logits`` and ``labels`` (rows, K,
  classes), ``image_mask`` (rows, K) True where a slot holds an image; the empty slots are
  out of the mean (and get no gradient)."""
  per_image = optim.loss_fn(options.loss, logits, labels, options.label_smoothing)
  return (jnp.where(image_mask, per_image, 0.).sum()
          / jnp.maximum(image_mask.sum(), 1).astype(per_image.dtype))


def loss_and_grads(model: nn.Module, options: StepOptions, params: Any,
                   batch: dict[str, jax.Array], rng: jax.Array,
                   constrain: Callable = lambda x: x,
                   gather: Callable = lambda p: p, mixed: bool = False,
                   teacher: Teacher | None = None) -> tuple[jax.Array, Any]:
  """Mean loss and its gradients, over ``grad_accum_steps`` micro-batches in sequence.

  ``gather`` maps ``params`` to what the model takes, inside the differentiated
  function (the shard_map step gathers its parameter shards there). ``mixed``: the
  batch has had its mixup/CutMix already (``mixing.mix_global_batch``). ``teacher``:
  the class head learns the labels and the distillation head the teacher's hard labels of
  the same images, half the loss each (DeiT's hard distillation); None: the heads' mean
  learns the labels (timm's training of a distilled model without a teacher).

  The model's input is ``naflex.inputs(batch)``: the images, or the patch sequences of a
  ``naflex`` pipeline. A packed batch (NaViT, ``vit_jax.data.packing``) has per-image labels
  (rows, K, classes) and ``image_mask`` (rows, K), the slots that hold an image: the loss is
  the mean over those images only (an empty slot's is out of the loss, so its gradient is
  zero); under ``grad_accum_steps`` or the shard_map step, each micro-batch's or device's mean,
  averaged.
  """
  def mean_loss(p: Any, images: Any, labels: jax.Array, key: jax.Array,
                *image_mask: jax.Array) -> jax.Array:
    if options.mpp:  # Self-supervised: the labels are not read.
      return mpp.loss(model, options.mpp, gather(p), images, key)
    logits = model.apply({'params': gather(p)}, images, train=True, rngs={'dropout': key},
                         both_heads=teacher is not None)
    if image_mask:
      return packed_loss(options, logits, labels, *image_mask)
    loss = lambda logits, y, smoothing=options.label_smoothing: optim.loss_fn(
        options.loss, logits, y, smoothing).mean()
    if teacher is None:
      return loss(logits, labels)
    return (loss(logits[0], labels) + loss(logits[1], teacher.labels(images), 0.)) / 2

  def arguments(batch: dict[str, jax.Array]) -> tuple[Any, ...]:
    """The model's input and the labels (and a packed batch's ``image_mask``)."""
    mask = (batch['image_mask'],) if 'image_mask' in batch else ()
    return (naflex.inputs(batch), batch['label'], *mask)

  grad_fn = jax.value_and_grad(mean_loss)
  if not mixed:
    batch = mixing.mix_global_batch(batch, rng, options.mix)
  k = options.grad_accum_steps
  if k == 1:
    inputs, labels, *mask = arguments(batch)
    return grad_fn(params, inputs, labels, rng, *mask)
  # Micro-batch i takes rows i, i + k, ...: every device keeps its rows.
  micro = jax.tree.map(
      lambda x: constrain(x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)), batch)

  def accumulate(carry: Any, xs: Any) -> tuple[Any, None]:
    i, mb = xs
    inputs, labels, *mask = arguments(mb)
    loss, grads = grad_fn(params, inputs, labels, jax.random.fold_in(rng, i), *mask)
    return jax.tree.map(jnp.add, carry, (loss, grads)), None

  zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
  (loss, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(k), micro))
  return loss / k, jax.tree.map(lambda g: g / k, grads)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, options: StepOptions,
                    mesh: jax.sharding.Mesh, state_shardings: Any,
                    teacher: Teacher | None = None, patch_size: int | None = None) -> Callable:
  """The jitted (state, batch) -> (state, metrics) step; the input state is donated.

  'jit': one program for the whole mesh, laid out by XLA (GSPMD) from the state's
  shardings and the model's activation constraints (``sharding.constrain``).
  'shard_map': explicit over the batch axes ('data', 'fsdp'): each device computes the
  loss and gradients of its own rows, with its fsdp parameter shards gathered where
  they are used (autodiff turns each gather into a reduce-scatter of the gradients),
  then averages them over the batch axes; the 'tensor' axis stays with XLA inside it.
  The optimizer update then runs on the sharded state, outside the shard_map.
  ``teacher`` (``loss_and_grads``) is put on the mesh and passed to the step as its third
  argument; the step returned still takes (state, batch), and lowers so.
  ``patch_size``: the model runs at this patch size on its own parameters, resampled inside
  the differentiated function (FlexiViT, ``flexi.at_patch_size``); None: its own.
  """
  model = flexi.at_patch_size(model, patch_size)

  def apply_grads(state: TrainState, loss: jax.Array, grads: Any) -> tuple[TrainState, Any]:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': loss, 'grad_norm': optax.tree.norm(grads),
               'learning_rate': schedule(state.step)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  if options.impl == 'jit':
    def step(state: TrainState, batch: dict[str, jax.Array],
             teacher: Teacher | None = None) -> tuple[TrainState, Any]:
      rng = jax.random.fold_in(state.rng, state.step)
      # Parameters stored split over the data axis are gathered once, for the whole step;
      # their gradients are reduce-scattered back to the stored layout.
      params = jax.lax.with_sharding_constraint(
          state.params, sharding.shardings_for(state.params, mesh))
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # For sharding.constrain.
        loss, grads = loss_and_grads(model, options, params, batch, rng,
                                     lambda x: sharding.constrain(x, 'micro_batches'),
                                     teacher=teacher)
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

    def per_device(params: Any, batch: dict[str, jax.Array], rng: jax.Array,
                   teacher: Teacher | None = None) -> tuple[jax.Array, Any]:
      # Each device: its own rows, and its own dropout and stochastic-depth key (the
      # step's, folded with its index; mixup already happened on the global batch). A
      # gradient of fsdp shards is already summed over 'fsdp' (the gather's
      # reduce-scatter); the rest is summed here, then all divided by the devices: the mean.
      rng = jax.random.fold_in(rng, jax.lax.axis_index(sharding.BATCH_AXES))
      loss, grads = loss_and_grads(model, options, params, batch, rng, gather=gather,
                                   mixed=True, teacher=teacher)
      grads = jax.tree.map(
          lambda g, spec: jax.lax.psum(g, tuple(a for a in sharding.BATCH_AXES
                                                if a not in spec)) / devices, grads, specs)
      return jax.lax.pmean(loss, sharding.BATCH_AXES), grads

    # The teacher, where there is one, is whole on each device.
    in_specs = (specs, P(sharding.BATCH_AXES), P()) + ((P(),) if teacher is not None else ())
    grads_fn = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs,
                             out_specs=(P(), specs), axis_names=set(sharding.BATCH_AXES),
                             check_vma=False)

    def step(state: TrainState, batch: dict[str, jax.Array],
             *teacher: Teacher) -> tuple[TrainState, Any]:
      rng = jax.random.fold_in(state.rng, state.step)
      batch = mixing.mix_global_batch(batch, rng, options.mix)  # As the jit step: global.
      loss, grads = grads_fn(state.params, batch, rng, *teacher)
      return apply_grads(state, loss, grads)

  in_shardings = (state_shardings, sharding.batch_sharding(mesh))
  if teacher is not None:
    in_shardings += (teacher.replace(params=sharding.shardings_for(teacher.params, mesh)),)
  jitted = jax.jit(step, in_shardings=in_shardings,
                   out_shardings=(state_shardings, sharding.replicated(mesh)), donate_argnums=0)
  return jitted if teacher is None else _WithTeacher(jitted,
                                                     jax.device_put(teacher, in_shardings[2]))


@dataclasses.dataclass(frozen=True)
class _WithTeacher:
  """A jitted (state, batch, teacher) step called and lowered as (state, batch)."""

  step: Callable
  teacher: Teacher

  def __call__(self, state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, Any]:
    return self.step(state, batch, self.teacher)

  def lower(self, state: Any, batch: Any) -> Any:
    return self.step.lower(state, batch, self.teacher)


@dataclasses.dataclass
class PatchSizeSteps:
  """FlexiViT's training: step s (1-based) runs at the patch size ``flexi.draw`` picks from
  (seed, s) alone, so a resumed run draws the same sizes; one jitted step per patch size,
  ``make(patch_size)``, made when first drawn and kept (each compiles on its first call)."""

  make: Callable[[int], Callable]
  seed: int
  patch_sizes: tuple[int, ...]
  probabilities: tuple[float, ...] = ()
  steps: dict[int, Callable] = dataclasses.field(default_factory=dict)

  def patch_size(self, step: int) -> int:
    return flexi.draw(self.seed, step, self.patch_sizes, self.probabilities)

  def at(self, step: int) -> Callable:
    """The jitted step of training step ``step``."""
    size = self.patch_size(step)
    if size not in self.steps:
      logging.info('FlexiViT: step %d draws patch size %d, the %s of %s: its step compiles now.',
                   step, size, _ordinal(len(self.steps) + 1), self.patch_sizes)
      self.steps[size] = self.make(size)
    return self.steps[size]

  def lower(self, state: Any, batch: Any) -> Any:
    """The smallest patch size's step lowered: the most tokens, the most memory and time
    (what a plan ahead of time, ``vit_jax.tools.aot``, must fit)."""
    size = min(self.patch_sizes)
    if size not in self.steps:
      self.steps[size] = self.make(size)
    return self.steps[size].lower(state, batch)


def _ordinal(n: int) -> str:
  return f'{n}{"th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")}'
