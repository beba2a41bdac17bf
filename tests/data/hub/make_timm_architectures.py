"""Writes vit_jax/checkpoints/formats/timm_architectures.json: timm's ViT architectures and their
defaults.

timm's config.json names an architecture and records only the keyword arguments given to
`create_model` (README.md beside this file), so a reader also needs each architecture's own
defaults (num_heads, class_token, global_pool, act_layer, ...): this script asks timm for them,
without building a model, and writes them as a JSON table, one architecture a line. Run in the
fixtures' venv (make_fixtures.py: torch CPU, timm 1.0.31), from the repository root:

    python tests/data/hub/make_timm_architectures.py

Every architecture of timm.models.vision_transformer and timm.models.deit is listed under
"architectures", and every one of timm.models.eva (the Eva class: EVA-02, DINOv3, PE, the
rotary ViTs) under "eva_architectures", with the keyword arguments its entry point passes
(`_create_vision_transformer` / `_create_deit` / `_create_eva` are replaced by a recorder);
every one of timm.models.naflexvit (NaFlexVit) under "naflex_architectures", as the fields of
its `NaFlexVitCfg` that differ from the dataclass' defaults (`_create_naflexvit` recorded, the
keyword arguments laid over its cfg as timm lays them), and those defaults under
"naflex_defaults";
values that are classes or partials (norm and activation layers,
block and MLP types) are written as strings naming them, which vit_jax refuses by name.
"""

import contextlib
import dataclasses
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures  # noqa: E402,F401  (the torchvision shim, before timm)
import timm  # noqa: E402
import timm.models.deit as deit  # noqa: E402
import timm.models.eva as eva  # noqa: E402
import timm.models.naflexvit as naflexvit  # noqa: E402
import timm.models.vision_transformer as vision_transformer  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'vit_jax',
                   'checkpoints', 'formats', 'timm_architectures.json')


class _Recorded(Exception):
  pass


def describe(value):
  """A keyword argument's value as a literal: numbers, strings, tuples; else a named string."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (tuple, list)):
    return tuple(describe(v) for v in value)
  if isinstance(value, functools.partial):
    args = ', '.join(f'{k}={v!r}' for k, v in value.keywords.items())
    return f'<{value.func.__name__}({args})>'
  return f'<{getattr(value, "__name__", type(value).__name__)}>'


def main():
  recorded, recorded_eva, recorded_naflex = {}, {}, {}

  def recorder(table):
    def record(name, pretrained=False, **kwargs):
      table[name] = kwargs
      raise _Recorded
    return record

  vision_transformer._create_vision_transformer = recorder(recorded)
  deit._create_deit = recorder(recorded)
  eva._create_eva = recorder(recorded_eva)
  defaults = dataclasses.asdict(naflexvit.NaFlexVitCfg())

  def record_naflex(name, pretrained=False, **kwargs):
    cfg = kwargs.pop('cfg', naflexvit.NaFlexVitCfg())
    fields = {f.name for f in dataclasses.fields(cfg)}
    cfg = dataclasses.asdict(naflexvit._overlay_kwargs(cfg, **kwargs))
    recorded_naflex[name] = {k: v for k, v in cfg.items() if v != defaults[k]}
    recorded_naflex[name].update({k: v for k, v in kwargs.items() if k not in fields})
    raise _Recorded

  naflexvit._create_naflexvit = record_naflex
  modules = ('timm.models.vision_transformer', 'timm.models.deit', 'timm.models.eva',
             'timm.models.naflexvit')
  for name in timm.list_models():
    entry = timm.models._registry._model_entrypoints[name]
    if entry.__module__ not in modules:
      continue
    with contextlib.suppress(_Recorded):
      entry(pretrained=False)
  lines = ['{', '"written_by": "tests/data/hub/make_timm_architectures.py, from timm\'s '
           'registry: do not edit",', f'"timm_version": {json.dumps(timm.__version__)},']
  tables = (('architectures', recorded), ('eva_architectures', recorded_eva),
            ('naflex_architectures', recorded_naflex))
  for key, table in tables:
    lines.append(f'"{key}": {{')
    names = sorted(table)
    for i, name in enumerate(names):
      arguments = {k: describe(v) for k, v in table[name].items()}
      lines.append(f'{json.dumps(name)}: {json.dumps(arguments, sort_keys=True)}'
                   + (',' if i < len(names) - 1 else ''))
    lines.append('},')
  naflex_defaults = {k: describe(v) for k, v in defaults.items()}
  lines.append(f'"naflex_defaults": {json.dumps(naflex_defaults, sort_keys=True)}')
  lines.append('}')
  with open(OUT, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  print(f'{len(recorded)} + {len(recorded_eva)} Eva + {len(recorded_naflex)} NaFlexVit '
        f'architectures -> {os.path.normpath(OUT)}')


if __name__ == '__main__':
  main()
