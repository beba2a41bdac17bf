"""Writes the backbone fixtures (CLIP, SigLIP, DINOv2, distilled DeiT) in this folder.

Run OUTSIDE the test environment, in the venv of make_fixtures.py (torch==2.13.0 CPU build,
timm==1.0.31, transformers==5.23.0; README.md beside this file says how to build it):

    python tests/data/hub/make_backbone_fixtures.py [OUT_DIR]   # defaults to this folder

As make_fixtures.py (whose inputs, labels and torchvision shim it reuses): each folder is
written by the library itself (timm's `save_for_hf`, transformers' `save_pretrained`, and
for transformers the image processor's `save_pretrained` too), random weights then every
parameter + 0.2 * N(0, 1), fixed seeds, one CPU thread, float32. The inputs and reference
outputs go to backbone_logits.npz. BACKBONES.md beside this file says what each exercises.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402  (first: its torchvision shim lets timm import)
import safetensors  # noqa: E402
import timm  # noqa: E402
import timm.models  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
  BitImageProcessor,
  CLIPImageProcessor,
  CLIPVisionConfig,
  CLIPVisionModel,
  DeiTConfig,
  DeiTForImageClassificationWithTeacher,
  DeiTImageProcessor,
  Dinov2Config,
  Dinov2Model,
  SiglipImageProcessor,
  SiglipVisionConfig,
  SiglipVisionModel,
)

LABELS = make_fixtures.LABELS
NUM_CLASSES = len(LABELS)
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)

# name -> (timm architecture, create_model kwargs (num_classes included), what it exercises)
TIMM = {
    'timm_clip': (
        'vit_base_patch16_clip_224', dict(TINY, num_classes=NUM_CLASSES),
        "OpenAI/LAION CLIP image tower: norm_pre (pre_norm=True), patch embedding without "
        "bias, LayerNorm eps 1e-5, exact GELU, class token"),
    'timm_clip_quickgelu': (
        'vit_base_patch16_clip_quickgelu_224', dict(TINY, num_classes=0),
        "OpenAI CLIP with act_layer='quick_gelu' (x * sigmoid(1.702 x)); features only"),
    'timm_siglip_map': (
        'vit_base_patch16_siglip_224', dict(TINY, num_classes=NUM_CLASSES),
        "SigLIP: no class token, global_pool='map' (attn_pool: latent, q, fused kv, proj, "
        "norm, mlp), exact GELU"),
    'timm_dinov2_swiglu': (
        'vit_giant_patch14_dinov2', dict(TINY, num_classes=0),
        "DINOv2-g: SwiGLUPacked MLP (fc1 gives 2 x hidden, silu(first half) * second half; "
        "the arch's mlp_ratio 2.66667 * 2: int(32 * 5.33334) = 170 -> hidden 85), SiLU, "
        "layer scale; features only"),
    'timm_deit_distilled': (
        'deit_tiny_distilled_patch16_224', dict(TINY, num_classes=NUM_CLASSES),
        "distilled DeiT: dist_token after cls_token, head_dist; eval logits = the two heads' "
        "mean"),
}

_HF_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, image_size=32, patch_size=8)
_HF_LABELS = dict(id2label=dict(enumerate(LABELS)),
                  label2id={name: i for i, name in enumerate(LABELS)})
_IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
_CROP = dict(crop_size={'height': 32, 'width': 32})
# name -> (model class, config, image processor, what it exercises). The processors: the
# library's defaults but the sizes (32 px models) and, where the Hub's checkpoints set their
# own (facebook/dinov2-*, facebook/deit-*), their ImageNet mean/std.
HF = {
    'hf_clip_vision': (
        CLIPVisionModel, CLIPVisionConfig(**_HF_COMMON),
        CLIPImageProcessor(size={'shortest_edge': 36}, **_CROP),
        "CLIPVisionModel: pre_layrnorm, quick_gelu, eps 1e-5, no patch bias; pooler_output = "
        "post_layernorm(class token); last_hidden_state is NOT post-normed"),
    'hf_siglip_vision': (
        SiglipVisionModel, SiglipVisionConfig(**_HF_COMMON),
        SiglipImageProcessor(size={'height': 32, 'width': 32}),
        "SiglipVisionModel: no class token, post_layernorm on every token, head = MAP "
        "(probe, torch MultiheadAttention with packed in_proj, layernorm, mlp); "
        "gelu_pytorch_tanh, eps 1e-6; pooler_output = head output"),
    'hf_dinov2': (
        Dinov2Model, Dinov2Config(**{k: v for k, v in _HF_COMMON.items()
                                     if k != 'intermediate_size'}, mlp_ratio=2),
        BitImageProcessor(size={'shortest_edge': 36}, **_CROP, **_IMAGENET),
        "Dinov2Model (S/B/L-like): layer scale (lambda1), exact GELU, eps 1e-6, mask_token "
        "(unused at inference); pooler_output = layernorm(class token)"),
    'hf_dinov2_swiglu': (
        Dinov2Model, Dinov2Config(**{k: v for k, v in _HF_COMMON.items()
                                     if k != 'intermediate_size'}, use_swiglu_ffn=True),
        BitImageProcessor(size={'shortest_edge': 36}, **_CROP, **_IMAGENET),
        "Dinov2Model (giant-like): use_swiglu_ffn (weights_in gives 2 x hidden, hidden = "
        "(int(32 * 4 * 2 / 3) + 7) // 8 * 8 = 88; silu(first half) * second half)"),
    'hf_deit_distilled': (
        DeiTForImageClassificationWithTeacher, DeiTConfig(**_HF_COMMON, **_HF_LABELS),
        DeiTImageProcessor(size={'height': 36, 'width': 36}, **_CROP, **_IMAGENET),
        "DeiTForImageClassificationWithTeacher: cls + distillation token, cls_classifier and "
        "distillation_classifier, logits = their mean; exact GELU, eps 1e-12"),
}

# What timm records about preprocessing in pretrained_cfg (also in each config.json).
PREPROCESS_KEYS = ('input_size', 'interpolation', 'crop_pct', 'crop_mode', 'mean', 'std')


def perturb_(model, seed):
  """Every parameter p (named_parameters order) becomes p + NOISE * N(0, 1)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for _, p in model.named_parameters():
      p.add_(make_fixtures.NOISE * torch.randn(p.shape, generator=gen, dtype=p.dtype))
  # Nothing a loader must carry besides parameters (CLIP's position_ids is not persistent).
  saved = set(model.state_dict())
  assert saved == {n for n, _ in model.named_parameters()}, saved


