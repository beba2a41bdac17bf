"""Tests of vit_jax.data on real data: sources, preprocessing, the loader."""

import functools
import gzip
import io
import math
import os
import pathlib
import re
import threading
import time
import types

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image

from vit_jax import main
from vit_jax.base import errors, sharding
from vit_jax.data import loader, preprocess, sources, tfrecord

from conftest import SHARED_DATA
from runs import read_metrics, restore_state, tiny_config


def test_fashion_mnist_idx_matches_the_published_counts(shared_data):
  train_set = sources.idx_dataset(shared_data / 'fashion_mnist', 'train')
  test_set = sources.idx_dataset(shared_data / 'fashion_mnist', 'test')
  assert (len(train_set), len(test_set)) == (60_000, 10_000)
  assert train_set.images.shape == (60_000, 28, 28, 1)
  assert np.bincount(train_set.labels).tolist() == [6000] * 10
  assert np.bincount(test_set.labels).tolist() == [1000] * 10
  # Pixel for pixel against a plain read of the gzip file.
  with gzip.open(shared_data / 'fashion_mnist' / 't10k-images-idx3-ubyte.gz') as f:
    raw = np.frombuffer(f.read(), np.uint8)[16:].reshape(10_000, 28, 28)
  np.testing.assert_array_equal(test_set.images[[0, 1234, 9999], ..., 0], raw[[0, 1234, 9999]])


def test_bad_idx_files_get_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='train-images-idx3-ubyte'):
    sources.idx_dataset(tmp_path, 'train')
  (tmp_path / 'train-images-idx3-ubyte').write_bytes(b'\x00\x00\x08\x01' + b'\x00' * 12)
  (tmp_path / 'train-labels-idx1-ubyte').write_bytes(b'\x00\x00\x08\x01\x00\x00\x00\x00')
  with pytest.raises(ValueError, match='not an IDX file with magic 2051'):
    sources.idx_dataset(tmp_path, 'train')


def test_preprocessing_ops():
  image = np.arange(16 * 16, dtype=np.uint8).reshape(16, 16, 1)
  rng = np.random.default_rng(0)
  out = preprocess.parse('to_rgb|resize((8, 12))|value_range(-1, 1)')(image, rng)
  assert out.shape == (8, 12, 3) and out.dtype == np.float32
  assert out.min() >= -1 and out.max() <= 1
  crop = preprocess.parse('pad_crop(3)')(image, rng)
  assert crop.shape == image.shape
  encoded = io.BytesIO()
  Image.fromarray(image[..., 0]).save(encoded, format='PNG')
  decoded = preprocess.parse('decode')(encoded.getvalue(), rng)
  np.testing.assert_array_equal(decoded, np.repeat(image, 3, axis=-1))
  flipped = preprocess.parse('decode|flip_lr')(encoded.getvalue(), np.random.default_rng(3))
  assert np.array_equal(flipped, decoded[:, ::-1]) or np.array_equal(flipped, decoded)
  photo = np.random.default_rng(1).integers(0, 256, (120, 200, 3), dtype=np.uint8)
  small = preprocess.parse('resize_small(60)|central_crop(60)')(photo, rng)
  assert small.shape == (60, 60, 3)
  crops = [preprocess.parse('inception_crop(32)')(photo, np.random.default_rng(s))
           for s in range(3)]
  assert all(c.shape == (32, 32, 3) for c in crops)
  assert not np.array_equal(crops[0], crops[1])
  # The whole-image area range gives back the (resized) image itself.
  whole = preprocess.parse('inception_crop(50, 1.0, 1.0)')(photo[:100, :100], rng)
  np.testing.assert_array_equal(whole, preprocess.parse('resize(50)')(photo[:100, :100], rng))
  augment = preprocess.parse('randaug(2, 10)')
  outs = [augment(photo, np.random.default_rng(s)) for s in range(8)]
  assert all(o.shape == photo.shape and o.dtype == np.uint8 for o in outs)
  assert sum(not np.array_equal(o, photo) for o in outs) >= 6
  np.testing.assert_array_equal(augment(photo, np.random.default_rng(5)), outs[5])
  with pytest.raises(ValueError, match="Unknown preprocessing op 'blur'"):
    preprocess.parse('to_rgb|blur')


