"""Checks that the export direction works: timm and transformers load folders written without them.

Run in the same venv as make_fixtures.py (torch 2.13.0 CPU, timm 1.0.31, transformers 5.23.0),
after it, offline:

    python tests/data/hub/check_roundtrip.py [FIXTURE_DIR]   # defaults to this folder

What an exporter in vit_jax would write is imitated without torch: the tensors are read with
`safetensors.numpy.load_file` and written again with `safetensors.numpy.save_file` (no
metadata, unlike transformers' own {'format': 'pt'}), and config.json is written with `json`.
Each check rebuilds the model from the folder alone and compares its logits with logits.npz.
It also tries cut-down config.json files to find which fields timm and transformers need, and
measures how much a wrong GELU or LayerNorm epsilon moves the logits. Prints one line per
check; exits non-zero if an expected outcome does not happen. Findings: README.md.
"""

import json
import os
import sys
import tempfile

# Nothing here may reach a hub: the hf-hub: checks read a local cache only.
os.environ['HF_HUB_OFFLINE'] = '1'
os.environ['HF_HUB_DISABLE_TELEMETRY'] = '1'
os.environ.setdefault('TRANSFORMERS_VERBOSITY', 'error')

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402  (torchvision shim, fixture definitions)
import numpy as np  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
  AutoModel,
  AutoModelForImageClassification,
  ViTForImageClassification,
  ViTModel,
)

FAILURES = []


def check(label, ok, detail=''):
  print(f"{'ok  ' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}")
  if not ok:
    FAILURES.append(label)


def read_json(path):
  with open(path) as f:
    return json.load(f)


def export(src, cfg, root):
  """A folder holding only config.json (cfg) and the tensors of src, written with numpy."""
  d = tempfile.mkdtemp(dir=root)
  save_file(load_file(os.path.join(src, 'model.safetensors')), os.path.join(d, 'model.safetensors'))
  with open(os.path.join(d, 'config.json'), 'w') as f:
    json.dump(cfg, f, indent=2)
  return d


def hub_cache(src_dir, root, repo_id):
  """A Hugging Face hub cache holding src_dir's files as repo_id at revision main."""
  cache = tempfile.mkdtemp(dir=root)
  repo = os.path.join(cache, 'models--' + repo_id.replace('/', '--'))
  commit = '0' * 40
  os.makedirs(os.path.join(repo, 'refs'))
  with open(os.path.join(repo, 'refs', 'main'), 'w') as f:
    f.write(commit)
  snap = os.path.join(repo, 'snapshots', commit)
  os.makedirs(snap)
  for name in os.listdir(src_dir):
    with open(os.path.join(src_dir, name), 'rb') as f_in, open(os.path.join(snap, name), 'wb') as f:
      f.write(f_in.read())
  return cache


def run_timm(model, x):
  with torch.no_grad():
    return model.eval()(x).numpy()


def try_build(fn):
  try:
    return fn(), None
  except Exception as e:  # noqa: BLE001 (recording what the library says)
    return None, f'{type(e).__name__}: {str(e).splitlines()[0][:160]}'


