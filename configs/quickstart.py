r"""A small ViT on scikit-learn's bundled 8x8 digits: runs offline, on CPU, in minutes.

1,437 training and 360 held-out images, upscaled to 16x16 and cut into 4x4
patches (16 tokens), with random translations as augmentation.

    python -m vit_jax.main --config=configs/quickstart.py --workdir=/tmp/q
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = ml_collections.ConfigDict(dict(
      name='ti16', image_size=16, patch_size=4, hidden_size=64, mlp_dim=128, num_heads=4,
      num_layers=4, pool='gap', scan=False,
      # 'bfloat16': bfloat16 matmuls, float32 accumulation (faster on CPUs with AVX512-BF16).
      matmul_dtype=ml_collections.config_dict.placeholder(str)))
  config.dataset = ml_collections.ConfigDict(dict(
      name='digits', num_classes=10, train_split='train', eval_split='test',
      pp_train='to_rgb|resize(16)|pad_crop(2)|value_range(-1, 1)',
      pp_eval='to_rgb|resize(16)|value_range(-1, 1)'))
  config.loss = 'softmax_xent'
  config.label_smoothing = 0.0
  config.mixup_alpha = 0.0
  config.batch_size = 128
  config.eval_batch_size = 128
  config.total_steps = 1500
  config.optimizer = ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999, weight_decay=0.1, grad_clip_norm=1.0))
  config.schedule = ml_collections.ConfigDict(dict(base_lr=3e-3, warmup_steps=100,
                                                   decay='cosine'))
  config.grad_accum_steps = 1
  config.step_impl = 'jit'
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  config.init_from = ''  # A run's workdir or a release .npz to fine-tune from.
  config.init_step = ml_collections.config_dict.placeholder(int)  # None: its latest step.
  config.init_keep_head = False  # Keep the source's classifier (same classes).
  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 2
  config.profile_steps = ()  # (first, last) step of a profiler trace.
  config.input_workers = 2
  return config
