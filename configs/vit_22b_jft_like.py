r"""ViT-22B pre-trained on a JFT-like dataset: Dehghani et al., 2023 ("Scaling Vision
Transformers to 22 Billion Parameters").

Meant for a TPU v4-2048 slice (1024 chips of 32 GiB): mesh (data, fsdp, tensor) =
(1, 256, 4), the 22B parameters and their optimizer state split 1024 ways, each
example's 48 heads and 24,576 MLP units over the 4 chips of a host; 4 micro-batches of
64 examples per fsdp group keep the activations within the chips.

The paper's recipe (section 2, table 1 and section 4.1): ViT-22B (width 6144, 48 layers,
MLP 24576, 48 heads, 14 px patches: 21,743M weights in its blocks) with attention and
MLP in parallel, normalised queries and keys, no QKV or LayerNorm biases and no
LayerNorm centering; 224 px (256 tokens), JFT-4B, batch 65k for 177k steps, learning
rate 1e-3 after a 10k-step warm-up, decoupled weight decay 0.03. JFT is multi-label:
sigmoid cross-entropy with the head bias at -10 and, as ViT-G/14, a MAP head and the
29,593 classes of JFT-3B (set your data's).

Where vit_jax has no equivalent of the paper's choice, the closest it has: Adam with a
bfloat16 first moment for the memory-saving Adafactor variant of Zhai et al., linear
decay for the reciprocal-square-root decay with a 30k-step cool-down, and weight decay
0.03 on the head too (the paper: 3.0 on the head).

    python -m vit_jax.main --config=configs/vit_22b_jft_like.py --workdir=gs://BUCKET/22b \
        --config.dataset.data_dir=gs://BUCKET/jft_like
"""

from vit_jax import config as config_lib


def get_config():
  config = config_lib.get_config()
  config.model.update(name='22b14', pool='map', head_bias_init=-10.0, dtype='bfloat16',
                      scan=True, remat_policy='full')
  config.dataset.update(name='jft_like', num_classes=29_593, eval_split='validation')
  config.loss = 'sigmoid_xent'
  config.batch_size = 65_536
  config.grad_accum_steps = 4
  config.total_steps = 177_000
  config.optimizer.update(weight_decay=0.03, mu_dtype='bfloat16')
  config.schedule.base_lr = 1e-3
  config.mesh.update(fsdp=256, tensor=4)
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 1000
  return config
