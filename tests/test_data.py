"""Tests of vit_jax.data on real data: sources, preprocessing, the loader."""

import gzip
import io

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image

from vit_jax import sharding, train
from vit_jax.data import loader, preprocess, sources

from conftest import SHARED_DATA
from runs import tiny_config


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


@pytest.fixture(scope='module')
def local_tfds(tmp_path_factory):
  """A TFDS dataset built here, in ArrayRecord format, from 512 + 256 Fashion-MNIST images."""
  import tensorflow_datasets as tfds

  if not SHARED_DATA.is_dir():
    pytest.skip(f'real data not found at {SHARED_DATA}')
  shared_data, tmp_path = SHARED_DATA, tmp_path_factory.mktemp('tfds')
  idx = {split: sources.idx_dataset(shared_data / 'fashion_mnist', split)
         for split in ('train', 'test')}

  class FashionMnistSample(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(shape=(28, 28, 1)),
          'label': tfds.features.ClassLabel(names=sources.FASHION_MNIST_CLASSES)}))

    def _split_generators(self, dl_manager):
      return {'train': self._generate_examples(idx['train'], 512),
              'test': self._generate_examples(idx['test'], 256)}

    def _generate_examples(self, source, n):
      for i in range(n):
        yield i, {'image': source.images[i], 'label': int(source.labels[i])}

  builder = FashionMnistSample(data_dir=str(tmp_path / 'tfds'))
  builder.download_and_prepare(file_format='array_record')
  return builder.name, str(tmp_path / 'tfds'), idx


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


def test_training_on_a_tfds_dataset(local_tfds, tmp_path):
  name, data_dir, _ = local_tfds
  config = tiny_config(**{'total_steps': 8, 'checkpoint_every_steps': 8})
  config.dataset = ml_collections.ConfigDict(dict(
      name=name, data_dir=data_dir, num_classes=10, train_split='train', eval_split='test',
      pp_train='to_rgb|resize(16)|value_range(-1, 1)',
      pp_eval='to_rgb|resize(16)|value_range(-1, 1)'))
  config.profile_steps = (2, 4)
  result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result['examples'] == 256
  assert list((tmp_path / 'run' / 'profile').rglob('*.xplane.pb'))  # The profiler trace.


def test_unprepared_tfds_dataset_is_explained(tmp_path):
  config = ml_collections.ConfigDict(dict(name='cifar10', data_dir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match="TFDS dataset 'cifar10' is not prepared in"):
    sources.get_source(config, 'train')
