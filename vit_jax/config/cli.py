r"""The ``--config`` flag of the entry points: a recipe file, then ``--config.FIELD=VALUE``.

    python -m vit_jax.main --config=configs/quickstart.py --workdir=/tmp/q \
        --config.batch_size=256 --config.model.image_size='(16, 24)' --config.model.pool=None

``--config=FILE:ARG`` calls the file's ``get_config(ARG)``; the recipe is completed from the base
config, then each override is read as a Python literal and checked against its field's kind
(``vit_jax.config``; ``--config.evals.NAME.type=TYPE`` adds an evaluator, ``=None`` removes one:
docs/config.md). A bad one is an ``errors.ConfigError``, which ``run`` prints as one line. An
entry point defines ``_CONFIG = cli.DEFINE_config('config', ...)``, reads ``_CONFIG.value`` in
its ``main`` and ends with ``cli.run(main)``.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
from absl import flags

from vit_jax.base import errors, paths
from vit_jax.config import defaults, rules, table
from vit_jax.config.field import Field, did_you_mean, is_kind, unknown_field

# --NAME.a.b=VALUE, --NAME.a.b (True) or --noNAME.a.b (False).
_OVERRIDE = re.compile(r'^--?(no)?([A-Za-z_]\w*)\.([\w.]+)(?:=(.*))?$', re.DOTALL)


class ConfigFlag:
  """A ``--NAME=FILE`` flag and its ``--NAME.FIELD=VALUE`` overrides."""

  def __init__(self, name: str, help_string: str):
    self.name = name
    self.file = paths.DEFINE_path(name, None, help_string + ' Fields are overridden with '
                                    f'--{name}.FIELD=VALUE (vit_jax/config/table.py).')
    self.overrides: list[tuple[str, str | None]] = []  # (field path, text), set by parse_flags.

  @property
  def value(self) -> ml_collections.ConfigDict:
    """The recipe of ``--NAME`` with the overrides applied, locked; loaded at each read."""
    return load(self.file.value, self.overrides, flag=self.name)


_DEFINED: dict[str, ConfigFlag] = {}


def DEFINE_config(name: str = 'config', help_string: str = 'Config file.') -> ConfigFlag:  # noqa: N802
  """Defines ``--NAME`` (a recipe file) and its overrides; read ``.value`` in main."""
  _DEFINED[name] = ConfigFlag(name, help_string)
  return _DEFINED[name]


def parse_flags(argv: list[str]) -> list[str]:
  """``app.run``'s flag parser: the overrides are taken out, absl parses the rest."""
  argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
  for flag in _DEFINED.values():
    flag.overrides = []
  rest = argv[:1]
  for i, arg in enumerate(argv[1:], 1):
    if arg == '--':
      rest += argv[i:]
      break
    match = _OVERRIDE.match(arg)
    if match and match.group(2) in _DEFINED and not (match.group(1) and match.group(4)):
      negated, name, field, text = match.groups()
      _DEFINED[name].overrides.append((field, 'false' if negated else text))
    else:
      rest.append(arg)
  return errors.parse_flags(rest)


def run(main: Callable[[list[str]], Any], arguments: bool = True) -> None:
  """``app.run(main)`` with these overrides and user errors as one line (``errors.run``)."""
  errors.run(main, arguments, flags_parser=parse_flags)


