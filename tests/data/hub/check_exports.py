"""Checks vit_jax's exports with the real libraries: timm and transformers load them, same logits.

Two steps, in two environments (CI runs neither: it never installs torch):

    # 1. vit_jax's venv: export every fixture (and vit_jax-made models) with
    #    vit_jax.checkpoints.export, and record vit_jax's logits for them.
    python tests/data/hub/check_exports.py write OUT_DIR
    # 2. the fixtures' venv (make_fixtures.py: torch CPU, timm 1.0.31, transformers 5.23.0):
    #    load each exported folder as a user would, compare the logits.
    python tests/data/hub/check_exports.py check OUT_DIR

`write` exports each timm and transformers fixture back to its own library's format (and
timm_augreg across, to transformers; bv_gap_scan, a big_vision tensorstore checkpoint, to
timm), and models made in vit_jax with its own options: the release's tanh GELU, DeiT III's
layer scale, registers on a non-square input, a class token without a position embedding, a
features-only model with a pre-logits layer. `check` loads timm folders with
`timm.create_model('local-dir:DIR', pretrained=True)`, with `hf-hub:ORG/NAME` from an
offline hub cache, and with `create_model(ARCH, pretrained=True, pretrained_cfg_overlay=dict(
file=..., num_classes=K), **model_args)`; transformers folders with
`ViTForImageClassification` / `AutoModelForImageClassification` (or `ViTModel` / `AutoModel`)
`.from_pretrained(DIR)`. It prints the largest relative difference of each (max |a - b| /
max |b|) and exits non-zero if one is above 1e-5.
"""

import json
import os
import pathlib
import sys

TOLERANCE = 1e-5
HERE = os.path.dirname(os.path.abspath(__file__))


