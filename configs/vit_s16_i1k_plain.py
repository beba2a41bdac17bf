r"""ViT-S/16 on ImageNet-1k from scratch: big_vision's plain-ViT baseline.

big_vision's ``configs/vit_s16_i1k.py``, "Better plain ViT baselines for ImageNet-1k"
(Beyer et al., 2022), a simplification of the AugReg recipe (``vit_i1k_augreg.py``):
global average pooling, fixed 2-D sin-cos position embeddings, a pre-logits layer,
softmax loss; batch 1024, Adam (first moment in bfloat16), lr 1e-3 with a 10k-step
warm-up then cosine decay, clipping at 1, inception crops, flips, big_vision's
RandAugment(2, 10) (``randaug``), mixup 0.2. Its weight decay, 1e-4, is not scaled by the
learning rate; here it is, so 0.1 x lr 1e-3 is the same decay. Reported there (ImageNet
validation): 76.5% after 90 epochs (its default), about 80% after 300; not run here.

    python -m vit_jax.main --config=configs/vit_s16_i1k_plain.py --workdir=DIR \
        --config.dataset.data_dir=gs://BUCKET/tensorflow_datasets [--config.num_epochs=90]
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='s16', pool='gap', posemb='sincos2d', representation_size=384,
                      matmul_dtype='bfloat16', scan=True)
  config.dataset.update(
      name='imagenet2012', num_classes=1000, train_split='train[:99%]', eval_split='validation',
      pp_train='decode|inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1, 1)')
  config.mixup_alpha = 0.2
  config.batch_size = 1024
  config.num_epochs = 300
  config.optimizer.update(weight_decay=0.1, mu_dtype='bfloat16')
  config.schedule.update(base_lr=1e-3, warmup_steps=10_000, decay='cosine')
  config.eval_every_steps = 2500
  return config
