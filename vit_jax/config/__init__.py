r"""The one base config: every field a run reads, declared once: kind, default, range, meaning.

``FIELDS`` is the table (``vit_jax/config/fields.py`` says how a line reads): ``get_config()``
builds the ConfigDict from it, ``complete`` lays a user's config over it, ``check`` applies it
before anything compiles, ``vit_jax.config.cli`` types the command line by it, and ``python -m
vit_jax.config`` prints it as docs/config.md. A recipe in ``configs/`` overrides only what it
changes (big_vision's habit); a field that is not here does not exist. ``config.evals`` holds
named evaluators, each entry's ``type`` (``EVAL_TYPES``) selecting its fields, e.g.
``config.evals.v2 = dict(type='classification', dataset='imagenet_v2', split='test')``.
"""

from __future__ import annotations

import difflib
from typing import Any

import ml_collections

from vit_jax.base import errors
from vit_jax.config.fields import REQUIRED, F, Field, Group

_ONE_OR_MORE = ' (a number of steps; 0 would divide by zero)'
_DATA_DIR = ("TFDS data_dir; '': config.dataset.data_dir where the dataset is the run's, "
             "else TFDS's default.")

# Field: F(kind, default, allowed, meaning); see vit_jax/config/fields.py.
FIELDS: dict[str, Field | Group] = {
    'model': Group(
        'The model: a zoo name (vit_jax.models.get_model) and any VisionTransformer option. A '
        "None option is the model's own: the architecture model.name names (b16: width 768, "
        "12 layers, ...) or VisionTransformer's default.", {
            'name': F('str', 'b16', '', 'ti16, b16, h14, r50_b16, g14, G14, e14, 22b14, ... '
                      'or ViT-B_16.'),
            'image_size': F('size?', None, '', 'Input size in pixels: 224 or (height, width).'),
            'patch_size': F('size?', None, '', 'Patch side or (height, width) (b16: 16).'),
            'hidden_size': F('int?', None, '>= 1', 'Token width.'),
            'mlp_dim': F('int?', None, '>= 1', 'MLP hidden units.'),
            'num_heads': F('int?', None, '>= 1', 'Attention heads.'),
            'num_layers': F('int?', None, '>= 1', 'Encoder blocks.'),
            'pool': F('str?', None, '', "'token' (class token), 'gap' (the patches' mean) or "
                      "'map'."),
            'representation_size': F('int?', None, '>= 1',
                                     'Pre-logits layer (Dense + tanh) width; None: none.'),
            'head_bias_init': F('float?', None, '',
                                'Classifier bias (0; -10 for sigmoid pre-training).'),
            'posemb': F('str?', None, '', "'learn' or 'sincos2d'."),
            'dropout_rate': F('float?', None, '[0, 1)', 'Dropout (0).'),
            'attention_dropout_rate': F('float?', None, '[0, 1)', 'Attention dropout (0).'),
            'stochastic_depth': F('float?', None, '[0, 1)', 'Drop-path rate of the last '
                                  'block (0).'),
            'attention_impl': F('str?', None, '', "'auto' (the model's default), 'einsum', "
                                "'xla' or 'cudnn'."),
            'scan': F('bool?', None, '', 'One scanned block: compiles much faster (False).'),
            'remat_policy': F('str?', None, '', "'none', 'full', 'dots' or 'dots_no_batch'."),
            'dtype': F('str?', None, '', "Compute dtype: 'float32' or 'bfloat16'."),
            'param_dtype': F('str?', None, '', "Parameter dtype ('float32')."),
            'matmul_dtype': F('str?', None, '', "'bfloat16': matmul operands in bfloat16 "
                              'with float32 accumulation, forward and backward.'),
            'resnet_layers': F('tuple?', None, '', 'BiT stem units per stage (hybrids).'),
            'resnet_width': F('int?', None, '>= 1', 'BiT width factor (1).'),
            'parallel_block': F('bool?', None, '', 'Attention and MLP side by side on one '
                                'LayerNorm (False).'),
            'qk_norm': F('bool?', None, '', "Normalise each head's queries and keys (False)."),
            'qkv_bias': F('bool?', None, '', 'Biases in the query/key/value projections '
                          '(True).'),
            'norm': F('str?', None, '', "'layernorm' or 'rmsnorm' (no centering, no bias; "
                      'ViT-22B).'),
            'norm_epsilon': F('float?', None, '> 0', "Every norm's epsilon (1e-6; transformers' "
                              'ViT: 1e-12).'),
            'activation': F('str?', None, '', "The MLP's: 'gelu_tanh' (the tanh GELU, the "
                            "releases'), 'gelu' (exact: timm's, transformers'), 'quick_gelu' "
                            "(OpenAI CLIP's) or 'silu' (SwiGLU with gated_mlp)."),
            'gated_mlp': F('bool?', None, '', 'A gated MLP: act(first half) * second half of '
                           "2 * mlp_dim units (DINOv2-g's SwiGLU; False)."),
            'pre_norm': F('bool?', None, '', "A LayerNorm before the first block (CLIP's "
                          'ln_pre; False).'),
            'layer_scale': F('float?', None, '', 'Initial per-channel scale of each residual '
                             'branch (DeiT III: 1e-6); None: no layer scale.'),
            'class_token': F('bool?', None, '', "A class token; None: where pool='token'."),
            'distill_token': F('bool?', None, '', "DeiT's distillation token with its own "
                               "head; the logits are the two heads' mean (False)."),
            'num_registers': F('int?', None, '>= 0', 'Register tokens, attended to, never '
                               'pooled (0).'),
            'prefix_posemb': F('bool?', None, '', 'The class token and registers get position '
                               "embeddings too (True); False: the patches only (timm's "
                               'no_embed_class, DeiT III).'),
            'fc_norm': F('bool?', None, '', 'The final LayerNorm after pooling instead of '
                         "before (timm's avg-pooled ViTs; False)."),
        }),
    'dataset': Group(
        "The data: a TFDS name, 'digits', 'mnist', 'fashion_mnist', or a local-format "
        'dataset.', {
            'name': F('str', 'imagenet2012', '', 'The dataset.'),
            'data_dir': F('path', '', '', 'TFDS data_dir, or the directory of IDX / '
                          'local-format files.'),
            'manual_dir': F('path', '', '', "TFDS manual_dir (ImageNet's tar files)."),
            'prepare': F('bool', False, '', 'Build a missing TFDS dataset first.'),
            'num_classes': F('int', 0, '>= 0', "0: the data's."),
            'train_split': F('str', 'train', '', 'The split trained on.'),
            'eval_split': F('str', 'test', '', 'The split evaluated on.'),
            'pp_train': F('str', 'decode|inception_crop(224)|flip_lr|value_range(-1, 1)', '',
                          'Training preprocessing (vit_jax/data/preprocess.py).'),
            'pp_eval': F('str', 'decode|resize_small(256)|central_crop(224)|'
                         'value_range(-1, 1)', '', 'Evaluation preprocessing.'),
            'repeats': F('int', 1, '>= 1', "Repeated augmentation (DeiT; timm's "
                         'RepeatAugSampler): each image this many times in a row, each copy '
                         'augmented apart; an epoch keeps its length, so it sees 1/repeats of '
                         'the images. 1: off.', why=' (3: DeiT repeated augmentation; 1: off)'),
        }),
    'objective': F('str', 'classification', '', "What the step learns: 'classification' (the "
                   "labels) or 'mpp': masked patch prediction, self-supervised, no label read "
                   '(vit_jax/models/mpp.py; the values and the model: mpp.check).'),
    'mpp': Group('Masked patch prediction (config.objective="mpp"; the paper\'s section 4.6).', {
        'target': F('str', 'mean_color', '', "'mean_color' (512-way 3-bit mean colour, the "
                    "paper's), 'color_4x4' (a 4x4 downsized patch of 3-bit colours), "
                    "'l2_mean_color' or 'l2_patch' (RGB regressed, L2 loss)."),
        'corrupt_rate': F('float', 0.5, '', "The share of each image's patches corrupted "
                          'and predicted.'),
        'mask_rate': F('float', 0.8, '', 'Of the corrupted patches: the share replaced by the '
                       'learnable [mask] embedding.'),
        'random_rate': F('float', 0.1, '', "Of the corrupted patches: the share replaced by a "
                         "random other patch's embedding (the rest are kept as they are)."),
    }),
    'loss': F('str', 'softmax_xent', ('softmax_xent', 'sigmoid_xent'),
              "'sigmoid_xent' for multi-label data."),
    'label_smoothing': F('float', 0.0, '[0, 1)', 'The share of the target spread over all '
                         'classes.', why=' (the share of the target spread over all classes)'),
    'mixup_alpha': F('float', 0.0, '>= 0', "Mixup's Beta(a, a); 0: off."),
    'cutmix_alpha': F('float', 0.0, '>= 0', "CutMix's Beta(a, a) (the share of the image "
                      'kept); 0: off.'),
    'mixup_switch_prob': F('float', 0.5, '[0, 1]', "Both on: the share of batches that take "
                           "CutMix (DeiT's 0.5)."),
    'batch_size': F('int', 4096, '>= 1', 'Global, over all devices and processes.'),
    'eval_batch_size': F('int?', None, '>= 1', 'None: batch_size.'),
    'grad_accum_steps': F('int', 1, '>= 1', 'Micro-batches per step (same result, less '
                          'memory).', why=' (micro-batches a step; 1: none)'),
    'total_steps': F('int?', None, '>= 1', "The run's length: total_steps, or else "
                     'num_epochs.'),
    'num_epochs': F('float?', None, '> 0', 'Epochs of the training split, where total_steps '
                    'is None.'),
    'optimizer': Group(
        'Adam with decoupled weight decay on the kernels, or SGD with momentum; gradients '
        'clipped to a global norm first.', {
            'name': F('str', 'adam', ('adam', 'sgd'), 'The optimizer.'),
            'b1': F('float', 0.9, '[0, 1)', "Adam's first-moment decay."),
            'b2': F('float', 0.999, '[0, 1)', "Adam's second-moment decay."),
            'momentum': F('float', 0.9, '[0, 1)', 'SGD only.'),
            'weight_decay': F('float', 0.0, '>= 0', "Scaled by the learning rate, as in the "
                              "paper's code."),
            'grad_clip_norm': F('float?', 1.0, '>= 0', '0 or None: no clipping.'),
            'mu_dtype': F('str?', None, '', "Adam's first moment in 'bfloat16' saves memory."),
            'layer_decay': F('float', 1.0, '(0, 1]', 'Layer-wise lr decay d: block i of L '
                             'learns at lr * d^(L - i), the embeddings at lr * d^(L + 1), the '
                             'head at lr (BEiT, MAE fine-tuning); 1: off.'),
            'ema_decay': F('float', 0.0, '[0, 1)', "The weights' moving average: d * ema + "
                           '(1 - d) * weights a step; 0: off.'),
        }),
    'schedule': Group(
        "Linear warm-up from 0 to base_lr, then 'linear', 'cosine' or 'constant' to end_lr.", {
            'base_lr': F('float', 1e-3, '',
                         'The peak learning rate (> 0: vit_jax.training.plan.validate).'),
            'end_lr': F('float', 0.0, '', 'The last learning rate (<= base_lr).'),
            'decay': F('str', 'linear', ('linear', 'cosine', 'constant'), 'After the warm-up.'),
            'warmup_steps': F('int', 10_000, '>= 0', 'The warm-up.'),
            'warmup_epochs': F('float?', None, '>= 0', 'Instead of warmup_steps.'),
            'phases': F('tuple', (), '', 'Named phases after total_steps, to train a run '
                        "further: each dict(name=..., total_steps=END, base_lr=..., end_lr=0., "
                        "decay='cosine', warmup_steps=0), a schedule of its own (warm-up from "
                        '0) from the step the phase before ended (docs/training.md).'),
        }),
    'step_impl': F('str', 'jit', ('jit', 'shard_map'), "'jit' (GSPMD shardings) or "
                   "'shard_map' (explicit over data and fsdp; tensor by XLA). Both mix the "
                   'global batch with one draw a step; under shard_map each device draws its '
                   'own dropout masks.'),
    'mesh': Group(
        'The device mesh (vit_jax/base/sharding.py): data parallelism x fully-sharded data '
        'parallelism x tensor parallelism (heads and MLP units split).', {
            'data': F('int', -1, '>= -1', '-1: the devices that fsdp and tensor leave.'),
            'fsdp': F('int', 1, '>= 1', 'Fully-sharded data parallelism.'),
            'tensor': F('int', 1, '>= 1', 'Tensor parallelism.'),
            'shard_state': F('bool?', None, '', 'The parameters and optimizer state stored '
                             'split over the data axis too, gathered once a step; None: on '
                             'TPUs and GPUs, off on CPUs (vit_jax/base/cpu/).'),
        }),
    'init_from': F('path', '', '', "The checkpoint to fine-tune from: a run's workdir, a "
                   "release or big_vision .npz, a timm or transformers folder, 'hf-hub:ORG/NAME' "
                   'or a big_vision tensorstore folder (docs/checkpoints.md).'),
    'init_step': F('int?', None, '>= 0', 'Its checkpoint; None: the latest.'),
    'init_keep_head': F('bool', False, '', "Keep the source's classifier (same classes)."),
    'init_ema': F('bool', False, '', "Start from the source run's moving average of the "
                  'weights (its optimizer.ema_decay > 0); a workdir only.'),
    'init_source_grid': F('tuple?', None, '', "A .npz source's patch grid (rows, columns), "
                          'needed where it is not square or is as large as a non-square '
                          "model grid (e.g. (14, 20) for 224x320); a workdir's, a timm or "
                          "transformers folder's are recorded."),
    'init_source_pool': F('str?', None, '', "A big_vision source's pool_type where its "
                          "arrays do not tell ('gap', '0', 'none'); needed with "
                          "init_keep_head, where only 'gap' loads."),
    'evals': F('evals', {'eval': {'type': 'classification'}}, '', 'The evaluators, by name: '
               "each a type and that type's fields (EVAL_TYPES; docs/evaluation.md)."),
    'seed': F('int', 0, '', 'The initialisation, data order and augmentation.'),
    'log_every_steps': F('int', 100, '>= 1', 'Training metrics.', why=_ONE_OR_MORE),
    'eval_every_steps': F('int', 0, '>= 0', 'The evaluators; 0: at the end only.'),
    'checkpoint_every_steps': F('int', 1000, '>= 1', 'Checkpoints.', why=_ONE_OR_MORE),
    'keep_checkpoints': F('int', 3, '>= 1', 'The latest ones kept (and the newest good '
                          'one, whatever came after it).',
                          why=' (0 would keep no checkpoint to resume from)'),
    'on_divergence': F('str', 'stop', ('stop', 'rewind'), 'A non-finite loss, gradient norm '
                       "or state: 'stop' (exit status 65; nothing non-finite is saved) or "
                       "'rewind': restore the newest good checkpoint and skip the batches of "
                       'the spike (docs/reliability.md).'),
    'max_rewinds': F('int', 3, '>= 1', "on_divergence='rewind': the most rewinds of a run "
                     '(workdir/rewinds.json); one more divergence stops it.'),
    'rewind_skip_batches': F('int', 200, '>= 0', "on_divergence='rewind': the batches skipped "
                             'from the rewound checkpoint on, at least up to the non-finite '
                             'step (PaLM: 200-500).'),
    'profile_steps': F('tuple', (), '', '(first, last) step of a profiler trace in '
                       'workdir/profile; (): none.'),
    'input_workers': F('int', 32, '>= 1', 'Decoding threads per process.'),
}

