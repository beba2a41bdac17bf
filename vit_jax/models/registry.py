"""The model zoo: every ViT of the paper by short name and by release name.

Short names are ``{size}{patch}`` (``ti16``, ``b8``, ``h14``; any size of
Ti/S/B/L/H with any patch size) and the hybrids ``r50_b16``, ``r26_s32`` and
``r_ti16``. Release names are the file names of the released checkpoints:
``ViT-B_16``, ``R50+ViT-B_16`` (``ViT-B/16`` is accepted too).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

import jax.numpy as jnp

from vit_jax.models.vit import VisionTransformer, pair

# Encoder shapes of the paper's table 1 (plus DeiT's Ti and S).
SIZES: dict[str, dict[str, int]] = {
    'ti': dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12),
    's': dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12),
    'b': dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12),
    'l': dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24),
    'h': dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32),
}
_RELEASE_SIZE = {'ti': 'Ti', 's': 'S', 'b': 'B', 'l': 'L', 'h': 'H'}

# Hybrids: (encoder size, patch size on the feature map, BiT units per stage).
# The BiT root downsamples 4x and each stage after the first 2x, so R50 (3, 4, 9)
# with 1x1 patches is /16 and R26 (2, 2, 2, 2) is /32. R+ViT-Ti/16 keeps the
# release's definition: the root alone with 8x8 patches (a /32 token grid).
HYBRIDS: dict[str, tuple[str, int, tuple[int, ...], str]] = {
    'r50_b16': ('b', 1, (3, 4, 9), 'R50+ViT-B_16'),
    'r26_s32': ('s', 1, (2, 2, 2, 2), 'R26+ViT-S_32'),
    'r_ti16': ('ti', 8, (), 'R+ViT-Ti_16'),
}

# The variants of the paper and the releases, listed by `list_models()`.
NAMED = ('ti16', 's16', 's32', 'b8', 'b16', 'b32', 'l16', 'l32', 'h14', *HYBRIDS)

_PLAIN = re.compile(r'^(ti|s|b|l|h)(\d+)$')
_RELEASE = re.compile(r'^vit-(ti|s|b|l|h)_(\d+)$')
_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


def release_name(name: str) -> str:
  """The release file name of a model (``b16`` -> ``ViT-B_16``)."""
  short = canonical_name(name)
  if short in HYBRIDS:
    return HYBRIDS[short][3]
  size, patch = _PLAIN.match(short).groups()
  return f'ViT-{_RELEASE_SIZE[size]}_{patch}'


def canonical_name(name: str) -> str:
  """Maps any accepted spelling of a model name to its short name."""
  key = str(name).strip().lower().replace('/', '_')
  if _PLAIN.match(key) or key in HYBRIDS:
    return key
  if m := _RELEASE.match(key):
    return ''.join(m.groups())
  for short, (*_, release) in HYBRIDS.items():
    if key == release.lower():
      return short
  known = list(NAMED) + [release_name(n) for n in NAMED]
  close = difflib.get_close_matches(str(name), known, n=3)
  hint = f' Did you mean {", ".join(close)}?' if close else ''
  raise ValueError(f'Unknown model {name!r}.{hint} Known models: {", ".join(known)} '
                   '(and any {ti,s,b,l,h}{patch}, e.g. "s8").')


def model_kwargs(name: str) -> dict[str, Any]:
  """The architecture of a named model, as ``VisionTransformer`` keyword arguments."""
  short = canonical_name(name)
  if short in HYBRIDS:
    size, patch, layers, _ = HYBRIDS[short]
    return dict(SIZES[size], patch_size=patch, resnet_layers=layers,
                model_name=release_name(short))
  size, patch = _PLAIN.match(short).groups()
  return dict(SIZES[size], patch_size=int(patch), model_name=release_name(short))


def list_models() -> tuple[str, ...]:
  """The short names of the paper's variants."""
  return NAMED


def get_model(name: str, *, num_classes: int | None, **overrides: Any) -> VisionTransformer:
  """Returns the Linen module of a named ViT.

  Args:
    name: a short name (``b16``) or a release name (``ViT-B_16``).
    num_classes: classifier outputs; 0 or None for a model without head.
    **overrides: any ``VisionTransformer`` attribute, e.g. ``image_size=384``,
      ``pool='gap'``, ``dtype='bfloat16'``, ``scan=True``.
  """
  fields = {f.name for f in dataclasses.fields(VisionTransformer)} - {'parent', 'name'}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f'Unknown model option(s) {unknown} for {name!r}. '
                     f'Valid options: {sorted(fields - {"num_classes"})}.')
  kwargs = model_kwargs(name)
  kwargs.update(overrides)
  for key in ('dtype', 'param_dtype', 'matmul_dtype'):
    if isinstance(kwargs.get(key), str):
      if kwargs[key] not in _DTYPES:
        raise ValueError(f'{key}={kwargs[key]!r} is not one of {sorted(_DTYPES)}.')
      kwargs[key] = _DTYPES[kwargs[key]]
  for key in ('image_size', 'patch_size'):
    kwargs[key] = pair(kwargs.get(key, 224))
  if kwargs.get('resnet_layers') is not None:
    kwargs['resnet_layers'] = tuple(kwargs['resnet_layers'])
  return VisionTransformer(num_classes=num_classes, **kwargs)
