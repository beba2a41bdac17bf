"""Prints the config's reference (docs/config.md): ``python -m vit_jax.config``."""

from vit_jax.config.markdown import reference

print(reference(), end='')
