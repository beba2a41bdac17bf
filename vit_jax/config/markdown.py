"""docs/config.md, written from the declarations (``table``) by ``python -m
vit_jax.config > docs/config.md``: a Markdown table of each group of fields."""

from __future__ import annotations

from vit_jax.config.field import REQUIRED, Field, Group
from vit_jax.config.table import EVAL_COMMON, EVAL_TYPES, FIELDS, MAY_CHANGE_ON_RESUME, PHASE_FIELDS

_KIND = {'size': 'int or (h, w)', 'ints': 'tuple of ints', 'strs': 'tuple of str',
         'evals': 'evaluators', 'path': 'path (~, $VAR expanded; from the current folder)'}


def reference() -> str:
  """Every field as Markdown tables (docs/config.md: ``python -m vit_jax.config``)."""
  lines = [
      '# Config fields', '',
      'Every field of a run\'s `config`, written by `python -m vit_jax.config > docs/config.md` '
      'from the declarations in `vit_jax/config/table.py` (a test keeps the two equal). A '
      'recipe in `configs/` sets what it changes; the command line sets any field with '
      '`--config.FIELD=VALUE`. A kind "or None" may be None; "required": no default, the '
      'config sets it.',
      *_table('## `config`', '', {k: f for k, f in FIELDS.items() if isinstance(f, Field)})]
  for key, group in FIELDS.items():
    if isinstance(group, Group):
      lines += _table(f'## `config.{key}`', group.doc, group.fields, f'{key}.')
  lines += _table('## A phase of `config.schedule.phases`', '', PHASE_FIELDS,
                  'schedule.phases[i].')
  lines += ['', '## On a resume', '',
            'A run resumed in its workdir is the same run: every field keeps the value its '
            '`config.json` records, but for these, which do not change what it trains: '
            + ', '.join(f'`{k}`' for k in MAY_CHANGE_ON_RESUME) + '. `schedule.phases` may '
            'grow (phases added after the recorded ones: a finished run trained further); a '
            'new `total_steps` is refused, as it would recompute the schedule.']
  lines += ['', '## `config.evals`', '',
            'Named evaluators: `config.evals.NAME` is a `type` and that type\'s fields; '
            'a recipe writes what differs from the type\'s defaults (`config.evals.fewshot = '
            'dict(type=\'fewshot\', datasets=(\'digits\',))`) and `config.evals.NAME = None` '
            'removes an entry. On the command line, `--config.evals.NAME.type=TYPE` adds an '
            'entry of that type (or changes an entry\'s type, keeping the fields both types '
            'have) and `--config.evals.NAME=None` removes one.',
            *_table('### Every evaluator', '', EVAL_COMMON, 'evals.NAME.')]
  for name, group in EVAL_TYPES.items():
    lines += _table(f'### `{name}`', group.doc, group.fields, 'evals.NAME.')
  return '\n'.join(lines) + '\n'


def _table(title: str, doc: str, fields: dict[str, Field], prefix: str = '') -> list[str]:
  """A section: its title, what it is (``doc``, if any), a row per field (``prefix`` + key)."""
  return ['', title, '', *([doc, ''] if doc else []),
          '| field | kind | default | allowed | meaning |', '| --- | --- | --- | --- | --- |',
          *(row(prefix + k, f) for k, f in fields.items())]


def row(name: str, field: Field) -> str:
  """A field's line of a table: name, kind, default, allowed, meaning."""
  kind = _KIND.get(field.base, field.base) + (' or None' if field.none else '')
  default = 'required' if field.default is REQUIRED else f'`{field.default!r}`'
  allowed = (', '.join(f'`{c!r}`' for c in field.allowed) if isinstance(field.allowed, tuple)
             else field.allowed)
  if field.nonempty:
    allowed = 'non-empty' + (f'; each {allowed}' if allowed else '')
  cells = (f'`{name}`', kind, default, allowed, field.doc)
  return '| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |'