# The fields a resumed run may change: they do not change what it trains (where and how often
# it logs, evaluates and saves, how its step and data are laid out, what it does at the next
# divergence). Every other field is the run's trajectory: a resume must keep it
# (vit_jax.checkpoints.run.workdir.check_resume), and total_steps grows only by schedule.phases.
MAY_CHANGE_ON_RESUME = (
    'model.attention_impl', 'model.remat_policy', 'dataset.data_dir', 'dataset.manual_dir',
    'dataset.prepare', 'dataset.eval_split', 'dataset.pp_eval', 'eval_batch_size', 'step_impl',
    'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'mesh.shard_state', 'evals', 'log_every_steps',
    'eval_every_steps', 'checkpoint_every_steps', 'keep_checkpoints', 'profile_steps',
    'input_workers', 'on_divergence', 'max_rewinds', 'rewind_skip_batches')
# A phase of config.schedule.phases: its fields, their kinds and defaults.
PHASE_FIELDS: dict[str, Field] = {
    'name': F('str', REQUIRED, '', 'What the phase is called (its log lines say it).'),
    'total_steps': F('int', REQUIRED, '>= 1', 'The step it ends at.'),
    'base_lr': F('float', REQUIRED, '> 0', 'Its peak rate.'),
    'end_lr': F('float', 0.0, '>= 0', 'Its last rate.'),
    'decay': F('str', 'cosine', ('linear', 'cosine', 'constant'), 'After its warm-up.'),
    'warmup_steps': F('int', 0, '>= 0', 'Its warm-up from 0.'),
}

