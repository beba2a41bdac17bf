"""The run's config: every field declared once, the config made from the declarations, checked
by them, typed on the command line by them and printed from them. One job a module:

- ``field``: how a field is declared (``Field``, ``Group``) and a value checked against it;
- ``table``: the declarations (``FIELDS``, ``EVAL_TYPES``, ``PHASE_FIELDS``, ...);
- ``defaults``: the config a recipe starts from (``get_config``), a recipe's or a config.json's
  values laid over it (``complete``);
- ``rules``: a complete config checked, field by field and across fields (``check``; a
  warm-up against the run's length, ``warmup_problem``, also where epochs are counted);
- ``cli``: ``--config=FILE --config.FIELD=VALUE``;
- ``markdown``: docs/config.md (``reference``; ``python -m vit_jax.config``).

The names below are the package's, as callers write them (``from vit_jax import config as
config_lib``; a recipe's ``config_lib.get_config()``). The modules import one another, never
this package, so that these re-exports make no cycle (tests/test_layers.py).
"""

from vit_jax.config.defaults import (
    complete,
    complete_eval,
    convert_old_evals,
    eval_defaults,
    get_config,
    model_options,
    phases,
)
from vit_jax.config.field import REQUIRED, Field, Group, unknown_field
from vit_jax.config.markdown import reference
from vit_jax.config.rules import check, warmup_problem
from vit_jax.config.table import (
    DECLARED,
    EVAL_COMMON,
    EVAL_TYPES,
    FIELDS,
    MAY_CHANGE_ON_RESUME,
    PHASE_FIELDS,
    eval_fields,
    flatten,
)

__all__ = [
    'DECLARED', 'EVAL_COMMON', 'EVAL_TYPES', 'FIELDS', 'MAY_CHANGE_ON_RESUME', 'PHASE_FIELDS',
    'REQUIRED', 'Field', 'Group', 'check', 'complete', 'complete_eval', 'convert_old_evals',
    'eval_defaults', 'eval_fields', 'flatten', 'get_config', 'model_options', 'phases',
    'reference', 'unknown_field', 'warmup_problem']
