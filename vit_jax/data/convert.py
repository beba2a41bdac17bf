r"""Converts image datasets into the local sharded format (``vit_jax.data.local``).

    python -m vit_jax.data.convert --source=DIR_OR_FILE --out=DIR [--shards=N] [--kind=KIND]

Sources (``--kind=auto`` recognises them): a folder of ``SPLIT/CLASS/*.jpg`` (without class
folders: unlabelled images, for self-supervised pre-training), MNIST-style IDX files, a CSV or
JSON-lines manifest (several labels an image: multi-label), or ImageNet-21k's ``WNID.tar`` files.
Each image is decoded once, in parallel, and stored in its own encoding; an undecodable or
oversized image is skipped and listed in the metadata. The output is written to ``OUT.tmp`` and
renamed when complete, so re-running is safe. The formats in detail: docs/data.md.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator
from typing import Any

from absl import flags
from etils import epath
from PIL import Image

from vit_jax.base import console, errors, paths
from vit_jax.data import local, sources

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp')
MAX_PIXELS = Image.MAX_IMAGE_PIXELS  # PIL's decompression-bomb limit: 89,478,485 (~9459^2).

# An item to convert: (split, key, labels, payload). The payload is a path to read,
# encoded bytes, or a uint8 array (IDX) to encode as PNG.
Item = tuple[str, str, list[int], Any]


def detect_kind(source: epath.Path) -> str:
  if not source.exists():
    raise FileNotFoundError(f'The source {source} does not exist.')
  if source.is_file():
    if source.suffix in ('.csv', '.jsonl', '.json'):
      return 'manifest'
    raise ValueError(f'{source}: a file source must be a .csv or .jsonl manifest.')
  names = [p.name for p in source.iterdir()]
  if any(n.endswith('.tar') for n in names):
    return 'i21k'
  if any('-idx3-ubyte' in n for n in names):
    return 'idx'
  return 'folder'


def _folder(path: epath.Path, role: str) -> epath.Path:
  """``path`` if it is a directory that is not a link back to itself or a parent."""
  try:
    target = os.path.realpath(path, strict=True) if os.path.islink(path) else None
  except (OSError, RuntimeError) as e:  # ELOOP: a link to a link ... to itself.
    raise errors.DataError(f'{path}: the {role} folder is a symbolic link that cannot be '
                           f'followed ({e}). Replace it with the folder itself.') from None
  if target and os.path.commonpath([target, os.path.realpath(path.parent)]) == target:
    raise errors.DataError(f'{path}: the {role} folder is a symbolic link to {target}, which '
                           'holds it: a loop. Replace it with the folder itself.')
  if not path.is_dir():
    raise errors.DataError(f'{path} is not a folder: in a folder source every entry of '
                           f'SPLIT/ is a {role} folder. Move it out of {path.parent}.')
  return path


def _hash_split(key: str, val_fraction: float, seed: int) -> str:
  """'validation' for a ``val_fraction`` share of keys, by a hash of the key, else 'train'."""
  h = int.from_bytes(hashlib.sha256(f'{seed}:{key}'.encode()).digest()[:8], 'little')
  return 'validation' if h / 2**64 < val_fraction else 'train'


def _visible(folder: epath.Path) -> list[epath.Path]:
  return sorted(p for p in folder.iterdir() if not p.name.startswith('.'))


def scan_folder(source: epath.Path, val_fraction: float = 0.02,
                seed: int = 0) -> tuple[list[str], Iterator[Item], int | None]:
  """SPLIT/CLASS/images; a class entry that is not a folder, or a link loop, is refused.

  Unlabelled (no class): SPLIT/images for every split, or images in ``source`` itself
  (split by ``val_fraction``). A split of both images and folders, or labelled and
  unlabelled splits side by side, is refused: which images have which class is unclear.
  """
  entries = _visible(source)
  dirs = [p for p in entries if p.is_dir() or os.path.islink(p)]
  images = [p for p in entries if p not in dirs and p.suffix.lower() in IMAGE_SUFFIXES]
  if images and dirs:
    raise errors.DataError(
        f'{source} holds both images ({images[0].name}, ...) and folders ({dirs[0].name}, '
        '...): use SPLIT/CLASS/ folders (labelled), SPLIT/ folders of images, or only images '
        '(unlabelled). Move one or the other out.')
  if images:  # One unlabelled folder: split by a hash of each name.
    return [], ((_hash_split(p.name, val_fraction, seed), p.name, [], str(p))
                for p in images), len(images)
  splits = dirs
  if not splits:
    raise errors.DataError(f'{source} holds no SPLIT/CLASS/ folders and no images.')
  unlabelled = {split: all(not (p.is_dir() or os.path.islink(p))
                           for p in _visible(_folder(split, 'split')))
                for split in splits}
  if all(unlabelled.values()):
    return [], ((s.name, f'{s.name}/{p.name}', [], str(p)) for s in splits
                for p in _visible(s)), sum(len(_visible(s)) for s in splits)
  if any(unlabelled.values()):
    raise errors.DataError(
        f'{source}: the splits {sorted(s.name for s in splits if unlabelled[s])} hold images '
        f'without class folders, {sorted(s.name for s in splits if not unlabelled[s])} class '
        'folders: give every split CLASS/ folders (labelled) or none (unlabelled).')
  folders = {split: [_folder(c, 'class') for c in _visible(_folder(split, 'split'))]
             for split in splits}
  classes = sorted({c.name for cs in folders.values() for c in cs})
  index = {name: i for i, name in enumerate(classes)}
  total = sum(1 for cs in folders.values() for c in cs for _ in c.iterdir())
  if not total:
    empty = [f'{s.name}/{c.name}' for s, cs in folders.items() for c in cs]
    raise errors.DataError(f'{source} holds no images: its class folders ({", ".join(empty[:3])}'
                           f'{", ..." if len(empty) > 3 else ""}) are empty. Put the images in '
                           'SPLIT/CLASS/ folders.')
  return classes, ((s.name, f'{s.name}/{c.name}/{p.name}', [index[c.name]], str(p))
                   for s in splits for c in folders[s] for p in sorted(c.iterdir())), total


def scan_idx(source: epath.Path) -> tuple[list[str], Iterator[Item], int | None]:
  data = {split: sources.idx_dataset(source, split) for split in ('train', 'test')}
  items = ((split, f'{split}/{i:06d}', [int(d.labels[i])], d.images[i, ..., 0])
           for split, d in data.items() for i in range(len(d)))
  names = [str(i) for i in range(10)]
  if 'fashion' in source.name.lower():
    names = list(sources.FASHION_MNIST_CLASSES)
  return names, items, sum(len(d) for d in data.values())


def _manifest_rows(source: epath.Path) -> Iterator[tuple[str, list[str], str]]:
  if source.suffix == '.csv':
    with source.open() as f:
      reader = csv.DictReader(f)
      if not reader.fieldnames or not {'path', 'labels'} <= set(reader.fieldnames):
        raise ValueError(f'{source}: the CSV header must name "path" and "labels" columns.')
      for row in reader:
        labels = [x.strip() for x in row['labels'].split(';') if x.strip()]
        yield row['path'], labels, row.get('split') or 'train'
  else:
    with source.open() as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          try:
            row = json.loads(line)
            labels = row['labels'] if 'labels' in row else [row['label']]
            yield row['path'], [str(x) for x in labels], row.get('split', 'train')
          except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f'{source}:{n}: not a {{"path", "labels"}} JSON line ({e}).') from e


def scan_manifest(source: epath.Path) -> tuple[list[str], Iterator[Item], int | None]:
  rows = [labels for _, labels, _ in _manifest_rows(source)]
  classes = sorted({label for labels in rows for label in labels})
  index = {name: i for i, name in enumerate(classes)}
  return classes, ((split, path, sorted(index[label] for label in labels),
                    path if os.path.isabs(path) else str(source.parent / path))
                   for path, labels, split in _manifest_rows(source)), len(rows)


def scan_i21k(source: epath.Path, val_fraction: float,
              seed: int) -> tuple[list[str], Iterator[Item], int | None]:
  """One tar a class; the total is not known without reading every tar's headers."""
  tars = sorted(p for p in source.iterdir() if p.name.endswith('.tar'))
  classes = [p.name[:-len('.tar')] for p in tars]
  def items() -> Iterator[Item]:
    for label, path in enumerate(tars):
      with tarfile.open(path) as tar:
        for member in tar:
          if member.isfile():
            key = f'{classes[label]}/{member.name}'
            yield _hash_split(key, val_fraction, seed), key, [label], tar.extractfile(member).read()
  return classes, items(), None


