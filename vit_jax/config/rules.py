"""A complete config checked before anything compiles (``check``): each field against its
declaration (``table``), then the rules that join fields. Checks that need the data or
the model are ``vit_jax.training.plan.validate``'s."""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax.base import errors
from vit_jax.config import zoo
from vit_jax.config.defaults import complete_eval
from vit_jax.config.field import REQUIRED, unknown_field
from vit_jax.config.table import DECLARED, PHASE_FIELDS, eval_fields, flatten


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for the first field of a complete ``config`` outside its declaration:
  a wrong type, a None where none is allowed, a value out of range, each evaluator by its
  type's fields; then the rules that join fields."""
  values = config.to_dict()
  flat = flatten(values)
  for name, field in DECLARED.items():
    if name in flat and (problem := field.problem(flat[name])):
      raise errors.ConfigError(f'config.{name}={flat[name]!r} {problem}.')
  for name, entry in values['evals'].items():
    entry = complete_eval(entry, f'config.evals.{name}')
    for key, field in eval_fields(entry['type']).items():
      if problem := field.problem(entry[key]):
        raise errors.ConfigError(f'config.evals.{name}.{key}={entry[key]!r} {problem}.')
  try:
    zoo.canonical_name(flat['model.name'])
  except ValueError as e:
    raise errors.ConfigError(f'config.model.name: {e}') from None
  if problem := _rules(flat):
    raise errors.ConfigError(problem)


# The fields of config.model that a zoo name sets (its architecture).
SHAPE_FIELDS = ('hidden_size', 'mlp_dim', 'num_heads', 'num_layers', 'patch_size')


def name_contradiction(model: ml_collections.ConfigDict, given: set[str], recipe: str) -> str:
  """Where a command line names another model (``model.name`` among ``given``, the fields it
  sets) than the one the recipe's own sizes make: what the recipe sets that the name does not
  ('' if nothing), so that a name is never silently overridden by a recipe's sizes."""
  if 'name' not in given:
    return ''
  try:
    named = zoo.model_kwargs(model.name)
  except ValueError:
    return ''  # Unknown: check's own message.
  pairs = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v, v)
  differ = [f'model.{k}={model[k]!r}' for k in SHAPE_FIELDS
            if k not in given and model.get(k) is not None and k in named
            and pairs(model[k]) != pairs(named[k])]
  if not differ:
    return ''
  shape = ', '.join(f'{k}={named[k]}' for k in SHAPE_FIELDS if k in named)
  fix = ' '.join(f'--config.{d.split("=")[0]}=None' for d in differ)
  return (f'config.model.name={model.name!r} names {named["model_name"]} ({shape}), but '
          f'{recipe} sets {", ".join(differ)}: the name alone would not change them. Drop '
          f'them ({fix}) to train the named model, or give them on the command line too.')


def _rules(flat: dict[str, Any]) -> str:
  """What is wrong across fields of a config whose fields are each right ('' if nothing)."""
  if flat['mesh.data'] == 0:
    return ('config.mesh.data=0 must be -1 (the devices that fsdp and tensor leave) or a '
            'positive number of devices.')
  for field in ('base_lr', 'end_lr'):
    lr = flat[f'schedule.{field}']
    if lr < 0 or (field == 'base_lr' and lr == 0):
      return (f'config.schedule.{field}={lr} must be '
              f'{"positive" if field == "base_lr" else ">= 0"} (e.g. 1e-3): a negative rate '
              'climbs the loss, a zero one trains nothing.')
  base, end = flat['schedule.base_lr'], flat['schedule.end_lr']
  if 0 < base < end:
    return (f'config.schedule.end_lr={end} is above config.schedule.base_lr={base}: the decay '
            'would climb. Use an end_lr <= base_lr.')
  rows = flat['packing.images_per_row']
  if rows and flat['batch_size'] % rows:
    return (f"config.batch_size={flat['batch_size']} does not split into packed rows of "
            f'config.packing.images_per_row={rows}: use a multiple of {rows}.')
  profile = flat['profile_steps']
  if profile and (len(profile) != 2 or not all(isinstance(s, int) and s >= 1 for s in profile)
                  or profile[0] > profile[1]):
    return (f'config.profile_steps={profile!r} must be () or (first, last) steps, '
            '1 <= first <= last.')
  if flat['total_steps'] and not flat['schedule.warmup_epochs'] and (
      problem := warmup_problem(flat['schedule.warmup_steps'], flat['total_steps'])):
    return problem  # In epochs: checked where the data's size is known (training.optim).
  return _flexi_problem(flat) or _phases_problem(flat['schedule.phases'], flat['total_steps'])


def _flexi_problem(flat: dict[str, Any]) -> str:
  """What is wrong with ``config.flexi`` ('' if nothing): each patch size once, and where
  probabilities are given, one each, >= 0, not all 0."""
  sizes, probs = tuple(flat['flexi.patch_sizes']), tuple(flat['flexi.probabilities'])
  if len(set(sizes)) != len(sizes):
    return f'config.flexi.patch_sizes={sizes} names a patch size twice: give each once.'
  if probs and (len(probs) != len(sizes) or not all(
      isinstance(p, (int, float)) and not isinstance(p, bool) and p >= 0 for p in probs)
                or not sum(probs) > 0):
    return (f'config.flexi.probabilities={probs} must be () (uniform) or one number >= 0 for '
            f'each of config.flexi.patch_sizes={sizes}, not all 0.')
  return ''


def warmup_problem(warmup: int, total: int) -> str:
  """What is wrong with a warm-up of ``warmup`` steps in a run of ``total`` ('' if nothing)."""
  if warmup < total:
    return ''
  return (f'config.schedule: the warm-up ({warmup} steps) is not shorter than the run ({total} '
          'steps). Shorten the warm-up or train longer.')


def _phases_problem(given: Any, total_steps: int | None) -> str:
  """What is wrong with ``config.schedule.phases`` ('' if nothing)."""
  where = 'config.schedule.phases'
  names, end = set(), total_steps
  for i, phase in enumerate(given):
    if not isinstance(phase, dict):
      return (f"{where}[{i}]={phase!r} must be a dict(name=..., total_steps=..., base_lr=...).")
    for key in phase:
      if key not in PHASE_FIELDS:
        return str(unknown_field(f'{where}[{i}]', key, list(PHASE_FIELDS),
                                 what='a field of a phase'))
    for key, field in PHASE_FIELDS.items():
      if key not in phase and field.default is REQUIRED:
        return f'{where}[{i}].{key} is required: {field.doc}'
      if key in phase and (problem := field.problem(phase[key])):
        return f'{where}[{i}].{key}={phase[key]!r} {problem}.'
    if phase['name'] in names:
      return f"{where}: two phases are called {phase['name']!r}; name each once."
    names.add(phase['name'])
    if total_steps is None:
      return f'{where} continue config.total_steps: set it (not num_epochs).'
    if phase['total_steps'] <= end:
      return (f"{where}[{i}] ({phase['name']!r}) ends at step {phase['total_steps']}, not "
              f'after the {"run" if i == 0 else "phase before"} ({end}): each phase ends later.')
    if phase.get('warmup_steps', 0) >= phase['total_steps'] - end:
      return (f"{where}[{i}].warmup_steps={phase['warmup_steps']} is not shorter than the "
              f"phase ({phase['total_steps'] - end} steps).")
    end = phase['total_steps']
  return ''
