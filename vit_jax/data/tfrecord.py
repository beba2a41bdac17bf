"""Random access to TFDS datasets prepared as TFRecord files: an index of record offsets.

TFRecord, TFDS's default format, is a stream: record ``i`` is found only by reading the headers
of the records before it. So each shard's headers are walked once (header to header on a local
disk, in large chunks on ``gs://``) and the offsets cached (``cache_dir``, keyed by ``cache_key``,
checked by ``_still_fits`` so a rewritten shard is indexed again) and checked against TFDS's
record counts and the shard's size. Then ``source[i]`` is one read at a known offset, and the
loader's permutation by index (its exact resume) works as on ArrayRecord.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from etils import epath

_HEADER = struct.Struct('<QI')  # Length, masked CRC of the length.
_FOOTER = 4  # Masked CRC of the data.
_CHUNK = 16 << 20


def cache_dir() -> epath.Path:
  return epath.Path(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')) / \
      'vit_jax' / 'tfrecord_offsets'


def _walk(f: Any, size: int, chunk: int) -> list[int]:
  """The offsets of the records of an open TFRecord file of ``size`` bytes, read ``chunk``
  bytes at a time: a header's size hops from header to header, more parses them from memory."""
  offsets, position = [], 0
  buffer, start = b'', 0  # The file's bytes [start, start + len(buffer)).
  while position < size:
    if position + _HEADER.size > start + len(buffer):
      if position > start + len(buffer):  # The next header is past the bytes read.
        f.seek(position)
        buffer = b''
      buffer, start = buffer[position - start:] + f.read(chunk), position
      if position + _HEADER.size > start + len(buffer):
        break
    length, _ = _HEADER.unpack_from(buffer, position - start)
    offsets.append(position)
    position += _HEADER.size + length + _FOOTER
  if position != size:
    raise ValueError(f'is not a complete TFRecord file: its records end at byte {position}, '
                     f'the file has {size} bytes')
  return offsets


def cache_key(path: epath.Path) -> tuple[str, int]:
  """(key of the cached index of ``path``, its size): a new key whenever the file is
  replaced or rewritten (path, size, modification time in ns, inode and device; the
  object's path, size and modification time on a remote store)."""
  if '://' in str(path):
    stat = path.stat()
    size, ident = stat.length, f'{path}:{stat.length}:{stat.mtime}'
  else:
    stat = os.stat(path)
    size = stat.st_size
    ident = (f'{os.path.abspath(path)}:{size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:'
             f'{stat.st_ino}:{stat.st_dev}')
  return hashlib.sha256(ident.encode()).hexdigest()[:32], size


def _still_fits(path: epath.Path, offsets: np.ndarray, size: int, checks: int = 8) -> bool:
  """Whether the headers at ``checks`` cached offsets (the last one among them) give the
  offsets after them: a cheap check that the file is still the one indexed."""
  if not len(offsets) or offsets[0] != 0:
    return False
  ends = np.append(offsets[1:], size)
  with path.open('rb') as f:
    for i in sorted({*np.linspace(0, len(offsets) - 1, checks).astype(int).tolist()}):
      f.seek(int(offsets[i]))
      header = f.read(_HEADER.size)
      if (len(header) < _HEADER.size
          or offsets[i] + _HEADER.size + _HEADER.unpack(header)[0] + _FOOTER != ends[i]):
        return False
  return True


def record_offsets(path: str | os.PathLike, sequential: bool | None = None) -> np.ndarray:
  """The byte offset of every record of the TFRecord file ``path`` (cached)."""
  path = epath.Path(path)
  key, size = cache_key(path)
  cached = cache_dir() / f'{key}.npy'
  if cached.exists():
    with cached.open('rb') as f:
      offsets = np.load(f)
    if _still_fits(path, offsets, size):
      return offsets
  if sequential is None:
    sequential = '://' in str(path)
  try:
    with path.open('rb') as f:
      offsets = np.asarray(_walk(f, size, _CHUNK if sequential else _HEADER.size), np.int64)
  except (ValueError, struct.error) as e:
    raise ValueError(f'{path} {e}.') from None
  cached.parent.mkdir(parents=True, exist_ok=True)
  tmp = cached.parent / f'.{cached.name}.tmp-{os.getpid()}-{threading.get_ident()}'
  with tmp.open('wb') as f:
    np.save(f, offsets)
  tmp.replace(cached)  # Atomic: another process may have written the same file.
  return offsets


class Records:
  """The records of TFDS file instructions, by index: ``len``, ``[i]`` -> bytes.

  ``instructions`` are TFDS ``FileInstruction``s (file, skip, take, examples in the
  shard), in the split's order; the shards are indexed in parallel threads.
  """

  def __init__(self, instructions: Sequence[Any], workers: int = 16):
    self.files = [epath.Path(i.filename) for i in instructions]

    def index(instruction: Any) -> np.ndarray:
      offsets = record_offsets(instruction.filename)
      if len(offsets) != instruction.examples_in_shard:
        raise ValueError(f'{instruction.filename} holds {len(offsets)} records, the '
                         f'dataset info says {instruction.examples_in_shard}.')
      # Each record's (offset, length): the length of the last one from the file's size.
      ends = np.append(offsets[1:], epath.Path(instruction.filename).stat().length)
      taken = slice(instruction.skip, instruction.skip + instruction.take)
      return np.stack([offsets[taken], ends[taken] - offsets[taken]], axis=1)

    with ThreadPoolExecutor(max(1, min(workers, len(instructions)))) as pool:
      self.spans = list(pool.map(index, instructions))
    self.starts = np.cumsum([0] + [len(s) for s in self.spans])

  def __len__(self) -> int:
    return int(self.starts[-1])

  def __getitem__(self, index: int) -> bytes:
    if not 0 <= index < len(self):
      raise IndexError(f'record {index} of {len(self)}')
    shard = int(np.searchsorted(self.starts, index, side='right')) - 1
    offset, length = (int(x) for x in self.spans[shard][index - self.starts[shard]])
    # Opened per read: thread-safe, and no file handles held (ImageNet has 1,024 shards).
    with self.files[shard].open('rb') as f:
      f.seek(offset + _HEADER.size)
      return f.read(length - _HEADER.size - _FOOTER)


class TFRecordSource:
  """A TFDS dataset prepared as TFRecord: ``len``, ``[i]`` -> the decoded example.

  Decoded as ``builder.as_data_source`` decodes ArrayRecord (the features'
  ``deserialize_example_np``, no TensorFlow), over ``Records``.
  """

  def __init__(self, builder: Any, split: str):
    self.records = Records(builder.info.splits[split].file_instructions)
    self.features = builder.info.features

  def __len__(self) -> int:
    return len(self.records)

  def __getitem__(self, index: int) -> Any:
    return self.features.deserialize_example_np(self.records[index])
