"""ViT models: the encoder, the BiT stem of the hybrids and the registry of names."""

from vit_jax.models.registry import (
    canonical_name,
    get_model,
    list_models,
    model_kwargs,
    release_name,
)
from vit_jax.models.vit import VisionTransformer

__all__ = ['VisionTransformer', 'canonical_name', 'get_model', 'list_models', 'model_kwargs',
           'release_name']
