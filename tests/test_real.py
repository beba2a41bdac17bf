"""vit_jax.evals.real, and ImageNet-v2 as a classification evaluator: through TFDS, on tiny
TFDS datasets written here under the real names (the registered builders read them back)."""

import io

import chex
import jax
import numpy as np
import pytest
from PIL import Image

from vit_jax import evals, main
from vit_jax.base import errors, sharding
from vit_jax.checkpoints.run import workdir
from vit_jax.data import preprocess, sources
from vit_jax.models import get_model
from vit_jax.training import plan as plan_lib

from runs import TINY_MODEL, read_metrics, tiny_config

PP = 'decode|resize(16)|value_range(-1, 1)'
N = 24
# The ReaL sets of the tiny validation split: every 4th one empty (left out of the score).
REAL_SETS = [[] if i % 4 == 0 else sorted({(i * 7) % 5, (i * 3) % 11})[:1 + i % 2]
             for i in range(N)]


def _jpeg(i):
  pixels = np.random.default_rng(i).integers(0, 256, (16, 16, 3), dtype=np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format='JPEG', quality=95)
  return buffer.getvalue()


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """imagenet2012_real (validation) and imagenet_v2 (test), N images each, as TFRecord."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.datasets.imagenet2012 import imagenet_common
  from tensorflow_datasets.datasets.imagenet2012_real import (
    imagenet2012_real_dataset_builder as real_lib,
  )
  from tensorflow_datasets.datasets.imagenet_v2 import imagenet_v2_dataset_builder as v2_lib

  labels = lambda: tfds.features.ClassLabel(names_file=imagenet_common.label_names_file())

  class TinyReal(real_lib.Builder, skip_registration=True):
    name = 'imagenet2012_real'

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(encoding_format='jpeg'), 'original_label': labels(),
          'real_label': tfds.features.Sequence(labels()), 'file_name': tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {'validation': self._generate_examples()}

    def _generate_examples(self):
      for i in range(N):
        yield i, {'image': _jpeg(i), 'original_label': 999, 'real_label': REAL_SETS[i],
                  'file_name': f'ILSVRC2012_val_{i:08d}.JPEG'}

  class TinyV2(v2_lib.Builder, skip_registration=True):
    name = 'imagenet_v2'

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(encoding_format='jpeg'), 'label': labels(),
          'file_name': tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {'test': self._generate_examples()}

    def _generate_examples(self):
      for i in range(N):
        yield i, {'image': _jpeg(100 + i), 'label': i % 3, 'file_name': f'{i}.jpeg'}

  directory = str(tmp_path_factory.mktemp('imagenet_variants'))
  for builder in (TinyReal, TinyV2):
    builder(data_dir=directory).download_and_prepare(file_format='tfrecord')
  return directory


def stored_sets(data_dir):
  """REAL_SETS in the order TFDS stored the examples (it shuffles them), read by file name."""
  import tensorflow_datasets as tfds

  from vit_jax.data import tfrecord

  raw = tfrecord.TFRecordSource(tfds.builder('imagenet2012_real', data_dir=data_dir),
                                'validation')
  return [REAL_SETS[int(raw[j]['file_name'].decode()[-13:-5])] for j in range(len(raw))]


def test_the_real_builders_read_the_tiny_datasets(data_dir):
  real = sources.TFDSSource('imagenet2012_real', 'validation', data_dir, label_key='real_label')
  assert len(real) == N and real.num_classes == 1000 and real.multi_label
  for j, expected in enumerate(stored_sets(data_dir)):
    chex.assert_trees_all_equal(np.flatnonzero(real[j]['label']), np.array(expected, int))
  v2 = sources.TFDSSource('imagenet_v2', 'test', data_dir)
  assert sorted(v2[i]['label'] for i in range(N)) == sorted(i % 3 for i in range(N))
  assert real.class_names == v2.class_names and real.class_names[0] == 'n01440764'


def _model_and_params(head_bias=None, seed=0):
  model = get_model(**TINY_MODEL, num_classes=1000)
  params = model.init(jax.random.key(seed), np.zeros((1, 16, 16, 3), np.float32))['params']
  rng = np.random.default_rng(seed)
  params['head']['kernel'] = rng.normal(size=(32, 1000)).astype(np.float32)
  if head_bias is not None:  # Every image predicted as one class.
    params['head'] = {'kernel': np.zeros((32, 1000), np.float32), 'bias': head_bias}
  return model, params


def imagenet_like(data_dir, **more):
  """The tiny recipe on the tiny imagenet_v2 (1000 classes in imagenet2012's order), with the
  ReaL evaluator and the classification one of imagenet_v2."""
  return tiny_config(**{
      'dataset.name': 'imagenet_v2', 'dataset.num_classes': 1000, 'dataset.data_dir': data_dir,
      'dataset.train_split': 'test', 'dataset.eval_split': 'test', 'dataset.pp_train': PP,
      'dataset.pp_eval': PP, 'batch_size': 8, 'eval_batch_size': 8,
      'evals.real': dict(type='real'),
      'evals.v2': dict(type='classification', dataset='imagenet_v2', split='test'), **more})


def _run(data_dir, model, params):
  """{'real/...': ..., 'v2/...': ...} of ``params``, by the evaluators training builds."""
  plan = plan_lib.validate(imagenet_like(data_dir, eval_batch_size=16))
  assert plan.model.num_classes == model.num_classes == 1000
  params = jax.device_put(params, sharding.shardings_for(params, plan.mesh))
  ctx = evals.Context.from_plan(plan)
  return {f'{e.name}/{k}': v for e in evals.from_config(ctx, ['real', 'v2'])
          for k, v in e.run(params).items()}


@pytest.mark.slow
def test_real_counts_a_prediction_in_the_set_and_leaves_empty_sets_out(data_dir):
  # Known answer: every image predicted as class 2; the non-empty sets that hold 2 count.
  bias = np.zeros(1000, np.float32)
  bias[2] = 10.
  metrics = _run(data_dir, *_model_and_params(head_bias=bias))
  labelled = [s for s in REAL_SETS if s]
  assert metrics['real/examples'] == len(labelled) == 18
  assert metrics['real/accuracy'] == pytest.approx(sum(2 in s for s in labelled) / 18)
  assert 0 < metrics['real/accuracy'] < 1
  assert metrics['v2/accuracy'] == pytest.approx(np.mean([i % 3 == 2 for i in range(N)]))
  assert 'real/loss' not in metrics and metrics['v2/examples'] == N

  # Any model: the same as its predictions computed image by image, on one device.
  model, params = _model_and_params(seed=3)
  metrics = _run(data_dir, model, params)
  real = sources.TFDSSource('imagenet2012_real', 'validation', data_dir, label_key='real_label')
  pp = preprocess.parse(PP)
  images = np.stack([pp(real[i]['image'], np.random.default_rng(0)) for i in range(N)])
  predicted = np.argmax(model.apply({'params': params}, images), -1)
  expected = np.mean([p in s for p, s in zip(predicted, stored_sets(data_dir), strict=True) if s])
  assert metrics['real/accuracy'] == pytest.approx(expected)


@pytest.mark.slow
def test_a_run_logs_real_and_v2_beside_its_top1(data_dir, tmp_path):
  # Trained on the tiny imagenet_v2 itself (1000 classes, imagenet2012's order), so the v2
  # evaluation must repeat the plain one.
  config = imagenet_like(data_dir, total_steps=2, **{'schedule.warmup_steps': 1},
                         checkpoint_every_steps=2)
  result = main.train_and_evaluate(config, str(tmp_path))
  row = {k: v for r in read_metrics(tmp_path) if r['step'] == 2 for k, v in r.items()}
  assert row['v2/accuracy'] == row['eval/accuracy']
  assert row['v2/loss'] == pytest.approx(row['eval/loss'])
  assert row['real/examples'] == 18 and result['real/examples'] == 18

  loaded = workdir.load_run(tmp_path)
  real = sources.TFDSSource('imagenet2012_real', 'validation', data_dir, label_key='real_label')
  pp = preprocess.parse(PP)
  images = np.stack([pp(real[i]['image'], np.random.default_rng(0)) for i in range(N)])
  predicted = np.argmax(loaded.model.apply({'params': loaded.params}, images), -1)
  expected = np.mean([p in s for p, s in zip(predicted, stored_sets(data_dir), strict=True) if s])
  assert row['real/accuracy'] == pytest.approx(expected)


def test_bad_real_v2_configs_are_refused_before_anything_starts(data_dir, tmp_path):
  with pytest.raises(errors.ConfigError, match=r'^config.evals.real: ImageNet ReaL evaluates '
                                               r'a 1000-class .* this model has 10 classes'):
    main.train_and_evaluate(tiny_config(**{'evals.real': dict(type='real')}),
                            str(tmp_path / 'a'))
  with pytest.raises(errors.MissingFileError, match="^config.evals.real: TFDS dataset "
                                                    "'imagenet2012_real' is not prepared"):
    main.train_and_evaluate(imagenet_like(data_dir, **{'evals.real.data_dir': str(tmp_path)}),
                            str(tmp_path / 'b'))
  with pytest.raises(errors.ConfigError, match=r"^config.evals.v2: its data has 10 classes, "
                                               r"the model 1000"):
    main.train_and_evaluate(imagenet_like(data_dir, **{'evals.v2.dataset': 'digits'}),
                            str(tmp_path / 'c'))
  assert not any((tmp_path / d).exists() for d in 'abc')