def test_random_erasing_is_timms_pixel_mode():
  """One box of N(0, 1) noise in normalised units (timm's RandomErasing(mode='pixel')), of
  2%-1/3 of the area and aspect 0.3-3.3, with probability ``prob``."""
  image = np.full((60, 80, 3), 0.25, np.float32)
  erase = preprocess.random_erase(1.0)  # The op on its own (a pipeline scales first).
  noise, areas = [], []
  for seed in range(300):
    out = erase(image, np.random.default_rng(seed))
    changed = (out != image).any(-1)
    rows, cols = np.where(changed)
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    assert changed[top:bottom, left:right].all()  # One box of noise ...
    assert changed.sum() == (bottom - top) * (right - left)  # ... and nothing else.
    area, aspect = (bottom - top) * (right - left) / (60 * 80), (bottom - top) / (right - left)
    assert 0.015 <= area <= 0.35 and 0.25 <= aspect <= 4
    areas.append(area)
    noise.append(out[top:bottom, left:right].ravel())
    np.testing.assert_array_equal(erase(image, np.random.default_rng(seed)), out)  # Seeded.
  noise = np.concatenate(noise)
  chex.assert_type(noise, np.float32)
  # Standard normal, not uniform: mean 0, sd 1, 4.55% beyond 2 sd (uniform on [-1, 1]: 0%).
  assert abs(noise.mean()) < 0.01 and abs(noise.std() - 1) < 0.01
  assert abs((np.abs(noise) > 2).mean() - 0.0455) < 0.003
  assert abs(np.mean(areas) - (0.02 + 1 / 3) / 2) < 0.02  # Uniform area: mean 0.177.
  # A quarter of the examples by default.
  default = preprocess.random_erase()
  erased = sum(not np.array_equal(default(image, np.random.default_rng(s)), image)
               for s in range(400))
  assert 70 <= erased <= 130
  # Before value_range it would have to fill uint8 pixels: refused, with the fix.
  with pytest.raises(ValueError, match='put it after value_range'):
    preprocess.parse('to_rgb|random_erase(0.25)|value_range(-1, 1)')
  pipeline = preprocess.parse('to_rgb|value_range(-1, 1)|random_erase(1.0)')
  assert pipeline.affine is None  # Scaled on the host then: the erasing needs floats.


def test_a_trailing_value_range_can_run_on_the_device():
  pipeline = preprocess.parse('to_rgb|resize(8)|value_range(0, 1)')
  image = np.random.default_rng(0).integers(0, 256, (10, 12, 3), dtype=np.uint8)
  host = pipeline.host(image, np.random.default_rng(1))
  assert host.dtype == np.uint8 and host.shape == (8, 8, 3)
  on_device = pipeline.on_device(jnp.asarray(host[None]))
  chex.assert_type(on_device, jnp.float32)
  np.testing.assert_allclose(on_device[0], pipeline(image, np.random.default_rng(1)), atol=1e-6)
  assert preprocess.parse('to_rgb|resize(8)').affine is None
  assert preprocess.parse('value_range(0, 1)|resize(8)').affine is None  # Not trailing.


def make_loader(source, seed=0, batch=32):
  mesh = sharding.make_mesh(None)
  return loader.TrainLoader(source, preprocess.parse('to_rgb|pad_crop(2)|value_range(-1, 1)'),
                            global_batch_size=batch, seed=seed,
                            sharding=sharding.batch_sharding(mesh), num_classes=10)


def test_shuffling_is_deterministic_per_seed_and_new_each_epoch():
  source = sources.digits('train')
  a, b, c = make_loader(source, 0), make_loader(source, 0), make_loader(source, 1)
  np.testing.assert_array_equal(a.indices(3), b.indices(3))
  assert not np.array_equal(a.indices(3), c.indices(3))
  steps = a.steps_per_epoch
  epoch0 = np.concatenate([a.indices(s) for s in range(steps)])
  epoch1 = np.concatenate([a.indices(s) for s in range(steps, 2 * steps)])
  assert len(np.unique(epoch0)) == len(epoch0) == steps * 32  # No repeats within an epoch.
  assert not np.array_equal(epoch0, epoch1)
  batch_a, batch_b = a.local_batch(5), b.local_batch(5)
  np.testing.assert_array_equal(batch_a['image'], batch_b['image'])
  # Resuming at step k gives the batch an uninterrupted run sees at step k.
  _, resumed = next(b.iterate(start_step=7))
  host = a.local_batch(7)['image']
  assert host.dtype == np.uint8  # value_range runs on the devices, after the transfer ...
  chex.assert_type(resumed['image'], jnp.float32)
  # ... and gives what the whole pipeline gives on the host, example by example.
  pipeline = preprocess.parse('to_rgb|pad_crop(2)|value_range(-1, 1)')
  expected = [pipeline(source[int(i)]['image'], np.random.default_rng([0, 7, j]))
              for j, i in enumerate(a.indices(7))]
  np.testing.assert_allclose(jax.device_get(resumed['image']), np.stack(expected), atol=1e-6)


