r"""The one base config: every field a run reads, its default, and what it means.

Each file in ``configs/`` starts from ``get_config()`` and overrides only what its
recipe changes, so two recipes are compared by reading two short files (big_vision's
habit). Any field can be overridden on the command line, ``--config.batch_size=256``;
a field that is not here does not exist.

A ``None`` model option means "the model's own": the architecture named by
``model.name`` (``b16``: width 768, 12 layers, ...) or ``VisionTransformer``'s default.
"""

from __future__ import annotations

import difflib
from typing import Any

import ml_collections

from vit_jax import errors

_none = ml_collections.config_dict.placeholder


def get_config() -> ml_collections.ConfigDict:
  """The defaults; a recipe overrides what it changes."""
  config = ml_collections.ConfigDict()

  # The model: a zoo name (vit_jax.models.get_model) and any VisionTransformer option.
  config.model = ml_collections.ConfigDict(dict(
      name='b16',  # ti16, b16, h14, r50_b16, g14, G14, e14, 22b14, ... or ViT-B_16.
      image_size=_none(object),  # Input size in pixels: 224 or (height, width); the name's.
      patch_size=_none(object),  # Patch side or (height, width); the name's (16 for b16).
      hidden_size=_none(int), mlp_dim=_none(int), num_heads=_none(int),
      num_layers=_none(int),  # The encoder's shape; the name's.
      pool=_none(str),  # 'token' (class token), 'gap' or 'map'.
      representation_size=_none(int),  # Pre-logits layer (Dense + tanh) width; none.
      head_bias_init=_none(float),  # Classifier bias (0; -10 for sigmoid pre-training).
      posemb=_none(str),  # 'learn' or 'sincos2d'.
      dropout_rate=_none(float), attention_dropout_rate=_none(float),  # 0.
      stochastic_depth=_none(float),  # Drop-path rate of the last block (0).
      attention_impl=_none(str),  # 'einsum', 'xla' or 'cudnn'.
      scan=_none(bool),  # One scanned block: compiles much faster (False).
      remat_policy=_none(str),  # 'none', 'full', 'dots' or 'dots_no_batch'.
      dtype=_none(str),  # Compute dtype: 'float32' or 'bfloat16'.
      param_dtype=_none(str),  # 'float32'.
      # bfloat16 matmul operands with float32 accumulation, forward and backward.
      matmul_dtype=_none(str),
      resnet_layers=_none(tuple),  # BiT stem units per stage (hybrids); the name's.
      resnet_width=_none(int),  # BiT width factor (1).
      parallel_block=_none(bool),  # Attention and MLP side by side on one LayerNorm (False).
      qk_norm=_none(bool),  # Normalise each head's queries and keys (False).
      qkv_bias=_none(bool),  # Biases in the query/key/value projections (True).
      norm=_none(str),  # 'layernorm' or 'rmsnorm' (no centering, no bias; ViT-22B).
  ))

  # The data: a TFDS name, 'digits', 'mnist', 'fashion_mnist', or a local-format dataset.
  config.dataset = ml_collections.ConfigDict(dict(
      name='imagenet2012',
      data_dir='',  # TFDS data_dir, or the directory of IDX / local-format files.
      manual_dir='',  # TFDS manual_dir (ImageNet's tar files).
      prepare=False,  # Build a missing TFDS dataset first.
      num_classes=0,  # 0: the data's.
      train_split='train', eval_split='test',
      pp_train='decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
      pp_eval='decode|resize_small(256)|central_crop(224)|value_range(-1, 1)',
  ))

  # What the step learns: 'classification' (the labels), or 'mpp': masked patch prediction,
  # self-supervised, no label read (vit_jax/mpp.py; the paper's section 4.6).
  config.objective = 'classification'
  config.mpp = ml_collections.ConfigDict(dict(
      # 'mean_color' (512-way 3-bit mean colour, the paper's), 'color_4x4' (a 4x4 downsized
      # patch of 3-bit colours), 'l2_mean_color' or 'l2_patch' (RGB regressed, L2 loss).
      target='mean_color',
      corrupt_rate=0.5,  # The share of each image's patches corrupted and predicted.
      mask_rate=0.8,  # Of those: replaced by the learnable [mask] embedding,
      random_rate=0.1,  # by a random other patch's embedding; the rest kept as they are.
  ))
  config.loss = 'softmax_xent'  # Or 'sigmoid_xent' (multi-label data).
  config.label_smoothing = 0.0
  config.mixup_alpha = 0.0  # Mixup's Beta(a, a); 0: off.
  config.cutmix_alpha = 0.0  # CutMix's Beta(a, a) (the share of the image kept); 0: off.
  config.mixup_switch_prob = 0.5  # Both on: the share of batches that take CutMix (DeiT's 0.5).
  config.batch_size = 4096  # Global, over all devices and processes.
  config.eval_batch_size = _none(int)  # None: batch_size.
  config.grad_accum_steps = 1  # Micro-batches per step (same result, less memory).
  config.total_steps = _none(int)  # The run's length: total_steps, or else num_epochs.
  config.num_epochs = _none(float)

  # Adam (0.9, 0.999) with decoupled weight decay on the kernels, or SGD with momentum;
  # gradients clipped to a global norm first.
  config.optimizer = ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999,
      momentum=0.9,  # SGD only.
      weight_decay=0.0,  # Scaled by the learning rate, as in the paper's code.
      grad_clip_norm=1.0,  # 0: no clipping.
      mu_dtype=_none(str),  # Adam's first moment in 'bfloat16' saves memory.
      # Layer-wise lr decay d: block i of L learns at lr * d^(L - i), the embeddings at
      # lr * d^(L + 1), the head at lr (BEiT, MAE fine-tuning); 1: off.
      layer_decay=1.0,
      ema_decay=0.0,  # The weights' moving average: d * ema + (1 - d) * weights a step; 0: off.
  ))
  # Linear warm-up from 0 to base_lr, then 'linear', 'cosine' or 'constant' to end_lr.
  config.schedule = ml_collections.ConfigDict(dict(
      base_lr=1e-3, end_lr=0.0, decay='linear',
      warmup_steps=10_000,
      warmup_epochs=_none(float),  # Instead of warmup_steps.
  ))

  # 'jit' (GSPMD shardings) or 'shard_map' (explicit over data and fsdp; tensor by XLA).
  config.step_impl = 'jit'
  # The device mesh (vit_jax/sharding.py): data parallelism x fully-sharded data
  # parallelism x tensor parallelism (heads and MLP units split). data=-1 takes the
  # devices that fsdp and tensor leave. shard_state: the parameters and optimizer state
  # are stored split over the data axis too, gathered once per step; None: on TPUs and
  # GPUs, off on CPUs (vit_jax/cpu.py).
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1,
                                               shard_state=_none(bool)))

  config.init_from = ''  # A run's workdir or a release .npz to fine-tune from.
  config.init_step = _none(int)  # Its checkpoint; None: the latest.
  config.init_keep_head = False  # Keep the source's classifier (same classes).

  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 0  # 0: at the end only.
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 3
  config.profile_steps = ()  # (first, last) step of a profiler trace in workdir/profile.
  config.input_workers = 32  # Decoding threads per process.
  return config


