r"""ViT-B/16 pre-trained on a JFT-like local dataset: the paper's JFT-300M recipe.

JFT is multi-label (about 18k classes, several labels per image), stored as shards
on the cluster's own storage: convert such data with ``python -m vit_jax.data.convert``
(a manifest with several labels per image makes a multi-label dataset), then point
``dataset.data_dir`` at it. Recipe (appendix B, table 3): Adam (0.9, 0.999), batch
4096, 7 epochs, base learning rate 8e-4 (ViT-B), 10k-step warm-up then linear decay,
weight decay 0.1, no dropout, clipping at 1; sigmoid cross-entropy with the head
bias at -10, and a pre-logits layer.

    python -m vit_jax.main --config=configs/vit_b16_jft_like.py --workdir=DIR \
        --config.dataset.data_dir=/data/jft_like
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = ml_collections.ConfigDict(dict(
      name='b16', image_size=224, representation_size=768, head_bias_init=-10.0,
      dropout_rate=0.0, dtype='bfloat16', scan=True, remat_policy='none'))
  config.dataset = ml_collections.ConfigDict(dict(
      name='jft_like', num_classes=0, data_dir='', train_split='train',
      eval_split='validation',
      pp_train='decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
      pp_eval='decode|resize_small(256)|central_crop(224)|value_range(-1, 1)'))
  config.loss = 'sigmoid_xent'
  config.label_smoothing = 0.0
  config.mixup_alpha = 0.0
  config.batch_size = 4096
  config.eval_batch_size = 4096
  config.num_epochs = 7
  config.optimizer = ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999, weight_decay=0.1, grad_clip_norm=1.0,
      mu_dtype='bfloat16'))
  config.schedule = ml_collections.ConfigDict(dict(base_lr=8e-4, warmup_steps=10_000,
                                                   decay='linear'))
  config.grad_accum_steps = 1
  config.step_impl = 'jit'
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  config.init_from = ''  # A run's workdir or a release .npz to fine-tune from.
  config.init_step = ml_collections.config_dict.placeholder(int)  # None: its latest step.
  config.init_keep_head = False  # Keep the source's classifier (same classes).
  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  config.keep_checkpoints = 3
  config.profile_steps = ()  # (first, last) step of a profiler trace.
  config.input_workers = 32
  return config
