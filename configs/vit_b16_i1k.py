r"""ViT-B/16 pre-trained on ImageNet-1k: the paper's recipe (appendix B, table 3).

Adam (0.9, 0.999), batch 4096, 300 epochs, base learning rate 3e-3 with a 10k-step
linear warm-up then linear decay, weight decay 0.3, global-norm clipping at 1,
dropout 0.1, a pre-logits layer, 224 px inception crops and flips.

Meant for a TPU v3-128 slice (32 images per core; ``python -m vit_jax.tools.aot
--config=configs/vit_b16_i1k.py --topology=v3-128`` shows the fit, the step time and the
cost). Adam's first moment in bfloat16, as in big_vision's ViT recipes; the blocks unrolled
(``scan=False``): faster on TPUs than scanned, and timed by the TPU compiler's cost model.

ImageNet comes from TFDS ``imagenet2012``: put ILSVRC2012_img_{train,val}.tar in
a manual directory and prepare it once (``--config.dataset.prepare=True
--config.dataset.manual_dir=DIR``).

    python -m vit_jax.main --config=configs/vit_b16_i1k.py --workdir=DIR \
        --config.dataset.data_dir=gs://BUCKET/tensorflow_datasets
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='b16', representation_size=768, dropout_rate=0.1, dtype='bfloat16',
                      scan=False)
  config.dataset.update(name='imagenet2012', num_classes=1000, train_split='train[:99%]',
                        eval_split='train[99%:]')
  config.num_epochs = 300
  config.optimizer.update(weight_decay=0.3, mu_dtype='bfloat16')
  config.schedule.base_lr = 3e-3
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2000
  return config
