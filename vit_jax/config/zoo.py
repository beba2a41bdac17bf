"""The model zoo's names and shapes, without jax: what ``config.model.name`` may say, and the
architecture each name stands for, for the config's checks before jax starts;
``vit_jax.models.registry`` builds the models (see its docstring for the names).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

# Encoder shapes of the paper's table 1 (plus DeiT's Ti and S); g and G of "Scaling
# Vision Transformers" (Zhai et al., 2022, table 2), e of PaLI (Chen et al., 2022), and
# ViT-22B (Dehghani et al., 2023, table 1) with its block: attention and MLP in
# parallel, QK normalisation, no QKV biases, LayerNorms without centering and bias.
SIZES: dict[str, dict[str, Any]] = {
    'ti': dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    's': dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    'b': dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    'l': dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    'h': dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
    'g': dict(hidden_size=1408, mlp_dim=6144, num_heads=16, num_layers=40),
    'G': dict(hidden_size=1664, mlp_dim=8192, num_heads=16, num_layers=48),
    'e': dict(hidden_size=1792, mlp_dim=15360, num_heads=16, num_layers=56),
    '22b': dict(hidden_size=6144, mlp_dim=24576, num_heads=48, num_layers=48,
                parallel_block=True, qk_norm=True, qkv_bias=False, norm='rmsnorm'),
}
RELEASE_SIZE = {'ti': 'Ti', 's': 'S', 'b': 'B', 'l': 'L', 'h': 'H', 'g': 'g', 'G': 'G',
                 'e': 'e', '22b': '22B'}

# Hybrids: (encoder size, patch size on the feature map, BiT units per stage).
# The BiT root downsamples 4x and each stage after the first 2x, so R50 (3, 4, 9)
# with 1x1 patches is /16 and R26 (2, 2, 2, 2) is /32. R+ViT-Ti/16 keeps the
# release's definition: the root alone with 8x8 patches (a /32 token grid).
HYBRIDS: dict[str, tuple[str, int, tuple[int, ...], str]] = {
    'r50_b16': ('b', 1, (3, 4, 9), 'R50+ViT-B_16'),
    'r26_s32': ('s', 1, (2, 2, 2, 2), 'R26+ViT-S_32'),
    'r_ti16': ('ti', 8, (), 'R+ViT-Ti_16'),
}

# The variants of the papers and the releases, listed by `list_models()`.
NAMED = ('ti16', 's16', 's32', 'b8', 'b16', 'b32', 'l16', 'l32', 'h14', *HYBRIDS,
         'g14', 'G14', 'e14', '22b14')

# Variants of any size and patch, by timm's family names: what each adds to the encoder.
# Both were trained in PyTorch, with the exact GELU.
DEIT3 = dict(layer_scale=1e-6, prefix_posemb=False, activation='gelu')


def registers_gap(count: int) -> dict[str, Any]:
  """timm's ``*_reg{count}_gap`` ViTs: registers, no class token, the patches' mean, fc_norm."""
  return dict(num_registers=count, class_token=False, pool='gap', fc_norm=True,
              prefix_posemb=False, activation='gelu')


VARIANTS = ('deit3_s16', 'deit3_b16', 'deit3_l16', 'deit3_h14', 's16_reg4_gap', 'b16_reg4_gap')

_SIZE = r'(ti|s|b|l|h|g|e|22b)'
_DEIT3 = re.compile(rf'^deit3_{_SIZE}_?(\d+)$', re.IGNORECASE)
_REG_GAP = re.compile(rf'^{_SIZE}_?(\d+)_reg(\d+)_gap$', re.IGNORECASE)
_PLAIN = re.compile(rf'^{_SIZE}_?(\d+)$', re.IGNORECASE)  # b16, G/14 (big_vision).
_RELEASE = re.compile(rf'^vit-{_SIZE}_(\d+)$', re.IGNORECASE)


def release_name(name: str) -> str:
  """The release file name of a model (``b16`` -> ``ViT-B_16``); a variant's short name."""
  short = canonical_name(name)
  if short in HYBRIDS:
    return HYBRIDS[short][3]
  if variant(short):
    return short
  size, patch = _PLAIN.match(short).groups()
  return f'ViT-{RELEASE_SIZE[_size(size)]}_{patch}'


def _size(letters: str) -> str:
  """A size's key in SIZES: lower case, but for big_vision's g (giant) and G (gigantic)."""
  return letters if letters in ('g', 'G') else letters.lower()


def variant(short: str) -> tuple[str, dict[str, Any]] | None:
  """(base short name, options) of a variant's short name; None for another name."""
  if m := _DEIT3.match(short):
    return _size(m.group(1)) + m.group(2), DEIT3
  if m := _REG_GAP.match(short):
    return _size(m.group(1)) + m.group(2), registers_gap(int(m.group(3)))
  return None


def canonical_name(name: str) -> str:
  """Maps any accepted spelling of a model name to its short name."""
  spelled = str(name).strip().replace('/', '_')
  if m := _PLAIN.match(spelled) or _RELEASE.match(spelled):
    return _size(m.group(1)) + m.group(2)
  if m := _DEIT3.match(spelled):
    return f'deit3_{_size(m.group(1))}{m.group(2)}'
  if m := _REG_GAP.match(spelled):
    return f'{_size(m.group(1))}{m.group(2)}_reg{m.group(3)}_gap'
  key = spelled.lower()
  if key in HYBRIDS:
    return key
  for short, (*_, release) in HYBRIDS.items():
    if key == release.lower():
      return short
  known = list(NAMED) + [release_name(n) for n in NAMED] + list(VARIANTS)
  close = difflib.get_close_matches(str(name), known, n=3)
  hint = f' Did you mean {", ".join(close)}?' if close else ''
  raise ValueError(f'Unknown model {name!r}.{hint} Known models: {", ".join(known)} '
                   '(and any {ti,s,b,l,h,g,G,e,22b}{patch}, e.g. "s8", as deit3_{size}{patch} '
                   'or {size}{patch}_reg{n}_gap).')


def model_kwargs(name: str) -> dict[str, Any]:
  """The architecture of a named model, as ``VisionTransformer`` keyword arguments."""
  short = canonical_name(name)
  if short in HYBRIDS:
    size, patch, layers, _ = HYBRIDS[short]
    return dict(SIZES[size], patch_size=patch, resnet_layers=layers,
                model_name=release_name(short))
  if found := variant(short):
    base, options = found
    return dict(model_kwargs(base), **options, model_name=short)
  size, patch = _PLAIN.match(short).groups()
  return dict(SIZES[_size(size)], patch_size=int(patch), model_name=release_name(short))
