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

from vit_jax import config_base


def get_config():
  config = config_base.get_config()
  config.model.update(name='b16', representation_size=768, head_bias_init=-10.0,
                      dtype='bfloat16', scan=True)
  config.dataset.update(name='jft_like', eval_split='validation')
  config.loss = 'sigmoid_xent'
  config.num_epochs = 7
  config.optimizer.update(weight_decay=0.1, mu_dtype='bfloat16')
  config.schedule.base_lr = 8e-4
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
