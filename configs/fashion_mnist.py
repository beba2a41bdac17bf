r"""A ViT trained from scratch on Fashion-MNIST (../shared/data/fashion_mnist).

28x28 greyscale images in 7x7 patches (a 4x4 grid of tokens), a 6-layer, 128-wide
encoder with global average pooling, random translations and flips, Adam with cosine
decay, 30 epochs.

    python -m vit_jax.main --config=configs/fashion_mnist.py --workdir=/tmp/fmnist
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = ml_collections.ConfigDict(dict(
      name='ti16', image_size=28, patch_size=7, hidden_size=128, mlp_dim=256, num_heads=4,
      num_layers=6, pool='gap',
      # 'bfloat16': bfloat16 matmuls, float32 accumulation (faster on CPUs with AVX512-BF16).
      matmul_dtype=ml_collections.config_dict.placeholder(str)))
  config.dataset = ml_collections.ConfigDict(dict(
      name='fashion_mnist', num_classes=10, data_dir='../shared/data/fashion_mnist',
      train_split='train', eval_split='test',
      pp_train='to_rgb|pad_crop(2)|flip_lr|value_range(-1, 1)',
      pp_eval='to_rgb|value_range(-1, 1)'))
  config.loss = 'softmax_xent'
  config.label_smoothing = 0.1
  config.mixup_alpha = 0.0
  config.batch_size = 256
  config.eval_batch_size = 1000
  config.num_epochs = 30
  config.optimizer = ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999, weight_decay=0.05, grad_clip_norm=1.0))
  config.schedule = ml_collections.ConfigDict(dict(base_lr=2e-3, warmup_steps=500,
                                                   decay='cosine'))
  config.grad_accum_steps = 1
  config.step_impl = 'jit'
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  config.init_from = ''  # A run's workdir or a release .npz to fine-tune from.
  config.init_step = ml_collections.config_dict.placeholder(int)  # None: its latest step.
  config.init_keep_head = False  # Keep the source's classifier (same classes).
  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 2
  config.profile_steps = ()  # (first, last) step of a profiler trace.
  config.input_workers = 2
  return config
