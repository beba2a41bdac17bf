"""How a config field is declared: its kind, default, allowed values and meaning in one call.

``vit_jax/config/__init__.py`` declares every field with ``F`` (and each group of fields with
``Group``); the config, its checks, the command line's typing and docs/config.md are all read
from those declarations, so nothing is written twice.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# The kinds of value; a trailing '?' (e.g. 'int?') lets the field be None too.
KINDS = {  # kind -> (the Python type the ConfigDict holds, the words for it)
    'int': (int, 'an int'), 'float': (float, 'a number'), 'str': (str, 'a string'),
    'path': (str, 'a path'),  # A string: ~ and $VAR expanded, made absolute (config.complete).
    'bool': (bool, 'True or False'), 'size': (object, 'an int or a (height, width) pair'),
    'tuple': (tuple, 'a tuple'), 'ints': (tuple, 'a tuple of ints'),
    'strs': (tuple, 'a tuple of strings'), 'evals': (dict, 'named evaluators'),
}
_CHECKS = {'int': int, 'float': (int, float), 'str': str, 'path': str, 'bool': bool,
           'tuple': (tuple, list), 'ints': (tuple, list), 'strs': (tuple, list)}
_ITEMS = {'ints': (int, 'ints'), 'strs': (str, 'strings')}  # A tuple kind's items.
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
    low = high = None
    low_in = high_in = False
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
      if all(_is_int(v) and v > 0 for v in sides):
        return ''
      return 'is not a positive int or a (height, width) pair of them'
    if not isinstance(value, _CHECKS[kind]) or (isinstance(value, bool) and kind != 'bool'):
      return f'must be {KINDS[kind][1]}, not {type(value).__name__}'
    if kind in _ITEMS:
      item_type, words = _ITEMS[kind]
      if self.nonempty and not value:
        return f'must hold at least one item{self.why}'
      for item in value:
        if not isinstance(item, item_type) or isinstance(item, bool):
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

  def row(self, name: str) -> str:
    """This field's line of a Markdown table: name, kind, default, allowed, meaning."""
    kind = {'size': 'int or (h, w)', 'ints': 'tuple of ints', 'strs': 'tuple of str',
            'evals': 'evaluators', 'path': 'path (~, $VAR expanded; from the current folder)'
            }.get(self.base, self.base)
    kind += ' or None' if self.none else ''
    default = 'required' if self.default is REQUIRED else f'`{self.default!r}`'
    allowed = (', '.join(f'`{c!r}`' for c in self.allowed) if isinstance(self.allowed, tuple)
               else self.allowed)
    if self.nonempty:
      allowed = 'non-empty' + (f'; each {allowed}' if allowed else '')
    cells = (f'`{name}`', kind, default, allowed, self.doc)
    return '| ' + ' | '.join(c.replace('|', '\\|') for c in cells) + ' |'


F = Field  # The tables' short name.


@dataclasses.dataclass(frozen=True)
class Group:
  """A group of fields (``config.model``), or an evaluator type's: what it is, its fields."""

  doc: str
  fields: dict[str, Field]


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)