def write(out):
  """vit_jax side: the exports and vit_jax's logits of them."""
  sys.path.insert(0, os.path.join(HERE, '..', '..', '..'))
  import jax
  import numpy as np

  from vit_jax import checkpoints
  from vit_jax.models import get_model

  jax.config.update('jax_platforms', 'cpu')
  ref = np.load(os.path.join(HERE, 'logits.npz'))
  bv = np.load(os.path.join(HERE, 'bv_logits.npz'))
  expected, manifest = {}, {}

  def add(name, library, model, params, images, class_names=(), preprocessing=None,
          loaded=None):
    """Exports ``loaded`` (what checkpoints.load returned: its classes, preprocessing and
    architecture's name) or ``model`` and ``params`` (with what is given)."""
    folder = os.path.join(out, name)
    if loaded is not None:
      checkpoints.export(loaded, folder, library)
    else:
      checkpoints.export(model, params, folder, format=library, class_names=class_names,
                         preprocessing=preprocessing)
    run = model.clone(attention_impl='einsum')
    expected[f'{name}/images'] = np.asarray(images, np.float32)
    expected[f'{name}/logits'] = np.asarray(run.apply({'params': params}, images))
    manifest[name] = library

  def made(name, seed=0, **kw):
    """A vit_jax model with random weights, each parameter perturbed as the fixtures are."""
    model = get_model(name, **kw)
    params = model.init(jax.random.key(seed), np.zeros((1, *model.image_size, 3)))['params']
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(100 + seed), len(leaves))
    leaves = [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return model, jax.tree.unflatten(tree, leaves)

  for name in ('timm_augreg', 'timm_deit3', 'timm_reg4_gap', 'timm_gap_fcnorm',
               'timm_gap_nofcnorm'):
    loaded = checkpoints.load(os.path.join(HERE, name))
    add(name, 'timm', loaded.model, loaded.params, ref[str(ref[f'{name}/input'])],
        loaded=loaded)
  for name in ('hf_vit_cls', 'hf_vit_cls_tanh', 'hf_vit_model'):
    loaded = checkpoints.load(os.path.join(HERE, name))
    add(name, 'transformers', loaded.model, loaded.params, ref['images'], loaded=loaded)
  loaded = checkpoints.load(os.path.join(HERE, 'timm_augreg'))
  add('timm_augreg_to_transformers', 'transformers', loaded.model, loaded.params,
      ref['images'], loaded.class_names)
  loaded = checkpoints.load(os.path.join(HERE, 'bv_gap_scan'), pool='gap', image_size=(16, 24),
                            source_grid=(4, 6))
  add('bv_gap_scan_to_timm', 'timm', loaded.model, loaded.params, bv['images'])

  small = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, patch_size=8,
               image_size=32)
  images = ref['images']
  model, params = made('ti16', 1, num_classes=5, **small)  # The releases' tanh GELU.
  add('vj_tanh_timm', 'timm', model, params, images, ('a', 'b', 'c', 'd', 'e'))
  add('vj_tanh_transformers', 'transformers', model, params, images, ('a', 'b', 'c', 'd', 'e'))
  model, params = made('deit3_s16', 2, num_classes=5, **{**small, 'patch_size': 4})
  add('vj_deit3_timm', 'timm', model, params, images)
  model, params = made('b16_reg4_gap', 3, num_classes=5, **{**small, 'image_size': (24, 32)})
  add('vj_reg4_24x32_timm', 'timm', model, params, ref['images_24x32'])
  model, params = made('ti16', 4, num_classes=5, prefix_posemb=False, **small)
  add('vj_unembedded_cls_transformers', 'transformers', model, params, images)
  add('vj_unembedded_cls_timm', 'timm', model, params, images)
  model, params = made('ti16', 5, num_classes=None, representation_size=32, **small)
  add('vj_features_transformers', 'transformers', model, params, images)

  # The backbones (BACKBONES.md): each transformers fixture written back to transformers (with
  # its image processor), timm's across, and vit_jax-made ones; features-only models' output
  # is transformers' pooler_output.
  bb = np.load(os.path.join(HERE, 'backbone_logits.npz'))
  for name in ('hf_clip_vision', 'hf_siglip_vision', 'hf_dinov2', 'hf_dinov2_swiglu',
               'hf_deit_distilled', 'timm_clip_quickgelu', 'timm_deit_distilled', 'timm_deit3'):
    loaded = checkpoints.load(os.path.join(HERE, name))
    add(f'{name}_to_transformers' if name.startswith('timm') else name, 'transformers',
        loaded.model, loaded.params, bb['images'], loaded=loaded)
  # timm's backbone folders written back to timm (their architecture's name and
  # pretrained_cfg kept: check compares them with the fixture's).
  for name in ('timm_clip', 'timm_clip_quickgelu', 'timm_siglip_map', 'timm_dinov2',
               'timm_dinov2_swiglu', 'timm_deit_distilled'):
    loaded = checkpoints.load(os.path.join(HERE, name))
    add(name, 'timm', loaded.model, loaded.params, bb['images'], loaded=loaded)
  model, params = made('ti16', 6, num_classes=5, gated_mlp=True, activation='silu',
                       layer_scale=1e-5, **{**small, 'mlp_dim': 88})
  add('vj_swiglu_transformers', 'transformers', model, params, images)  # Dinov2ForImage...
  model, params = made('ti16', 7, num_classes=None, pre_norm=True, activation='quick_gelu',
                       norm_epsilon=1e-5, **small)  # A patch bias CLIP folds into its posemb.
  add('vj_clip_transformers', 'transformers', model, params, images)
  model, params = made('ti16', 8, num_classes=None, pool='map', class_token=False, **small)
  add('vj_siglip_transformers', 'transformers', model, params, images)

  np.savez(os.path.join(out, 'expected.npz'), **expected)
  with open(os.path.join(out, 'manifest.json'), 'w') as f:
    json.dump(manifest, f, indent=1)
  print(f'{len(manifest)} exports in {out}')