def timm_checks(fix, ref, root):
  for name, (arch, _, input_key, _) in make_fixtures.TIMM.items():
    src = os.path.join(fix, name)
    want = ref[f'{name}/logits']
    x = torch.from_numpy(ref['pixel_values' + input_key[len('images'):]])
    cfg = read_json(os.path.join(src, 'config.json'))
    model_args = cfg['model_args']

    # 1. The folder as timm wrote it, through each way in.
    d = export(src, cfg, root)
    file = os.path.join(d, 'model.safetensors')
    # The registry's pretrained_cfg says 1000 classes: unless the overlay says 5 too, timm
    # drops head.weight/bias from the file (logged at INFO only) and keeps a random head.
    m = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=file),
                          **model_args)
    got = run_timm(m, x)
    check(f'{name}: create_model(arch, pretrained_cfg_overlay=dict(file=F), **model_args) '
          'differs (head silently re-initialised)', not np.array_equal(got, want),
          f'max |diff| {np.abs(got - want).max():.1e}')
    m = timm.create_model(arch, pretrained=True, **model_args,
                          pretrained_cfg_overlay=dict(file=file, num_classes=cfg['num_classes']))
    got = run_timm(m, x)
    check(f'{name}: create_model(arch, pretrained_cfg_overlay=dict(file=F, num_classes=5), '
          '**model_args)', np.array_equal(got, want))
    got = run_timm(timm.create_model('local-dir:' + d, pretrained=True), x)
    check(f'{name}: create_model("local-dir:PATH")', np.array_equal(got, want))
    cache = hub_cache(d, root, f'local/{name}')
    got = run_timm(timm.create_model(f'hf-hub:local/{name}', pretrained=True, cache_dir=cache), x)
    check(f'{name}: create_model("hf-hub:local/{name}", cache_dir=CACHE) offline',
          np.array_equal(got, want))

    # 2. The smallest config.json that rebuilds it: architecture, model_args and an
    # empty pretrained_cfg.
    mini = {'architecture': arch, 'model_args': model_args, 'pretrained_cfg': {}}
    got = run_timm(timm.create_model('local-dir:' + export(src, mini, root), pretrained=True), x)
    check(f'{name}: minimal config {sorted(mini)}', np.array_equal(got, want))

  # 3. Which fields are needed (timm_augreg: no architecture defaults differ from ViT-B/16's
  # but the sizes), and what a missing one does.
  name, src = 'timm_augreg', os.path.join(fix, 'timm_augreg')
  cfg = read_json(os.path.join(src, 'config.json'))
  x, want = torch.from_numpy(ref['pixel_values']), ref[f'{name}/logits']
  arch, model_args = cfg['architecture'], cfg['model_args']
  no_img = {k: v for k, v in model_args.items() if k != 'img_size'}
  no_nc = {k: v for k, v in model_args.items() if k != 'num_classes'}
  cases = [
      ('no pretrained_cfg key (legacy single-dict parse)',
       {'architecture': arch, 'model_args': model_args}, False),
      ('no model_args', {'architecture': arch, 'pretrained_cfg': {}}, False),
      ('model_args without img_size (input_size in pretrained_cfg)',
       {'architecture': arch, 'model_args': no_img, 'pretrained_cfg': {'input_size': [3, 32, 32]}},
       False),
      ('model_args without num_classes, top-level num_classes',
       {'architecture': arch, 'num_classes': 5, 'model_args': no_nc, 'pretrained_cfg': {}}, True),
      ('model_args without num_classes, pretrained_cfg.num_classes',
       {'architecture': arch, 'model_args': no_nc, 'pretrained_cfg': {'num_classes': 5}}, True),
  ]
  for label, c, expect in cases:
    d = export(src, c, root)
    got, err = try_build(
        lambda d=d: run_timm(timm.create_model('local-dir:' + d, pretrained=True), x))
    same = got is not None and got.shape == want.shape and np.array_equal(got, want)
    check(f'timm config {label}: rebuilds={same}', same == expect, err or '')

  # 4. act_layer in model_args is honoured (what an exact vit_jax export writes: the release
  # models use the tanh GELU, timm's ViT default is nn.GELU, the exact erf form).
  tanh_args = dict(model_args, act_layer='gelu_tanh')
  d = export(src, {'architecture': arch, 'model_args': tanh_args, 'pretrained_cfg': {}}, root)
  m = timm.create_model('local-dir:' + d, pretrained=True)
  got = run_timm(m, x)
  direct = timm.create_model(arch, **tanh_args)
  direct.load_state_dict({k: torch.from_numpy(v) for k, v in
                          load_file(os.path.join(src, 'model.safetensors')).items()})
  check('timm model_args act_layer="gelu_tanh" honoured by local-dir',
        type(m.blocks[0].mlp.act).__name__ == 'GELUTanh'
        and np.array_equal(got, run_timm(direct, x)),
        f'{type(m.blocks[0].mlp.act).__name__}; logits move {np.abs(got - want).max():.1e} '
        'from the exact-GELU ones')
  eps12 = timm.create_model(arch, **model_args)
  eps12.load_state_dict(direct.state_dict())
  for mod in eps12.modules():
    if isinstance(mod, torch.nn.LayerNorm):
      mod.eps = 1e-12
  diff = np.abs(run_timm(eps12, x) - want).max()
  print(f'info timm_augreg with LayerNorm eps 1e-12 instead of 1e-6: logits move {diff:.1e}')

  # 5. hf-hub: offline without the files in the cache: refused, nothing downloaded.
  _, err = try_build(lambda: timm.create_model('hf-hub:local/absent', pretrained=True,
                                               cache_dir=tempfile.mkdtemp(dir=root)))
  check('timm hf-hub: offline, not cached -> refused', err is not None, err or '')

  # 6. A registry name with a path-like id and no prefix is refused (not silently a registry model).
  _, err = try_build(lambda: timm.create_model(os.path.join(fix, 'timm_augreg')))
  check('timm name that looks like a path without local-dir: -> refused', err is not None,
        err or '')


