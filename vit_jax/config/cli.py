r"""The ``--config`` flag of the entry points: a recipe file, then ``--config.FIELD=VALUE``.

    python -m vit_jax.main --config=configs/quickstart.py --workdir=/tmp/q \
        --config.batch_size=256 --config.model.image_size='(16, 24)' --config.model.pool=None

``--config=FILE:ARG`` calls the file's ``get_config(ARG)``
(``configs/vit_b16_finetune.py:cifar10``). A value is read as a Python literal
and checked against the field's type in the recipe (``vit_jax.config``):
``(16, 24)`` or ``[16, 24]`` for a tuple field or an int-or-pair one
(``model.image_size``), ``None`` to unset a field, ``true`` / ``false`` (or
``--config.F`` / ``--noconfig.F``) for booleans; a string field takes the text as
it is. An unknown field (named with the closest valid ones), a value of the wrong
type or a missing value is an ``errors.ConfigError``; ``run`` prints it as one line.

An entry point::

    _CONFIG = config_cli.DEFINE_config('config', 'Training config file.')

    def main(argv):
      config = _CONFIG.value  # The recipe, overrides applied (a ConfigError if one is bad).

    if __name__ == '__main__':
      config_cli.run(main)
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

from vit_jax import config as config_lib
from vit_jax.base import errors

# --NAME.a.b=VALUE, --NAME.a.b (True) or --noNAME.a.b (False).
_OVERRIDE = re.compile(r'^--?(no)?([A-Za-z_]\w*)\.([\w.]+)(?:=(.*))?$', re.DOTALL)
_KINDS = {int: 'an int', float: 'a number', bool: 'true or false', tuple: 'a tuple'}
_EXAMPLES = {int: '8', float: '0.001', bool: 'true', tuple: '(16, 24)'}


class ConfigFlag:
  """A ``--NAME=FILE`` flag and its ``--NAME.FIELD=VALUE`` overrides."""

  def __init__(self, name: str, help_string: str):
    self.name = name
    self.file = flags.DEFINE_string(name, None, help_string + ' Fields are overridden with '
                                    f'--{name}.FIELD=VALUE (vit_jax/config/__init__.py).')
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


def run(main: Callable[[list[str]], Any]) -> None:
  """``app.run(main)`` with these overrides and user errors as one line (``errors.run``)."""
  errors.run(main, flags_parser=parse_flags)


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
  return apply_overrides(config, overrides, flag=flag)


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Sequence[tuple[str, str | None]], *,
                    flag: str = 'config') -> ml_collections.ConfigDict:
  """``config`` with ``overrides`` (field path, command-line text) set, typed; then locked."""
  for field, text in overrides:
    *parents, key = field.split('.')
    node, where = config, flag
    for part in parents:
      _check_field(node, part, where)
      node, where = node[part], f'{where}.{part}'
      if not isinstance(node, ml_collections.ConfigDict):
        raise errors.ConfigError(f'--{flag}.{field}: {where} is a single value, not a group of '
                                 'fields.')
    _set(node, key, text, where)
  config.lock()
  return config


def _check_field(node: ml_collections.ConfigDict, key: str, where: str) -> None:
  if key not in node:
    raise config_lib.unknown_field(where, key, list(node))


def _set(node: ml_collections.ConfigDict, key: str, text: Any, where: str) -> None:
  """Sets ``node[key]`` from ``text`` (a command-line string, or a value in a dict literal)."""
  _check_field(node, key, where)
  field = f'{where}.{key}'
  declared, current = node.get_type(key), node[key]
  if isinstance(current, ml_collections.ConfigDict):
    value = _literal(text)
    if not isinstance(value, dict):
      raise errors.ConfigError(f'{field} is a group of fields: set them one by one '
                               f'(--{field}.{next(iter(current), "FIELD")}=...) or as a dict.')
    for k, v in value.items():
      _set(current, str(k), v, field)
    return
  if text is None:
    if declared is not bool:
      raise errors.ConfigError(f'--{field} needs a value: --{field}=VALUE.')
    text = 'true'
  node[key] = _coerce(declared, text, field)


def _literal(text: Any) -> Any:
  if not isinstance(text, str):
    return text
  try:
    return ast.literal_eval(text)
  except (SyntaxError, ValueError):
    return text  # A bare string: --config.model.name=b16.


def _coerce(declared: type, text: Any, field: str) -> Any:
  """``text`` as a value of the ``declared`` type, or a ConfigError naming the field."""
  if text in ('None', 'none', None):
    return None
  if declared is str:
    value = _literal(text)
    return value if isinstance(value, str) else str(text)
  value = _literal(text)
  if declared is bool and isinstance(value, str) and value.lower() in ('true', 'false'):
    value = value.lower() == 'true'
  ok = {bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        tuple: lambda v: isinstance(v, (tuple, list))}.get(declared, lambda v: True)
  if not ok(value):
    raise errors.ConfigError(f'{field}={text!r} is not {_KINDS[declared]}: e.g. '
                             f'--{field}={_EXAMPLES[declared]}.')
  if declared is float:
    return float(value)
  return tuple(value) if isinstance(value, list) else value
