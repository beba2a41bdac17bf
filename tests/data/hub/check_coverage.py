"""Counts which timm and transformers ViT-family checkpoints vit_jax loads exactly, and which it
refuses in one line: every architecture, as its library writes it (tiny, random weights).

Two steps, in two environments (CI runs neither):

    # 1. the fixtures' venv (make_fixtures.py: torch CPU, timm 1.0.31, transformers 5.23.0):
    python tests/data/hub/check_coverage.py write OUT_DIR
    # 2. vit_jax's venv: load each folder, compare the outputs, print the table.
    python tests/data/hub/check_coverage.py check OUT_DIR   # also writes OUT_DIR/coverage.json

`write`: every architecture of timm's vision_transformer, deit, eva,
vision_transformer_hybrid, beit, vision_transformer_relpos and naflexvit modules, built tiny
(`img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5`; without
the patch size, or at 64 px, where the architecture rejects those), saved with `save_for_hf`;
and the transformers ViT-family classes (tiny configs as make_backbone_fixtures.py's) with
`save_pretrained`. Each folder's output on
`backbone_logits.npz`'s images (timm: `model(x)`; transformers: `logits`, else
`pooler_output`) goes beside it. `check`: `vit_jax.checkpoints.formats.load_folder`, then
'exact' (the output within 1e-4 relative), 'refused' (a one-line vit_jax error), 'wrong'
(loads, another output) or 'error' (anything else); each timm folder that loads exactly is
exported back to timm (``checkpoints.export`` of what ``load`` returned), and the count of
exports that keep its architecture's name and its pretrained_cfg's preprocessing printed.
"""

import json
import os
import pathlib
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ('vision_transformer', 'deit', 'eva', 'vision_transformer_hybrid', 'beit',
           'vision_transformer_relpos', 'naflexvit')
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
_HF = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
           image_size=32, patch_size=8)


