r"""DeiT-S on ImageNet-1k from scratch: the DeiT recipe (Touvron et al., 2021, table 9).

ViT-S/16 with a class token and stochastic depth 0.1; batch 1024, AdamW lr 1e-3
(5e-4 x 1024 / 512), weight decay 0.05, 5 warm-up epochs then cosine decay to 1e-5, no
clipping, 300 epochs; label smoothing 0.1, random-resized crops (8-100% of the area),
flips, timm's RandAugment 'rand-m9-mstd0.5-inc1' (``rand_augment``), random erasing 0.25
(timm's 'pixel' mode: N(0, 1) noise in normalised units, after ``value_range``), mixup 0.8
or CutMix 1.0 (half the batches each), repeated augmentation (each image 3 times in a row
in the stream, ``dataset.repeats``), and the weights' moving average at 0.99996 (DeiT's
code). Reported there: 79.8% (ImageNet validation); not run here.

    python -m vit_jax.main --config=configs/deit_s16_i1k.py --workdir=DIR \
        --config.dataset.data_dir=gs://BUCKET/tensorflow_datasets
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='s16', pool='token', stochastic_depth=0.1, matmul_dtype='bfloat16',
                      scan=True)
  config.dataset.update(
      name='imagenet2012', num_classes=1000, train_split='train', eval_split='validation',
      pp_train="decode|inception_crop(224, 0.08)|flip_lr|rand_augment('rand-m9-mstd0.5-inc1')|"
               'value_range(-1, 1)|random_erase(0.25)',
      repeats=3)
  config.label_smoothing = 0.1
  config.mixup_alpha = 0.8
  config.cutmix_alpha = 1.0
  config.mixup_switch_prob = 0.5
  config.batch_size = 1024
  config.num_epochs = 300
  config.optimizer.update(weight_decay=0.05, grad_clip_norm=0.0, ema_decay=0.99996)
  config.schedule.update(base_lr=1e-3, end_lr=1e-5, warmup_steps=0, warmup_epochs=5,
                         decay='cosine')
  config.eval_every_steps = 2500
  return config
