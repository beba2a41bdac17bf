"""The config made from the declarations (``table``): the defaults a recipe starts
from (``get_config``), and a recipe's or a config.json's values laid over them (``complete``);
whether the values are right is ``vit_jax.config.rules``'s."""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax.base import errors, paths
from vit_jax.config.field import REQUIRED, Field, Group, unknown_field
from vit_jax.config.table import EVAL_TYPES, FIELDS, PHASE_FIELDS, eval_fields


def get_config() -> ml_collections.ConfigDict:
  """The defaults; a recipe overrides what it changes."""
  return complete({})


def complete(config: Any) -> ml_collections.ConfigDict:
  """``config`` (a ConfigDict or a dict) laid over the defaults, so that every field is there.

  ``config.evals``, where given, is the whole set of evaluators, each completed from its
  type's defaults; a None entry is dropped. Raises ConfigError (a ValueError) for a field
  the defaults do not have, at any depth, naming the closest valid names (a typo would
  otherwise be ignored), and for an evaluator without a type, of an unknown type or with a
  field its type does not have.
  """
  user = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return _configdict(FIELDS, user, 'config')


def complete_eval(entry: Any, where: str) -> dict[str, Any]:
  """The evaluator ``entry`` (a dict with a ``type``) with its type's defaults filled in;
  ``where`` (config.evals.NAME) names it in the ConfigError of a bad entry."""
  if not isinstance(entry, dict):
    raise errors.ConfigError(f'{where}={entry!r} must be an evaluator: a dict with a type, '
                             f'e.g. dict(type={next(iter(EVAL_TYPES))!r}).')
  if 'type' not in entry:
    raise errors.ConfigError(f'{where} has no type: set {where}.type to one of '
                             f'{", ".join(map(repr, EVAL_TYPES))}.')
  kind = entry['type']
  fields = eval_fields(kind, where)
  for key in entry:
    if key not in fields:
      raise unknown_field(where, key, list(fields), what=f'a field of {kind!r} evaluators (to '
                          f'change an evaluator\'s type, replace it: {where} = dict(type=...))')
  for key, field in fields.items():
    if field.default is REQUIRED and key not in entry:
      raise errors.ConfigError(f'{where}.{key} is required by {kind!r} evaluators: {field.doc}')
  return {k: _value(fields[k], v) for k, v in (eval_defaults(kind) | entry).items()}


def eval_defaults(eval_type: str) -> dict[str, Any]:
  """An evaluator of ``eval_type`` with its defaults (its required fields left out)."""
  return _defaults(eval_fields(eval_type)) | {'type': eval_type}


def phases(config: Any) -> list[dict[str, Any]]:
  """``config.schedule.phases`` with each phase's defaults filled in."""
  return [_defaults(PHASE_FIELDS) | dict(p) for p in config.schedule.phases]


def _defaults(fields: dict[str, Field]) -> dict[str, Any]:
  return {k: f.default for k, f in fields.items() if f.default is not REQUIRED}


def _value(field: Field, value: Any) -> Any:
  """A field's value as the config holds it: a path ``paths.expand``-ed (absolute, as on the
  command line: config.json then names the same file from any folder), a list a tuple."""
  return paths.expand(value) if field.base == 'path' else _tuple(value)


def _tuple(value: Any) -> Any:
  """JSON's lists (config.json) as the tuples the config held."""
  return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _configdict(fields: dict[str, Field | Group], user: dict[str, Any], where: str
                ) -> ml_collections.ConfigDict:
  """The declared ``fields`` with the ``user``'s values where it has them, each typed as
  declared (so that a later value of another type is refused, and a None field still takes
  its kind)."""
  for key, value in user.items():
    if key not in fields:
      raise unknown_field(where, key, list(fields))
    field = fields[key]
    if (isinstance(field, Group) or field.kind == 'evals') and not isinstance(value, dict):
      default = _defaults(field.fields) if isinstance(field, Group) else field.default
      raise errors.ConfigError(f'{where}.{key} must be a group of fields, like the '
                               f'default {default}; got {value!r}.')
  config = ml_collections.ConfigDict()
  for key, field in fields.items():
    if isinstance(field, Group):
      config[key] = _configdict(field.fields, user.get(key, {}), f'{where}.{key}')
      continue
    value = _value(field, user.get(key, field.default))
    if field.kind == 'evals':
      entries = {name: complete_eval(entry, f'{where}.{key}.{name}')
                 for name, entry in value.items() if entry is not None}
      config[key] = ml_collections.ConfigDict({
          name: _configdict(eval_fields(e['type']), e, f'{where}.{key}.{name}')
          for name, e in entries.items()})
    elif value is not REQUIRED:  # Every field but an evaluator's missing required one.
      try:
        config[key] = ml_collections.FieldReference(value, field_type=field.type)
      except TypeError:  # A value of another kind, which rules.check names.
        config[key] = value
  return config


def model_options(model: Any) -> tuple[str, dict[str, Any]]:
  """``config.model`` as (name, options), the options left unset (None) dropped."""
  options = {k: v for k, v in dict(model).items() if v is not None}
  if 'name' not in options:
    raise errors.ConfigError('config.model.name is missing (e.g. "ti16", "b16").')
  return options.pop('name'), options


def convert_old_evals(config: dict[str, Any]) -> dict[str, Any]:
  """``config`` (a config.json's dict) with the ``evals`` fields of runs older than named
  evaluators (fewshot.*, real, v2, data_dir) as entries: 'eval', and 'fewshot', 'real' and
  'v2' where they were on; a config of today as it is."""
  old = config.get('evals')
  if not isinstance(old, dict) or not ({'real', 'v2', 'data_dir'} & set(old) or (
      isinstance(old.get('fewshot'), dict) and 'type' not in old['fewshot'])):
    return config
  data_dir = old.get('data_dir', '')
  evals: dict[str, Any] = {'eval': {'type': 'classification'}}
  fewshot = old.get('fewshot') or {}
  if fewshot.get('datasets'):
    evals['fewshot'] = {'type': 'fewshot', **fewshot}
  if old.get('real'):
    evals['real'] = {'type': 'real', 'data_dir': data_dir}
  if old.get('v2'):
    evals['v2'] = {'type': 'classification', 'dataset': 'imagenet_v2', 'split': 'test',
                   'data_dir': data_dir}
  return {**config, 'evals': evals}