# config.evals.NAME: each entry's type picks its fields.
EVAL_TYPES: dict[str, Group] = {
    'classification': Group(
        'Top-1 accuracy (precision@1 for multi-label data) and loss, every example once. '
        "ImageNet-v2: dict(type='classification', dataset='imagenet_v2', split='test').", {
            'dataset': F('str', '', '', "A TFDS name; '': the run's config.dataset.name."),
            'split': F('str', '', '', "'': config.dataset.eval_split."),
            'data_dir': F('path', '', '', _DATA_DIR),
            'pp': F('str', '', '', "'': config.dataset.pp_eval."),
        }),
    'fewshot': Group(
        "Few-shot linear accuracy of the frozen features (big_vision's fewshot_lsr).", {
            'datasets': F('strs', REQUIRED, '', "'NAME' (its train and test splits) or "
                          "'NAME,TRAIN_SPLIT,TEST_SPLIT[,DATA_DIR]'; NAME: a TFDS or "
                          "bundled name ('digits'); the run's dataset.name is read from "
                          'config.dataset.data_dir.', nonempty=True,
                          why=' (to turn few-shot off, remove the entry)'),
            'shots': F('ints', (1, 5, 10, 25), '>= 1', 'Examples per class.', nonempty=True),
            'seeds': F('int', 3, '>= 1', 'Draws of the few-shot examples.'),
            'l2_reg': F('float', 2.0**10, '> 0', 'The ridge penalty.'),
            'pp': F('str', '', '', "Both splits' preprocessing; '': config.dataset.pp_eval."),
        }),
    'real': Group("ImageNet ReaL: the validation images' reassessed label sets.", {
        'data_dir': F('path', '', '', _DATA_DIR),
        'pp': F('str', '', '', "'': config.dataset.pp_eval."),
    }),
    'mpp': Group("Masked patch prediction's colour accuracy on held-out images.", {
        'split': F('str', '', '', "'': config.dataset.eval_split."),
        'pp': F('str', '', '', "'': config.dataset.pp_eval."),
    }),
}
# The fields every evaluator has, before its type's.
EVAL_COMMON: dict[str, Field] = {
    'type': F('str', REQUIRED, tuple(EVAL_TYPES), 'What it evaluates; it picks the fields.'),
    'every_steps': F('int', 0, '>= 0', '0: with config.eval_every_steps. Every evaluator '
                     'also runs at the last step.'),
}