def _no_pil_limit() -> None:
  """Turns PIL's own limit off in a worker: ``check`` applies ours, naming the file (PIL
  warns without a name, or raises above twice its limit)."""
  Image.MAX_IMAGE_PIXELS = None


def check(item: Item,
          max_pixels: int = MAX_PIXELS) -> tuple[str, str, list[int], bytes | None, str]:
  """Reads and fully decodes one image: (split, key, labels, bytes or None, why skipped).

  An image of more than ``max_pixels`` is skipped before it is decoded (its size is
  in its header): training would decode it again in every epoch, and it may be a
  decompression bomb.
  """
  split, key, labels, payload = item
  try:
    if isinstance(payload, str):
      with open(payload, 'rb') as f:
        data = f.read()
    elif isinstance(payload, bytes):
      data = payload
    else:  # An array from IDX files: stored as PNG.
      out = io.BytesIO()
      Image.fromarray(payload).save(out, format='PNG')
      data = out.getvalue()
    with Image.open(io.BytesIO(data)) as image:
      width, height = image.size
      if width * height > max_pixels:
        return split, key, labels, None, (
            f'too large: {width}x{height} = {width * height:,} pixels, above the limit of '
            f'{max_pixels:,} (--max_pixels); downscale it, or raise the limit')
      image.load()  # Decodes everything: truncated files fail here.
    return split, key, labels, data, ''
  except Image.UnidentifiedImageError:  # Its message names a BytesIO: say what the file holds.
    return split, key, labels, None, ('not an image file Pillow can decode (it starts '
                                      f'{data[:16]!r})')
  except Exception as e:  # noqa: BLE001 (any failure to read an image means: skip it)
    return split, key, labels, None, f'{type(e).__name__}: {e}'


