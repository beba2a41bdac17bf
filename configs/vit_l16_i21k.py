r"""ViT-L/16 pre-trained on ImageNet-21k: the paper's recipe (appendix B, table 3).

Adam (0.9, 0.999), batch 4096, 90 epochs, base learning rate 1e-3 with a 10k-step
linear warm-up then linear decay, weight decay 0.03, global-norm clipping at 1,
dropout 0.1, 224 px. ImageNet-21k is multi-label: sigmoid cross-entropy with the
classifier bias initialised to -10, and a pre-logits (representation) layer of
the model's width, as in the released i21k checkpoints.

    python -m vit_jax.main --config=configs/vit_l16_i21k.py --workdir=DIR
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  config.model = ml_collections.ConfigDict(dict(
      name='l16',
      image_size=224,
      representation_size=1024,
      head_bias_init=-10.0,
      dropout_rate=0.1,
      dtype='bfloat16',
      scan=True,
      remat_policy='none',
  ))

  # ImageNet-21k has no TFDS builder: it is read from this project's local sharded
  # format (the input-pipeline milestone), converted from the release's tar files.
  config.dataset = ml_collections.ConfigDict(dict(
      name='imagenet21k',
      num_classes=21843,
      data_dir='',
      train_split='train',
      eval_split='validation',
      pp_train='decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
      pp_eval='decode|resize_small(256)|central_crop(224)|value_range(-1, 1)',
  ))

  config.loss = 'sigmoid_xent'
  config.batch_size = 4096
  config.num_epochs = 90

  config.optimizer = ml_collections.ConfigDict(dict(
      name='adam',
      b1=0.9,
      b2=0.999,
      weight_decay=0.03,
      grad_clip_norm=1.0,
      mu_dtype='bfloat16',
  ))
  config.schedule = ml_collections.ConfigDict(dict(
      base_lr=1e-3,
      warmup_steps=10_000,
      decay='linear',
  ))
  config.label_smoothing = 0.0
  config.mixup_alpha = 0.0
  config.eval_batch_size = 4096
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