def _rules(flat: dict[str, Any]) -> str:
  """What is wrong across fields of a config whose fields are each right ('' if nothing)."""
  if flat['mesh.data'] == 0:
    return ('config.mesh.data=0 must be -1 (the devices that fsdp and tensor leave) or a '
            'positive number of devices.')
  base, end = flat['schedule.base_lr'], flat['schedule.end_lr']
  if 0 < base < end:  # base_lr <= 0 itself: vit_jax.training.plan.validate.
    return (f'config.schedule.end_lr={end} is above config.schedule.base_lr={base}: the decay '
            'would climb. Use an end_lr <= base_lr.')
  profile = flat['profile_steps']
  if profile and (len(profile) != 2 or not all(isinstance(s, int) and s >= 1 for s in profile)
                  or profile[0] > profile[1]):
    return (f'config.profile_steps={profile!r} must be () or (first, last) steps, '
            '1 <= first <= last.')
  return _phases_problem(flat['schedule.phases'], flat['total_steps'])


def phases(config: Any) -> list[dict[str, Any]]:
  """``config.schedule.phases`` with each phase's defaults filled in."""
  return [{k: f.default for k, f in PHASE_FIELDS.items() if f.default is not REQUIRED}
          | dict(p) for p in config.schedule.phases]


def _phases_problem(given: Any, total_steps: int | None) -> str:
  """What is wrong with ``config.schedule.phases`` ('' if nothing)."""
  where = 'config.schedule.phases'
  names, end = set(), total_steps
  for i, phase in enumerate(given):
    if not isinstance(phase, dict):
      return (f"{where}[{i}]={phase!r} must be a dict(name=..., total_steps=..., base_lr=...).")
    for key in phase:
      if key not in PHASE_FIELDS:
        return str(unknown_field(f'{where}[{i}]', key, list(PHASE_FIELDS),
                                 what='a field of a phase'))
    for key, field in PHASE_FIELDS.items():
      if key not in phase and field.default is REQUIRED:
        return f'{where}[{i}].{key} is required: {field.doc}'
      if key in phase and (problem := field.problem(phase[key])):
        return f'{where}[{i}].{key}={phase[key]!r} {problem}.'
    if phase['name'] in names:
      return f"{where}: two phases are called {phase['name']!r}; name each once."
    names.add(phase['name'])
    if total_steps is None:
      return f'{where} continue config.total_steps: set it (not num_epochs).'
    if phase['total_steps'] <= end:
      return (f"{where}[{i}] ({phase['name']!r}) ends at step {phase['total_steps']}, not "
              f'after the {"run" if i == 0 else "phase before"} ({end}): each phase ends later.')
    if phase.get('warmup_steps', 0) >= phase['total_steps'] - end:
      return (f"{where}[{i}].warmup_steps={phase['warmup_steps']} is not shorter than the "
              f"phase ({phase['total_steps'] - end} steps).")
    end = phase['total_steps']
  return ''


