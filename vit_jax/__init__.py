"""vit_jax: Vision Transformers in JAX/Flax, from the paper's models to pod-scale training.

Importing vit_jax picks jax's platforms first (``vit_jax.base.platforms.pick``): where libtpu is
installed and no TPU is attached, jax stays off the TPU backend (whose start-up would print
libtpu's errors), unless ``JAX_PLATFORMS`` is set.
"""

from vit_jax.base import platforms as _platforms

__version__ = '0.1.0'

_platforms.pick()
