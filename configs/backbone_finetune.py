r"""Fine-tuning the backbones of the Hub with the recipes their authors publish for transfer.

The argument is ``FAMILY,DATASET``: FAMILY one of ``clip``, ``siglip``, ``dinov2``,
``dinov3``, ``eva02``, ``deit_distilled`` (a ViT-B of each, from its timm Hub id,
``HUB_IDS``); DATASET one of
``DATASETS`` (``digits`` is bundled: an offline try; ``local`` is your own data,
``--config.dataset.data_dir=DIR``). Each preset normalises as its checkpoint says
(``config.init_normalization``: OpenAI's mean and std for CLIP, 0.5 for SigLIP, ImageNet's for
DINOv2, DINOv3 and DeiT, CLIP's for EVA-02); its pipelines' ``value_range(-1, 1)`` stands for
that. The rotary ones (DINOv3, EVA-02) run at any resolution: their rotary coordinates follow
the new grid (EVA-02's position embeddings are resized too).

    python -m vit_jax.main --config=configs/backbone_finetune.py:clip,cifar100 --workdir=DIR

The first run of a family downloads its weights from the Hub once (a ViT-B: about 350 MB,
into the Hugging Face cache, ``HF_HOME``); later runs read the cache. Where the run's machines
have no network, or to download ahead of time, fetch them once where there is one, e.g.
``hf download timm/vit_base_patch16_clip_224.openai`` (each family's id: ``HUB_IDS``), and
run with ``HF_HUB_OFFLINE=1``.

What each follows (the recipes are ImageNet-1k's; other datasets take the same epochs, which
no source publishes for them):

* ``clip``: FT-CLIP (Dong et al., 2022, github.com/LightDXY/FT-CLIP,
  scripts/bash_fine_Openai_CLIP_P16.sh and run_class_finetuning.py's defaults): 224 px,
  AdamW (0.9, 0.999) lr 6e-4 (not scaled by the batch), weight decay 0.05, layer-wise decay
  0.6, batch 2048 (256 x 8 GPUs), 50 epochs with 10 of warm-up, cosine to 1e-6, no clipping,
  no drop path, label smoothing 0.1, EMA 0.9998, random-resized crops (8-100%), flips,
  RandAugment 'rand-m9-mstd0.5-inc1', random erasing 0.25, no mixup or CutMix; evaluated on
  the 224 px shorter side's central crop (its datasets.py, crop_pct 1). OpenAI's weights use
  quick GELU (timm's ``vit_base_patch16_clip_224`` says exact GELU: a warning says the
  config's is taken). Not as FT-CLIP (no option here): it freezes the patch embedding and
  pools the patches' mean through a new LayerNorm; here every weight trains and the class
  token is pooled through CLIP's own final LayerNorm.
* ``siglip``: big_vision's transfer config (big_vision/configs/transfer.py): 384 px, SGD
  momentum 0.9, no weight decay, clipping at norm 1, batch 512, cosine after a warm-up,
  Inception crops, flips, evaluated on the central 384 crop of the 448 px shorter side; steps,
  warm-up and learning rate per dataset from its table (found for ViT-AugReg-B/32; SigLIP
  publishes none of its own). Its ``resmall_crop`` for CIFAR (a random crop of the shorter
  side) has no op here: Inception crops throughout. For ``digits`` and ``local`` (not in it):
  the Pets/Flowers schedule and the config's default lr 0.01.
* ``dinov2``: the DINOv2 paper fine-tunes "with the pipeline of Touvron et al. (2022)" (its
  table 5) and gives no numbers: DeiT III's fine-tuning command for ViT-B at 224 px
  (facebookresearch/deit README_revenge.md, main.py's defaults): AdamW lr 1e-5 (unscaled) to
  1e-5 (``--min-lr``), weight decay 0.1, batch 512, 20 epochs with 5 of warm-up, drop path
  0.2, label smoothing 0.1, mixup 0.8 / CutMix 1.0, RandAugment 'rand-m9-mstd0.5-inc1', no
  random erasing or repeated augmentation, EMA 0.99996; evaluated as DINOv2's eval transform
  does (shorter side 256, bicubic, central 224 crop).
* ``dinov3``: DINOv3 (Siméoni et al., 2025) evaluates its frozen features (linear probes) and
  publishes no full fine-tuning recipe for classification: DINOv2's choice above (DeiT III's
  ViT-B command) at 224 px, from ``vit_base_patch16_dinov3.lvd1689m`` (saved for 256 px:
  fine-tuned at another grid, no resize), pooling the class token as DINOv3 does (timm's
  default pools the patches' mean).
* ``eva02``: EVA-02's fine-tuning of its MIM pre-trained B/14 on ImageNet-1k
  (baaivision/EVA, EVA-02/asuka/README.md, "Fine-tune MIM pre-trained eva02_B_pt_in21k_p14 on
  IN-1K"): 448 px from the 224 px ``eva02_base_patch14_224.mim_in22k`` (the position
  embeddings resized, the rotary coordinates scaled to its 16x16 reference grid), batch 1024
  (32 x 32 GPUs), AdamW lr 1e-4 (unscaled), layer-wise decay 0.7, weight decay 0.05, 30 epochs
  with 3 of warm-up from 0, cosine to 0, drop path 0.1, label smoothing 0.1, random-resized
  crops (8-100%), RandAugment 'rand-m9-mstd0.5-inc1', no mixup, CutMix or random erasing, EMA
  (its decay not given: timm's 0.9999 here); evaluated at 448 px with crop_pct 1.
* ``deit_distilled``: DeiT's fine-tuning at 384 px (facebookresearch/deit README_deit.md's
  command, main.py's defaults): batch 512 (32 x 16 GPUs), AdamW lr 5e-6 (x 512 / 512), held
  at 5e-6 (``--min-lr``) after 5 warm-up epochs, weight decay 1e-8, 30 epochs, drop path 0.1,
  label smoothing 0.1, mixup 0.8 / CutMix 1.0, RandAugment, random erasing 0.25, repeated
  augmentation 3, EMA 0.99996, no clipping; evaluated on the central 384 crop of the 438 px
  shorter side (crop ratio 0.875). DeiT's code refuses distillation while fine-tuning, so no
  teacher is named.

Not as published: warm-ups start at 0 (the sources' at 1e-6), and crops resize bilinearly
(theirs bicubically). Reported by the sources: FT-CLIP B/16 85.7% on ImageNet; not run here.
"""

