r"""The one base config: every field a run reads, its default, and what it means.

Each file in ``configs/`` starts from ``get_config()`` and overrides only what its
recipe changes, so two recipes are compared by reading two short files (big_vision's
habit). Any field can be overridden on the command line, ``--config.batch_size=256``;
a field that is not here does not exist.

Each field's type, whether it may be None and its range are in ``SCHEMA`` (below
``get_config``, in the same order); ``check`` applies it before anything compiles.

A ``None`` model option means "the model's own": the architecture named by
``model.name`` (``b16``: width 768, 12 layers, ...) or ``VisionTransformer``'s default.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import ml_collections

from vit_jax.base import errors

_none = ml_collections.config_dict.placeholder


# TEMPORARY: each evaluator type's fields (replaced by the one-declaration config).
EVAL_TYPES = {
    'classification': dict(type='classification', every_steps=0, dataset='', split='',
                           data_dir='', pp=''),
    'real': dict(type='real', every_steps=0, data_dir='', pp=''),
    'fewshot': dict(type='fewshot', every_steps=0, datasets=(), shots=(1, 5, 10, 25), seeds=3,
                    l2_reg=2.0**10, pp=''),
    'mpp': dict(type='mpp', every_steps=0, split='', pp=''),
}


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
      attention_impl=_none(str),  # 'auto' (the model's default), 'einsum', 'xla' or 'cudnn'.
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
      # Repeated augmentation (DeiT; timm's RepeatAugSampler): each image this many times
      # in a row in the training stream, each copy augmented apart; an epoch keeps its
      # length, so it sees 1/repeats of the images. 1: off.
      repeats=1,
  ))

  # What the step learns: 'classification' (the labels), or 'mpp': masked patch prediction,
  # self-supervised, no label read (vit_jax/models/mpp.py; the paper's section 4.6).
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
      grad_clip_norm=1.0,  # 0 or None: no clipping.
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
  # Both mix (mixup/CutMix) the global batch with one draw per step; under shard_map each
  # device draws its own dropout/stochastic-depth masks (its index folded into the key).
  config.step_impl = 'jit'
  # The device mesh (vit_jax/base/sharding.py): data parallelism x fully-sharded data
  # parallelism x tensor parallelism (heads and MLP units split). data=-1 takes the
  # devices that fsdp and tensor leave. shard_state: the parameters and optimizer state
  # are stored split over the data axis too, gathered once per step; None: on TPUs and
  # GPUs, off on CPUs (vit_jax/base/cpu/).
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1,
                                               shard_state=_none(bool)))

  config.init_from = ''  # A run's workdir or a release .npz to fine-tune from.
  config.init_step = _none(int)  # Its checkpoint; None: the latest.
  config.init_keep_head = False  # Keep the source's classifier (same classes).
  # Start from the source run's moving average of the weights (its optimizer.ema_decay > 0)
  # instead of its weights; a workdir only (export --ema makes a .npz of it).
  config.init_ema = False
  # A .npz source's patch grid (rows, columns), needed where it is not square or is as
  # large as a non-square model grid (e.g. (14, 20) for 224x320); a workdir's is recorded.
  config.init_source_grid = _none(tuple)
  # A big_vision .npz source's pool_type where its arrays do not tell ('gap', '0', 'none'
  # store the same ones); needed with init_keep_head, where only 'gap' loads.
  config.init_source_pool = _none(str)

  # The evaluators, by name (vit_jax.evals): each entry names its type.
  config.evals = ml_collections.ConfigDict({'eval': EVAL_TYPES['classification']})

  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 0  # 0: at the end only.
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 3
  config.profile_steps = ()  # (first, last) step of a profiler trace in workdir/profile.
  config.input_workers = 32  # Decoding threads per process.
  return config


# ---------------------------------------------------------------------------
# The schema: each field's type, whether it may be None, and its range. ``check`` applies it
# to a complete config before anything compiles (``train.validate``); a field's meaning and
# default are beside it in ``get_config`` above, in the same order.


@dataclasses.dataclass(frozen=True)
class Field:
  """What a field may hold: ``kind`` ('int', 'float', 'str', 'bool', 'size', 'tuple'),
  None allowed or not, and a range: ``low``/``high`` (``low_open``: ``low`` itself
  excluded, ``high`` always excluded unless ``high_closed``), or ``choices``."""

  kind: str
  none: bool = False
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_closed: bool = False
  choices: tuple[Any, ...] = ()
  why: str = ''  # Said with a value out of range.

  def problem(self, value: Any) -> str:
    """What is wrong with ``value`` ('' if nothing)."""
    if value is None:
      return '' if self.none else 'cannot be None'
    if self.kind == 'size':
      sides = value if isinstance(value, (tuple, list)) and len(value) == 2 else (value,)
      if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sides):
        return ''
      return 'is not a positive int or a (height, width) pair of them'
    kinds = {'int': int, 'float': (int, float), 'str': str, 'bool': bool,
             'tuple': (tuple, list)}[self.kind]
    if not isinstance(value, kinds) or (isinstance(value, bool) and self.kind != 'bool'):
      return f'must be {_KIND_WORDS[self.kind]}, not {type(value).__name__}'
    if self.choices and value not in self.choices:
      return f'must be one of {", ".join(map(repr, self.choices))}'
    if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
      return f'must be {">" if self.low_open else ">="} {self.low:g}{self.why}'
    if self.high is not None and (value > self.high or (not self.high_closed
                                                         and value == self.high)):
      return f'must be {"<=" if self.high_closed else "<"} {self.high:g}{self.why}'
    return ''


_KIND_WORDS = {'int': 'an int', 'float': 'a number', 'str': 'a string', 'bool': 'True or False',
               'tuple': 'a tuple'}
_POSITIVE = Field('int', low=1)
_POSITIVE_OR_NONE = Field('int', none=True, low=1)
_STR_OR_NONE = Field('str', none=True)
_BOOL_OR_NONE = Field('bool', none=True)
_RATE = Field('float', none=True, low=0, high=1)  # Dropout-like: [0, 1).
_INTERVAL = Field('int', low=1, why=' (a number of steps; 0 would divide by zero)')

SCHEMA: dict[str, Field] = {
    'model.name': Field('str'),
    'model.image_size': Field('size', none=True),
    'model.patch_size': Field('size', none=True),
    'model.hidden_size': _POSITIVE_OR_NONE, 'model.mlp_dim': _POSITIVE_OR_NONE,
    'model.num_heads': _POSITIVE_OR_NONE, 'model.num_layers': _POSITIVE_OR_NONE,
    'model.pool': _STR_OR_NONE,
    'model.representation_size': _POSITIVE_OR_NONE,
    'model.head_bias_init': Field('float', none=True),
    'model.posemb': _STR_OR_NONE,
    'model.dropout_rate': _RATE, 'model.attention_dropout_rate': _RATE,
    'model.stochastic_depth': _RATE,
    'model.attention_impl': _STR_OR_NONE,
    'model.scan': _BOOL_OR_NONE,
    'model.remat_policy': _STR_OR_NONE,
    'model.dtype': _STR_OR_NONE, 'model.param_dtype': _STR_OR_NONE,
    'model.matmul_dtype': _STR_OR_NONE,
    'model.resnet_layers': Field('tuple', none=True),
    'model.resnet_width': _POSITIVE_OR_NONE,
    'model.parallel_block': _BOOL_OR_NONE, 'model.qk_norm': _BOOL_OR_NONE,
    'model.qkv_bias': _BOOL_OR_NONE,
    'model.norm': _STR_OR_NONE,
    'dataset.name': Field('str'), 'dataset.data_dir': Field('str'),
    'dataset.manual_dir': Field('str'), 'dataset.prepare': Field('bool'),
    'dataset.num_classes': Field('int', low=0),
    'dataset.train_split': Field('str'), 'dataset.eval_split': Field('str'),
    'dataset.pp_train': Field('str'), 'dataset.pp_eval': Field('str'),
    'dataset.repeats': Field('int', low=1, why=' (3: DeiT repeated augmentation; 1: off)'),
    # Their values, and how they go together with the model: mpp.check.
    'objective': Field('str'), 'mpp.target': Field('str'),
    'mpp.corrupt_rate': Field('float'), 'mpp.mask_rate': Field('float'),
    'mpp.random_rate': Field('float'),
    'loss': Field('str', choices=('softmax_xent', 'sigmoid_xent')),
    'label_smoothing': Field('float', low=0, high=1,
                             why=' (the share of the target spread over all classes)'),
    'mixup_alpha': Field('float', low=0), 'cutmix_alpha': Field('float', low=0),
    'mixup_switch_prob': Field('float', low=0, high=1, high_closed=True),
    'batch_size': _POSITIVE,
    'eval_batch_size': _POSITIVE_OR_NONE,
    'grad_accum_steps': Field('int', low=1, why=' (micro-batches a step; 1: none)'),
    'total_steps': _POSITIVE_OR_NONE,
    'num_epochs': Field('float', none=True, low=0, low_open=True),
    'optimizer.name': Field('str', choices=('adam', 'sgd')),
    'optimizer.b1': Field('float', low=0, high=1), 'optimizer.b2': Field('float', low=0, high=1),
    'optimizer.momentum': Field('float', low=0, high=1),
    'optimizer.weight_decay': Field('float', low=0),
    'optimizer.grad_clip_norm': Field('float', none=True, low=0),  # 0 or None: no clipping.
    'optimizer.mu_dtype': _STR_OR_NONE,
    'optimizer.layer_decay': Field('float', low=0, high=1, low_open=True, high_closed=True),
    'optimizer.ema_decay': Field('float', low=0, high=1),
    'schedule.base_lr': Field('float'),  # > 0 and >= end_lr >= 0: train.validate, check.
    'schedule.end_lr': Field('float'),
    'schedule.decay': Field('str', choices=('linear', 'cosine', 'constant')),
    'schedule.warmup_steps': Field('int', low=0),
    'schedule.warmup_epochs': Field('float', none=True, low=0),
    'step_impl': Field('str', choices=('jit', 'shard_map')),
    'mesh.data': Field('int', low=-1), 'mesh.fsdp': _POSITIVE, 'mesh.tensor': _POSITIVE,
    'mesh.shard_state': _BOOL_OR_NONE,
    'init_from': Field('str'),
    'init_step': Field('int', none=True, low=0),
    'init_keep_head': Field('bool'),
    'init_ema': Field('bool'),
    # Their values against the source: workdir.check_init_from.
    'init_source_grid': Field('tuple', none=True), 'init_source_pool': _STR_OR_NONE,
    'seed': Field('int'),
    'log_every_steps': _INTERVAL,
    'eval_every_steps': Field('int', low=0),  # 0: at the end only.
    'checkpoint_every_steps': _INTERVAL,
    'keep_checkpoints': Field('int', low=1, why=' (0 would keep no checkpoint to resume from)'),
    'profile_steps': Field('tuple'),
    'input_workers': _POSITIVE,
}


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for the first field of a complete ``config`` outside the schema:
  a wrong type, a None where none is allowed, a value out of range; then the rules that
  join fields."""
  flat = flatten(config.to_dict())
  for name, field in SCHEMA.items():
    if name in flat and (problem := field.problem(flat[name])):
      raise errors.ConfigError(f'config.{name}={flat[name]!r} {problem}.')
  if flat['mesh.data'] == 0:
    raise errors.ConfigError('config.mesh.data=0 must be -1 (the devices that fsdp and tensor '
                             'leave) or a positive number of devices.')
  base, end = flat['schedule.base_lr'], flat['schedule.end_lr']
  if 0 < base < end:  # base_lr <= 0 itself: train.validate.
    raise errors.ConfigError(f'config.schedule.end_lr={end} is above config.schedule.base_lr='
                             f'{base}: the decay would climb. Use an end_lr <= base_lr.')
  profile = flat['profile_steps']
  if profile and (len(profile) != 2 or not all(isinstance(s, int) and s >= 1 for s in profile)
                  or profile[0] > profile[1]):
    raise errors.ConfigError(f'config.profile_steps={profile!r} must be () or (first, last) '
                             'steps, 1 <= first <= last.')


def flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a.b.c': value} of a config's dict (``to_dict()`` or config.json's); lists as tuples."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = tuple(value) if isinstance(value, list) else value
  return flat


def complete(config: Any) -> ml_collections.ConfigDict:
  """``config`` laid over the defaults, so that every field is there.

  Raises ConfigError (a ValueError) for a field that the defaults do not have, at any
  depth, naming the closest valid names (a typo would otherwise be ignored).
  """
  user = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return ml_collections.ConfigDict(_merge(get_config().to_dict(), user, 'config'))


def _merge(base: dict[str, Any], user: dict[str, Any], where: str) -> dict[str, Any]:
  merged = dict(base)
  if where == 'config.evals':  # TEMPORARY: entries completed from their type.
    merged = {}
    for key, value in user.items():
      if value is None:
        continue
      merged[key] = _merge(EVAL_TYPES[value['type']], value, f'{where}.{key}')
    return merged
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
                            f'{", ".join(sorted(fields))} (vit_jax/config/__init__.py).')


def model_options(model: Any) -> tuple[str, dict[str, Any]]:
  """``config.model`` as (name, options), the options left unset (None) dropped."""
  options = {k: v for k, v in dict(model).items() if v is not None}
  if 'name' not in options:
    raise errors.ConfigError('config.model.name is missing (e.g. "ti16", "b16").')
  return options.pop('name'), options
