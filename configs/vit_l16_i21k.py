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

  config.dataset = ml_collections.ConfigDict(dict(
      name='imagenet21k',
      num_classes=21843,
      multi_label=True,
      train_split='full[:12400000]',
      eval_split='full[12400000:]',
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
  ))
  config.schedule = ml_collections.ConfigDict(dict(
      base_lr=1e-3,
      warmup_steps=10_000,
      decay='linear',
  ))
  config.seed = 0
  return config