class _SplitWriter:
  """Round-robin over ``shards`` ArrayRecord files of one split."""

  def __init__(self, directory: epath.Path, split: str, shards: int):
    from array_record.python import array_record_module

    self.directory, self.split, self.count = directory, split, 0
    self.files = [local.shard_name(split, i, shards) for i in range(shards)]
    self.sizes = [0] * shards
    self.writers = [array_record_module.ArrayRecordWriter(str(directory / f), 'group_size:1')
                    for f in self.files]

  def write(self, record: bytes) -> None:
    shard = self.count % len(self.writers)
    self.writers[shard].write(record)
    self.sizes[shard] += 1
    self.count += 1

  def close(self) -> dict[str, Any]:
    shards = []
    for writer, name, size in zip(self.writers, self.files, self.sizes, strict=True):
      writer.close()
      path = self.directory / name
      if size == 0:
        path.unlink()
        continue
      shards.append({'file': name, 'num_examples': size, 'bytes': path.stat().length,
                     'sha256': local.sha256(path)})
    return {'num_examples': self.count, 'shards': shards}


def convert(source: str, out: str, *, shards: int = 16, kind: str = 'auto',
            val_fraction: float = 0.02, seed: int = 0, workers: int | None = None,
            overwrite: bool = False, name: str = '',
            max_pixels: int = MAX_PIXELS, progress_every: float = 10.) -> dict[str, Any]:
  """Converts ``source`` into ``out``; returns the metadata.

  Progress (images, rate, ETA) goes to stderr every ``progress_every`` seconds; for
  ImageNet-21k's tars the ETA is from the share of the classes' tars done.
  """
  source_path, out_path = epath.Path(source), epath.Path(out)
  kind = detect_kind(source_path) if kind == 'auto' else kind
  if (out_path / local.METADATA).exists() and not overwrite:
    print(f'{out} is already converted (pass --overwrite to convert again).', file=sys.stderr)
    return local.read_metadata(out_path)
  scanners = {'folder': lambda s: scan_folder(s, val_fraction, seed), 'idx': scan_idx,
              'manifest': scan_manifest, 'i21k': lambda s: scan_i21k(s, val_fraction, seed)}
  if kind not in scanners:
    raise ValueError(f'--kind={kind!r} is not one of {sorted(scanners)} or auto.')
  classes, items, total = scanners[kind](source_path)
  progress = console.Progress('convert', total, every=progress_every)

  tmp = epath.Path(f'{out}.tmp')
  if tmp.exists():
    shutil.rmtree(tmp)  # Left by an interrupted run.
  tmp.mkdir(parents=True)
  writers: dict[str, _SplitWriter] = {}
  skipped: list[dict[str, str]] = []
  multi_label, done, start = False, 0, time.time()
  with multiprocessing.get_context('spawn').Pool(workers or os.cpu_count(),
                                                 _no_pil_limit) as pool:
    for split, key, labels, data, why in pool.imap(
        functools.partial(check, max_pixels=max_pixels), items, chunksize=32):
      done += 1
      if data is None:
        skipped.append({'key': key, 'split': split, 'reason': why})
      else:
        if split not in writers:
          writers[split] = _SplitWriter(tmp, split, shards)
        writers[split].write(local.encode_record(data, labels, key))
        multi_label |= bool(classes) and len(labels) != 1
      progress.update(done, None if total else labels[0] / len(classes))
  if not writers:  # Nothing to train on: no dataset, and nothing left behind.
    shutil.rmtree(tmp)
    raise errors.DataError(f'{source} holds no image that can be read: '
                           + (f'the {done} files were skipped, e.g. {skipped[0]["key"]}: '
                              f'{skipped[0]["reason"]}.' if skipped else 'it holds no files.'))
  metadata = {
      'format_version': local.FORMAT_VERSION, 'name': name or source_path.name,
      'source': str(source), 'kind': kind, 'num_classes': len(classes),
      'class_names': classes, 'multi_label': multi_label,
      'splits': {split: w.close() for split, w in sorted(writers.items())},
      'skipped': skipped,
  }
  (tmp / local.METADATA).write_text(json.dumps(metadata, indent=1))
  if out_path.exists():
    shutil.rmtree(out_path)
  tmp.rename(out_path)
  counts = ', '.join(f'{s} {v["num_examples"]}' for s, v in metadata['splits'].items())
  print(f'convert: wrote {out} ({counts}; {len(classes)} classes; {len(skipped)} skipped) in '
        f'{time.time() - start:.0f}s.', file=sys.stderr)
  for s in skipped:
    print(f'  skipped {s["key"]}: {s["reason"]}', file=sys.stderr)
  return metadata