from vit_jax import config as config_lib

HUB_IDS = {
    'clip': 'hf-hub:timm/vit_base_patch16_clip_224.openai',
    'siglip': 'hf-hub:timm/vit_base_patch16_siglip_224.webli',
    'dinov2': 'hf-hub:timm/vit_base_patch14_dinov2.lvd142m',
    'dinov3': 'hf-hub:timm/vit_base_patch16_dinov3.lvd1689m',
    'eva02': 'hf-hub:timm/eva02_base_patch14_224.mim_in22k',
    'deit_distilled': 'hf-hub:timm/deit_base_distilled_patch16_224.fb_in1k',
}
# dataset: (classes, train split, eval split)
DATASETS = {
    'imagenet2012': (1000, 'train', 'validation'), 'cifar10': (10, 'train', 'test'),
    'cifar100': (100, 'train', 'test'), 'oxford_iiit_pet': (37, 'train', 'test'),
    'oxford_flowers102': (102, 'train', 'test'), 'digits': (10, 'train', 'test'),
    'local': (0, 'train', 'val'),
}
# big_vision's transfer.py: dataset -> (steps, warm-up, lr) ('digits', 'local': not in it).
SIGLIP_SCHEDULES = {
    'imagenet2012': (20_000, 500, 0.03), 'cifar10': (10_000, 500, 0.003),
    'cifar100': (10_000, 500, 0.01), 'oxford_iiit_pet': (500, 100, 0.003),
    'oxford_flowers102': (500, 100, 0.003),
}
RANDAUGMENT = "rand_augment('rand-m9-mstd0.5-inc1')"


def _timm_recipe(config, size: int, eval_resize: int, epochs: int, warmup: int, lr: float,
                 end_lr: float, weight_decay: float, ema: float, erase: bool) -> None:
  """The timm-based recipes' common part (FT-CLIP, DeiT, DeiT III): AdamW, cosine, no
  clipping, label smoothing 0.1, random-resized crops, flips, RandAugment."""
  config.dataset.update(
      pp_train=f'decode|inception_crop({size}, 0.08)|flip_lr|{RANDAUGMENT}|value_range(-1, 1)'
               + ('|random_erase(0.25)' if erase else ''),
      pp_eval=f"decode|resize_small({eval_resize}, 'pil_bicubic')|central_crop({size}, 'round')|"
              'value_range(-1, 1)')
  config.num_epochs = epochs
  config.label_smoothing = 0.1
  config.optimizer.update(name='adam', weight_decay=weight_decay, grad_clip_norm=0.0,
                          ema_decay=ema)
  config.schedule.update(base_lr=lr, end_lr=end_lr, decay='cosine', warmup_steps=0,
                         warmup_epochs=warmup)


