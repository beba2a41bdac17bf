"""Image, patch and grid sizes: an int for a square, or a (height, width) pair."""

from __future__ import annotations

from collections.abc import Sequence


def pair(x: int | Sequence[int]) -> tuple[int, int]:
  """Returns ``(x, x)`` for an int, ``tuple(x)`` for a pair."""
  if isinstance(x, int):
    return (x, x)
  h, w = x
  return (int(h), int(w))