def test_naflex_patch_sequences_go_through_the_loader_and_resume_exactly():
  """A naflex pipeline's dict of fixed shapes batches key by key; its patches are scaled on the
  devices (padding left zero) as on the host; a batch is a function of the step alone."""
  source = sources.digits('train')
  spec = 'to_rgb|inception_crop(8, 0.3)|naflex(4, 6)|value_range(-1, 1)'
  mesh = sharding.make_mesh(None)
  make = lambda: loader.TrainLoader(source, preprocess.parse(spec), global_batch_size=16,
                                    seed=0, sharding=sharding.batch_sharding(mesh),
                                    num_classes=10)
  a, b = make(), make()
  local = a.local_batch(3)
  assert sorted(local) == sorted([*preprocess.PATCH_KEYS, 'label'])
  chex.assert_shape([local['image'], local['patch_coords'], local['patch_mask'],
                     local['patch_grid'], local['label']],
                    [(16, 6, 48), (16, 6, 2), (16, 6), (16, 2), (16, 10)])
  assert local['image'].dtype == np.uint8 and local['patch_mask'].dtype == bool
  _, resumed = next(b.iterate(start_step=3))
  pipeline = preprocess.parse(spec)
  expected = [pipeline(source[int(i)]['image'], np.random.default_rng([0, 3, j]))
              for j, i in enumerate(a.indices(3))]
  for key in preprocess.PATCH_KEYS:
    np.testing.assert_allclose(jax.device_get(resumed[key]), np.stack([e[key] for e in expected]),
                               atol=1e-6)
  batches = list(loader.eval_batches(sources.digits('test'), pipeline, global_batch_size=64,
                                     sharding=sharding.batch_sharding(mesh), num_classes=10))
  assert len(batches) == 6 and batches[0]['image'].shape == (64, 6, 48)
  assert sum(int(jax.device_get(b['mask']).sum()) for b in batches) == 359


def test_repeated_augmentation_is_timms_repeat_aug_sampler():
  """Each index 3 times in a row in the epoch's stream, which keeps its length (1/3 of the
  images an epoch), each copy augmented apart; still a pure function of the step."""
  source = sources.digits('train')
  mesh = sharding.make_mesh(None)
  pipeline = preprocess.parse('to_rgb|pad_crop(2)|value_range(-1, 1)')
  make = lambda repeats: loader.TrainLoader(
      source, pipeline, global_batch_size=32, seed=0, sharding=sharding.batch_sharding(mesh),
      num_classes=10, repeats=repeats)
  plain, repeated = make(1), make(3)
  steps = repeated.steps_per_epoch
  assert steps == plain.steps_per_epoch
  stream = np.concatenate([repeated.indices(s) for s in range(steps)])
  once = np.concatenate([plain.indices(s) for s in range(steps)])
  # timm: torch.repeat_interleave(permutation, 3), cut at the epoch's length.
  np.testing.assert_array_equal(stream, np.repeat(once, 3)[:len(stream)])
  assert len(np.unique(stream)) == math.ceil(len(stream) / 3)
  epoch1 = np.concatenate([repeated.indices(s) for s in range(steps, 2 * steps)])
  assert not np.array_equal(stream, epoch1)  # A new permutation each epoch.
  # The copies in one batch are the same example augmented differently.
  batch = repeated.local_batch(0)
  assert (repeated.indices(0)[:3] == repeated.indices(0)[0]).all()
  np.testing.assert_array_equal(batch['label'][0], batch['label'][1])
  assert not np.array_equal(batch['image'][0], batch['image'][1])
  _, resumed = next(make(3).iterate(start_step=steps + 5))  # Exact resume.
  expected = make(3).local_batch(steps + 5)['image']
  np.testing.assert_allclose(jax.device_get(resumed['image']),
                             pipeline.on_device(jnp.asarray(expected)), atol=1e-6)
  with pytest.raises(ValueError, match='repeats=0'):
    make(0)