# ---------------------------------------------------------------------------
# The config from the table.


def _declared(fields: dict[str, Field | Group], prefix: str = '') -> dict[str, Field]:
  """{'model.name': Field, ...}: the table's fields by dotted name."""
  flat = {}
  for key, field in fields.items():
    if isinstance(field, Group):
      flat.update(_declared(field.fields, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = field
  return flat


# The base config's fields by dotted name ('model.name'), config.evals aside.
DECLARED = {k: f for k, f in _declared(FIELDS).items() if f.kind != 'evals'}


def eval_fields(eval_type: str) -> dict[str, Field]:
  """The fields of an evaluator of ``eval_type`` (one of ``EVAL_TYPES``)."""
  return {**EVAL_COMMON, **EVAL_TYPES[eval_type].fields}


def eval_defaults(eval_type: str) -> dict[str, Any]:
  """An evaluator of ``eval_type`` with its defaults (its required fields left out)."""
  return {k: f.default for k, f in eval_fields(eval_type).items() if f.default is not REQUIRED
          } | {'type': eval_type}


def get_config() -> ml_collections.ConfigDict:
  """The defaults; a recipe overrides what it changes."""
  return complete({})


def complete(config: Any) -> ml_collections.ConfigDict:
  """``config`` (a ConfigDict or a dict) laid over the defaults, so that every field is there.

  ``config.evals``, where given, is the whole set of evaluators, each completed from its
  type's defaults; a None entry is dropped. Raises ConfigError (a ValueError) for a field
  the defaults do not have, at any depth, naming the closest valid names (a typo would
  otherwise be ignored), and for an evaluator without a type, of an unknown type or with a
  field its type does not have.
  """
  user = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return _configdict(_merge(FIELDS, user, 'config'), FIELDS)


def _merge(fields: dict[str, Field | Group], user: dict[str, Any], where: str
           ) -> dict[str, Any]:
  """The declared ``fields`` with the ``user``'s values where it has them."""
  for key, value in user.items():
    if key not in fields:
      raise unknown_field(where, key, list(fields))
    grouped = isinstance(fields[key], Group) or fields[key].kind == 'evals'
    if grouped and not isinstance(value, dict):
      raise errors.ConfigError(f'{where}.{key} must be a group of fields, like the '
                               f'default {_default(fields[key])}; got {value!r}.')
  out = {}
  for key, field in fields.items():
    if isinstance(field, Group):
      out[key] = _merge(field.fields, user.get(key, {}), f'{where}.{key}')
    elif field.kind == 'evals':
      out[key] = {name: complete_eval(entry, f'{where}.{key}.{name}')
                  for name, entry in user.get(key, field.default).items() if entry is not None}
    else:
      out[key] = _tuple(user.get(key, field.default))
  return out


def complete_eval(entry: Any, where: str) -> dict[str, Any]:
  """The evaluator ``entry`` (a dict with a ``type``) with its type's defaults filled in;
  ``where`` (config.evals.NAME) names it in the ConfigError of a bad entry."""
  if not isinstance(entry, dict):
    raise errors.ConfigError(f'{where}={entry!r} must be an evaluator: a dict with a type, '
                             f'e.g. dict(type={next(iter(EVAL_TYPES))!r}).')
  types = ', '.join(map(repr, EVAL_TYPES))
  if 'type' not in entry:
    raise errors.ConfigError(f'{where} has no type: set {where}.type to one of {types}.')
  if not isinstance(entry['type'], str) or entry['type'] not in EVAL_TYPES:
    raise errors.ConfigError(f'{where}.type={entry["type"]!r} is not an evaluator type: one '
                             f'of {types}.')
  kind = entry['type']
  fields = eval_fields(kind)
  for key in entry:
    if key not in fields:
      raise unknown_field(where, key, list(fields), what=f'a field of {kind!r} evaluators (to '
                          f'change an evaluator\'s type, replace it: {where} = dict(type=...))')
  for key, field in fields.items():
    if field.default is REQUIRED and key not in entry:
      raise errors.ConfigError(f'{where}.{key} is required by {kind!r} evaluators: {field.doc}')
  return {k: _tuple(v) for k, v in (eval_defaults(entry['type']) | entry).items()}


def _tuple(value: Any) -> Any:
  """JSON's lists (config.json) as the tuples the config held."""
  return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _default(field: Field | Group) -> Any:
  if isinstance(field, Group):
    return {k: _default(f) for k, f in field.fields.items()}
  return field.default


def _configdict(values: dict[str, Any], fields: dict[str, Field | Group]
                ) -> ml_collections.ConfigDict:
  """``values`` as a ConfigDict, each field typed as declared (so that a later value of
  another type is refused, and a None field still takes its kind)."""
  config = ml_collections.ConfigDict()
  for key, field in fields.items():
    if isinstance(field, Group):
      config[key] = _configdict(values[key], field.fields)
    elif field.kind == 'evals':
      config[key] = ml_collections.ConfigDict({
          name: _configdict(entry, eval_fields(entry['type']))
          for name, entry in values[key].items()})
    elif key in values:  # Every field but an evaluator's missing required one.
      try:
        config[key] = ml_collections.FieldReference(values[key], field_type=field.type)
      except TypeError:  # A value of another kind, which check() names.
        config[key] = values[key]
  return config


# ---------------------------------------------------------------------------
# Checking a complete config.


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for the first field of a complete ``config`` outside its declaration:
  a wrong type, a None where none is allowed, a value out of range, each evaluator by its
  type's fields; then the rules that join fields."""
  values = config.to_dict()
  flat = flatten(values)
  for name, field in DECLARED.items():
    if name in flat and (problem := field.problem(flat[name])):
      raise errors.ConfigError(f'config.{name}={flat[name]!r} {problem}.')
  for name, entry in values['evals'].items():
    entry = complete_eval(entry, f'config.evals.{name}')
    for key, field in eval_fields(entry['type']).items():
      if problem := field.problem(entry[key]):
        raise errors.ConfigError(f'config.evals.{name}.{key}={entry[key]!r} {problem}.')
  if problem := _rules(flat):
    raise errors.ConfigError(problem)


def flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a.b.c': value} of a config's dict (``to_dict()`` or config.json's); lists as tuples."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = tuple(value) if isinstance(value, list) else value
  return flat


def unknown_field(where: str, key: str, fields: list[str], what: str = 'a config field'
                  ) -> errors.ConfigError:
  """The error for ``where.key`` that is not one of ``fields``: the closest ones named."""
  close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
  hint = f' Did you mean {", ".join(f"{where}.{c}" for c in close)}?' if close else ''
  return errors.ConfigError(f'{where}.{key} is not {what}.{hint} The fields of {where}: '
                            f'{", ".join(sorted(fields))} (vit_jax/config/__init__.py).')


def model_options(model: Any) -> tuple[str, dict[str, Any]]:
  """``config.model`` as (name, options), the options left unset (None) dropped."""
  options = {k: v for k, v in dict(model).items() if v is not None}
  if 'name' not in options:
    raise errors.ConfigError('config.model.name is missing (e.g. "ti16", "b16").')
  return options.pop('name'), options


def convert_old_evals(config: dict[str, Any]) -> dict[str, Any]:
  """``config`` (a config.json's dict) with the ``evals`` fields of runs older than named
  evaluators (fewshot.*, real, v2, data_dir) as entries: 'eval', and 'fewshot', 'real' and
  'v2' where they were on; a config of today as it is."""
  old = config.get('evals')
  if not isinstance(old, dict) or not ({'real', 'v2', 'data_dir'} & set(old) or (
      isinstance(old.get('fewshot'), dict) and 'type' not in old['fewshot'])):
    return config
  data_dir = old.get('data_dir', '')
  evals: dict[str, Any] = {'eval': {'type': 'classification'}}
  fewshot = old.get('fewshot') or {}
  if fewshot.get('datasets'):
    evals['fewshot'] = {'type': 'fewshot', **fewshot}
  if old.get('real'):
    evals['real'] = {'type': 'real', 'data_dir': data_dir}
  if old.get('v2'):
    evals['v2'] = {'type': 'classification', 'dataset': 'imagenet_v2', 'split': 'test',
                   'data_dir': data_dir}
  return {**config, 'evals': evals}


# ---------------------------------------------------------------------------
# The reference: docs/config.md.


def reference() -> str:
  """Every field as Markdown tables (docs/config.md: ``python -m vit_jax.config``)."""
  head = '| field | kind | default | allowed | meaning |\n| --- | --- | --- | --- | --- |'
  lines = [
      '# Config fields', '',
      'Every field of a run\'s `config`, written by `python -m vit_jax.config > docs/config.md` '
      'from the declarations in `vit_jax/config/__init__.py` (a test keeps the two equal). A '
      'recipe in `configs/` sets what it changes; the command line sets any field with '
      '`--config.FIELD=VALUE`. A kind "or None" may be None; "required": no default, the '
      'config sets it.', '',
      '## `config`', '', head,
      *(f.row(k) for k, f in FIELDS.items() if isinstance(f, Field))]
  for key, group in FIELDS.items():
    if isinstance(group, Group):
      lines += ['', f'## `config.{key}`', '', group.doc, '', head,
                *(f.row(f'{key}.{k}') for k, f in group.fields.items())]
  lines += ['', '## A phase of `config.schedule.phases`', '', head,
            *(f.row(f'schedule.phases[i].{k}') for k, f in PHASE_FIELDS.items())]
  lines += ['', '## On a resume', '',
            'A run resumed in its workdir is the same run: every field keeps the value its '
            '`config.json` records, but for these, which do not change what it trains: '
            + ', '.join(f'`{k}`' for k in MAY_CHANGE_ON_RESUME) + '. `schedule.phases` may '
            'grow (phases added after the recorded ones: a finished run trained further); a '
            'new `total_steps` is refused, as it would recompute the schedule.']
  lines += ['', '## `config.evals`', '',
            'Named evaluators: `config.evals.NAME` is a `type` and that type\'s fields; '
            'a recipe writes what differs from the type\'s defaults (`config.evals.fewshot = '
            'dict(type=\'fewshot\', datasets=(\'digits\',))`) and `config.evals.NAME = None` '
            'removes an entry. On the command line, `--config.evals.NAME.type=TYPE` adds an '
            'entry of that type (or changes an entry\'s type, keeping the fields both types '
            'have) and `--config.evals.NAME=None` removes one.', '',
            '### Every evaluator', '', head,
            *(f.row(f'evals.NAME.{k}') for k, f in EVAL_COMMON.items())]
  for name, group in EVAL_TYPES.items():
    lines += ['', f'### `{name}`', '', group.doc, '', head,
              *(f.row(f'evals.NAME.{k}') for k, f in group.fields.items())]
  return '\n'.join(lines) + '\n'
