r"""The one base config: every field a run reads, declared once: kind, default, range, meaning.

``FIELDS`` is the table (each line a ``field.Field``), with a schedule phase's fields
(``PHASE_FIELDS``), each evaluator type's (``EVAL_TYPES``, after ``EVAL_COMMON``) and the
fields a resume may change (``MAY_CHANGE_ON_RESUME``). A recipe in ``configs/`` overrides only
what it changes (big_vision's habit); a field that is not here does not exist. ``config.evals``
holds named evaluators, each entry's ``type`` selecting its fields, e.g.
``config.evals.v2 = dict(type='classification', dataset='imagenet_v2', split='test')``.
"""

from __future__ import annotations

from typing import Any

from vit_jax.base import errors
from vit_jax.config.field import REQUIRED, F, Field, Group

_ONE_OR_MORE = ' (a number of steps; 0 would divide by zero)'
_DATA_DIR = ("TFDS data_dir; '': config.dataset.data_dir where the dataset is the run's, "
             "else TFDS's default.")

# Field: F(kind, default, allowed, meaning); see vit_jax/config/field.py.
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
            'posemb': F('str?', None, '', "The absolute position encoding: 'learn', 'sincos2d' "
                        "or 'none' (vit_jax/models/posemb.py)."),
            'rope': F('str?', None, '', "A rotary position encoding in every attention: "
                      "'axial', 'dinov3', 'mixed' or KIND(setting=value, ...), e.g. "
                      "\"axial(temperature=100.0, xy=True)\" (vit_jax/models/posemb.py); None: "
                      'none.'),
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
            'key_bias': F('bool?', None, '', "With qkv_bias, the keys' too (True; EVA's "
                          'attention: False).'),
            'attention_norm': F('bool?', None, '', "A norm on the heads' joined outputs before "
                                "the attention's output projection (EVA-02 CLIP; False)."),
            'mlp_norm': F('bool?', None, '', "A norm on the MLP's hidden units (EVA-02's "
                          'SwiGLU; False).'),
            'map_heads': F('int?', None, '>= 1', "The MAP head's attention heads (PE: 8); None: "
                           'num_heads.'),
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
    'packing': Group(
        "NaViT packing (docs/training.md): several images' patch sequences in one sequence, "
        'for a dataset.pp_train ending naflex(P, N) and a scaling.', {
            'images_per_row': F('int', 0, '>= 0', 'Consecutive images packed into each row '
                                '(those that do not fit in seq_len are dropped); the batch '
                                'is batch_size / images_per_row rows. 0: off, one image per '
                                'sequence.'),
            'seq_len': F('int', 0, '>= 0', "The tokens of a packed row; 0: naflex's "
                         'max_num_patches N (the budget of one unpacked image).'),
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
    'distill': Group("DeiT's hard-label distillation, for a model with model.distill_token "
                     '(docs/training.md).', {
        'teacher': F('path', '', '', "The teacher: any SOURCE init_from takes. Its hard labels "
                     'of the same (augmented, mixed) images train the distillation head, the '
                     "labels the class head, half the loss each; '': the heads' mean learns "
                     "the labels (timm's training without a teacher)."),
    }),
    'flexi': Group("FlexiViT's training (Beyer et al., 2023): each step at a patch size drawn "
                   'from a list, the parameters kept at model.patch_size (docs/evaluation.md).', {
        'patch_sizes': F('ints', (), '>= 1', "The patch sizes a step is drawn from (each must "
                         "tile model.image_size; the paper's: 8 to 48 at 240 px); (): off, "
                         'every step at model.patch_size.'),
        'probabilities': F('tuple', (), '', "Each patch size's probability, in order; (): "
                           'uniform.'),
    }),
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
    'init_normalization': F('bool', True, '', 'Where init_from records how its images were '
                            "normalised (timm's and transformers': OpenAI's mean and std for "
                            "CLIP, 0.5 for SigLIP, ImageNet's for DINOv2 and DeiT), that scaling "
                            'replaces the value_range or normalize op of dataset.pp_train and '
                            "pp_eval (appended where they have none; config.json's pp_eval is "
                            "the one run); False: the pipelines' own (logged)."),
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


def flatten(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a.b.c': value} of a config's dict (``to_dict()`` or config.json's); lists as tuples."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = tuple(value) if isinstance(value, list) else value
  return flat


# The base config's fields by dotted name ('model.name'), config.evals aside.
DECLARED: dict[str, Field] = {
    k: f for k, f in flatten({k: f.fields if isinstance(f, Group) else f
                              for k, f in FIELDS.items()}).items() if f.kind != 'evals'}


def eval_fields(eval_type: Any, where: str = 'config.evals.NAME') -> dict[str, Field]:
  """The fields of an evaluator of ``eval_type``, or a ConfigError naming ``where`` (the
  entry, config.evals.NAME) for a type that is not one of ``EVAL_TYPES``."""
  if not isinstance(eval_type, str) or eval_type not in EVAL_TYPES:
    raise errors.ConfigError(f'{where}.type={eval_type!r} is not an evaluator type: one of '
                             f'{", ".join(map(repr, EVAL_TYPES))}.')
  return {**EVAL_COMMON, **EVAL_TYPES[eval_type].fields}