def test_the_train_loader_keeps_every_worker_busy():
  """``TrainLoader`` as ``vit_jax.main`` builds it (``config.input_workers`` threads, no
  ``prefetch``) prepares that many examples at once: with 4 batches in flight, as before, a
  host used at most 4 cores however many it had (vit_jax.tools.feeding counts them all)."""
  live, peak, lock = [0], [0], threading.Lock()

  def slow(image, rng):  # Sleeps, so the threads overlap on any number of cores.
    with lock:
      live[0] += 1
      peak[0] = max(peak[0], live[0])
    time.sleep(0.05)
    with lock:
      live[0] -= 1
    return image

  source = sources.ArraySource(np.zeros((256, 2, 2, 3), np.uint8), np.zeros(256, np.int64), 10)
  train_loader = loader.TrainLoader(
      source, slow, global_batch_size=4, seed=0, num_classes=10, num_workers=12,
      sharding=sharding.batch_sharding(sharding.make_mesh(None, jax.devices()[:1])))
  batches = train_loader.iterate_local(0)
  for _ in range(12):
    next(batches)
  batches.close()
  assert peak[0] == 12


def test_each_process_reads_the_rows_its_devices_hold():
  devices = jax.devices()
  host = devices[:4]  # The first of two processes of four devices.
  rows = lambda mesh, order=range(8): loader.process_rows(sharding.batch_sharding(
      sharding.make_mesh(mesh, [devices[i] for i in order])), 64, host)
  np.testing.assert_array_equal(rows({'data': 2, 'tensor': 4}), np.arange(32))
  np.testing.assert_array_equal(rows({'fsdp': 2, 'tensor': 4}), np.arange(32))
  # A tensor axis across the hosts: both hold (and read) every row.
  np.testing.assert_array_equal(rows({'tensor': 8}), np.arange(64))
  np.testing.assert_array_equal(rows({'data': 4, 'tensor': 2}, (0, 4, 1, 5, 2, 6, 3, 7)),
                                np.arange(64))
  # Hosts that alternate along the data axis read alternate blocks.
  np.testing.assert_array_equal(rows({'data': 4, 'tensor': 2}, (0, 1, 4, 5, 2, 3, 6, 7)),
                                np.r_[0:16, 32:48])


def test_eval_batches_cover_every_example_once():
  source = sources.digits('test')
  mesh = sharding.make_mesh(None)
  batches = list(loader.eval_batches(source, preprocess.parse('to_rgb|value_range(-1, 1)'),
                                     global_batch_size=64, sharding=sharding.batch_sharding(mesh),
                                     num_classes=10))
  masks = np.concatenate([jax.device_get(b['mask']) for b in batches])
  assert len(batches) == 6 and masks.sum() == len(source) == 359
  labels = np.concatenate([jax.device_get(b['label']) for b in batches])[masks > 0]
  np.testing.assert_array_equal(labels.argmax(-1), source.labels)


@functools.cache
def _sample_builder():
  """A TFDS builder of 512 + 256 Fashion-MNIST images (a class: TFDS registers it by name)."""
  import tensorflow_datasets as tfds

  class FashionMnistSample(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(shape=(28, 28, 1)),
          'label': tfds.features.ClassLabel(names=sources.FASHION_MNIST_CLASSES)}))

    def _split_generators(self, dl_manager):
      return {'train': self._generate_examples('train', 512),
              'test': self._generate_examples('test', 256)}

    def _generate_examples(self, split, n):
      source = sources.idx_dataset(SHARED_DATA / 'fashion_mnist', split)
      for i in range(n):
        yield i, {'image': source.images[i], 'label': int(source.labels[i])}

  return FashionMnistSample


