"""Evaluators: every evaluation of a run behind one interface (``base.Evaluator``).

Each entry of ``config.evals`` names its ``type``, which is a module here (big_vision's
manner): 'classification', 'real', 'fewshot', 'mpp'. Adding one is adding a module with an
``Evaluator`` class (and its fields in ``vit_jax.config``); ``from_config(ctx)`` builds them.
"""

from __future__ import annotations

import importlib

import ml_collections

from vit_jax import config as config_lib
from vit_jax.base import errors
from vit_jax.evals.base import Context, Evaluator

__all__ = ['Context', 'Evaluator', 'from_config', 'headline']


def evaluator_class(name: str, type_: str) -> type[Evaluator]:
  """The ``Evaluator`` of module ``vit_jax.evals.<type_>``; a ConfigError naming the entry
  where ``type_`` is not one of ``vit_jax.config.EVAL_TYPES``."""
  config_lib.eval_fields(type_, f'config.evals.{name}')
  return importlib.import_module(f'vit_jax.evals.{type_}').Evaluator


def from_config(ctx: Context, names: list[str] | None = None) -> list[Evaluator]:
  """Every evaluator ``config.evals`` names (or those of ``names``), built and checked:
  a ConfigError for one that cannot evaluate this run, before anything compiles."""
  entries = ctx.config.evals
  if names is not None:
    unknown = sorted(set(names) - set(entries))
    if unknown:
      raise errors.ConfigError(f'no evaluator {", ".join(unknown)} in config.evals (it has: '
                               f'{", ".join(entries) or "none"}).')
  return [evaluator_class(name, entry.type).from_config(name, entry, ctx)
          for name, entry in entries.items() if names is None or name in names]


def headline(config: ml_collections.ConfigDict) -> str:
  """'NAME/METRIC' that a sweep or VTAB reads of a run of (complete) ``config``: the headline
  metric of its evaluator 'eval' (the default's), else of its first by name; '': none."""
  name = 'eval' if 'eval' in config.evals else min(config.evals, default='')
  entry = config.evals.get(name)
  return name and f'{name}/{evaluator_class(name, entry.type).headline(entry, config)}'
