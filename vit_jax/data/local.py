"""The local sharded format, the project's answer to JFT: ArrayRecord shards and a metadata file.

A dataset is a directory of ``SPLIT-NNNNN-of-NNNNN.array_record`` shards (random access to any
example, read by grain) and ``metadata.json``: the format version, the classes, whether it is
multi-label, each split's example count and each shard's name, count, size and SHA-256, and the
source files the converter skipped. Readers hold only the metadata. A record is ``b'VJ1'`` +
uint32 header length + JSON header (labels, the example's key) + the image in its source
encoding (JPEG, PNG), so converting copies bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from typing import Any

import numpy as np
from etils import epath

FORMAT_VERSION = 1
METADATA = 'metadata.json'
_MAGIC = b'VJ1'


def encode_record(image_bytes: bytes, labels: list[int], key: str) -> bytes:
  header = json.dumps({'labels': labels, 'key': key}).encode()
  return _MAGIC + struct.pack('<I', len(header)) + header + image_bytes


def decode_record(record: bytes) -> tuple[dict[str, Any], bytes]:
  """(header, image bytes) of a record."""
  if record[:3] != _MAGIC:
    raise ValueError('not a vit_jax record (bad magic): the shard is corrupt or foreign.')
  (length,) = struct.unpack('<I', record[3:7])
  return json.loads(record[7:7 + length]), record[7 + length:]


def shard_name(split: str, index: int, count: int) -> str:
  return f'{split}-{index:05d}-of-{count:05d}.array_record'


def sha256(path: epath.Path) -> str:
  digest = hashlib.sha256()
  with path.open('rb') as f:
    while chunk := f.read(1 << 22):
      digest.update(chunk)
  return digest.hexdigest()


def read_metadata(directory: str | epath.PathLike) -> dict[str, Any]:
  path = epath.Path(directory) / METADATA
  if not path.exists():
    raise FileNotFoundError(f'{directory} is not a vit_jax dataset: no {METADATA}. Convert '
                            'the data first: python -m vit_jax.data.convert --source=... '
                            f'--out={directory}')
  metadata = json.loads(path.read_text())
  if metadata.get('format_version') != FORMAT_VERSION:
    raise ValueError(f'{path}: format version {metadata.get("format_version")}, this vit_jax '
                     f'reads version {FORMAT_VERSION}.')
  return metadata


def verify(directory: str | epath.PathLike, checksums: bool = True) -> None:
  """Checks that every shard exists with its size (and, if asked, its SHA-256)."""
  directory = epath.Path(directory)
  for split, info in read_metadata(directory)['splits'].items():
    for shard in info['shards']:
      path = directory / shard['file']
      if not path.exists():
        raise FileNotFoundError(f'{path} is missing (split {split!r}).')
      size = path.stat().length
      if size != shard['bytes']:
        raise ValueError(f'{path} has {size} bytes, the metadata says {shard["bytes"]}: '
                         'the shard is truncated or was replaced. Convert again.')
      if checksums and sha256(path) != shard['sha256']:
        raise ValueError(f'{path}: SHA-256 mismatch, the shard is corrupt. Convert again.')


@dataclasses.dataclass
class LocalSource:
  """One split of a local dataset; ``source[i]`` -> {'image', 'label', 'key'}.

  The image is the stored encoded bytes (the preprocessing pipeline's ``decode``
  op decodes it, 16-bit images scaled to 8 bits); labels are a class index for
  single-label data, a multi-hot float32 vector for multi-label data, -1 for unlabelled
  data (``num_classes`` 0: images only, for self-supervised pre-training); the key is the
  source path. Opening checks every shard's presence and size.
  """

  directory: str
  split: str

  def __post_init__(self):
    import grain

    metadata = read_metadata(self.directory)
    if self.split not in metadata['splits']:
      raise ValueError(f'{self.directory} has no split {self.split!r}; it has '
                       f'{sorted(metadata["splits"])}.')
    verify(self.directory, checksums=False)
    info = metadata['splits'][self.split]
    self.num_classes = int(metadata['num_classes'])
    self.class_names = tuple(metadata['class_names'])
    self.multi_label = bool(metadata['multi_label'])
    self.num_examples = int(info['num_examples'])
    paths = [str(epath.Path(self.directory) / s['file']) for s in info['shards']]
    self._records = grain.sources.ArrayRecordDataSource(paths)
    if len(self._records) != self.num_examples:
      raise ValueError(f'{self.directory}/{self.split}: the shards hold {len(self._records)} '
                       f'records, the metadata says {self.num_examples}.')

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, Any]:
    header, image = decode_record(self._records[int(index)])
    labels = header['labels']
    if not self.num_classes:
      label = -1
    elif self.multi_label:
      label = np.zeros(self.num_classes, np.float32)
      label[labels] = 1.
    else:
      label = labels[0]
    return {'image': image, 'label': label, 'key': header['key']}