def _prepare_tfds(directory, file_format):
  """The sample prepared in ``file_format``: (name, data_dir, the IDX data it came from)."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f'real data not found at {SHARED_DATA}')
  idx = {split: sources.idx_dataset(SHARED_DATA / 'fashion_mnist', split)
         for split in ('train', 'test')}
  builder = _sample_builder()(data_dir=str(directory))
  builder.download_and_prepare(file_format=file_format)
  return builder.name, str(directory), idx


@pytest.fixture(scope='module')
def local_tfds(tmp_path_factory):
  """The sample in ArrayRecord format: (name, data_dir, the IDX data it came from)."""
  return _prepare_tfds(tmp_path_factory.mktemp('tfds'), 'array_record')


@pytest.fixture(scope='module')
def local_tfds_tfrecord(tmp_path_factory):
  """The same sample in TFRecord format, TFDS's default."""
  return _prepare_tfds(tmp_path_factory.mktemp('tfds_tfrecord'), 'tfrecord')


@pytest.mark.slow
def test_tfds_source_reads_a_prepared_dataset(local_tfds):
  name, data_dir, idx = local_tfds
  config = ml_collections.ConfigDict(dict(name=name, data_dir=data_dir))
  source = sources.get_source(config, 'test')
  assert len(source) == 256 and source.num_classes == 10
  # TFDS stores the examples in its own order: compare (label, pixels) as a multiset.
  got = sorted((int(source[i]['label']), source[i]['image'].tobytes()) for i in range(256))
  want = sorted((int(label), image.tobytes())
                for image, label in zip(idx['test'].images[:256], idx['test'].labels[:256],
                                        strict=True))
  assert got == want


def test_unprepared_tfds_dataset_is_explained(tmp_path):
  config = ml_collections.ConfigDict(dict(name='cifar10', data_dir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match="TFDS dataset 'cifar10' is not prepared in"):
    sources.get_source(config, 'train')


def test_a_dataset_name_that_names_nothing_is_refused_without_reading_data(tmp_path):
  """``check_name``, which a command runs before jax: a name that is not prepared, bundled,
  local or a VTAB task is refused; one TFDS will prepare, or one prepared, passes."""
  def dataset(name, **fields):
    return ml_collections.ConfigDict({'name': name, 'data_dir': str(tmp_path),
                                      'prepare': False, **fields})

  for name in ('cifar10', 'imagenet9', 'cifar10:3.*.*'):
    with pytest.raises(errors.ConfigError, match=f"^config.dataset.name='{re.escape(name)}': "
                       f'no dataset of that name is prepared in {tmp_path} '):
      sources.check_name(dataset(name))
  with pytest.raises(errors.ConfigError, match="^config.dataset.name='vtab/dtdd' is not a VTAB "
                                               'task: vtab/ and one of caltech101, '):
    sources.check_name(dataset('vtab/dtdd'))
  (tmp_path / 'cifar10' / '3.0.2').mkdir(parents=True)
  (tmp_path / 'cifar10' / '3.0.2' / 'dataset_info.json').write_text('{"splits": []}')
  for ok in (dataset('cifar10'), dataset('cifar10:3.*.*'), dataset('imagenet9', prepare=True),
             dataset('digits'), dataset('vtab/dtd'), dataset('fashion_mnist')):
    sources.check_name(ok)


def test_tfds_tfrecord_dataset_reads_as_its_array_record_twin(local_tfds, local_tfds_tfrecord,
                                                              tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  name, array_record_dir, _ = local_tfds
  _, tfrecord_dir, _ = local_tfds_tfrecord
  for split, examples in (('test', 256), ('train[25%:75%]', 256)):
    twin = sources.get_source(ml_collections.ConfigDict(dict(name=name,
                                                             data_dir=array_record_dir)), split)
    source = sources.get_source(ml_collections.ConfigDict(dict(name=name,
                                                               data_dir=tfrecord_dir)), split)
    assert len(source) == len(twin) == examples
    for i in range(examples):  # Example i is the same example, in the same order.
      a, b = source[i], twin[i]
      assert int(a['label']) == int(b['label'])
      np.testing.assert_array_equal(a['image'], b['image'])
  # The offsets are kept, one file a shard; walked in chunks (remote files), the same.
  shards = sorted(pathlib.Path(tfrecord_dir).rglob('*.tfrecord-*'))
  assert len(list((tmp_path / 'cache' / 'vit_jax' / 'tfrecord_offsets').iterdir())) == len(shards)
  hop = tfrecord.record_offsets(shards[0])
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'other'))
  np.testing.assert_array_equal(tfrecord.record_offsets(shards[0], sequential=True), hop)
  # A truncated shard is an error, not a shifted dataset.
  truncated = tmp_path / 'truncated.tfrecord'
  truncated.write_bytes(shards[0].read_bytes()[:-100])
  for sequential in (False, True):
    with pytest.raises(ValueError, match='truncated.tfrecord is not a complete TFRecord file'):
      tfrecord.record_offsets(truncated, sequential=sequential)