def main(out):
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  os.makedirs(out, exist_ok=True)
  inputs = make_fixtures.make_inputs()
  results = {k: inputs[k] for k in ('images', 'pixel_values')}
  x = torch.from_numpy(inputs['pixel_values'])

  for i, (name, (arch, kwargs, _)) in enumerate(TIMM.items()):
    torch.manual_seed(5000 + i)
    model = timm.create_model(arch, pretrained=False, **kwargs)
    perturb_(model, seed=6000 + i)
    model.eval()
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    timm.models.save_for_hf(model, folder, safe_serialization=True,
                            model_config=dict(label_names=LABELS) if model.num_classes else None)
    with torch.no_grad():
      feats = model.forward_features(x)
      results[f'{name}/pre_logits'] = model.forward_head(feats, pre_logits=True).numpy()
      if model.num_classes:
        results[f'{name}/logits'] = model.forward_head(feats).numpy()
      np.testing.assert_allclose(model(x).numpy(),
                                 results[f'{name}/logits' if model.num_classes
                                         else f'{name}/pre_logits'], rtol=1e-6)
    cfg = model.pretrained_cfg
    results[f'{name}/preprocess'] = np.array(json.dumps(
        {k: cfg.get(k) for k in PREPROCESS_KEYS}, sort_keys=True))
    print(name, sorted(os.listdir(folder)), results[f'{name}/pre_logits'][0, :3])

  for i, (name, (cls, config, processor, _)) in enumerate(HF.items()):
    torch.manual_seed(7000 + i)
    model = cls(config)
    perturb_(model, seed=8000 + i)
    model.eval()
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    with torch.no_grad():
      o = model(pixel_values=x)
      if cls is DeiTForImageClassificationWithTeacher:
        for key in ('logits', 'cls_logits', 'distillation_logits'):
          results[f'{name}/{key}'] = getattr(o, key).numpy()
        # Features: the two tokens after the final LayerNorm (timm's pre_logits: their mean).
        hidden = model.deit(pixel_values=x).last_hidden_state
        results[f'{name}/last_hidden_state'] = hidden.numpy()
        results[f'{name}/pre_logits'] = ((hidden[:, 0] + hidden[:, 1]) / 2).numpy()
      else:
        results[f'{name}/last_hidden_state'] = o.last_hidden_state.numpy()
        results[f'{name}/pooler_output'] = o.pooler_output.numpy()
    print(name, sorted(os.listdir(folder)))

  results = {k: (v.astype(np.float32) if v.dtype.kind == 'f' else v) for k, v in results.items()}
  results['versions'] = np.array(json.dumps({
      'torch': torch.__version__, 'timm': timm.__version__,
      'transformers': transformers.__version__, 'safetensors': safetensors.__version__,
      'numpy': np.__version__}, sort_keys=True))
  np.savez(os.path.join(out, 'backbone_logits.npz'), **results)
  print('versions', results['versions'])


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
