r"""Fine-tuning a pre-trained ViT-B/16: the paper's recipe (appendix B, table 4).

SGD with momentum 0.9, batch 512, no weight decay, clipping at global norm 1,
cosine decay after a short warm-up, 384 px. The argument picks the dataset
(TFDS names) and its number of steps: imagenet2012 (20k), cifar10 and cifar100
(10k), oxford_iiit_pet and oxford_flowers102 (500); ``local`` fine-tunes on a
dataset in the local format (``--config.dataset.data_dir=DIR``). Each trains on the whole
training split, as the paper's reported runs do. The paper chose the learning rate from
{0.001, 0.003, 0.01, 0.03} on a minival split held out of the training split (``MINIVAL``
percent: 1 for ImageNet, 2 for CIFAR, 10 for Pets and Flowers); ``vit_jax.sweep --minival``
does that choice, then trains on the whole split. 0.03 is the default here.

    python -m vit_jax.main --config=configs/vit_b16_finetune.py:cifar10 --workdir=DIR \
        --config.init_from=ViT-B_16.npz
    python -m vit_jax.sweep --config=configs/vit_b16_finetune.py:cifar10 --workdir=DIR \
        --minival=2 --seeds=3 --grid=schedule.base_lr=0.001,0.003,0.01,0.03
"""

from vit_jax import config as config_lib

# dataset: (classes, steps, warm-up, train split, eval split)
PRESETS = {
    'imagenet2012': (1000, 20_000, 500, 'train', 'validation'),
    'cifar10': (10, 10_000, 500, 'train', 'test'),
    'cifar100': (100, 10_000, 500, 'train', 'test'),
    'oxford_iiit_pet': (37, 500, 100, 'train', 'test'),
    'oxford_flowers102': (102, 500, 100, 'train', 'test'),
    # Your own images, converted with vit_jax.data.convert: set dataset.data_dir
    # (the classes are read from its metadata) and total_steps.
    'local': (0, 2_000, 100, 'train', 'val'),
}
# The share of the training split (%) the paper held out to choose the learning rate
# (appendix B.1.1): vit_jax.sweep's --minival.
MINIVAL = {'imagenet2012': 1, 'cifar10': 2, 'cifar100': 2, 'oxford_iiit_pet': 10,
           'oxford_flowers102': 10}


def get_config(dataset: str = 'cifar10'):
  if dataset not in PRESETS:
    raise ValueError(f'{dataset!r} is not a choice: pick one of {", ".join(PRESETS)}.')
  classes, steps, warmup, train_split, eval_split = PRESETS[dataset]
  config = config_lib.get_config()
  config.model.update(name='b16', image_size=384, dtype='bfloat16', scan=True)
  config.dataset.update(
      name=dataset, num_classes=classes, train_split=train_split, eval_split=eval_split,
      pp_train='to_rgb|inception_crop(384)|flip_lr|value_range(-1, 1)',
      pp_eval='to_rgb|resize(384)|value_range(-1, 1)')
  config.batch_size = 512
  config.total_steps = steps
  config.optimizer.name = 'sgd'
  config.schedule.update(base_lr=0.03, warmup_steps=warmup, decay='cosine')
  config.init_from = 'ViT-B_16.npz'  # A release (ImageNet-21k) checkpoint.
  config.log_every_steps = 50
  config.eval_every_steps = max(steps // 10, 100)
  config.checkpoint_every_steps = max(steps // 10, 100)
  config.keep_checkpoints = 2
  return config
