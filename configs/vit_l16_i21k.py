r"""ViT-L/16 pre-trained on ImageNet-21k: the paper's recipe (appendix B, table 3).

Adam (0.9, 0.999), batch 4096, 90 epochs, base learning rate 1e-3 with a 10k-step
linear warm-up then linear decay, weight decay 0.03, global-norm clipping at 1,
dropout 0.1, 224 px. ImageNet-21k is multi-label: sigmoid cross-entropy with the
classifier bias initialised to -10, and a pre-logits (representation) layer of
the model's width, as in the released i21k checkpoints.

Meant for a TPU v3-128 slice (32 images per core; ``python -m vit_jax.tools.aot
--config=configs/vit_l16_i21k.py --topology=v3-128`` shows the fit, the step time and the
cost: about half the paper's 230 TPUv3-core-days, README). The blocks unrolled
(``scan=False``): faster on TPUs than scanned, and timed by the TPU compiler's cost model.

ImageNet-21k has no TFDS builder: it is read from this project's local sharded format,
converted from the release's tar files (``python -m vit_jax.data.convert --kind=i21k``).

    python -m vit_jax.main --config=configs/vit_l16_i21k.py --workdir=DIR \
        --config.dataset.data_dir=/data/i21k
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='l16', representation_size=1024, head_bias_init=-10.0,
                      dropout_rate=0.1, dtype='bfloat16', scan=False)
  config.dataset.update(name='imagenet21k', num_classes=21843, eval_split='validation')
  config.loss = 'sigmoid_xent'
  config.num_epochs = 90
  config.optimizer.update(weight_decay=0.03, mu_dtype='bfloat16')
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
