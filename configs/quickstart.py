r"""A small ViT on scikit-learn's bundled 8x8 digits: runs offline, on CPU, in minutes.

1,437 training and 360 held-out images, upscaled to 16x16 and cut into 4x4
patches (16 tokens), with random translations as augmentation.

    python -m vit_jax.main --config=configs/quickstart.py --workdir=/tmp/q
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='ti16', image_size=16, patch_size=4, hidden_size=64, mlp_dim=128,
                      num_heads=4, num_layers=4, pool='gap')
  config.dataset.update(
      name='digits', num_classes=10,
      pp_train='to_rgb|resize(16)|pad_crop(2)|value_range(-1, 1)',
      pp_eval='to_rgb|resize(16)|value_range(-1, 1)')
  config.batch_size = 128
  config.total_steps = 1500
  config.optimizer.weight_decay = 0.1
  config.schedule.update(base_lr=3e-3, warmup_steps=100, decay='cosine')
  config.eval_every_steps = 500
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 2
  config.input_workers = 2
  # Few-shot linear accuracy of the frozen features on the same digits (docs/evaluation.md).
  config.evals.fewshot = dict(type='fewshot', datasets=('digits',))
  return config
