"""Tests of the converter and the local sharded format, on the real data in ../shared/data."""

import csv
import json
import os
import re
import shutil
import tarfile

import cv2
import numpy as np
import pytest
from PIL import Image

from vit_jax import main
from vit_jax.base import errors, sharding
from vit_jax.data import convert, loader, local, preprocess, sources

from conftest import SHARED_DATA
from runs import tiny_config


def needs_shared_data():
  if not SHARED_DATA.is_dir():
    pytest.skip(f'real data not found at {SHARED_DATA}')


@pytest.fixture(scope='module')
def fashion_local(tmp_path_factory):
  needs_shared_data()
  out = tmp_path_factory.mktemp('fmnist') / 'local'
  convert.convert(str(SHARED_DATA / 'fashion_mnist'), str(out), shards=4, workers=2)
  return out


@pytest.fixture(scope='module')
def imagenette_local(tmp_path_factory):
  needs_shared_data()
  out = tmp_path_factory.mktemp('imagenette') / 'local'
  convert.convert(str(SHARED_DATA / 'imagenette_224'), str(out), shards=8, workers=2)
  return out


@pytest.mark.slow
def test_fashion_mnist_converts_exactly(fashion_local):
  metadata = local.read_metadata(fashion_local)
  assert metadata['kind'] == 'idx' and metadata['num_classes'] == 10
  assert metadata['class_names'][0] == 'T-shirt/top' and not metadata['multi_label']
  idx = sources.idx_dataset(SHARED_DATA / 'fashion_mnist', 'test')
  converted = local.LocalSource(str(fashion_local), 'test')
  assert len(converted) == 10_000 and metadata['splits']['train']['num_examples'] == 60_000
  assert len(metadata['splits']['test']['shards']) == 4
  labels = np.array([converted[i]['label'] for i in range(len(converted))])
  assert np.bincount(labels).tolist() == [1000] * 10
  for i in np.random.default_rng(0).choice(10_000, 20, replace=False):
    example = converted[i]
    source_index = int(example['key'].split('/')[1])
    assert example['label'] == idx.labels[source_index]
    image = preprocess.decode()(example['image'], None)
    np.testing.assert_array_equal(image[..., 0], idx.images[source_index, ..., 0])
    assert image.shape == (28, 28, 3)


@pytest.mark.slow
def test_imagenette_converts_exactly(imagenette_local):
  metadata = local.read_metadata(imagenette_local)
  folder = SHARED_DATA / 'imagenette_224'
  for split in ('train', 'val'):
    source = local.LocalSource(str(imagenette_local), split)
    expected = [len(list((folder / split / c).iterdir())) for c in metadata['class_names']]
    labels = [source[i]['label'] for i in range(len(source))]
    assert np.bincount(labels, minlength=10).tolist() == expected
  assert (metadata['splits']['train']['num_examples'],
          metadata['splits']['val']['num_examples']) == (9469, 3925)
  source = local.LocalSource(str(imagenette_local), 'val')
  for i in np.random.default_rng(1).choice(len(source), 10, replace=False):
    example = source[i]
    path = folder / example['key']
    with Image.open(path) as image:
      np.testing.assert_array_equal(preprocess.decode()(example['image'], None),
                                    np.asarray(image.convert('RGB')))
    assert metadata['class_names'][example['label']] == path.parent.name


@pytest.mark.slow
def test_two_processes_cover_an_epoch_exactly_once(fashion_local):
  source = local.LocalSource(str(fashion_local), 'test')
  mesh = sharding.make_mesh(None)
  pp = preprocess.parse('to_rgb|value_range(-1, 1)')
  shares = [loader.TrainLoader(source, pp, global_batch_size=1000, seed=3,
                               sharding=sharding.batch_sharding(mesh), num_classes=10,
                               process_index=p, process_count=2) for p in range(2)]
  steps = shares[0].steps_per_epoch
  seen = np.concatenate([s.indices(k)[s.rows] for s in shares for k in range(steps)])
  assert np.array_equal(np.sort(seen), np.arange(10_000))
  batch = shares[1].local_batch(2)
  assert batch['image'].shape == (500, 28, 28, 3)
  rows = shares[1].indices(2)[500:]
  np.testing.assert_array_equal(batch['label'].argmax(-1), [source[i]['label'] for i in rows])


