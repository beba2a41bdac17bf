"""big_vision's ViT as the benchmarks' reference: the same step, its model.

``vit(path, ...)`` imports ``big_vision.models.vit`` from a checkout of
google-research/big_vision (not a dependency of vit_jax) and wraps it as a Linen module
that returns the logits: ``dtype_mm='bfloat16'`` (big_vision's mixed precision: bfloat16
products, float32 parameters and element-wise work) and the class token, with
vit_jax's analytic FLOP count of every token (big_vision computes them all).
``vit_jax.benchmarks.tpu_step`` compiles it for a TPU slice and
``vit_jax.benchmarks.train`` times it on this machine's devices.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any


def _import_without_tensorflow() -> None:
  """``big_vision.utils`` imports TensorFlow's gfile at module level, for file I/O that the
  model never calls. Where TensorFlow is not installed (a GPU image, a jax-only venv), an
  empty ``tensorflow.io.gfile`` module stands in, so that the model's module imports;
  anything that reaches for gfile then fails loudly."""
  try:
    import tensorflow.io.gfile  # noqa: F401 (big_vision imports it next anyway)
    return
  except ImportError:
    pass
  # flax.io picks its file layer by whether TensorFlow is installed: it decides first.
  import flax.io  # noqa: F401
  names = ('tensorflow', 'tensorflow.io', 'tensorflow.io.gfile')
  modules = {n: types.ModuleType(n, 'Stand-in: TensorFlow is not installed.') for n in names}
  modules['tensorflow'].io = modules['tensorflow.io']
  modules['tensorflow.io'].gfile = modules['tensorflow.io.gfile']
  sys.modules.update(modules)


def vit(path: str, model: str, image_size: int | tuple[int, int] = 224,
        num_layers: int | None = None) -> Any:
  """big_vision's ViT of vit_jax's ``model`` size (e.g. 'b16'), at ``image_size`` with
  ``num_layers`` blocks (None: the model's), as a Linen module ``(images, train) -> logits``
  with 1000 classes."""
  import flax.linen as nn

  from vit_jax.models import get_model, registry

  if not os.path.isdir(os.path.join(path, 'big_vision', 'models')):
    raise FileNotFoundError(f'{path} is not a big_vision checkout (no big_vision/models).')
  sys.path.insert(0, os.path.abspath(path))
  _import_without_tensorflow()
  from big_vision.models import vit as bv  # noqa: PLC0415 (a checkout given by path)

  shape = {'image_size': image_size}
  if num_layers is not None:
    shape['num_layers'] = num_layers
  ours = get_model(model, num_classes=1000, **shape)
  size = registry.model_kwargs(model)
  variant = {768: 'B', 1024: 'L', 1280: 'H', 384: 'S', 192: 'Ti'}[size['hidden_size']]

  class BigVision(nn.Module):
    image_size: tuple[int, int] = ours.image_size
    scan: bool = False

    def forward_flops(self, all_tokens: bool = False) -> int | None:
      del all_tokens  # big_vision computes every token's output in every block.
      return ours.forward_flops(all_tokens=True)

    @nn.compact
    def __call__(self, images, train: bool = False):
      return bv.Model(num_classes=1000, variant=f'{variant}/{size["patch_size"]}',
                      depth=ours.num_layers, pool_type='tok', dtype_mm='bfloat16',
                      name='vit')(images, train=train)[0]

  return BigVision()
