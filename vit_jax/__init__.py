"""vit_jax: Vision Transformers in JAX/Flax, from the paper's models to pod-scale training."""

__version__ = '0.1.0'