@pytest.mark.slow
def test_training_from_the_local_format(fashion_local, tmp_path):
  config = tiny_config(**{'total_steps': 8, 'checkpoint_every_steps': 8})
  config.dataset.name = 'fashion_mnist'
  with config.unlocked():
    config.dataset.data_dir = str(fashion_local)
  config.dataset.pp_train = 'decode|resize(16)|value_range(-1, 1)'
  config.dataset.pp_eval = 'decode|resize(16)|value_range(-1, 1)'
  config.dataset.eval_split = 'test'
  result = main.train_and_evaluate(config, str(tmp_path))
  assert result['eval/examples'] == 10_000


def test_bad_images_are_skipped_and_reported(tmp_path):
  needs_shared_data()
  root = tmp_path / 'folder'
  files = sorted((SHARED_DATA / 'imagenette_224' / 'val' / 'n01440764').iterdir())[:6]
  for cls in ('a', 'b'):
    (root / 'train' / cls).mkdir(parents=True)
    for f in files[:3] if cls == 'a' else files[3:]:
      shutil.copy(f, root / 'train' / cls / f.name)
  data = files[0].read_bytes()
  (root / 'train' / 'a' / 'truncated.JPEG').write_bytes(data[:len(data) // 2])
  (root / 'train' / 'b' / 'notes.txt').write_text('not an image')
  metadata = convert.convert(str(root), str(tmp_path / 'out'), shards=2, workers=1)
  assert metadata['splits']['train']['num_examples'] == 6
  skipped = {s['key']: s['reason'] for s in metadata['skipped']}
  assert set(skipped) == {'train/a/truncated.JPEG', 'train/b/notes.txt'}
  assert 'truncated' in skipped['train/a/truncated.JPEG']
  assert skipped['train/b/notes.txt'] == ("not an image file Pillow can decode (it starts "
                                          "b'not an image')")
  assert local.read_metadata(tmp_path / 'out')['skipped'] == metadata['skipped']


@pytest.mark.parametrize('suffix', ['csv', 'jsonl'])
def test_multi_label_manifest_round_trip(tmp_path, suffix):
  needs_shared_data()
  files = sorted((SHARED_DATA / 'imagenette_224' / 'val' / 'n03888257').iterdir())[:5]
  labels = [['sky', 'parachute'], ['parachute'], ['sky', 'person', 'parachute'], ['sky'],
            ['person']]
  splits = ['train', 'train', 'train', 'validation', 'validation']
  manifest = tmp_path / f'manifest.{suffix}'
  if suffix == 'csv':
    with manifest.open('w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(['path', 'labels', 'split'])
      for path, ls, split in zip(files, labels, splits, strict=True):
        writer.writerow([str(path), ';'.join(ls), split])
  else:
    manifest.write_text(''.join(json.dumps({'path': str(p), 'labels': ls, 'split': s}) + '\n'
                                for p, ls, s in zip(files, labels, splits, strict=True)))
  metadata = convert.convert(str(manifest), str(tmp_path / 'out'), shards=2, workers=1)
  assert metadata['multi_label'] and metadata['class_names'] == ['parachute', 'person', 'sky']
  train_split = local.LocalSource(str(tmp_path / 'out'), 'train')
  got = {train_split[i]['key']: train_split[i]['label'] for i in range(len(train_split))}
  for path, ls in zip(files[:3], labels[:3], strict=True):
    expected = np.zeros(3, np.float32)
    expected[[metadata['class_names'].index(x) for x in ls]] = 1
    np.testing.assert_array_equal(got[str(path)], expected)
  assert len(local.LocalSource(str(tmp_path / 'out'), 'validation')) == 2


def test_imagenet21k_tar_layout_with_a_seeded_validation_split(tmp_path, capsys):
  needs_shared_data()
  root = tmp_path / 'i21k'
  root.mkdir()
  counts = {}
  for wnid in ('n01440764', 'n02102040', 'n02979186'):
    files = sorted((SHARED_DATA / 'imagenette_224' / 'val' / wnid).iterdir())[:40]
    counts[wnid] = len(files)
    with tarfile.open(root / f'{wnid}.tar', 'w') as tar:
      for f in files:
        tar.add(f, arcname=f.name)
  first = convert.convert(str(root), str(tmp_path / 'a'), shards=2, val_fraction=0.25,
                          seed=7, workers=1, progress_every=0)
  # No total without reading every tar: the ETA comes from the share of tars done.
  assert re.search(r'convert: 41 images \(33%\), [\d,]+/s, ETA', capsys.readouterr().err)
  assert first['kind'] == 'i21k' and first['class_names'] == sorted(counts)
  splits = {s: v['num_examples'] for s, v in first['splits'].items()}
  assert splits['train'] + splits['validation'] == 120 and 15 < splits['validation'] < 45
  for directory, seed in (('b', 7), ('c', 8)):
    convert.convert(str(root), str(tmp_path / directory), shards=2, val_fraction=0.25,
                    seed=seed, workers=1)

  def keys(directory):
    source = local.LocalSource(str(tmp_path / directory), 'validation')
    return sorted(source[i]['key'] for i in range(len(source)))
  assert keys('a') == keys('b')  # The same seed carves the same split...
  assert keys('a') != keys('c')  # ... another seed another one.


def test_rerun_is_safe_and_damage_is_detected(tmp_path, capsys):
  needs_shared_data()
  root = tmp_path / 'folder' / 'train' / 'fish'
  root.mkdir(parents=True)
  for f in sorted((SHARED_DATA / 'imagenette_224' / 'val' / 'n01440764').iterdir())[:4]:
    shutil.copy(f, root / f.name)
  out = tmp_path / 'out'
  (tmp_path / 'out.tmp').mkdir()  # Left behind by an interrupted run.
  convert.convert(str(tmp_path / 'folder'), str(out), shards=2, workers=1)
  assert not (tmp_path / 'out.tmp').exists()
  before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
  convert.convert(str(tmp_path / 'folder'), str(out), shards=2, workers=1)
  assert 'already converted' in capsys.readouterr().err
  assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
  local.verify(out)

  shard = out / 'train-00001-of-00002.array_record'
  data = bytearray(shard.read_bytes())
  data[len(data) // 2] ^= 0xFF
  shard.write_bytes(bytes(data))
  with pytest.raises(ValueError, match='SHA-256 mismatch, the shard is corrupt'):
    local.verify(out)
  shard.write_bytes(bytes(data[:100]))
  with pytest.raises(ValueError, match='has 100 bytes, the metadata says'):
    local.LocalSource(str(out), 'train')
  shard.unlink()
  with pytest.raises(FileNotFoundError, match='train-00001-of-00002.array_record is missing'):
    local.LocalSource(str(out), 'train')
  with pytest.raises(ValueError, match="has no split 'test'"):
    local.LocalSource(str(out), 'test')


def test_missing_sources_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='The source .*nothing does not exist'):
    convert.convert(str(tmp_path / 'nothing'), str(tmp_path / 'out'))
  with pytest.raises(FileNotFoundError, match='is not a vit_jax dataset: no metadata.json'):
    local.LocalSource(str(tmp_path), 'train')


def test_permutation_is_a_bijection_for_any_size():
  for n in (1, 2, 3, 1000, 1537, 65_537):
    np.testing.assert_array_equal(np.sort(loader.permute(np.arange(n), n, (0, 1))),
                                  np.arange(n))
  a = loader.permute(np.arange(4096), 300_000_000, (0, 0))
  b = loader.permute(np.arange(4096), 300_000_000, (0, 1))
  assert len(np.unique(a)) == 4096 and a.max() < 300_000_000 and not np.array_equal(a, b)


@pytest.mark.slow
def test_multi_label_training_reports_precision_at_1(tmp_path):
  needs_shared_data()
  files = sorted((SHARED_DATA / 'imagenette_224' / 'val' / 'n03888257').iterdir())[:64]
  rng = np.random.default_rng(0)
  tags = ['sky', 'parachute', 'person', 'tree']
  with (tmp_path / 'manifest.jsonl').open('w') as f:
    for i, path in enumerate(files):
      labels = list(rng.choice(tags, size=rng.integers(1, 4), replace=False))
      split = 'train' if i < 48 else 'validation'
      f.write(json.dumps({'path': str(path), 'labels': labels, 'split': split}) + '\n')
  convert.convert(str(tmp_path / 'manifest.jsonl'), str(tmp_path / 'data'), shards=2, workers=1)

  config = tiny_config(**{'total_steps': 6, 'batch_size': 16, 'eval_batch_size': 16,
                          'schedule.warmup_steps': 2, 'checkpoint_every_steps': 6,
                          'loss': 'sigmoid_xent'})
  with config.unlocked():
    config.model.head_bias_init = -10.0
    config.dataset.data_dir = str(tmp_path / 'data')
  config.dataset.update(dict(name='tags', num_classes=4, eval_split='validation',
                             pp_train='decode|inception_crop(16)|value_range(-1, 1)',
                             pp_eval='decode|resize(16)|value_range(-1, 1)'))
  result = main.train_and_evaluate(config, str(tmp_path / 'run'))
  assert set(result) == {'eval/prec@1', 'eval/loss', 'eval/examples'}
  assert result['eval/examples'] == 16
  assert 0 <= result['eval/prec@1'] <= 1


@pytest.mark.slow
def test_command_line(tmp_path):
  needs_shared_data()
  import subprocess
  import sys

  root = tmp_path / 'folder' / 'val' / 'fish'
  root.mkdir(parents=True)
  for f in sorted((SHARED_DATA / 'imagenette_224' / 'val' / 'n01440764').iterdir())[:3]:
    shutil.copy(f, root / f.name)
  command = [sys.executable, '-m', 'vit_jax.data.convert', f'--source={tmp_path / "folder"}',
             f'--out={tmp_path / "out"}', '--shards=2', '--workers=1']
  done = subprocess.run(command + ['--progress_every=0'], capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'wrote' in done.stderr and '(val 3; 1 classes; 0 skipped)' in done.stderr
  assert re.search(r'convert: 1/3 images \(33%\), [\d,]+/s, ETA 0h00m\d\ds', done.stderr)
  assert local.read_metadata(tmp_path / 'out')['splits']['val']['num_examples'] == 3
  missing = subprocess.run(command[:3] + [f'--source={tmp_path / "nope"}', command[4]],
                           capture_output=True, text=True)
  assert missing.returncode == 2, missing.stderr
  assert missing.stderr.startswith(f'error: --source={tmp_path / "nope"} does not exist')


def test_the_converter_refuses_loops_and_files_as_class_folders(tmp_path):
  root = tmp_path / 'folder' / 'train'
  (root / 'cat').mkdir(parents=True)
  os.symlink('..', root / 'loop')  # train/loop -> train: holds itself.
  with pytest.raises(errors.DataError, match=r'train/loop: the class folder is a symbolic link '
                                             r'to .*folder, which holds it: a loop'):
    convert.convert(str(tmp_path / 'folder'), str(tmp_path / 'out'))
  (root / 'loop').unlink()
  os.symlink('self', root / 'self')
  with pytest.raises(errors.DataError, match='train/self: the class folder is a symbolic link '
                                             'that cannot be followed'):
    convert.convert(str(tmp_path / 'folder'), str(tmp_path / 'out'))
  (root / 'self').unlink()
  (root / 'notes.txt').write_text('not a class')
  with pytest.raises(errors.DataError, match=r'train/notes.txt is not a folder: .* Move it out'):
    convert.convert(str(tmp_path / 'folder'), str(tmp_path / 'out'))


def test_class_folders_without_images_are_refused_and_nothing_is_written(tmp_path):
  """Empty class folders (a copy that has not run yet), or ones holding no image that can be
  read: one error, no dataset of 0 examples, nothing left in --out."""
  root = tmp_path / 'folder'
  for name in ('train/cat', 'train/dog', 'val/cat', 'val/dog'):
    (root / name).mkdir(parents=True)
  with pytest.raises(errors.DataError, match=f'^{root} holds no images: its class folders '
                     r'\(train/cat, train/dog, val/cat, ...\) are empty. Put the images in'):
    convert.convert(str(root), str(tmp_path / 'out'))
  (root / 'train' / 'cat' / 'notes.txt').write_text('not an image')
  with pytest.raises(errors.DataError, match=f'^{root} holds no image that can be read: the 1 '
                     'files were skipped, e.g. train/cat/notes.txt: not an image file Pillow can '
                     "decode \\(it starts b'not an image'\\).$"):
    convert.convert(str(root), str(tmp_path / 'out'), workers=1)
  assert os.listdir(tmp_path) == ['folder']


def test_images_above_the_pixel_limit_are_skipped_and_listed_not_decoded(tmp_path):
  root = tmp_path / 'folder' / 'train'
  for cls, (height, width) in (('small', (24, 32)), ('large', (64, 80))):
    (root / cls).mkdir(parents=True)
    cv2.imwrite(str(root / cls / 'a.png'), np.zeros((height, width, 3), np.uint8))
  # Above PIL's decompression-bomb limit, the default: 9500 x 9500 (1 bit, 12 MB to decode).
  Image.new('1', (9500, 9500)).save(root / 'large' / 'bomb.png')
  metadata = convert.convert(str(tmp_path / 'folder'), str(tmp_path / 'out'), shards=1,
                             workers=1)
  assert convert.MAX_PIXELS == Image.MAX_IMAGE_PIXELS
  assert [s['key'] for s in metadata['skipped']] == ['train/large/bomb.png']
  assert metadata['skipped'][0]['reason'].startswith(
      'too large: 9500x9500 = 90,250,000 pixels, above the limit of 89,478,485 (--max_pixels)')
  metadata = convert.convert(str(tmp_path / 'folder'), str(tmp_path / 'out'), shards=1,
                             workers=1, max_pixels=32 * 32, overwrite=True)
  assert {s['key']: s['reason'] for s in metadata['skipped']}['train/large/a.png'].startswith(
      'too large: 80x64 = 5,120 pixels, above the limit of 1,024')
  assert metadata['splits']['train']['num_examples'] == 1 and metadata['num_classes'] == 2


def test_16_bit_images_are_read_as_8_bits(tmp_path):
  """OpenCV, the pipeline's decoder, scales 16-bit images (PIL's convert('RGB') clipped them)."""
  (tmp_path / 'folder' / 'train' / 'grey').mkdir(parents=True)
  image = (np.arange(16 * 16, dtype=np.uint16).reshape(16, 16) * 257)
  cv2.imwrite(str(tmp_path / 'folder' / 'train' / 'grey' / 'a.png'), image)
  convert.convert(str(tmp_path / 'folder'), str(tmp_path / 'out'), shards=1, workers=1)
  stored = local.LocalSource(str(tmp_path / 'out'), 'train')[0]['image']
  decoded = preprocess.decode()(stored, None)
  np.testing.assert_array_equal(decoded, np.repeat((image >> 8).astype(np.uint8)[..., None], 3, -1))


def test_folders_without_classes_are_unlabelled(tmp_path):
  def images(folder, count):
    folder.mkdir(parents=True)
    for i in range(count):
      Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(folder / f'{i:03d}.png')

  # SPLIT/ folders of images: every split unlabelled, no class.
  images(tmp_path / 'splits' / 'train', 6)
  images(tmp_path / 'splits' / 'val', 3)
  metadata = convert.convert(str(tmp_path / 'splits'), str(tmp_path / 'a'), shards=2, workers=1)
  assert (metadata['num_classes'], metadata['class_names'], metadata['multi_label']) == (0, [],
                                                                                        False)
  assert {s: v['num_examples'] for s, v in metadata['splits'].items()} == {'train': 6, 'val': 3}
  source = local.LocalSource(str(tmp_path / 'a'), 'val')
  assert source.num_classes == 0
  assert sorted((source[i]['key'], source[i]['label']) for i in range(3)) == [
      ('val/000.png', -1), ('val/001.png', -1), ('val/002.png', -1)]
  # The loader's placeholder labels: no class to encode.
  assert loader._labels(np.array([-1, -1]), 0).shape == (2, 1)

  # One folder of images: train and validation by a hash of each name, --val_fraction.
  images(tmp_path / 'flat', 200)
  metadata = convert.convert(str(tmp_path / 'flat'), str(tmp_path / 'b'), workers=1,
                             val_fraction=0.25)
  counts = {s: v['num_examples'] for s, v in metadata['splits'].items()}
  assert sum(counts.values()) == 200 and 25 <= counts['validation'] <= 75, counts
  keys = {split: {local.LocalSource(str(tmp_path / 'b'), split)[i]['key']
                  for i in range(n)} for split, n in counts.items()}
  assert all(convert._hash_split(k, 0.25, 0) == split for split, ks in keys.items() for k in ks)

  # Ambiguous layouts are refused: images beside folders, labelled beside unlabelled splits.
  images(tmp_path / 'flat' / 'more', 1)
  with pytest.raises(errors.DataError, match=r'holds both images \(000.png, ...\) and folders '
                                             r'\(more, ...\)'):
    convert.convert(str(tmp_path / 'flat'), str(tmp_path / 'c'))
  images(tmp_path / 'splits' / 'test' / 'cat', 1)
  with pytest.raises(errors.DataError, match=r"the splits \['train', 'val'\] hold images "
                                             r"without class folders, \['test'\] class folders"):
    convert.convert(str(tmp_path / 'splits'), str(tmp_path / 'd'))