def write(out):
  sys.path.insert(0, HERE)
  import make_fixtures  # noqa: F401  (the torchvision shim, before timm)
  import numpy as np
  import timm
  import timm.models
  import torch
  import transformers

  torch.set_num_threads(1)
  images = np.load(os.path.join(HERE, 'backbone_logits.npz'))['images']
  manifest = {}

  def record(name, family, model, folder, run):
    for size in (32, 64):
      x = np.random.RandomState(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
      if size == 32:
        x = images
      try:
        with torch.no_grad():
          y = run(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
        break
      except Exception:  # noqa: BLE001  (an input size the model does not take)
        continue
    else:
      manifest[name] = dict(family=family, built=False)
      return
    np.savez(os.path.join(folder, 'io.npz'), x=x, y=y.numpy())
    manifest[name] = dict(family=family, built=True)

  for module in MODULES:
    for arch in timm.list_models(module=module):
      folder = os.path.join(out, arch)
      model = None
      for drop in ((), ('patch_size',), ('patch_size', 'img_size')):
        kwargs = {k: v for k, v in TINY.items() if k not in drop}
        if 'img_size' in drop:
          kwargs['img_size'] = 64
        try:
          torch.manual_seed(0)
          model = timm.create_model(arch, pretrained=False, **kwargs).eval()
          break
        except Exception:  # noqa: BLE001  (arguments this architecture does not take)
          continue
      if model is None or sum(p.numel() for p in model.parameters()) > 20_000_000:
        manifest[arch] = dict(family=module, built=False)
        continue
      timm.models.save_for_hf(model, folder, safe_serialization=True)
      record(arch, module, model, folder, model)

  classes = {
      'ViTModel': transformers.ViTConfig(**_HF),
      'ViTForImageClassification': transformers.ViTConfig(**_HF, num_labels=5),
      'DeiTModel': transformers.DeiTConfig(**_HF),
      'DeiTForImageClassification': transformers.DeiTConfig(**_HF, num_labels=5),
      'DeiTForImageClassificationWithTeacher': transformers.DeiTConfig(**_HF, num_labels=5),
      'Dinov2Model': transformers.Dinov2Config(**_HF),
      'Dinov2ForImageClassification': transformers.Dinov2Config(**_HF, num_labels=5),
      'Dinov2WithRegistersModel': transformers.Dinov2WithRegistersConfig(**_HF),
      'CLIPVisionModel': transformers.CLIPVisionConfig(**_HF),
      'CLIPVisionModelWithProjection': transformers.CLIPVisionConfig(**_HF, projection_dim=16),
      'SiglipVisionModel': transformers.SiglipVisionConfig(**_HF),
      'Siglip2VisionModel': transformers.Siglip2VisionConfig(**_HF),
      'ViTMAEModel': transformers.ViTMAEConfig(**_HF, mask_ratio=0.0),
      'BeitModel': transformers.BeitConfig(**_HF),
  }
  for cls_name, config in classes.items():
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    folder = os.path.join(out, 'hf_' + cls_name)
    model.save_pretrained(folder)

    def run(x, model=model):
      o = model(pixel_values=x)
      for key in ('logits', 'image_embeds', 'pooler_output'):
        if getattr(o, key, None) is not None:
          return o[key]
      raise ValueError('no output')

    record('hf_' + cls_name, 'transformers', model, folder, run)
  with open(os.path.join(out, 'manifest.json'), 'w') as f:
    json.dump(manifest, f, indent=1)
  print(f'{len(manifest)} folders in {out}')


def check(out):
  sys.path.insert(0, os.path.join(HERE, '..', '..', '..'))
  import jax
  import numpy as np

  from vit_jax import checkpoints
  from vit_jax.base import errors
  from vit_jax.checkpoints import formats

  jax.config.update('jax_platforms', 'cpu')
  with open(os.path.join(out, 'manifest.json')) as f:
    manifest = json.load(f)
  results, reasons, exports = {}, {}, {}

  def exported(folder, loaded):
    """Whether its timm export (``checkpoints.export`` of what ``load`` returned) keeps the
    architecture's name and the pretrained_cfg's preprocessing."""
    with tempfile.TemporaryDirectory() as out:
      checkpoints.export(loaded, out, 'timm')
      ours, theirs = (json.loads(pathlib.Path(d, 'config.json').read_text())
                      for d in (out, folder))
    keys = ('mean', 'std', 'interpolation', 'crop_pct', 'crop_mode')
    return dict(name=ours['architecture'] == theirs['architecture'],
                preprocessing=all(ours['pretrained_cfg'][k] == theirs['pretrained_cfg'][k]
                                  for k in keys))
  for name, entry in manifest.items():
    if not entry['built']:
      continue
    folder = os.path.join(out, name)
    io = np.load(os.path.join(folder, 'io.npz'))
    try:
      loaded = formats.load_folder(folder)
      got = np.asarray(loaded.model.clone(attention_impl='einsum').apply(
          {'params': loaded.params}, io['x']))
      want = io['y']
      ok = got.shape == want.shape and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
      result = 'exact' if ok else 'wrong'
      if ok and entry['family'] != 'transformers':
        exports[name] = exported(folder, loaded)
    except errors.UserError as e:
      result = 'refused' if '\n' not in str(e) else 'error'
      reasons[name] = str(e).split(': ', 1)[-1]
    except Exception as e:  # noqa: BLE001
      result, reasons[name] = 'error', f'{type(e).__name__}: {e}'
    results[name] = dict(entry, result=result)
    print(f'{result:8s} {name:48s} {reasons.get(name, "")[:110]}')
  table = {}
  for entry in results.values():
    row = table.setdefault(entry['family'], dict(exact=0, refused=0, wrong=0, error=0))
    row[entry['result']] += 1
  print('\n| family | built | load exactly | refused in one line | wrong | other error |')
  print('| --- | --- | --- | --- | --- | --- |')
  for family, row in table.items():
    print(f'| {family} | {sum(row.values())} | {row["exact"]} | {row["refused"]} | '
          f'{row["wrong"]} | {row["error"]} |')
  kept = {k: sum(e[k] for e in exports.values()) for k in ('name', 'preprocessing')}
  print(f'timm exports of the {len(exports)} timm folders that load exactly: the architecture\'s '
        f'name kept in {kept["name"]}, the pretrained_cfg\'s preprocessing in '
        f'{kept["preprocessing"]}')
  unbuilt = sorted(n for n, e in manifest.items() if not e['built'])
  print(f'not built tiny (left out): {len(unbuilt)}: {", ".join(unbuilt)}')
  with open(os.path.join(out, 'coverage.json'), 'w') as f:
    json.dump(dict(results=results, reasons=reasons, table=table, unbuilt=unbuilt,
                   exports=exports), f, indent=1)
  return 1 if any(r['wrong'] or r['error'] for r in table.values()) else 0


if __name__ == '__main__':
  if len(sys.argv) != 3 or sys.argv[1] not in ('write', 'check'):
    sys.exit(__doc__)
  os.makedirs(sys.argv[2], exist_ok=True)
  sys.exit(write(sys.argv[2]) if sys.argv[1] == 'write' else check(sys.argv[2]))
