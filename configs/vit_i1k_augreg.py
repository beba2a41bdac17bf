r"""ViT on ImageNet-1k from scratch: the AugReg recipe ("How to train your ViT?", Steiner et al.,
2021), as big_vision's ``configs/vit_i1k.py`` runs it.

A class token, learned position embeddings, a pre-logits layer as wide as the model,
sigmoid cross-entropy with the head bias at -6.9; batch 4096, 300 epochs, Adam (first
moment in bfloat16), lr 1e-3 with a 10k-step warm-up then cosine decay, clipping at 1,
weight decay 1e-4 (big_vision's, not scaled by the learning rate: 0.1 x lr 1e-3 here),
no dropout or stochastic depth; inception crops, flips, big_vision's RandAugment and
mixup at the strength its table picks for the model (the paper's figure 4): ti16 'light1'
(RandAugment(2, 0), no mixup), s32 'medium1' (RandAugment(2, 15), mixup 0.2), s16, b32,
b16, l16 'medium2' (RandAugment(2, 15), mixup 0.5). The argument picks the model (b16,
big_vision's default). The model code is this project's (scanned blocks, bfloat16 matmuls),
the recipe big_vision's; not run here.

    python -m vit_jax.main --config=configs/vit_i1k_augreg.py:s16 --workdir=DIR \
        --config.dataset.data_dir=gs://BUCKET/tensorflow_datasets
"""

from vit_jax import config as config_lib

# model: (width, RandAugment magnitude or None, mixup alpha), big_vision's table.
PRESETS = {'ti16': (192, 0, 0.0), 's32': (384, 15, 0.2), 's16': (384, 15, 0.5),
           'b32': (768, 15, 0.5), 'b16': (768, 15, 0.5), 'l16': (1024, 15, 0.5)}


def get_config(model: str = 'b16'):
  if model not in PRESETS:
    raise ValueError(f'{model!r} is not a choice: pick one of {", ".join(PRESETS)}.')
  width, magnitude, mixup = PRESETS[model]
  config = config_lib.get_config()
  config.model.update(name=model, pool='token', posemb='learn', representation_size=width,
                      head_bias_init=-6.9, matmul_dtype='bfloat16', scan=True)
  config.dataset.update(
      name='imagenet2012', num_classes=1000, train_split='train[:99%]', eval_split='validation',
      pp_train=f'decode|inception_crop(224)|flip_lr|randaug(2, {magnitude})|value_range(-1, 1)')
  config.loss = 'sigmoid_xent'
  config.mixup_alpha = mixup
  config.batch_size = 4096
  config.num_epochs = 300
  config.optimizer.update(weight_decay=0.1, mu_dtype='bfloat16', grad_clip_norm=1.0)
  config.schedule.update(base_lr=1e-3, warmup_steps=10_000, decay='cosine')
  config.eval_every_steps = 2500
  return config
