r"""A ViT trained from scratch on Fashion-MNIST (../shared/data/fashion_mnist).

28x28 greyscale images in 7x7 patches (a 4x4 grid of tokens), a 6-layer, 128-wide
encoder with global average pooling, random translations and flips, Adam with cosine
decay, 30 epochs.

    python -m vit_jax.main --config=configs/fashion_mnist.py --workdir=/tmp/fmnist
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='ti16', image_size=28, patch_size=7, hidden_size=128, mlp_dim=256,
                      num_heads=4, num_layers=6, pool='gap')
  config.dataset.update(
      name='fashion_mnist', num_classes=10, data_dir='../shared/data/fashion_mnist',
      pp_train='to_rgb|pad_crop(2)|flip_lr|value_range(-1, 1)',
      pp_eval='to_rgb|value_range(-1, 1)')
  config.label_smoothing = 0.1
  config.batch_size = 256
  config.eval_batch_size = 1000
  config.num_epochs = 30
  config.optimizer.weight_decay = 0.05
  config.schedule.update(base_lr=2e-3, warmup_steps=500, decay='cosine')
  config.eval_every_steps = 1000
  config.keep_checkpoints = 2
  config.input_workers = 2
  return config
