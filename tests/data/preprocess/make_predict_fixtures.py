"""Writes what timm and transformers themselves predict for the PNGs in images/.

Run OUTSIDE the test environment (CI never installs torch), in the venv of
tests/data/hub/README.md (torch 2.13.0 CPU, timm 1.0.31, transformers 5.23.0):

    /work/fixture-venv/bin/python tests/data/preprocess/make_predict_fixtures.py

Writes ``tests/data/hub/timm_dinov2`` (a DINOv2-S-like classifier, as make_backbone_fixtures.py
writes its folders: timm's ``save_for_hf``, random weights + 0.2 * N(0, 1)) and, beside this
file, ``predict.npz``: for each folder, the top-1 class (``FOLDER/top1``) and its softmax
probability (``FOLDER/prob``) of each image (``images``, in that order), as the library's own
eval pipeline makes them: timm's ``create_model('local-dir:...')``, ``resolve_data_config`` and
``create_transform``; transformers' ``from_pretrained`` model and image processor. The folders'
preprocessing differs: CLIP's OpenAI mean and std (crop 0.95), SigLIP's 0.5 (crop 0.9),
DINOv2's ImageNet mean and std (shorter side, then the crop), DeiT's ImageNet (squash, crop).
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
HUB = os.path.join(HERE, '..', 'hub')
sys.path.insert(0, HUB)
import make_backbone_fixtures  # noqa: E402  (make_fixtures' torchvision shim, then timm)
import timm  # noqa: E402
import timm.data  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402

TIMM_FOLDERS = ('timm_clip', 'timm_siglip_map', 'timm_dinov2')
HF_FOLDERS = ('hf_deit_distilled',)
IMAGES = ('wide', 'tall', 'square', 'grey')


def write_dinov2():
  torch.manual_seed(5100)
  model = timm.create_model('vit_small_patch14_dinov2', pretrained=False,
                            **make_backbone_fixtures.TINY,
                            num_classes=make_backbone_fixtures.NUM_CLASSES)
  make_backbone_fixtures.perturb_(model, seed=6100)
  folder = os.path.join(HUB, 'timm_dinov2')
  shutil.rmtree(folder, ignore_errors=True)
  timm.models.save_for_hf(model, folder, safe_serialization=True,
                          model_config=dict(label_names=make_backbone_fixtures.LABELS))


def predict(model, transform, images):
  x = torch.stack([transform(image) for image in images])
  with torch.no_grad():
    probs = torch.softmax(model(x) if callable(getattr(model, 'forward_head', None))
                          else model(pixel_values=x).logits, -1).numpy()
  return probs.argmax(-1), probs.max(-1)


def main():
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  write_dinov2()
  images = [Image.open(os.path.join(HERE, 'images', f'{n}.png')).convert('RGB') for n in IMAGES]
  out = {'images': np.array(IMAGES), 'versions': np.array(json.dumps(dict(
      torch=torch.__version__, timm=timm.__version__, transformers=transformers.__version__)))}
  for name in TIMM_FOLDERS:
    model = timm.create_model(f'local-dir:{os.path.join(HUB, name)}', pretrained=True).eval()
    config = timm.data.resolve_data_config(model=model)
    transform = timm.data.create_transform(**config, is_training=False)
    out[f'{name}/top1'], out[f'{name}/prob'] = predict(model, transform, images)
    print(name, config, out[f'{name}/top1'], out[f'{name}/prob'])
  for name in HF_FOLDERS:
    folder = os.path.join(HUB, name)
    # The class it was saved as (Auto* would take DeiT's without its distillation head).
    cls = getattr(transformers, transformers.AutoConfig.from_pretrained(folder).architectures[0])
    model = cls.from_pretrained(folder).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    transform = lambda image, p=processor: torch.from_numpy(  # noqa: E731
        p(image, return_tensors='np')['pixel_values'][0])
    out[f'{name}/top1'], out[f'{name}/prob'] = predict(model, transform, images)
    print(name, type(processor).__name__, out[f'{name}/top1'], out[f'{name}/prob'])
  np.savez(os.path.join(HERE, 'predict.npz'), **out)


if __name__ == '__main__':
  main()