def main() -> None:
  """The CLI; its flags exist only when this module runs as a script."""
  source = paths.DEFINE_path('source', None, 'Image folder, IDX directory, manifest or i21k.')
  out = paths.DEFINE_path('out', None, 'Output directory.')
  options = [  # convert's keyword arguments, by their names.
      flags.DEFINE_integer('shards', 16, 'Shards per split.'),
      flags.DEFINE_enum('kind', 'auto', ['auto', 'folder', 'idx', 'manifest', 'i21k'],
                        'Source kind.'),
      flags.DEFINE_float('val_fraction', 0.02, 'i21k, or one folder of unlabelled images: the '
                         'share of validation images.'),
      flags.DEFINE_integer('seed', 0, 'i21k, one unlabelled folder: the validation split\'s seed.'),
      flags.DEFINE_integer('workers', None, 'Decoding processes (default: all cores).'),
      flags.DEFINE_bool('overwrite', False, 'Replace an existing output.'),
      flags.DEFINE_string('name', '', 'Dataset name in the metadata.'),
      flags.DEFINE_integer('max_pixels', MAX_PIXELS, 'Images of more pixels are skipped and '
                           'listed, not decoded (default: PIL\'s decompression-bomb limit).'),
      flags.DEFINE_float('progress_every', 10., 'Seconds between progress lines.')]
  flags.mark_flags_as_required(['source', 'out'])

  def run(argv: list[str]) -> None:
    paths.input_path(source.value, 'source', 'image folder, IDX folder, manifest or i21k folder')
    paths.output_path(out.value, 'out', folder=True)
    convert(source.value, out.value, **{o.name: o.value for o in options})
  errors.run(run, arguments=False)


if __name__ == '__main__':
  main()
