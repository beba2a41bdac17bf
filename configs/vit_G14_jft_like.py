r"""ViT-G/14 pre-trained on a JFT-like dataset: "Scaling Vision Transformers" (Zhai et al., 2022).

Meant for a TPU v4-256 slice (128 chips of 32 GiB): mesh (data, fsdp, tensor) =
(1, 64, 2), the parameters and optimizer state split 128 ways, each example's heads and
MLP units over 2 chips. On a larger slice the data axis (-1) takes what fsdp x tensor
leave; plain FSDP is --config.mesh.fsdp=128 --config.mesh.tensor=1.

The paper's recipe, as its authors' big_vision config ``scaling_laws/train_vit_g.py``
gives it for G/14: ViT-G/14 (width 1664, 48 layers, MLP 8192, 16 heads; 1843M
parameters in the encoder) with a MAP head, 224 px inception crops and flips, JFT-3B
(29,593 classes, multi-label: sigmoid cross-entropy, head bias -10), batch 16,384, 1M
steps, learning rate 8e-4 after a 10k-step warm-up, decoupled weight decay 0.03,
clipping at 1.

Where vit_jax has no equivalent of the paper's choice, the closest it has: Adam with a
bfloat16 first moment for the paper's Adafactor variant (bfloat16 first moment, factored
second moment), linear decay for its reciprocal-square-root decay with a 50k-step
cool-down, and weight decay 0.03 on the head too (the paper: 3.0 on the head).

    python -m vit_jax.main --config=configs/vit_G14_jft_like.py --workdir=gs://BUCKET/G14 \
        --config.dataset.data_dir=gs://BUCKET/jft_like
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='G14', pool='map', head_bias_init=-10.0, dtype='bfloat16',
                      scan=True, remat_policy='full')
  config.dataset.update(name='jft_like', num_classes=29_593, eval_split='validation')
  config.loss = 'sigmoid_xent'
  config.batch_size = 16_384
  config.total_steps = 1_000_000
  config.optimizer.update(weight_decay=0.03, mu_dtype='bfloat16')
  config.schedule.base_lr = 8e-4
  config.mesh.update(fsdp=64, tensor=2)
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
