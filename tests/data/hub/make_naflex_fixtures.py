"""Writes the NaFlex (SigLIP 2) checkpoint fixtures in this folder and naflex_logits.npz.

Run OUTSIDE the test environment, in the venv of make_fixtures.py (torch==2.13.0 CPU build,
timm==1.0.31, transformers==5.23.0; README.md beside this file says how to build it), from
the repository root:

    python tests/data/hub/make_naflex_fixtures.py [OUT_DIR]   # defaults to this folder

Each folder is written by its library itself, tiny (width 16, 2 blocks, 2 heads, 8-px
patches, a 4 x 4 table of position embeddings), random weights then every parameter +
0.2 * N(0, 1) (make_backbone_fixtures.perturb_), fixed seeds, one CPU thread, float32:

* ``hf_siglip2_cls``: transformers' ``Siglip2ForImageClassification`` (5 classes: the mean of
  the image's own patches after the final LayerNorm, then the classifier; its tower's unused
  MAP head beside) and its ``Siglip2ImageProcessor`` (patch 8, max_num_patches 20);
* ``hf_siglip2_vision``: ``Siglip2VisionModel`` with its MAP head (``pooler_output``), the
  processor at max_num_patches 24, ImageNet's mean and std;
* ``hf_siglip2_model``: ``Siglip2Model`` (image and text towers, as the Hub's
  google/siglip2-*-naflex are), its image tower's ``get_image_features``; the processor at 20
  patches;
* ``timm_naflex_siglip``: timm's ``naflexvit_base_patch16_siglip`` (its linear patch
  embedding, bilinear antialiased position-embedding resize, MAP pool; 5 classes), its
  pretrained_cfg's input size 40 x 40 (25 patches: the NaFlex budget vit_jax reads from it).

``naflex_logits.npz``, for the PNGs of ../preprocess/images (converted to RGB by PIL, as
make_predict_fixtures.py does): ``FOLDER/{patches,mask,grid,coords}`` (the library's own
preprocessing: transformers' processor, or timm's ``create_transform(naflex=True,
patchify=True)`` and ``NaFlexCollator``, padded to the budget), ``FOLDER/logits`` (or the
pooled features) of the model on them and ``FOLDER/probs`` (softmax); ``FOLDER/settings``
the preprocessing's settings as JSON. The grids of the four images at these budgets (4 x 5,
6 x 3, 4 x 6, 5 x 5, ...) resize the 4 x 4 table up, and up on one side and down on the other
(6 x 3: antialiasing matters).
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PREPROCESS = os.path.join(HERE, '..', 'preprocess')
sys.path.insert(0, HERE)
import make_backbone_fixtures  # noqa: E402  (first: make_fixtures' torchvision shim lets timm import)
import make_fixtures  # noqa: E402
import timm  # noqa: E402
import timm.data  # noqa: E402
import timm.models  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data.naflex_dataset import NaFlexCollator  # noqa: E402
from transformers import (  # noqa: E402
    Siglip2Config,
    Siglip2ForImageClassification,
    Siglip2ImageProcessor,
    Siglip2Model,
    Siglip2VisionConfig,
    Siglip2VisionModel,
)

LABELS = make_fixtures.LABELS
IMAGES = ('wide', 'tall', 'square', 'grey')
VISION = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
              patch_size=8, num_patches=16)
TEXT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
TIMM_SIZE, TIMM_PATCH = 40, 8  # pretrained_cfg's input_size: (40 / 8)^2 = 25 patches.


def images():
  return [Image.open(os.path.join(PREPROCESS, 'images', f'{n}.png')).convert('RGB')
          for n in IMAGES]


def write_hf(out, results):
  """The two transformers folders (model and processor, each by save_pretrained)."""
  labels = dict(id2label=dict(enumerate(LABELS)),
                label2id={name: i for i, name in enumerate(LABELS)})
  folders = {
      'hf_siglip2_cls': (
          lambda: Siglip2ForImageClassification(Siglip2Config(
              vision_config=VISION, text_config=TEXT, num_labels=len(LABELS), **labels)),
          Siglip2ImageProcessor(patch_size=8, max_num_patches=20), 9700),
      'hf_siglip2_vision': (
          lambda: Siglip2VisionModel(Siglip2VisionConfig(**VISION)),
          Siglip2ImageProcessor(patch_size=8, max_num_patches=24, **IMAGENET), 9701),
      'hf_siglip2_model': (
          lambda: Siglip2Model(Siglip2Config(vision_config=VISION, text_config=TEXT)),
          Siglip2ImageProcessor(patch_size=8, max_num_patches=20), 9703)}
  for name, (build, processor, seed) in folders.items():
    torch.manual_seed(seed)
    model = build().eval()
    make_backbone_fixtures.perturb_(model, seed=seed)
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    # Read back as the library reads a folder: its outputs are the saved model's.
    model = type(model).from_pretrained(folder).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    inputs = processor(images=images(), return_tensors='pt')
    with torch.no_grad():
      output = (model.get_image_features(**inputs) if isinstance(model, Siglip2Model)
                else model(**inputs))
    logits = output.logits if hasattr(output, 'logits') else output.pooler_output
    n = inputs['pixel_values'].shape[1]
    grid = inputs['spatial_shapes'].numpy()
    results.update({
        f'{name}/patches': inputs['pixel_values'].numpy(),
        f'{name}/mask': inputs['pixel_attention_mask'].numpy().astype(bool),
        f'{name}/grid': grid,
        f'{name}/coords': _coords(grid, n),
        f'{name}/logits': logits.numpy(),
        f'{name}/probs': torch.softmax(logits, -1).numpy(),
        f'{name}/settings': np.array(json.dumps(processor.to_dict(), sort_keys=True,
                                                default=str))})
    print(name, type(model).__name__, 'grids', grid.tolist(), sorted(os.listdir(folder)))


def _coords(grid, n):
  """Each patch's (row, column) in its image's grid, row-major, zeros after the last."""
  out = np.zeros((len(grid), n, 2), np.int32)
  for i, (rows, cols) in enumerate(grid):
    out[i, :rows * cols] = np.stack(np.divmod(np.arange(rows * cols), cols), -1)
  return out


def write_timm(out, results):
  """timm's naflexvit_base_patch16_siglip, tiny, saved with save_for_hf."""
  name = 'timm_naflex_siglip'
  torch.manual_seed(9702)
  model = timm.create_model(
      'naflexvit_base_patch16_siglip', pretrained=False, patch_size=TIMM_PATCH, embed_dim=16,
      depth=2, num_heads=2, mlp_ratio=2., num_classes=len(LABELS), pos_embed_grid_size=(4, 4),
      pretrained_cfg_overlay=dict(input_size=(3, TIMM_SIZE, TIMM_SIZE))).eval()
  make_backbone_fixtures.perturb_(model, seed=9702)
  folder = os.path.join(out, name)
  shutil.rmtree(folder, ignore_errors=True)
  timm.models.save_for_hf(model, folder, safe_serialization=True,
                          model_config=dict(label_names=LABELS))
  model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
  config = timm.data.resolve_data_config(model=model)
  budget = (config['input_size'][1] // TIMM_PATCH) * (config['input_size'][2] // TIMM_PATCH)
  transform = timm.data.create_transform(**config, is_training=False, naflex=True,
                                         patch_size=TIMM_PATCH, max_seq_len=budget,
                                         patchify=True)
  batch, _ = NaFlexCollator(max_seq_len=budget)([(transform(im), 0) for im in images()])
  with torch.no_grad():
    logits = model(batch)
  coords, valid = batch['patch_coord'].numpy(), batch['patch_valid'].numpy().astype(bool)
  grid = np.stack([np.where(valid, coords[..., i], 0).max(1) + 1 for i in (0, 1)], -1)
  results.update({
      f'{name}/patches': batch['patches'].numpy(), f'{name}/mask': valid,
      f'{name}/grid': grid.astype(np.int32), f'{name}/coords': np.where(
          valid[..., None], coords, 0).astype(np.int32),
      f'{name}/logits': logits.numpy(), f'{name}/probs': torch.softmax(logits, -1).numpy(),
      f'{name}/settings': np.array(json.dumps(dict(config, max_seq_len=budget,
                                                   patch_size=TIMM_PATCH), sort_keys=True))})
  print(name, config, 'budget', budget, 'grids', grid.tolist(), sorted(os.listdir(folder)))


def main(out):
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  os.makedirs(out, exist_ok=True)
  results = {'images': np.array(IMAGES)}
  write_hf(out, results)
  write_timm(out, results)
  results = {k: (v.astype(np.float32) if v.dtype.kind == 'f' else v) for k, v in results.items()}
  results['versions'] = np.array(json.dumps({
      'torch': torch.__version__, 'timm': timm.__version__,
      'transformers': transformers.__version__, 'numpy': np.__version__}, sort_keys=True))
  np.savez_compressed(os.path.join(out, 'naflex_logits.npz'), **results)
  print('versions', results['versions'])


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else HERE)