def hf_checks(fix, ref, root):
  x = torch.from_numpy(ref['pixel_values'])

  def logits(m):
    with torch.no_grad():
      return m.eval()(pixel_values=x).logits.numpy()

  for name, (cls, _, _) in make_fixtures.HF.items():
    src = os.path.join(fix, name)
    cfg = read_json(os.path.join(src, 'config.json'))
    d = export(src, cfg, root)
    cache = hub_cache(d, root, f'local/{name}')
    auto = AutoModelForImageClassification if cls is ViTForImageClassification else AutoModel
    loads = [
        (f'{cls.__name__}.from_pretrained(PATH)', lambda c=cls, d=d: c.from_pretrained(d)),
        (f'{auto.__name__}.from_pretrained(PATH)', lambda c=auto, d=d: c.from_pretrained(d)),
        (f'{cls.__name__}.from_pretrained("local/{name}", cache_dir=CACHE) offline',
         lambda c=cls, n=name, k=cache: c.from_pretrained(f'local/{n}', cache_dir=k)),
    ]
    for label, load in loads:
      m = load()
      if cls is ViTModel:
        with torch.no_grad():
          o = m.eval()(pixel_values=x)
        ok = (np.array_equal(o.last_hidden_state.numpy(), ref[f'{name}/last_hidden_state'])
              and np.array_equal(o.pooler_output.numpy(), ref[f'{name}/pooler_output']))
      else:
        ok = np.array_equal(logits(m), ref[f'{name}/logits'])
      check(f'{name}: {label} (numpy-written safetensors, no metadata)', ok)

  # Which config.json fields ViTForImageClassification needs; what a missing one does.
  name = 'hf_vit_cls_tanh'
  src = os.path.join(fix, name)
  cfg = read_json(os.path.join(src, 'config.json'))
  want = ref[f'{name}/logits']
  sizes = {k: cfg[k] for k in ('hidden_size', 'num_hidden_layers', 'num_attention_heads',
                               'intermediate_size', 'image_size', 'patch_size')}
  exact = dict(sizes, hidden_act=cfg['hidden_act'], layer_norm_eps=cfg['layer_norm_eps'])
  cases = [
      ('sizes + hidden_act + layer_norm_eps + id2label, no model_type',
       dict(exact, id2label=cfg['id2label']), ViTForImageClassification, 'same'),
      ('model_type + sizes + hidden_act + layer_norm_eps + num_labels (Auto class)',
       dict(exact, model_type='vit', num_labels=5), AutoModelForImageClassification, 'same'),
      ('no model_type (Auto class)', dict(exact, id2label=cfg['id2label']),
       AutoModelForImageClassification, 'refused'),
      ('no id2label / num_labels (default 2 labels)', dict(exact), ViTForImageClassification,
       'refused'),
      ('no hidden_act (default exact "gelu")', dict(sizes, layer_norm_eps=1e-6,
                                                    id2label=cfg['id2label']),
       ViTForImageClassification, 'differs'),
      ('no layer_norm_eps (default 1e-12)', dict(sizes, hidden_act=cfg['hidden_act'],
                                                 id2label=cfg['id2label']),
       ViTForImageClassification, 'close'),
      ('hidden_act "gelu_new" (another tanh GELU)', dict(exact, hidden_act='gelu_new',
                                                         id2label=cfg['id2label']),
       ViTForImageClassification, 'close'),
  ]
  for label, c, cls, expect in cases:
    d = export(src, c, root)
    got, err = try_build(lambda c=cls, d=d: logits(c.from_pretrained(d)))
    if got is None:
      outcome = 'refused'
    elif np.array_equal(got, want):
      outcome = 'same'
    elif got.shape == want.shape and np.abs(got - want).max() < 1e-4:
      outcome = 'close'
    else:
      outcome = 'differs'
    detail = err or (f'max |diff| {np.abs(got - want).max():.1e}' if got.shape == want.shape
                     else f'shape {got.shape}')
    check(f'transformers config {label}: {outcome}', outcome == expect, detail)


def main(fix):
  torch.set_num_threads(1)
  ref = np.load(os.path.join(fix, 'logits.npz'))
  print('versions', torch.__version__, timm.__version__, transformers.__version__)
  with tempfile.TemporaryDirectory() as root:
    timm_checks(fix, ref, root)
    hf_checks(fix, ref, root)
  print(f'{len(FAILURES)} failed' if FAILURES else 'all checks passed')
  return 1 if FAILURES else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))))
