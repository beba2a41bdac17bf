"""Checks vit_jax's exports of the NaFlex fixtures with the real libraries: same outputs.

Two steps, in two environments (CI runs neither: it never installs torch):

    # 1. vit_jax's venv: export each NaFlex fixture (make_naflex_fixtures.py) with
    #    vit_jax.checkpoints.export, to its own library and to timm's NaFlexVit.
    python tests/data/hub/check_naflex_exports.py write OUT_DIR
    # 2. the fixtures' venv (torch CPU, timm 1.0.31, transformers 5.23.0): load each export as
    #    a user would and compare its outputs with naflex_logits.npz's.
    python tests/data/hub/check_naflex_exports.py check OUT_DIR

`check` loads transformers exports with `AutoModelForImageClassification` / `AutoModel` and
`AutoImageProcessor.from_pretrained(DIR)`, runs the processor on the PNGs and the model on
its output; timm exports with `timm.create_model('local-dir:DIR', pretrained=True)`, on
timm's own NaFlex transform at the budget its pretrained_cfg's input size holds
(`create_transform(naflex=True, patchify=True)`, `NaFlexCollator`). It prints the largest
difference of each from the fixture's reference outputs and exits non-zero above 1e-5.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 1e-5
# (fixture, format): written by `write`, read by `check`.
EXPORTS = (('hf_siglip2_cls', 'transformers'), ('hf_siglip2_vision', 'transformers'),
           ('timm_naflex_siglip', 'timm'), ('hf_siglip2_cls', 'timm'),
           ('hf_siglip2_vision', 'timm'), ('hf_siglip2_model', 'transformers'))


def write(out):
  sys.path.insert(0, os.path.join(HERE, '..', '..', '..'))
  from vit_jax import checkpoints

  for name, library in EXPORTS:
    folder = os.path.join(out, f'{name}-{library}')
    checkpoints.export(checkpoints.load(os.path.join(HERE, name)), folder, library)
    print('wrote', folder)


def check(out):
  sys.path.insert(0, HERE)
  import make_fixtures  # noqa: F401  (the torchvision shim, before timm)
  import numpy as np
  import timm
  import timm.data
  import torch
  import transformers
  from PIL import Image
  from timm.data.naflex_dataset import NaFlexCollator

  reference = np.load(os.path.join(HERE, 'naflex_logits.npz'))
  images = [Image.open(os.path.join(HERE, '..', 'preprocess', 'images', f'{n}.png'))
            .convert('RGB') for n in reference['images']]
  worst = 0.
  for name, library in EXPORTS:
    folder = os.path.join(out, f'{name}-{library}')
    with torch.no_grad():
      if library == 'transformers':
        with open(os.path.join(folder, 'config.json')) as f:
          config = json.load(f)
        auto = (transformers.AutoModelForImageClassification if config.get('id2label')
                else transformers.AutoModel)
        model = auto.from_pretrained(folder).eval()
        processor = transformers.AutoImageProcessor.from_pretrained(folder)
        output = model(**processor(images=images, return_tensors='pt'))
        got = getattr(output, 'logits', None)
        got = (got if got is not None else output.pooler_output).numpy()
        how = f'{type(model).__name__} + {type(processor).__name__}'
      else:
        model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
        config = timm.data.resolve_data_config(model=model)
        patch = model.embeds.patch_size[0]
        budget = (config['input_size'][1] // patch) * (config['input_size'][2] // patch)
        transform = timm.data.create_transform(**config, is_training=False, naflex=True,
                                               patch_size=patch, max_seq_len=budget,
                                               patchify=True)
        batch, _ = NaFlexCollator(max_seq_len=budget)([(transform(im), 0) for im in images])
        own = model(batch).numpy()
        # The model alone, on the fixture library's own patch sequences.
        got = model(dict(patches=torch.from_numpy(reference[f'{name}/patches']),
                         patch_coord=torch.from_numpy(reference[f'{name}/coords']).long(),
                         patch_valid=torch.from_numpy(reference[f'{name}/mask']))).numpy()
        how = f'timm {model.pretrained_cfg["architecture"]}, budget {budget}'
    want = reference[f'{name}/logits']
    diff = float(np.abs(got - want).max() / np.abs(want).max())
    worst = max(worst, diff)
    extra = ''
    if library == 'timm':  # Its own transform (PIL; transformers' processor: torchvision).
      extra = f'; on its own NaFlex transform {np.abs(own - want).max() / np.abs(want).max():.2e}'
    print(f'{name:20s} -> {library:12s} {how}: max relative difference {diff:.2e}{extra}')
  print('worst', worst)
  return 0 if worst <= TOLERANCE else 1


if __name__ == '__main__':
  command, out = sys.argv[1:3]
  sys.exit(write(out) if command == 'write' else check(out))
