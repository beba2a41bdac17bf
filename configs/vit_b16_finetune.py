r"""Fine-tuning a pre-trained ViT-B/16: the paper's recipe (appendix B, table 4).

SGD with momentum 0.9, batch 512, no weight decay, clipping at global norm 1,
cosine decay after a short warm-up, 384 px. The argument picks the dataset
(TFDS names) and its number of steps: imagenet2012 (20k), cifar10 and cifar100
(10k), oxford_iiit_pet and oxford_flowers102 (500); ``local`` fine-tunes on a
dataset in the local format (``--config.dataset.data_dir=DIR``). The paper sweeps the
learning rate over {0.001, 0.003, 0.01, 0.03}; 0.03 is the default here.

    python -m vit_jax.main --config=configs/vit_b16_finetune.py:cifar10 --workdir=DIR \
        --config.init_from=ViT-B_16.npz
"""

import ml_collections

# dataset: (classes, steps, warm-up, train split, eval split)
PRESETS = {
    'imagenet2012': (1000, 20_000, 500, 'train[:99%]', 'validation'),
    'cifar10': (10, 10_000, 500, 'train[:98%]', 'test'),
    'cifar100': (100, 10_000, 500, 'train[:98%]', 'test'),
    'oxford_iiit_pet': (37, 500, 100, 'train[:90%]', 'test'),
    'oxford_flowers102': (102, 500, 100, 'train', 'test'),
    # Your own images, converted with vit_jax.data.convert: set dataset.data_dir
    # (the classes are read from its metadata) and total_steps.
    'local': (0, 2_000, 100, 'train', 'val'),
}


def get_config(dataset: str = 'cifar10') -> ml_collections.ConfigDict:
  if dataset not in PRESETS:
    raise ValueError(f'vit_b16_finetune.py:{dataset} - pick one of {sorted(PRESETS)}.')
  classes, steps, warmup, train_split, eval_split = PRESETS[dataset]
  config = ml_collections.ConfigDict()
  config.model = ml_collections.ConfigDict(dict(
      name='b16', image_size=384, representation_size=None, dropout_rate=0.0,
      dtype='bfloat16', scan=True, remat_policy='none'))
  config.dataset = ml_collections.ConfigDict(dict(
      name=dataset, num_classes=classes, data_dir='', manual_dir='', prepare=False,
      train_split=train_split, eval_split=eval_split,
      pp_train='to_rgb|inception_crop(384)|flip_lr|value_range(-1, 1)',
      pp_eval='to_rgb|resize(384)|value_range(-1, 1)'))
  config.loss = 'softmax_xent'
  config.label_smoothing = 0.0
  config.mixup_alpha = 0.0
  config.batch_size = 512
  config.eval_batch_size = 512
  config.total_steps = steps
  config.optimizer = ml_collections.ConfigDict(dict(name='sgd', momentum=0.9,
                                                    weight_decay=0.0, grad_clip_norm=1.0))
  config.schedule = ml_collections.ConfigDict(dict(base_lr=0.03, warmup_steps=warmup,
                                                   decay='cosine'))
  config.grad_accum_steps = 1
  config.step_impl = 'jit'
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  config.init_from = 'ViT-B_16.npz'  # A release (ImageNet-21k) checkpoint.
  config.init_step = ml_collections.config_dict.placeholder(int)  # None: its latest step.
  config.init_keep_head = False  # Keep the source's classifier (same classes).
  config.seed = 0
  config.log_every_steps = 50
  config.eval_every_steps = max(steps // 10, 100)
  config.checkpoint_every_steps = max(steps // 10, 100)
  config.keep_checkpoints = 2
  config.profile_steps = ()  # (first, last) step of a profiler trace.
  config.input_workers = 32
  return config
