r"""Pre-train at low resolution, then fine-tune at the same or a higher one (Imagenette).

The paper's recipe in miniature: a small ViT (8x8 patches, width 128, 6 layers,
class token) trained from scratch on Imagenette (10 ImageNet classes, 9,469 train /
3,925 val images) at 64 px; then fine-tuned from that run's checkpoint with SGD for one
epoch, at 64 px (an 8x8 grid) or at a higher resolution (the position embeddings are
resized, e.g. to 16x16 at 128 px) - a fresh zero head each time. First convert the
JPEG folder into the local format:

    python -m vit_jax.data.convert --source=../shared/data/imagenette_224 \
        --out=/tmp/imagenette --shards=8
    python -m vit_jax.main --config=configs/imagenette.py:pretrain --workdir=/tmp/demo/pre64
    python -m vit_jax.main --config=configs/imagenette.py:finetune_64 \
        --workdir=/tmp/demo/ft64 --config.init_from=/tmp/demo/pre64
    python -m vit_jax.main --config=configs/imagenette.py:finetune_128 \
        --workdir=/tmp/demo/ft128 --config.init_from=/tmp/demo/pre64

``imagenette.py:finetune_native`` fine-tunes the same checkpoint at each image's own aspect
ratio (NaFlex: ``naflex(8, 64)``, at most 64 patches of 8 px, the pre-training's count, each
image cut at its own grid; docs/training.md), on a mixed-size, mixed-aspect copy of Imagenette
(``vit_jax.tools.crops``: one random crop of each image, 1:3 to 3:1):

    python -m vit_jax.tools.crops --source=../shared/data/imagenette_224 \
        --out=/tmp/imagenette_crops
    python -m vit_jax.data.convert --source=/tmp/imagenette_crops \
        --out=/tmp/imagenette_mixed --shards=8
    python -m vit_jax.main --config=configs/imagenette.py:finetune_native \
        --workdir=/tmp/demo/ftnative --config.init_from=/tmp/demo/pre64

``imagenette.py:mpp`` pre-trains the same model at 64 px without labels, by masked patch
prediction (``vit_jax.models.mpp``; the labels are not read), with the same Adam recipe; fine-tune
from its workdir with ``:pretrain`` or ``:finetune_SIZE`` (docs/self_supervised.md).
"""

from vit_jax import config as config_lib

PRETRAIN_SIZE = 64


def get_config(arg: str = 'pretrain'):
  if arg in ('pretrain', 'mpp'):
    size, finetune = PRETRAIN_SIZE, False
  elif arg == 'finetune_native':
    size, finetune = PRETRAIN_SIZE, True
  elif arg.startswith('finetune_') and arg[len('finetune_'):].isdigit():
    size, finetune = int(arg[len('finetune_'):]), True
  else:
    raise ValueError(f'{arg!r} is not a choice: use "pretrain", "mpp", "finetune_SIZE" '
                     '(e.g. finetune_128) or "finetune_native".')
  if size % 8:
    raise ValueError(f'{arg!r}: the size must be a multiple of the 8 px patches.')
  config = config_lib.get_config()
  config.model.update(name='ti16', image_size=size, patch_size=8, hidden_size=128, mlp_dim=384,
                      num_heads=4, num_layers=6, pool='token')
  resize = int(size * 1.14)  # Eval: resize the short side, then a central crop.
  config.dataset.update(
      name='imagenette', data_dir='/tmp/imagenette', num_classes=10, eval_split='val',
      pp_train=f'decode|inception_crop({size}, 0.08)|flip_lr|value_range(-1, 1)',
      pp_eval=f'decode|resize_small({resize})|central_crop({size})|value_range(-1, 1)')
  if arg == 'finetune_native':  # Each image at its aspect ratio, in 64 patches at most.
    patches = (PRETRAIN_SIZE // 8) ** 2
    config.dataset.update(
        data_dir='/tmp/imagenette_mixed',
        pp_train=f'decode|flip_lr|naflex(8, {patches})|value_range(-1, 1)',
        pp_eval=f'decode|naflex(8, {patches})|value_range(-1, 1)')
  config.label_smoothing = 0.1
  config.batch_size = 64
  config.eval_batch_size = 200
  if not finetune:  # Adam, cosine decay (appendix B, scaled down).
    config.num_epochs = 8
    config.optimizer.weight_decay = 0.05
    config.schedule.update(base_lr=1e-3, warmup_steps=300, decay='cosine')
  else:  # SGD with momentum, no weight decay, clipping, cosine (table 4).
    config.num_epochs = 1
    config.optimizer.name = 'sgd'
    config.schedule.update(base_lr=0.01, warmup_steps=20, decay='cosine')
  if arg == 'mpp':  # Masked patch prediction: self-supervised, the labels ignored.
    config.objective = 'mpp'
    config.evals.eval = dict(type='mpp')
  config.log_every_steps = 50
  config.checkpoint_every_steps = 300
  config.keep_checkpoints = 2
  config.input_workers = 2
  return config
