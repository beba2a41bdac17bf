r"""ViT-B/16 pre-trained on ImageNet-1k: the paper's recipe (appendix B, table 3).

Adam (0.9, 0.999), batch 4096, 300 epochs, base learning rate 3e-3 with a 10k-step
linear warm-up then linear decay, weight decay 0.3, global-norm clipping at 1,
dropout 0.1, a pre-logits layer, 224 px inception crops and flips.

ImageNet comes from TFDS ``imagenet2012``: put ILSVRC2012_img_{train,val}.tar in
a manual directory and prepare it once (``--config.dataset.prepare=True
--config.dataset.manual_dir=DIR``), in ArrayRecord format.

    python -m vit_jax.main --config=configs/vit_b16_i1k.py --workdir=DIR \
        --config.dataset.data_dir=gs://BUCKET/tensorflow_datasets
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = ml_collections.ConfigDict(dict(
      name='b16', image_size=224, representation_size=768, dropout_rate=0.1,
      dtype='bfloat16', scan=True, remat_policy='none'))
  config.dataset = ml_collections.ConfigDict(dict(
      name='imagenet2012', num_classes=1000, data_dir='', manual_dir='', prepare=False,
      train_split='train[:99%]', eval_split='train[99%:]',
      pp_train='decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
      pp_eval='decode|resize_small(256)|central_crop(224)|value_range(-1, 1)'))
  config.loss = 'softmax_xent'
  config.label_smoothing = 0.0
  config.mixup_alpha = 0.0
  config.batch_size = 4096
  config.eval_batch_size = 4096
  config.num_epochs = 300
  config.optimizer = ml_collections.ConfigDict(dict(
      name='adam', b1=0.9, b2=0.999, weight_decay=0.3, grad_clip_norm=1.0, mu_dtype=None))
  config.schedule = ml_collections.ConfigDict(dict(base_lr=3e-3, warmup_steps=10_000,
                                                   decay='linear'))
  config.grad_accum_steps = 1
  config.step_impl = 'jit'
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  config.init_from = ''  # A run's workdir or a release .npz to fine-tune from.
  config.init_step = ml_collections.config_dict.placeholder(int)  # None: its latest step.
  config.init_keep_head = False  # Keep the source's classifier (same classes).
  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2000
  config.keep_checkpoints = 3
  config.profile_steps = ()  # (first, last) step of a profiler trace.
  config.input_workers = 32
  return config