def complete(config: Any) -> ml_collections.ConfigDict:
  """``config`` laid over the defaults, so that every field is there.

  Raises ConfigError (a ValueError) for a field that the defaults do not have, at any
  depth, naming the closest valid names (a typo would otherwise be ignored).
  """
  user = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return ml_collections.ConfigDict(_merge(get_config().to_dict(), user, 'config'))


def _merge(base: dict[str, Any], user: dict[str, Any], where: str) -> dict[str, Any]:
  merged = dict(base)
  for key, value in user.items():
    if key not in base:
      raise unknown_field(where, key, list(base))
    if isinstance(base[key], dict):
      if not isinstance(value, dict):
        raise errors.ConfigError(f'{where}.{key} must be a group of fields, like the '
                                 f'default {base[key]}; got {value!r}.')
      value = _merge(base[key], value, f'{where}.{key}')
    merged[key] = value
  return merged


def unknown_field(where: str, key: str, fields: list[str]) -> errors.ConfigError:
  """The error for ``where.key`` that is not one of ``fields``: the closest ones named."""
  close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
  hint = f' Did you mean {", ".join(f"{where}.{c}" for c in close)}?' if close else ''
  return errors.ConfigError(f'{where}.{key} is not a config field.{hint} The fields of {where}: '
                            f'{", ".join(sorted(fields))} (vit_jax/config_base.py).')


def model_options(model: Any) -> tuple[str, dict[str, Any]]:
  """``config.model`` as (name, options), the options left unset (None) dropped."""
  options = {k: v for k, v in dict(model).items() if v is not None}
  if 'name' not in options:
    raise errors.ConfigError('config.model.name is missing (e.g. "ti16", "b16").')
  return options.pop('name'), options
