"""Optimizers, learning-rate schedules and losses of the paper's recipes (appendix B).

Pre-training: Adam (0.9, 0.999) with decoupled weight decay on the kernels and
global-norm clipping; fine-tuning: SGD with momentum 0.9. Linear warm-up, then
linear or cosine decay. Weight decay is decoupled (AdamW) and, as in the paper's
code, scaled by the learning rate: the paper's 0.03 at lr 1e-3 removes 3e-5 of
each kernel per step.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax.base import errors
from vit_jax.checkpoints.formats.layout import flatten, unflatten

_MU_DTYPES = {None: None, 'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def resolve_steps(config: Any, num_train_examples: int) -> tuple[int, int]:
  """(total_steps, warmup_steps) from ``total_steps`` or ``num_epochs`` (and warm-up alike)."""
  steps_per_epoch = num_train_examples / config.batch_size
  if config.get('total_steps'):
    total = int(config.total_steps)
  elif config.get('num_epochs'):
    total = math.ceil(config.num_epochs * steps_per_epoch)
  else:
    raise errors.ConfigError('Set config.total_steps or config.num_epochs.')
  schedule = config.schedule
  if schedule.get('warmup_epochs'):
    warmup = math.ceil(schedule.warmup_epochs * steps_per_epoch)
  else:
    warmup = int(schedule.get('warmup_steps', 0))
  if warmup >= total:
    raise errors.ConfigError(f'config.schedule: the warm-up ({warmup} steps) is not shorter '
                             f'than the run ({total} steps). Shorten the warm-up or train longer.')
  return total, warmup


def make_schedule(schedule: Any, total_steps: int, warmup_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to ``base_lr``, then 'linear', 'cosine' or 'constant' to the end."""
  base_lr = float(schedule.base_lr)
  end_lr = float(schedule.get('end_lr', 0.))
  decay_steps = total_steps - warmup_steps
  decay = schedule.get('decay', 'cosine')
  if decay == 'linear':
    after = optax.linear_schedule(base_lr, end_lr, decay_steps)
  elif decay == 'cosine':
    after = optax.cosine_decay_schedule(base_lr, decay_steps,
                                        alpha=end_lr / base_lr if base_lr else 0.)
  elif decay == 'constant':
    after = optax.constant_schedule(base_lr)
  else:
    raise errors.ConfigError(
        f"config.schedule.decay={decay!r} is not 'linear', 'cosine' or 'constant'.")
  if not warmup_steps:
    return after
  return optax.join_schedules([optax.linear_schedule(0., base_lr, warmup_steps), after],
                              [warmup_steps])


def with_phases(schedule: optax.Schedule, total_steps: int,
                phases: list[dict[str, Any]]) -> tuple[optax.Schedule, int]:
  """``schedule`` (steps 0 to ``total_steps``) followed by each of ``phases``
  (``vit_jax.config.phases``: a schedule of its own from the step the one before ended,
  never a recomputed one), and the step the last ends at."""
  schedules, boundaries, end = [schedule], [], total_steps
  for phase in phases:
    schedules.append(make_schedule(ml_collections.ConfigDict(phase), phase['total_steps'] - end,
                                   phase['warmup_steps']))
    boundaries.append(end)
    end = phase['total_steps']
  return (optax.join_schedules(schedules, boundaries) if boundaries else schedule), end


def kernel_mask(params: Any) -> Any:
  """True for the weight matrices and convolution kernels (weight decay applies there)."""
  flat = flatten(params)
  return unflatten({k: k.endswith('/kernel') for k in flat})


_BLOCK = re.compile(r'^Transformer/encoderblock_(\d+)/')
# The input side, below the first block: the patch embedding, the class token, the
# position embeddings and the BiT stem of the hybrids (conv_root, gn_root, block{i}).
_EMBEDDINGS = re.compile(r'^(embedding|cls|Transformer/posembed_input|conv_root|gn_root|'
                         r'block\d+)/?')


def layer_scales(params: Any, decay: float) -> Any:
  """Each parameter's learning-rate factor for layer-wise decay ``decay``, as a tree.

  With L blocks, block i (``Transformer/encoderblock_{i}``, from 0) gets
  decay^(L - i), the embeddings decay^(L + 1), everything above the blocks (the final
  LayerNorm, MAP head, pre-logits, head) 1. A scanned model's stacked blocks
  (``Transformer/encoderblock``, layer axis first) get a vector over that axis, shaped
  to broadcast. The release names give the depth, as in BEiT's and MAE's fine-tuning.
  """
  flat = flatten(params)
  scanned = [np.shape(v)[0] for k, v in flat.items() if k.startswith('Transformer/encoderblock/')]
  depth = scanned[0] if scanned else len({m.group(1) for k in flat if (m := _BLOCK.match(k))})

  def scale(key: str, value: Any) -> Any:
    if m := _BLOCK.match(key):
      return decay ** (depth - int(m.group(1)))
    if key.startswith('Transformer/encoderblock/'):
      factors = decay ** (depth - np.arange(depth, dtype=np.float64))
      return jnp.asarray(factors.reshape((depth,) + (1,) * (np.ndim(value) - 1)), jnp.float32)
    return decay ** (depth + 1) if _EMBEDDINGS.match(key) else 1.
  return unflatten({k: scale(k, v) for k, v in flat.items()})