def load(path: str | None, overrides: Sequence[tuple[str, str | None]] = (), *,
         flag: str = 'config') -> ml_collections.ConfigDict:
  """The ``get_config()`` of the file at ``path``, with ``overrides`` (field path, text)."""
  if not path:
    raise errors.ConfigError(f'--{flag} is required: a config file, e.g. '
                             f'--{flag}=configs/quickstart.py.')
  path, colon, argument = path.partition(':')  # FILE:ARG: get_config(ARG).
  if not path.endswith('.py'):
    raise errors.ConfigError(f'--{flag}={path} is not a Python config file (configs/*.py).')
  spec = importlib.util.spec_from_file_location('config_file', path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except FileNotFoundError:
    raise errors.MissingFileError(f'--{flag}={path} does not exist (the recipes are in '
                                  'configs/, e.g. configs/quickstart.py).') from None
  if not hasattr(module, 'get_config'):
    raise errors.ConfigError(f'--{flag}={path} has no get_config() function.')
  args = (argument,) if colon else ()
  try:
    inspect.signature(module.get_config).bind(*args)
  except TypeError:
    fix = (f'no argument: use --{flag}={path}.' if colon else
           f'an argument: --{flag}={path}:ARG (the file says which).')
    raise errors.ConfigError(f'--{flag}={path}{colon}{argument}: its get_config() takes '
                             f'{fix}') from None
  try:
    config = module.get_config(*args)
  except (ValueError, KeyError) as e:  # The file's own check of its argument, or a field.
    raise errors.ConfigError(f'--{flag}={path}{colon}{argument}: {e}') from None
  # Completed first (each evaluator from its type's defaults), so that an override reaches
  # every field, a recipe's partial evaluators' too.
  config = apply_overrides(defaults.complete(config), overrides, flag=flag)
  given = {field.removeprefix('model.') for field, _ in overrides if field.startswith('model.')}
  if problem := rules.name_contradiction(config.model, given, path):
    raise errors.ConfigError(problem)
  return config


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Sequence[tuple[str, str | None]], *,
                    flag: str = 'config') -> ml_collections.ConfigDict:
  """``config`` (complete) with ``overrides`` (field path, command-line text) set, each typed
  by its declaration (``table``); then locked. The overrides that add, remove or
  retype an evaluator (``evals.NAME=None``, ``evals.NAME.type=TYPE``) go first, so that
  its fields can be set in any order."""
  with config.unlocked():  # Evaluators are added and removed (load's config is locked).
    for field, text in sorted(overrides, key=lambda o: not _EVAL_ENTRY.match(o[0])):
      *parents, key = field.split('.')
      if parents[:1] == ['evals']:
        _set_eval(config.evals, parents[1:] + [key], text, flag)
        continue
      node, where = config, flag
      for part in parents:
        _check_field(node, part, where)
        node, where = node[part], f'{where}.{part}'
        if not isinstance(node, ml_collections.ConfigDict):
          raise errors.ConfigError(f'--{flag}.{field}: {where} is a single value, not a group '
                                   'of fields.')
      _set(node, key, text, where, flag)
  config.lock()
  return config


_EVAL_ENTRY = re.compile(r'^evals\.[^.]+(\.type)?$')


def _check_field(node: ml_collections.ConfigDict, key: str, where: str) -> None:
  if key not in node:
    raise unknown_field(where, key, list(node))


def _set(node: ml_collections.ConfigDict, key: str, text: Any, where: str, flag: str,
         fields: dict[str, Field] | None = None) -> None:
  """Sets ``node[key]`` from ``text`` (a command-line string, or a value in a dict literal),
  typed by its declaration in ``fields`` (default: the base config's)."""
  field = f'{where}.{key}'
  if where == f'{flag}.evals':
    _set_eval(node, [key], text, flag)
    return
  _check_field(node, key, where)
  current = node[key]
  if isinstance(current, ml_collections.ConfigDict):
    value = _literal(text)
    if not isinstance(value, dict):
      raise errors.ConfigError(f'{field} is a group of fields: set them one by one '
                               f'(--{field}.{next(iter(current), "FIELD")}=...) or as a dict.')
    for k, v in value.items():
      _set(current, str(k), v, field, flag, fields)
    return
  kind = (table.DECLARED[field.partition('.')[2]] if fields is None else fields[key]).base
  if text is None:
    if kind != 'bool':
      raise errors.ConfigError(f'--{field} needs a value: --{field}=VALUE.')
    text = 'true'
  node[key] = _coerce(kind, text, field)


