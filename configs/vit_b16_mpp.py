r"""ViT-B/16 pre-trained without labels by masked patch prediction (section 4.6, appendix B.1.2).

The paper's self-supervised recipe: half of each image's patch embeddings corrupted (80%
a learnable [mask] embedding, 10% a random other patch's, 10% unchanged), each corrupted
patch's 3-bit mean colour (512 classes) predicted from its final representation with a
softmax cross-entropy (``vit_jax.models.mpp``; ``--config.mpp.target`` picks the alternatives
it tried: color_4x4, l2_patch, or l2_mean_color). ViT-B/16, batch 4096, Adam (0.9, 0.999),
base learning rate 2e-4, a 10k-step warm-up then cosine decay, 1M steps (about 14 epochs
of JFT-300M). The paper names no weight decay or dropout for it: none here; clipping at
1 as in its other recipes. No label is read: the argument picks the data, ImageNet-style
(``i1k``: TFDS ``imagenet2012``, its labels ignored) or JFT-like (``jft_like``: a local
dataset, converted from a folder of images without class folders, or any labelled one).
Its evaluation is the same objective on held-out images ('color_accuracy': the corrupted
patches' colours predicted right). Then fine-tune from the workdir as from any run: the
mask embedding and the prediction head are dropped, a fresh classifier added. The paper:
79.9% on ImageNet after fine-tuning, 2% over training from scratch, 4% behind supervised
pre-training.

    python -m vit_jax.data.convert --source=/data/unlabelled_images --out=/data/mpp
    python -m vit_jax.main --config=configs/vit_b16_mpp.py:jft_like --workdir=DIR \
        --config.dataset.data_dir=/data/mpp
    python -m vit_jax.main --config=configs/vit_b16_finetune.py:imagenet2012 \
        --workdir=DIR_FT --config.init_from=DIR
    python -m vit_jax.tools.aot --config=configs/vit_b16_mpp.py:jft_like --topology=v3-128 \
        --num_train_examples=303000000
"""

from vit_jax import config as config_lib

DATA = ('i1k', 'jft_like')


def get_config(data: str = 'jft_like'):
  if data not in DATA:
    raise ValueError(f'{data!r} is not a choice: pick one of {", ".join(DATA)}.')
  config = config_lib.get_config()
  config.objective = 'mpp'
  config.evals.eval = dict(type='mpp')  # The colours of held-out images' patches.
  config.mpp.update(target='mean_color', corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1)
  config.model.update(name='b16', dtype='bfloat16', scan=False)
  if data == 'i1k':
    config.dataset.update(name='imagenet2012', train_split='train[:99%]',
                          eval_split='train[99%:]')
  else:
    config.dataset.update(name='jft_like', eval_split='validation')
  config.batch_size = 4096
  config.total_steps = 1_000_000
  config.optimizer.update(weight_decay=0.0, grad_clip_norm=1.0, mu_dtype='bfloat16')
  config.schedule.update(base_lr=2e-4, warmup_steps=10_000, decay='cosine')
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
