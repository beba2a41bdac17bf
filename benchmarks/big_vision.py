"""big_vision's ViT as the benchmarks' reference: the same step, its model.

``vit(path, ...)`` imports ``big_vision.models.vit`` from a checkout of
google-research/big_vision (not a dependency of vit_jax) and wraps it as a Linen module
that returns the logits: ``dtype_mm='bfloat16'`` (big_vision's mixed precision: bfloat16
products, float32 parameters and element-wise work) and the class token, with
vit_jax's analytic FLOP count of every token (big_vision computes them all).
``benchmarks.tpu_step`` compiles it for a TPU slice and
``benchmarks.train`` times it on this machine's devices.
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


def not_a_checkout(path: str) -> str | None:
  """Why ``path`` is not a big_vision checkout (a flag's error line), or None if it is."""
  if os.path.isdir(os.path.join(path, 'big_vision', 'models')):
    return None
  return f'--big_vision={path}: not a big_vision checkout (no big_vision/models in it).'


# vit_jax's remat policies by the names big_vision's scanned encoder looks up in
# jax.checkpoint_policies. big_vision always remats inside its scan: 'none' is its default.
SCAN_REMAT_POLICIES = {'none': 'nothing_saveable', 'full': 'nothing_saveable',
                       'dots': 'checkpoint_dots',
                       'dots_no_batch': 'checkpoint_dots_with_no_batch_dims'}


def vit(path: str, model: str, image_size: int | tuple[int, int] = 224,
        num_layers: int | None = None, scan: bool = False, remat_policy: str = 'none') -> Any:
  """big_vision's ViT of vit_jax's ``model`` size (e.g. 'b16'), at ``image_size`` with
  ``num_layers`` blocks (None: the model's), as a Linen module ``(images, train) -> logits``
  with 1000 classes.

  ``scan``: big_vision's scanned encoder, which remats each block by ``remat_policy`` (a
  vit_jax name; 'none' gives big_vision's default, full remat). Its unrolled encoder has
  no remat: there a ``remat_policy`` other than 'none' wraps each block as vit_jax's
  unrolled encoder does (``prevent_cse``), the scanned program unrolled, which the TPU
  cost model can time (it counts a loop's body once).
  """
  import unittest.mock

  import flax.linen as nn

  from vit_jax.models import get_model, registry
  from vit_jax.models.vit import REMAT_POLICIES

  if why := not_a_checkout(path):
    raise FileNotFoundError(why)
  sys.path.insert(0, os.path.abspath(path))
  _import_without_tensorflow()
  from big_vision.models import vit as bv  # noqa: PLC0415 (a checkout given by path)

  shape = {'image_size': image_size}
  if num_layers is not None:
    shape['num_layers'] = num_layers
  ours = get_model(model, num_classes=1000, **shape)
  size = registry.model_kwargs(model)
  variant = {768: 'B', 1024: 'L', 1280: 'H', 384: 'S', 192: 'Ti'}[size['hidden_size']]

  class RematEncoder(bv.Encoder):
    """big_vision's unrolled encoder with each block rematerialised."""

    @nn.compact
    def __call__(self, x, deterministic=True):
      block = nn.remat(bv.Encoder1DBlock, prevent_cse=True, static_argnums=(2,),
                       policy=REMAT_POLICIES[remat_policy])
      for i in range(self.depth):
        x, _ = block(name=f'encoderblock_{i}', dtype_mm=self.dtype_mm, mlp_dim=self.mlp_dim,
                     num_heads=self.num_heads, dropout=self.dropout)(x, deterministic)
      return nn.LayerNorm(name='encoder_norm')(x), {}

  encoder = RematEncoder if remat_policy != 'none' and not scan else bv.Encoder

  class BigVision(nn.Module):
    image_size: tuple[int, int] = ours.image_size
    scan: bool = False

    def forward_flops(self, all_tokens: bool = False) -> int | None:
      del all_tokens  # big_vision computes every token's output in every block.
      return ours.forward_flops(all_tokens=True)

    @nn.compact
    def __call__(self, images, train: bool = False):
      with unittest.mock.patch.object(bv, 'Encoder', encoder):  # bv.Model looks it up.
        return bv.Model(num_classes=1000, variant=f'{variant}/{size["patch_size"]}',
                        depth=ours.num_layers, pool_type='tok', dtype_mm='bfloat16',
                        scan=self.scan, remat_policy=SCAN_REMAT_POLICIES[remat_policy],
                        name='vit')(images, train=train)[0]

  return BigVision(scan=scan)
