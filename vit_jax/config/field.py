"""How a config field is declared (``F(kind, default, allowed, meaning)``: a ``Field``; each
group of them a ``Group``), and a value checked against its declaration: kind, None, range.
``table`` declares every field so."""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from vit_jax.base import errors

# The kinds of value; a trailing '?' (e.g. 'int?') lets the field be None too.
KINDS = {  # kind -> (the Python type the ConfigDict holds, the words for it)
    'int': (int, 'an int'), 'float': (float, 'a number'), 'str': (str, 'a string'),
    'path': (str, 'a path'),  # A string: ~ and $VAR expanded, made absolute (complete).
    'bool': (bool, 'True or False'), 'size': (object, 'an int or a (height, width) pair'),
    'tuple': (tuple, 'a tuple'), 'ints': (tuple, 'a tuple of ints'),
    'strs': (tuple, 'a tuple of strings'), 'evals': (dict, 'named evaluators'),
}
# The types a value may have: a float field takes an int, a tuple field a list (JSON's) too.
_CHECKS = {k: {float: (int, float), tuple: (tuple, list)}.get(t, t) for k, (t, _) in KINDS.items()}
_ITEMS = {'ints': ('int', 'ints'), 'strs': ('str', 'strings')}  # A tuple kind's items.
_INTERVAL = re.compile(r'^([\[(])(-?[\d.e+-]+), (-?[\d.e+-]+)([\])])$')
_BOUND = re.compile(r'^(>=|>|<=|<) (-?[\d.e+-]+)$')


class _Required:
  """The default of a field that has none: a config must set it."""

  def __repr__(self) -> str:
    return 'REQUIRED'


REQUIRED: Any = _Required()


@dataclasses.dataclass(frozen=True)
class Field:
  """One field: its ``kind`` (``KINDS``; 'int?': an int or None), ``default`` (``REQUIRED``:
  none, the config must set it), the values ``allowed`` ('' any; an interval '>= 1', '> 0',
  '[0, 1)', '(0, 1]'; or a tuple of choices; for 'ints', each item's) and its meaning,
  ``doc``. ``why`` follows the message of a value out of range; ``nonempty``: a tuple kind
  needs at least one item."""

  kind: str
  default: Any
  allowed: str | tuple[Any, ...]
  doc: str
  why: str = ''
  nonempty: bool = False
  bounds: tuple[float | None, bool, float | None, bool] = dataclasses.field(
      init=False, repr=False, compare=False)  # (low, low included, high, high included).

  def __post_init__(self):
    assert self.base in KINDS, f'unknown kind {self.kind!r}'
    assert self.doc, 'every field says what it means'
    low, low_in, high, high_in = None, False, None, False
    if isinstance(self.allowed, str) and self.allowed:
      if m := _INTERVAL.match(self.allowed):
        low, high = float(m[2]), float(m[3])
        low_in, high_in = m[1] == '[', m[4] == ']'
      elif m := _BOUND.match(self.allowed):
        if m[1].startswith('>'):
          low, low_in = float(m[2]), m[1] == '>='
        else:
          high, high_in = float(m[2]), m[1] == '<='
      else:
        raise AssertionError(f'cannot read the range {self.allowed!r}')
    object.__setattr__(self, 'bounds', (low, low_in, high, high_in))

  @property
  def base(self) -> str:
    """The kind without its '?'."""
    return self.kind.rstrip('?')

  @property
  def none(self) -> bool:
    """Whether None is allowed."""
    return self.kind.endswith('?')

  @property
  def type(self) -> type:
    """The Python type a ConfigDict holds this field as."""
    return KINDS[self.base][0]

  def problem(self, value: Any) -> str:
    """What is wrong with ``value`` ('' if nothing)."""
    if value is None:
      return '' if self.none else 'cannot be None'
    kind = self.base
    if kind == 'size':
      sides = value if isinstance(value, (tuple, list)) and len(value) == 2 else (value,)
      if all(is_kind('int', v) and v > 0 for v in sides):
        return ''
      return 'is not a positive int or a (height, width) pair of them'
    if not is_kind(kind, value):
      return f'must be {KINDS[kind][1]}, not {type(value).__name__}'
    if kind in _ITEMS:
      item_kind, words = _ITEMS[kind]
      if self.nonempty and not value:
        return f'must hold at least one item{self.why}'
      for item in value:
        if not is_kind(item_kind, item):
          return f'must be a tuple of {words}: {item!r} is not one'
        if problem := self._range(item):
          return f'holds {item!r}: each item {problem}'
      return ''
    return self._range(value)

  def _range(self, value: Any) -> str:
    if isinstance(self.allowed, tuple):
      return '' if value in self.allowed else (
          f'must be one of {", ".join(map(repr, self.allowed))}{self.why}')
    low, low_in, high, high_in = self.bounds
    if low is not None and (value < low or (not low_in and value == low)):
      return f'must be {">=" if low_in else ">"} {low:g}{self.why}'
    if high is not None and (value > high or (not high_in and value == high)):
      return f'must be {"<=" if high_in else "<"} {high:g}{self.why}'
    return ''


F = Field  # The tables' short name.


@dataclasses.dataclass(frozen=True)
class Group:
  """A group of fields (``config.model``), or an evaluator type's: what it is, its fields."""

  doc: str
  fields: dict[str, Field]


def is_kind(kind: str, value: Any) -> bool:
  """Whether ``value`` has the type of ``kind`` (a bool is no int; a 'size' is checked apart)."""
  return isinstance(value, _CHECKS[kind]) and (kind == 'bool' or not isinstance(value, bool))


def did_you_mean(where: str, key: str, names: list[str]) -> str:
  """' Did you mean WHERE.NAME, ...?' for the ``names`` closest to ``key`` ('' if none)."""
  close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
  return f' Did you mean {", ".join(f"{where}.{c}" for c in close)}?' if close else ''


def unknown_field(where: str, key: str, fields: list[str], what: str = 'a config field'
                  ) -> errors.ConfigError:
  """The error for ``where.key`` that is not one of ``fields``: the closest ones named."""
  return errors.ConfigError(f'{where}.{key} is not {what}.{did_you_mean(where, key, fields)} '
                            f'The fields of {where}: {", ".join(sorted(fields))} '
                            '(vit_jax/config/table.py).')