def get_config(arg: str = 'clip,cifar10'):
  family, _, dataset = arg.partition(',')
  if family not in HUB_IDS or dataset not in DATASETS:
    raise ValueError(f'{arg!r} is not a choice: FAMILY,DATASET with FAMILY one of '
                     f'{", ".join(HUB_IDS)} and DATASET one of {", ".join(DATASETS)}.')
  classes, train_split, eval_split = DATASETS[dataset]
  config = config_lib.get_config()
  config.init_from = HUB_IDS[family]
  config.dataset.update(name=dataset, num_classes=classes, train_split=train_split,
                        eval_split=eval_split)
  config.model.update(name='b16', dtype='bfloat16', scan=True)
  if family == 'clip':
    config.model.update(image_size=224, pre_norm=True, norm_epsilon=1e-5,
                        activation='quick_gelu')
    config.batch_size = 2048
    config.optimizer.layer_decay = 0.6
    _timm_recipe(config, 224, 224, epochs=50, warmup=10, lr=6e-4, end_lr=1e-6,
                 weight_decay=0.05, ema=0.9998, erase=True)
  elif family == 'siglip':
    config.model.update(image_size=384, pool='map', activation='gelu')
    steps, warmup, lr = SIGLIP_SCHEDULES.get(dataset, (500, 100, 0.01))
    config.dataset.update(pp_train='decode|inception_crop(384)|flip_lr|value_range(-1, 1)',
                          pp_eval='decode|resize_small(448)|central_crop(384)|value_range(-1, 1)')
    config.batch_size = 512
    config.total_steps = steps
    config.optimizer.update(name='sgd', momentum=0.9, weight_decay=0.0, grad_clip_norm=1.0)
    config.schedule.update(base_lr=lr, end_lr=0.0, decay='cosine', warmup_steps=warmup)
  elif family == 'dinov2':
    config.model.update(name='b14', image_size=224, layer_scale=1e-5, activation='gelu',
                        stochastic_depth=0.2)
    config.batch_size = 512
    config.mixup_alpha, config.cutmix_alpha, config.mixup_switch_prob = 0.8, 1.0, 0.5
    _timm_recipe(config, 224, 256, epochs=20, warmup=5, lr=1e-5, end_lr=1e-5,
                 weight_decay=0.1, ema=0.99996, erase=False)
  elif family == 'dinov3':
    config.model.update(image_size=224, posemb='none', rope='dinov3', num_registers=4,
                        layer_scale=1e-5, key_bias=False,
                        norm_epsilon=1e-5, activation='gelu', pool='token', class_token=True,
                        prefix_posemb=False, stochastic_depth=0.2)
    config.batch_size = 512
    config.mixup_alpha, config.cutmix_alpha, config.mixup_switch_prob = 0.8, 1.0, 0.5
    _timm_recipe(config, 224, 256, epochs=20, warmup=5, lr=1e-5, end_lr=1e-5,
                 weight_decay=0.1, ema=0.99996, erase=False)
  elif family == 'eva02':
    config.model.update(name='b14', image_size=448, mlp_dim=2048, gated_mlp=True,
                        activation='silu', mlp_norm=True, key_bias=False, pool='gap',
                        class_token=True, fc_norm=True,
                        rope="axial(ref_grid=(16, 16))", stochastic_depth=0.1)
    config.batch_size = 1024
    config.optimizer.layer_decay = 0.7
    _timm_recipe(config, 448, 448, epochs=30, warmup=3, lr=1e-4, end_lr=0.0,
                 weight_decay=0.05, ema=0.9999, erase=False)
  else:
    config.model.update(image_size=384, distill_token=True, activation='gelu',
                        stochastic_depth=0.1)
    config.batch_size = 512
    config.dataset.repeats = 3
    config.mixup_alpha, config.cutmix_alpha, config.mixup_switch_prob = 0.8, 1.0, 0.5
    _timm_recipe(config, 384, 438, epochs=30, warmup=5, lr=5e-6, end_lr=5e-6,
                 weight_decay=1e-8, ema=0.99996, erase=True)
  config.log_every_steps = 50
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 2
  return config