def check(out):
  """timm and transformers side: load each export as a user would."""
  os.environ['HF_HUB_OFFLINE'] = '1'
  os.environ.setdefault('TRANSFORMERS_VERBOSITY', 'error')
  sys.path.insert(0, HERE)
  import tempfile

  import make_fixtures  # noqa: F401  (the torchvision shim, before timm)
  import numpy as np
  import PIL.Image
  import timm
  import torch
  import transformers
  from check_roundtrip import hub_cache
  from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification

  torch.set_num_threads(1)
  transformers.utils.logging.disable_progress_bar()
  print('versions', torch.__version__, timm.__version__, transformers.__version__)
  expected = np.load(os.path.join(out, 'expected.npz'))
  with open(os.path.join(out, 'manifest.json')) as f:
    manifest = json.load(f)
  failures = []

  def report(name, how, got, want):
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    ok = got.shape == want.shape and rel <= TOLERANCE
    print(f"{'ok  ' if ok else 'FAIL'} {name:32s} {how:52s} max rel diff {rel:.1e}")
    if not ok:
      failures.append((name, how))

  def run(model, x, features=False):
    with torch.no_grad():
      if features:
        return model.eval()(pixel_values=x).pooler_output.numpy()
      if isinstance(model, torch.nn.Module) and hasattr(model, 'forward_head'):
        return model.eval()(x).numpy()
      return model.eval()(pixel_values=x).logits.numpy()

  with tempfile.TemporaryDirectory() as root:
    for name, library in manifest.items():
      folder = os.path.join(out, name)
      x = torch.from_numpy(expected[f'{name}/images'].transpose(0, 3, 1, 2).copy())
      want = expected[f'{name}/logits']
      with open(os.path.join(folder, 'config.json')) as f:
        config = json.load(f)
      if library == 'timm':
        report(name, "create_model('local-dir:DIR', pretrained=True)",
               run(timm.create_model('local-dir:' + folder, pretrained=True), x), want)
        cache = hub_cache(folder, root, f'local/{name}')
        report(name, "create_model('hf-hub:local/NAME') offline cache",
               run(timm.create_model(f'hf-hub:local/{name}', pretrained=True, cache_dir=cache),
                   x), want)
        overlay = dict(file=os.path.join(folder, 'model.safetensors'),
                       num_classes=config['num_classes'])
        model = timm.create_model(config['architecture'], pretrained=True,
                                  pretrained_cfg_overlay=overlay, **config['model_args'])
        report(name, 'create_model(ARCH, overlay file+num_classes, **args)', run(model, x), want)
        fixture = os.path.join(HERE, name)
        if os.path.isdir(fixture):  # A timm folder written back: its name and preprocessing.
          theirs = timm.create_model('local-dir:' + fixture, pretrained=True)
          ours = timm.create_model('local-dir:' + folder, pretrained=True)
          same = (ours.pretrained_cfg['architecture'] == theirs.pretrained_cfg['architecture']
                  and timm.data.resolve_data_config({}, model=ours)
                  == timm.data.resolve_data_config({}, model=theirs))
          report(name, "the fixture's architecture, resolve_data_config", np.array([float(same)]),
                 np.array([1.]))
      else:
        cls = getattr(transformers, config['architectures'][0])
        features = 'ForImageClassification' not in cls.__name__
        model = cls.from_pretrained(folder)
        report(name, f'{cls.__name__}.from_pretrained(DIR)', run(model, x, features), want)
        if cls.__name__ != 'DeiTForImageClassificationWithTeacher':  # Auto: DeiT's other class.
          auto = AutoModel if features else AutoModelForImageClassification
          report(name, f'{auto.__name__}.from_pretrained(DIR)',
                 run(auto.from_pretrained(folder), x, features), want)
        resaved = os.path.join(root, name)
        model.save_pretrained(resaved)
        distinct = len({pathlib.Path(d, 'model.safetensors').read_bytes()
                        for d in (resaved, folder)})
        report(name, 'save_pretrained: model.safetensors bit-identical',
               np.array([2. - distinct]), np.array([1.]))
        processor = AutoImageProcessor.from_pretrained(folder)
        fixture = os.path.join(HERE, name)
        if os.path.exists(os.path.join(fixture, 'preprocessor_config.json')):
          image = PIL.Image.fromarray(
              np.random.RandomState(0).randint(0, 256, (40, 52, 3), np.uint8))
          pixels = [p(image, return_tensors='np')['pixel_values']
                    for p in (processor, AutoImageProcessor.from_pretrained(fixture))]
          report(name, f'{type(processor).__name__}: the fixture\'s pixel_values',
                 pixels[0], pixels[1])
  print(f'{len(failures)} failed' if failures else 'all exports load with the same logits')
  return 1 if failures else 0


if __name__ == '__main__':
  if len(sys.argv) != 3 or sys.argv[1] not in ('write', 'check'):
    sys.exit(__doc__)
  os.makedirs(sys.argv[2], exist_ok=True)
  sys.exit(write(sys.argv[2]) if sys.argv[1] == 'write' else check(sys.argv[2]))