@pytest.mark.slow
def test_a_run_on_tfrecord_data_resumes_exactly(local_tfds_tfrecord, tmp_path, monkeypatch):
  import shutil

  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  name, data_dir, _ = local_tfds_tfrecord
  config = tiny_config(**{'total_steps': 8, 'checkpoint_every_steps': 4, 'log_every_steps': 2,
                          'schedule.warmup_steps': 2})
  config.dataset = ml_collections.ConfigDict(dict(
      name=name, data_dir=data_dir, num_classes=10, train_split='train', eval_split='test',
      pp_train='to_rgb|resize(16)|flip_lr|value_range(-1, 1)',
      pp_eval='to_rgb|resize(16)|value_range(-1, 1)'))
  config.profile_steps = (2, 4)
  result = main.train_and_evaluate(config, str(tmp_path / 'a'))
  assert result['eval/examples'] == 256
  assert list((tmp_path / 'a' / 'profile').rglob('*.xplane.pb'))  # The profiler trace.
  (tmp_path / 'b' / 'checkpoints').mkdir(parents=True)
  shutil.copytree(tmp_path / 'a' / 'checkpoints' / '4', tmp_path / 'b' / 'checkpoints' / '4')
  assert main.train_and_evaluate(config, str(tmp_path / 'b')) == result
  losses = lambda run: {m['step']: m['train/loss'] for m in read_metrics(tmp_path / run)
                        if 'train/loss' in m}
  assert losses('b') == {s: loss for s, loss in losses('a').items() if s > 4}
  chex.assert_trees_all_equal(restore_state(tmp_path / 'a', config),
                              restore_state(tmp_path / 'b', config))


def _write_tfrecord(path, records):
  import tensorflow as tf

  with tf.io.TFRecordWriter(str(path)) as writer:
    for record in records:
      writer.write(record)


@pytest.mark.parametrize('same_mtime', [False, True])
def test_a_shard_rewritten_with_the_same_size_is_indexed_again(tmp_path, monkeypatch,
                                                               same_mtime):
  """The cache of offsets never goes stale: a shard rewritten in place (same path, size and
  inode) with other record lengths, with a new modification time or (as within one clock
  tick) the same one restored, reads the new records."""
  pytest.importorskip('tensorflow')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  shard = tmp_path / 'data.tfrecord-00000-of-00001'
  old = [b'a' * 10, b'b' * 30, b'c' * 20]
  new = [b'x' * 30, b'y' * 10, b'z' * 20]
  _write_tfrecord(shard, old)
  size, inode, mtime = shard.stat().st_size, shard.stat().st_ino, shard.stat().st_mtime_ns
  np.testing.assert_array_equal(tfrecord.record_offsets(shard), [0, 26, 72])
  _write_tfrecord(tmp_path / 'new', new)
  data = (tmp_path / 'new').read_bytes()
  with open(shard, 'r+b') as f:  # In place: the same inode.
    f.write(data)
  os.utime(shard, ns=(mtime, mtime) if same_mtime else (mtime + 10**9, mtime + 10**9))
  assert (shard.stat().st_size, shard.stat().st_ino) == (size, inode)
  assert (shard.stat().st_mtime_ns == mtime) == same_mtime
  np.testing.assert_array_equal(tfrecord.record_offsets(shard), [0, 46, 72])
  records = tfrecord.Records([types.SimpleNamespace(filename=str(shard), skip=0, take=3,
                                                    examples_in_shard=3)])
  assert [records[i] for i in range(3)] == new


def test_a_tfds_dataset_without_tfds_installed_is_one_error(monkeypatch):
  import sys

  from vit_jax.base import errors

  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # The core install's.
  with pytest.raises(errors.ConfigError, match=r"'cifar10' is read through TFDS, which this "
                     r'install lacks: pip install -e "\.\[tf\]"'):
    sources.TFDSSource('cifar10', 'train')