def scale_by_layer(decay: float) -> optax.GradientTransformation:
  """Multiplies each update by its ``layer_scales`` factor."""
  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    del params
    scales = layer_scales(updates, decay)
    return jax.tree.map(lambda u, s: (u * s).astype(u.dtype), updates, scales), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class WeightEmaState(NamedTuple):
  ema: Any  # The moving average of the weights, in their layout, in float32.


def weight_ema(decay: float) -> optax.GradientTransformation:
  """Keeps ema = decay * ema + (1 - decay) * weights, of the weights after each update.

  Last in a chain, it sees the final updates: the new weights are
  ``optax.apply_updates(params, updates)``, as the train step computes them. The
  average starts at the initial weights (``init`` is called on the weights a run
  starts from) and is kept in float32 whatever the weights' dtype: in bfloat16,
  ``(1 - d) * (w - ema)`` with d = 0.9999 is below half a unit in the last place of
  ``ema`` whenever ``|w - ema|`` is under about 20 ``|ema|``, so the average would
  never move. The updates pass through unchanged.
  """
  def init(params: Any) -> WeightEmaState:
    return WeightEmaState(jax.tree.map(lambda w: jnp.asarray(w, jnp.float32), params))

  def update(updates: Any, state: WeightEmaState, params: Any = None) -> tuple[Any, Any]:
    weights = optax.apply_updates(params, updates)
    ema = jax.tree.map(lambda e, w: decay * e + (1. - decay) * w.astype(jnp.float32),
                       state.ema, weights)
    return updates, WeightEmaState(ema)
  return optax.GradientTransformation(init, update)


def ema_params(opt_state: Any) -> Any:
  """The ``weight_ema`` average in an optimizer state (a chain's), or None."""
  if isinstance(opt_state, WeightEmaState):
    return opt_state.ema
  if isinstance(opt_state, tuple):
    for inner in opt_state:
      if (found := ema_params(inner)) is not None:
        return found
  return None


def make_optimizer(optimizer: Any, learning_rate: optax.Schedule) -> optax.GradientTransformation:
  """Adam with decoupled weight decay, or SGD with momentum; clipping first.

  ``layer_decay`` < 1 scales each parameter's step (its weight decay included, which
  the learning rate scales too) by ``layer_scales``; ``ema_decay`` > 0 keeps a moving
  average of the weights in the optimizer state (``weight_ema``).
  """
  name = optimizer.get('name', 'adam')
  clip = optimizer.get('grad_clip_norm')
  chain = [optax.clip_by_global_norm(clip)] if clip else []
  if name == 'adam':
    mu_dtype = optimizer.get('mu_dtype')
    if mu_dtype not in _MU_DTYPES:
      raise errors.ConfigError(f'config.optimizer.mu_dtype={mu_dtype!r} is not one of '
                               f'{list(_MU_DTYPES)}.')
    chain.append(optax.scale_by_adam(optimizer.get('b1', 0.9), optimizer.get('b2', 0.999),
                                     mu_dtype=_MU_DTYPES[mu_dtype]))
    if optimizer.get('weight_decay'):
      chain.append(optax.add_decayed_weights(optimizer.weight_decay, mask=kernel_mask))
  elif name == 'sgd':
    if optimizer.get('weight_decay'):
      chain.append(optax.add_decayed_weights(optimizer.weight_decay, mask=kernel_mask))
    chain.append(optax.trace(decay=optimizer.get('momentum', 0.9)))
  else:
    raise errors.ConfigError(f"config.optimizer.name={name!r} is not 'adam' or 'sgd'.")
  layer_decay = optimizer.get('layer_decay', 1.)
  if not 0 < layer_decay <= 1:
    raise errors.ConfigError(f'config.optimizer.layer_decay={layer_decay} is not in (0, 1] '
                             '(1: off; 0.65-0.75 for fine-tuning a ViT-B).')
  if layer_decay < 1:
    chain.append(scale_by_layer(layer_decay))
  chain.append(optax.scale_by_learning_rate(learning_rate))
  ema_decay = optimizer.get('ema_decay', 0.)
  if not 0 <= ema_decay < 1:
    raise ValueError(f'config.optimizer.ema_decay={ema_decay} is not in [0, 1) (0: off; '
                     'DeiT: 0.99996).')
  if ema_decay:
    chain.append(weight_ema(ema_decay))
  return optax.chain(*chain)


def loss_fn(name: str, logits: jax.Array, labels: jax.Array,
            label_smoothing: float = 0.) -> jax.Array:
  """Per-example loss. ``labels`` are one-hot (softmax) or multi-hot (sigmoid) floats."""
  if label_smoothing:
    labels = labels * (1. - label_smoothing) + label_smoothing / labels.shape[-1]
  if name == 'softmax_xent':
    return optax.softmax_cross_entropy(logits, labels)
  if name == 'sigmoid_xent':
    return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)
  raise ValueError(f"config.loss={name!r} is not 'softmax_xent' or 'sigmoid_xent'.")