def _set_eval(evals: ml_collections.ConfigDict, parts: list[str], text: Any, flag: str) -> None:
  """``--FLAG.evals.NAME...``: removes (``=None``), replaces (``={'type': ...}``), adds or
  retypes (``.type=TYPE``) the evaluator NAME, or sets one of its fields."""
  name, *rest = parts
  where = f'{flag}.evals.{name}'
  if not rest:
    value = _literal(text)
    if value is None or text in ('None', 'none'):
      _entry(evals, name, where, flag)
      del evals[name]
    elif isinstance(value, dict):
      evals[name] = defaults.complete_eval(value, where)
    else:
      raise errors.ConfigError(f'{where} is an evaluator: set its fields one by one '
                               f'(--{where}.FIELD=...), add one with --{where}.type=TYPE, or '
                               f'remove it with --{where}=None.')
    return
  key, *deeper = rest
  if deeper:
    raise errors.ConfigError(f'--{flag}.evals.{".".join(parts)}: {where}.{key} is a single '
                             'value, not a group of fields.')
  if key == 'type':
    kind = _coerce('str', text, f'{where}.type')
    fields = table.eval_fields(kind, where)
    entry = evals[name].to_dict() if name in evals else {}
    if entry.get('type') != kind:  # Added, or retyped: the fields both types have kept.
      evals[name] = defaults.eval_defaults(kind) | {
          k: v for k, v in entry.items() if k in fields and k != 'type'}
    return
  entry = _entry(evals, name, where, flag)
  fields = table.eval_fields(entry.type)
  if key not in fields:
    raise unknown_field(where, key, list(fields), what=f'a field of {entry.type!r} evaluators')
  if key not in entry:  # A required field, not set yet.
    entry[key] = None
  _set(entry, key, text, where, flag, fields)


def _entry(evals: ml_collections.ConfigDict, name: str, where: str,
           flag: str) -> ml_collections.ConfigDict:
  """The evaluator ``name``, or a ConfigError naming the config's evaluators."""
  if name not in evals:
    raise errors.ConfigError(
        f'{where} is not an evaluator of this config.'
        f'{did_you_mean(f"{flag}.evals", name, list(evals))} Its evaluators: '
        f'{", ".join(evals) or "none"}; add one with --{where}.type=TYPE '
        f'({", ".join(table.EVAL_TYPES)}).')
  return evals[name]


def _literal(text: Any) -> Any:
  if not isinstance(text, str):
    return text
  try:
    return ast.literal_eval(text)
  except (SyntaxError, ValueError):
    return text  # A bare string: --config.model.name=b16.


_EXPECTED = {  # The kinds whose type the text must have: in words, and an example.
    'int': ('an int', '8'), 'float': ('a number', '0.001'), 'bool': ('true or false', 'true'),
    'tuple': ('a tuple', '(16, 24)'), 'ints': ('a tuple', '(1, 5)'),
    'strs': ('a tuple', "\"('cifar100',)\"")}


def _coerce(kind: str, text: Any, field: str) -> Any:
  """``text`` as a value of the declared ``kind`` (``vit_jax.config.field.KINDS``), or a
  ConfigError naming the field: ``None`` unsets a field, ``(16, 24)`` or ``[16, 24]`` is a
  tuple (or an int-or-pair size), ``true`` / ``false`` a bool (as ``--config.F`` /
  ``--noconfig.F``), and a string field takes the text as it is."""
  if text in ('None', 'none', None):
    return None
  value = _literal(text)
  if kind == 'str':
    return value if isinstance(value, str) else str(text)
  if kind == 'path':  # As a shell would have expanded it, but does not after --FLAG=.
    return paths.expand(text if isinstance(text, str) else str(value))
  if kind == 'bool' and isinstance(value, str) and value.lower() in ('true', 'false'):
    value = value.lower() == 'true'
  if kind in _EXPECTED and not is_kind(kind, value):
    words, example = _EXPECTED[kind]
    raise errors.ConfigError(f'{field}={text!r} is not {words}: e.g. --{field}={example}.')
  if kind == 'float':
    return float(value)
  return tuple(value) if isinstance(value, list) else value
