"""The model zoo: every ViT of the paper, and the giant ones that followed, by name.

Short names are ``{size}{patch}`` (``ti16``, ``b8``, ``h14``; any size of
Ti/S/B/L/H/g/G/e/22B with any patch size) and the hybrids ``r50_b16``, ``r26_s32`` and
``r_ti16``. Release names are the file names of the released checkpoints:
``ViT-B_16``, ``R50+ViT-B_16`` (``ViT-B/16`` is accepted too). Names are
case-insensitive except for big_vision's g (giant, ``g14``) and G (gigantic, ``G14``).
timm's pretrained families with options the paper's ViT lacks are named after them:
``deit3_b16`` (DeiT III: layer scale, no class-token position embedding, exact GELU) and
``b16_reg4_gap`` (4 register tokens, no class token, average pooling then ``fc_norm``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from vit_jax.base.sizes import pair
from vit_jax.config import zoo
from vit_jax.models.vit import VisionTransformer

# The zoo's names and shapes (``vit_jax.config.zoo``, read by the config's checks before jax).
SIZES, HYBRIDS, NAMED, VARIANTS, DEIT3 = zoo.SIZES, zoo.HYBRIDS, zoo.NAMED, zoo.VARIANTS, zoo.DEIT3
registers_gap, release_name = zoo.registers_gap, zoo.release_name
canonical_name, model_kwargs = zoo.canonical_name, zoo.model_kwargs
_RELEASE_SIZE, _variant = zoo.RELEASE_SIZE, zoo.variant

_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


_SHAPE = ('hidden_size', 'mlp_dim', 'num_heads', 'num_layers')


def shape_name(kwargs: dict[str, Any]) -> str:
  """The name of a ViT of this architecture (``VisionTransformer`` keyword arguments):
  the zoo's release name where its encoder has a zoo size (``ViT-B_16``, or ``ViT-S_8``:
  any zoo size with any square patch) or is a zoo hybrid, else its shape in words
  (``ViT (4 layers, width 64, MLP 128, 4 heads, patch 4)``), so that no log calls a
  model by a name whose shape it does not have. Image size and options (pooling, dtypes,
  ...) are not part of the name."""
  patch = pair(kwargs['patch_size'])
  resnet = kwargs.get('resnet_layers')
  resnet = None if resnet is None else tuple(resnet)
  shape = {k: kwargs[k] for k in _SHAPE}
  if resnet is None and patch[0] == patch[1]:
    for size, fields in SIZES.items():
      if all(fields[k] == v for k, v in shape.items()):
        return f'ViT-{_RELEASE_SIZE[size]}_{patch[0]}'
  if resnet is not None and kwargs.get('resnet_width', 1) == 1:
    for size, hybrid_patch, layers, release in HYBRIDS.values():
      if ((resnet, patch) == (layers, (hybrid_patch, hybrid_patch))
          and all(SIZES[size][k] == v for k, v in shape.items())):
        return release
  words = (f'{shape["num_layers"]} layers, width {shape["hidden_size"]}, MLP '
           f'{shape["mlp_dim"]}, {shape["num_heads"]} heads, patch '
           + (f'{patch[0]}' if patch[0] == patch[1] else f'{patch[0]}x{patch[1]}'))
  if resnet is not None:
    width = kwargs.get('resnet_width', 1)
    words += f' on a BiT stem {resnet}' + (f' of width x{width}' if width != 1 else '')
  return f'ViT ({words})'


def list_models() -> tuple[str, ...]:
  """The short names of the paper's variants and of the giant ones."""
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
  if 'model_name' not in overrides:  # The name of the shape built, overrides and all.
    variant = _variant(canonical_name(name))
    same = variant and shape_name(kwargs) == shape_name(model_kwargs(variant[0]))
    kwargs['model_name'] = canonical_name(name) if same else shape_name(kwargs)
  return VisionTransformer(num_classes=num_classes, **kwargs)
