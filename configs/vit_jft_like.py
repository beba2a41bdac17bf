r"""ViT pre-trained on a JFT-like local dataset: the paper's JFT-300M recipes (B/16, L/16, H/14).

JFT is multi-label (18,291 classes, several labels per image), stored as shards on the
cluster's own storage: convert such data with ``python -m vit_jax.data.convert`` (a
manifest with several labels per image makes a multi-label dataset), then point
``dataset.data_dir`` at it. Recipe (appendix B, table 3): Adam (0.9, 0.999), batch 4096,
a 10k-step warm-up then linear decay, weight decay 0.1, no dropout, clipping at 1;
sigmoid cross-entropy with the head bias at -10, and a pre-logits layer. The argument
picks the model, its learning rate and epochs: b16 (8e-4, 7 epochs), l16 (4e-4, 14),
h14 (3e-4, 14). Adam's first moment in bfloat16, as in big_vision's ViT recipes; the
blocks unrolled (``scan=False``): faster on TPUs, and timed by the TPU compiler's cost model.

Each is meant for a TPU v3-128 slice (32 images per core); ``vit_jax.tools.aot`` shows the fit,
the step time and the cost (JFT-300M's 303M images; README):

    python -m vit_jax.tools.aot --config=configs/vit_jft_like.py:h14 --topology=v3-128 \
        --config.dataset.num_classes=18291 --num_train_examples=303000000
    python -m vit_jax.main --config=configs/vit_jft_like.py:l16 --workdir=DIR \
        --config.dataset.data_dir=/data/jft_like
"""

from vit_jax import config as config_lib

# model: (base learning rate, epochs), the paper's.
PRESETS = {'b16': (8e-4, 7), 'l16': (4e-4, 14), 'h14': (3e-4, 14)}


def get_config(model: str = 'b16'):
  if model not in PRESETS:
    raise ValueError(f'{model!r} is not a choice: pick one of {", ".join(PRESETS)}.')
  base_lr, epochs = PRESETS[model]
  config = config_lib.get_config()
  width = {'b16': 768, 'l16': 1024, 'h14': 1280}[model]
  config.model.update(name=model, representation_size=width, head_bias_init=-10.0,
                      dtype='bfloat16', scan=False)
  config.dataset.update(name='jft_like', eval_split='validation')
  config.loss = 'sigmoid_xent'
  config.num_epochs = epochs
  config.optimizer.update(weight_decay=0.1, mu_dtype='bfloat16')
  config.schedule.base_lr = base_lr
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
