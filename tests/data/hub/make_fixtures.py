"""Writes the timm and Hugging Face transformers fixtures in this folder, and logits.npz.

Run OUTSIDE the test environment (CI never installs torch), in a venv with
torch==2.13.0 (CPU build), timm==1.0.31, transformers==5.23.0, safetensors, numpy:

    python tests/data/hub/make_fixtures.py [OUT_DIR]   # OUT_DIR defaults to this folder

Every folder is written by the reference library itself: timm's
`timm.models.save_for_hf` (what `timm.models.push_to_hf_hub` writes before it uploads)
and transformers' `PreTrainedModel.save_pretrained`. Weights are random and then
perturbed (every parameter gets + 0.2 * N(0, 1)), so that any loader mistake changes
the logits. Everything is deterministic (fixed seeds, one CPU thread, float32).
See README.md beside this file for what each fixture exercises.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch


def _torchvision_shim():
  """Lets timm import torchvision when only a CUDA build of torchvision can be installed.

  timm imports torchvision, and PyPI's torchvision 0.28.0 (the release for torch 2.13)
  is built against CUDA torch: with the CPU build of torch its C++ ops library cannot
  load, and torchvision's import then fails at
  `torch.library.register_fake("torchvision::nms")` (the only registrations it does not
  guard). Defining those two op schemas first lets torchvision import without its C++
  ops; nothing here uses them (they are detection ops). A no-op where torchvision's ops
  load (a matching CPU torchvision).
  """
  import importlib.util
  spec = importlib.util.find_spec('torchvision')
  if spec is None:
    return None
  try:
    torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), '_C.so'))
    return None
  except (OSError, RuntimeError):
    pass
  lib = torch.library.Library('torchvision', 'DEF')
  lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
  lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
  return lib


_TV_LIB = _torchvision_shim()

import safetensors  # noqa: E402
import timm  # noqa: E402
import timm.models  # noqa: E402
import transformers  # noqa: E402
from transformers import ViTConfig, ViTForImageClassification, ViTModel  # noqa: E402

NOISE = 0.2
NUM_CLASSES = 5
LABELS = ['tench', 'goldfish', 'great white shark', 'tiger shark', 'hammerhead']

# name -> (timm architecture, create_model kwargs, input key, what it exercises)
TIMM = {
    'timm_augreg': (
        'vit_base_patch16_224',
        dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
        'images', 'AugReg-like plain ViT: class token, token pooling, qkv bias, final norm'),
    'timm_deit3': (
        'deit3_small_patch16_224',
        dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2),
        'images', 'DeiT III: layer scale (ls1/ls2 gamma), no_embed_class (no position '
        'embedding for the class token)'),
    'timm_reg4_gap': (
        'vit_base_patch16_reg4_gap_256',
        dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2),
        'images', '4 register tokens, no class token, no_embed_class, avg pool of the patch '
        'tokens only, fc_norm after the pool (no final norm)'),
    'timm_gap_fcnorm': (
        'vit_base_patch16_224',
        dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2,
             class_token=False, global_pool='avg', fc_norm=True),
        'images', 'no class token, avg pool then fc_norm (pool, then LayerNorm)'),
    'timm_gap_nofcnorm': (
        'vit_base_patch16_gap_224',
        dict(img_size=(24, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2),
        'images_24x32', 'no class token, final norm then avg pool (= big_vision/vit_jax '
        '"gap"), non-square 3x4 patch grid'),
    'timm_qknorm': (
        'vit_base_patch16_224',
        dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2,
             qk_norm=True),
        'images', 'qk_norm=True (LayerNorm on queries and keys): a standard ViT cannot load '
        'it; the loader must refuse it in one line'),
}

_HF_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, image_size=32, patch_size=8)
_HF_LABELS = dict(id2label=dict(enumerate(LABELS)),
                  label2id={name: i for i, name in enumerate(LABELS)})
# name -> (class, ViTConfig kwargs, what it exercises)
HF = {
    'hf_vit_cls': (
        ViTForImageClassification, dict(_HF_COMMON, **_HF_LABELS),
        "ViTForImageClassification with transformers' defaults: exact (erf) GELU "
        "hidden_act='gelu', layer_norm_eps=1e-12"),
    'hf_vit_cls_tanh': (
        ViTForImageClassification,
        dict(_HF_COMMON, hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6, **_HF_LABELS),
        "ViTForImageClassification as a vit_jax model would be exported: tanh-approximate "
        "GELU, layer_norm_eps=1e-6"),
    'hf_vit_model': (
        ViTModel, dict(_HF_COMMON, patch_size=4),
        'ViTModel (no classifier) with its pooler (Dense + tanh on the class token), '
        'patch 4 (8x8 grid)'),
}


def perturb_(model, seed):
  """Every parameter p (named_parameters order) becomes p + NOISE * N(0, 1)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for _, p in model.named_parameters():
      p.add_(NOISE * torch.randn(p.shape, generator=gen, dtype=p.dtype))
  buffers = [n for n, _ in model.named_buffers()]
  assert not buffers, buffers  # nothing that a loader would have to carry besides parameters


