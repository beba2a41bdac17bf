"""Checkpoints, in and out, in two rooms: a run's own state (``run``: Orbax checkpoints that
verify themselves, the workdir read back, the lock) and foreign weight formats (``formats``:
release ``.npz``, big_vision, timm, transformers, ``hf-hub:``). ``load`` reads any of them,
named by one SOURCE string; ``export`` writes a model as .npz, timm or transformers."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vit_jax.base import errors

if TYPE_CHECKING:
  from vit_jax.checkpoints.formats.layout import Loaded


def load(source: str, *, step: int | None = None, ema: bool = False,
         allow_nonfinite: bool = False, model_name: str | None = None,
         image_size: int | tuple[int, int] | None = None, pool: str | None = None,
         source_grid: tuple[int, int] | None = None,
         patch_size: int | tuple[int, int] | None = None) -> Loaded:
  """The model, parameters and class names a SOURCE names (``formats``).

  A run's workdir: its checkpoint (the latest unless ``step``; ``ema``: the weights' moving
  average; a non-finite checkpoint refused unless ``allow_nonfinite``). Any other source:
  ``formats.load`` (``model_name``, ``image_size``, ``pool``, ``source_grid`` and, for
  big_vision, ``step``). ``patch_size``, for any source: the model at another patch size,
  its patch embedding resampled as FlexiViT does and its position embeddings resized to
  the new grid (``formats.resized``).
  """
  from vit_jax.checkpoints import formats  # These import jax: this package's light modules
  from vit_jax.checkpoints.run import workdir  # (hf_hub, run.lock, run.record) do not.

  if formats.origin(source) == formats.WORKDIR:
    given = [k for k, v in (('model_name', model_name), ('image_size', image_size),
                            ('pool', pool), ('source_grid', source_grid)) if v is not None]
    if given:
      raise errors.ConfigError(f'{", ".join(given)} given, but {source} is a workdir: its '
                               'config.json says its model; leave them unset.')
    loaded = workdir.load_run(source, step, ema=ema, allow_nonfinite=allow_nonfinite)
    return formats.resized(loaded, patch_size=patch_size)
  if ema:
    raise errors.ConfigError(f'ema=True, but {source} is not a workdir: it holds one set of '
                             'weights.')
  return formats.load(source, model_name=model_name, image_size=image_size, pool=pool,
                      source_grid=source_grid, step=step, patch_size=patch_size)


def export(model: Any, params: Mapping[str, Any] | str | os.PathLike | None = None,
           out: str | os.PathLike | None = None, format: str | None = None,
           class_names: Sequence[str] | None = None, preprocessing: Any = None,
           architecture: Mapping[str, Any] | None = None) -> str:
  """Writes a model's parameters as 'npz', 'timm' or 'transformers' (``formats.export``):
  ``export(loaded, OUT, format)``, what ``load`` returned with its class names, preprocessing
  and architecture's name, or ``export(model, params, OUT, format, class_names,
  preprocessing)``."""
  from vit_jax.checkpoints import formats  # It imports jax (as in load).

  return formats.export(model, params, out, format, class_names, preprocessing, architecture)
