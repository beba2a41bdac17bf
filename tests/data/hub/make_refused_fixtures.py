"""Writes tests/data/hub/refused/: timm ViT-family folders vit_jax refuses, as timm writes them.

Run OUTSIDE the test environment, in the fixtures' venv (make_fixtures.py: torch 2.13.0 CPU,
timm 1.0.31), from the repository root:

    python tests/data/hub/make_refused_fixtures.py [OUT_DIR]   # defaults to tests/data/hub/refused

Each folder is `timm.models.save_for_hf` of a tiny random model of one architecture
(`img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=0`; the hybrid's
stem is its own), in float16 to keep the files a few kilobytes: the test reads their names,
config.json and tensors, never their outputs. What each exercises is in README.md beside this
file ("Refused architectures").
"""

import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402,F401  (the torchvision shim, before timm)
import timm  # noqa: E402
import timm.models  # noqa: E402

TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=0)
# folder -> timm architecture (its class, block or attention is what vit_jax refuses).
ARCHITECTURES = {
    'eva02': 'eva02_tiny_patch14_224',  # Eva: rotary position embeddings, SwiGLU.
    'dinov3': 'vit_small_patch16_dinov3',  # Eva: rotary, its tensors named as timm's ViT's.
    'pe_core': 'vit_pe_core_tiny_patch16_384',  # Eva (Perception Encoder).
    'rope': 'vit_base_patch16_rope_224',  # Eva: timm's rotary ViT.
    'hybrid_r': 'vit_tiny_r_s16_p8_224',  # HybridEmbed: a ResNet stem (R+ViT-Ti/16).
    'parallel_scaling': 'vit_base_patch16_xp_224',  # ParallelScalingBlock.
    'parallel_things': 'vit_small_patch16_18x2_224',  # ParallelThingsBlock.
    'respost': 'vit_base_patch16_rpn_224',  # ResPostBlock.
    'diff_attention': 'vit_dwee_patch16_reg1_gap_256',  # attn_layer='diff'.
    'no_final_norm': 'vit_base_patch16_radio_v3',  # final_norm=False.
    'map_registers': 'vit_so150m_patch16_reg4_map_256',  # The MAP pool without the registers.
    'beit': 'beit_base_patch16_224',  # Beit: a relative position bias per block.
    'relpos': 'vit_relpos_base_patch16_224',  # VisionTransformerRelPos.
    'naflexvit': 'naflexvit_base_patch16_gap',  # NaFlexVit.
}


def main(out):
  torch.manual_seed(0)
  os.makedirs(out, exist_ok=True)
  for folder, arch in ARCHITECTURES.items():
    kwargs = dict(TINY)
    if arch.startswith('vit_tiny_r_'):  # The stem's own patch: 1 after its stride-16 stem.
      kwargs.update(img_size=32, patch_size=1)
    model = timm.create_model(arch, pretrained=False, **kwargs).half().eval()
    path = os.path.join(out, folder)
    shutil.rmtree(path, ignore_errors=True)
    timm.models.save_for_hf(model, path, safe_serialization=True)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f'{folder:18s} {arch:34s} {size:7,d} bytes')


if __name__ == '__main__':
  here = os.path.dirname(os.path.abspath(__file__))
  main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, 'refused'))