def make_inputs():
  rng = np.random.RandomState(0)
  images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype(np.float32)
  return {
      'images': images,
      'pixel_values': np.ascontiguousarray(images.transpose(0, 3, 1, 2)),
      'images_24x32': np.ascontiguousarray(images[:, :24]),
      'pixel_values_24x32': np.ascontiguousarray(images[:, :24].transpose(0, 3, 1, 2)),
  }


def main(out):
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  os.makedirs(out, exist_ok=True)
  inputs = make_inputs()
  results = dict(inputs)

  for i, (name, (arch, kwargs, input_key, _)) in enumerate(TIMM.items()):
    torch.manual_seed(1000 + i)
    model = timm.create_model(arch, pretrained=False, num_classes=NUM_CLASSES, **kwargs)
    perturb_(model, seed=2000 + i)
    model.eval()
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    # timm's own writer; push_to_hf_hub calls it with safe_serialization='both' (it
    # would add a pickled pytorch_model.bin as well) and then uploads.
    timm.models.save_for_hf(model, folder, safe_serialization=True,
                            model_config=dict(label_names=LABELS))
    x = torch.from_numpy(inputs['pixel_values' + input_key[len('images'):]])
    with torch.no_grad():
      feats = model.forward_features(x)
      results[f'{name}/logits'] = model.forward_head(feats).numpy()
      results[f'{name}/pre_logits'] = model.forward_head(feats, pre_logits=True).numpy()
      np.testing.assert_allclose(model(x).numpy(), results[f'{name}/logits'], rtol=1e-6)
    results[f'{name}/input'] = np.array(input_key)
    print(name, sorted(os.listdir(folder)), results[f'{name}/logits'][0])

  for i, (name, (cls, kwargs, _)) in enumerate(HF.items()):
    torch.manual_seed(3000 + i)
    model = cls(ViTConfig(**kwargs))
    perturb_(model, seed=4000 + i)
    model.eval()
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    x = torch.from_numpy(inputs['pixel_values'])
    with torch.no_grad():
      if cls is ViTModel:
        o = model(pixel_values=x)
        results[f'{name}/last_hidden_state'] = o.last_hidden_state.numpy()
        results[f'{name}/pooler_output'] = o.pooler_output.numpy()
      else:
        results[f'{name}/logits'] = model(pixel_values=x).logits.numpy()
        # The classifier's input: the class token after the final LayerNorm.
        results[f'{name}/pre_logits'] = model.vit(pixel_values=x).last_hidden_state[:, 0].numpy()
    results[f'{name}/input'] = np.array('images')
    print(name, sorted(os.listdir(folder)))

  results = {k: (v.astype(np.float32) if v.dtype.kind == 'f' else v) for k, v in results.items()}
  results['versions'] = np.array(json.dumps({
      'torch': torch.__version__, 'timm': timm.__version__,
      'transformers': transformers.__version__, 'safetensors': safetensors.__version__,
      'numpy': np.__version__}, sort_keys=True))
  np.savez(os.path.join(out, 'logits.npz'), **results)
  print('versions', results['versions'])


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
