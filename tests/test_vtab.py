"""VTAB-1k: the task table, the label functions on hand-made examples, and tiny runs on
tiny TFDS datasets written here under the real datasets' names and versions."""

import json
import subprocess
import sys

import chex
import numpy as np
import pytest

from vit_jax import vtab
from vit_jax.base import errors
from vit_jax.data import vtab as vtab_tasks

from runs import env


def test_the_table_has_the_19_tasks_in_their_groups():
  chex.assert_equal(len(vtab_tasks.TASKS), 19)
  groups = {g: [t.name for t in vtab_tasks.TASKS if t.group == g] for g in vtab_tasks.GROUPS}
  chex.assert_equal([len(groups[g]) for g in vtab_tasks.GROUPS], [7, 4, 8])
  assert set(groups['structured']) == {'clevr_count', 'clevr_dist', 'dmlab', 'kitti_dist',
                                       'dsprites_loc', 'dsprites_ori', 'smallnorb_azi',
                                       'smallnorb_elev'}
  classes = {t.name: t.num_classes for t in vtab_tasks.TASKS}
  assert classes == {
      'caltech101': 102, 'cifar100': 100, 'dtd': 47, 'oxford_flowers102': 102,
      'oxford_iiit_pet': 37, 'sun397': 397, 'svhn': 10, 'patch_camelyon': 2, 'eurosat': 10,
      'resisc45': 45, 'diabetic_retinopathy': 5, 'clevr_count': 8, 'clevr_dist': 6, 'dmlab': 6,
      'kitti_dist': 4, 'dsprites_loc': 16, 'dsprites_ori': 16, 'smallnorb_azi': 18,
      'smallnorb_elev': 9}


def test_split_strings_are_task_adaptations():
  """Worked by hand from task_adaptation/data/*.py and the datasets' published sizes."""
  splits = {t.name: t.splits() for t in vtab_tasks.TASKS}
  assert splits['cifar100'] == {'train800': 'train[:800]', 'val200': 'train[45000:45200]',
                                'train800val200': 'train[:800]+train[45000:45200]',
                                'test': 'test'}
  assert splits['caltech101']['val200'] == 'train[2754:2954]'  # 90% of 3,060.
  assert splits['oxford_iiit_pet']['val200'] == 'train[2944:3144]'  # 80% of 3,680.
  assert splits['svhn']['val200'] == 'train[65931:66131]'  # 90% of 73,257, rounded down.
  assert splits['clevr_count']['test'] == 'validation'
  assert splits['eurosat']['val200'] == 'train[16200:16400]'  # 60% of 27,000.
  assert splits['eurosat']['test'] == 'train[21600:]'  # After 60% train + 20% validation.
  assert splits['resisc45']['test'] == 'train[25200:]'
  assert splits['dsprites_ori'] == {
      'train800': 'train[:800]', 'val200': 'train[589824:590024]',
      'train800val200': 'train[:800]+train[589824:590024]', 'test': 'train[663552:]'}
  assert splits['smallnorb_azi'] == {'train800': 'train[:800]', 'val200': 'test[:200]',
                                     'train800val200': 'train[:800]+test[:200]',
                                     'test': 'test[50%:]'}
  assert splits['dmlab']['train800val200'] == 'train[:800]+validation[:200]'
  assert vtab_tasks.BY_NAME['kitti_dist'].tfds_name == 'kitti:3.1.0'
  assert vtab_tasks.BY_NAME['dmlab'].tfds_name == 'dmlab:2.0.1'
  assert vtab_tasks.BY_NAME['diabetic_retinopathy'].tfds_name == \
      'diabetic_retinopathy_detection/btgraham-300:3.*.*'


def _objects(**fields):
  return {'objects': {k: np.asarray(v) for k, v in fields.items()}}


def test_clevr_labels():
  assert vtab_tasks.clevr_count(_objects(size=[0, 1, 0])) == 0  # 3 objects.
  assert vtab_tasks.clevr_count(_objects(size=[1] * 10)) == 7  # 10 objects.
  coords = lambda *z: _objects(pixel_coords=[[10., 20., d] for d in z])  # noqa: E731
  # The nearest object's depth, in (0, 8], (8, 8.5], (8.5, 9], (9, 9.5], (9.5, 10], (10, 100].
  assert vtab_tasks.clevr_distance(coords(12.0, 8.2, 9.7)) == 1
  assert vtab_tasks.clevr_distance(coords(8.0)) == 0  # On a threshold: the bin below.
  assert vtab_tasks.clevr_distance(coords(9.0, 11.0)) == 2
  assert vtab_tasks.clevr_distance(coords(9.3)) == 3
  assert vtab_tasks.clevr_distance(coords(9.9)) == 4
  assert vtab_tasks.clevr_distance(coords(10.5, 50.0)) == 5


def test_kitti_distance_label():
  def example(types, depths):
    return _objects(type=types, location=[[1.0, 1.5, z] for z in depths])
  assert vtab_tasks.kitti_distance(example([0], [15.0])) == 1  # A car at 15 m: (8, 20].
  assert vtab_tasks.kitti_distance(example([3, 0], [2.0, 15.0])) == 1  # A pedestrian: no vehicle.
  assert vtab_tasks.kitti_distance(example([1, 0], [5.0, 25.0])) == 0  # The nearest: a van at 5 m.
  assert vtab_tasks.kitti_distance(example([2], [30.0])) == 2  # A truck at 30 m.
  assert vtab_tasks.kitti_distance(example([0], [8.0])) == 0  # On a threshold: the bin below.
  assert vtab_tasks.kitti_distance(example([4, 7], [3.0, 4.0])) == 3  # No vehicle at all.
  assert vtab_tasks.kitti_distance(example([], [])) == 3


def test_dsprites_and_smallnorb_labels():
  loc, ori = vtab_tasks.BY_NAME['dsprites_loc'].label, vtab_tasks.BY_NAME['dsprites_ori'].label
  # 32 x positions in 16 classes of 2; 40 orientations in 16 classes of 2.5.
  assert [loc({'label_x_position': x}) for x in (0, 1, 2, 17, 31)] == [0, 0, 1, 8, 15]
  assert [ori({'label_orientation': o}) for o in (0, 2, 3, 4, 5, 37, 39)] == \
      [0, 0, 1, 1, 2, 14, 15]
  example = {'label_azimuth': 17, 'label_elevation': 3, 'label_category': 4}
  assert vtab_tasks.BY_NAME['smallnorb_azi'].label(example) == 17
  assert vtab_tasks.BY_NAME['smallnorb_elev'].label(example) == 3
  assert vtab_tasks.BY_NAME['dmlab'].label({'label': 5}) == 5
  image = vtab_tasks.BY_NAME['dsprites_loc'].image(np.array([[[0], [1]]], np.uint8))
  chex.assert_trees_all_equal(image, np.array([[[0], [255]]], np.uint8))


def test_task_selection():
  assert [t.name for t in vtab_tasks.select('specialized')] == [
      'patch_camelyon', 'eurosat', 'resisc45', 'diabetic_retinopathy']
  assert len(vtab_tasks.select('all')) == 19
  assert [t.name for t in vtab_tasks.select('smallnorb_elev,dmlab')] == ['dmlab', 'smallnorb_elev']
  with pytest.raises(errors.ConfigError, match='not a VTAB task or group'):
    vtab_tasks.select('natural,cifar10')


@pytest.mark.slow
def test_list_json_prints_the_table():
  out = subprocess.run([sys.executable, '-m', 'vit_jax.vtab', '--list', '--json'],
                       capture_output=True, text=True, check=True).stdout
  table = json.loads(out)
  assert [t['name'] for t in table] == [t.name for t in vtab_tasks.TASKS]
  for row in table:
    assert set(row) == {'name', 'group', 'tfds_name', 'splits', 'num_classes'}
    assert set(row['splits']) == {'train800', 'val200', 'train800val200', 'test'}


# ---------------------------------------------------------------------------
# Tiny TFDS datasets under the real names: the real builders' features, few examples.


def _tiny_builder(name, version, splits, example):
  """The installed TFDS builder ``name`` with its own features but ``splits`` examples."""
  import tensorflow_datasets as tfds

  real = tfds.builder_cls(name)

  class Tiny(real, skip_registration=True):
    VERSION = tfds.core.Version(version)
    SUPPORTED_VERSIONS = []

    def _split_generators(self, dl_manager):
      return {split: self._tiny(split, n) for split, n in splits.items()}

    def _tiny(self, split, n):
      for i in range(n):
        yield f'{split}{i}', example(split, i)

  Tiny.name = name
  return Tiny


def _smallnorb_example(split, i):
  image = np.full((96, 96, 1), (i % 9) * 28, np.uint8)
  return {'image': image, 'image2': image, 'label_category': 4, 'instance': 0,
          'label_elevation': i % 9, 'label_azimuth': (i // 9) % 18, 'label_lighting': 0}


@pytest.fixture(scope='module')
def tiny_tfds(tmp_path_factory):
  """smallnorb 2.0.0 (two tasks: azimuth and elevation), just large enough for train[:800]
  and test[:200] (TFDS refuses a slice past a split's end), in ArrayRecord."""
  data_dir = str(tmp_path_factory.mktemp('vtab_tfds'))
  _tiny_builder('smallnorb', '2.0.0', {'train': 800, 'test': 400},
                _smallnorb_example)(data_dir=data_dir).download_and_prepare(
                    file_format='array_record')
  return data_dir


@pytest.mark.slow
def test_task_sources_read_the_splits_with_the_label_functions(tiny_tfds):
  import tensorflow_datasets as tfds

  source = vtab_tasks.get_source('smallnorb_azi', 'train800val200', tiny_tfds)
  chex.assert_equal(len(source), 1000)  # train[:800] + test[:200].
  # TFDS itself on the same split strings: the azimuths (not the elevations, nor the category).
  raw = tfds.builder('smallnorb:2.0.0', data_dir=tiny_tfds)
  want = [int(raw.as_data_source(split=split)[i]['label_azimuth'])
          for split, n in (('train[:800]', 800), ('test[:200]', 200)) for i in range(n)]
  chex.assert_equal([int(source[i]['label']) for i in range(1000)], want)
  assert want != [int(raw.as_data_source(split='train[:800]+test[:200]')[i]['label_elevation'])
                  for i in range(1000)]
  chex.assert_equal(source[0]['image'].shape, (96, 96, 1))
  chex.assert_equal(len(vtab_tasks.get_source('smallnorb_elev', 'test', tiny_tfds)), 200)  # [50%:].
  with pytest.raises(errors.MissingFileError, match='not prepared'):
    vtab_tasks.get_source('dtd', 'test', tiny_tfds)


def test_a_share_task_of_another_size_is_refused(tmp_path):
  """dsprites' val200 and test are cut at shares of 737,280 examples: 48 would move them."""
  def example(split, i):
    return {'image': np.zeros((64, 64, 1), np.uint8), 'label_orientation': i % 40,
            'label_scale': 0, 'label_shape': 0, 'label_x_position': i % 32,
            'label_y_position': 0, 'value_orientation': 0., 'value_scale': 0.,
            'value_shape': 0., 'value_x_position': 0., 'value_y_position': 0.}
  _tiny_builder('dsprites', '2.0.0', {'train': 48}, example)(
      data_dir=str(tmp_path)).download_and_prepare(file_format='array_record')
  with pytest.raises(errors.DataError, match='holds 48 training examples.*737280'):
    vtab_tasks.get_source('dsprites_loc', 'train800', str(tmp_path))


@pytest.mark.slow
def test_vtab_runs_two_tasks_prints_the_grouped_table_and_resumes(tiny_run, tiny_tfds,
                                                                   tmp_path):
  workdir = tmp_path / 'vtab'
  command = [sys.executable, '-m', 'vit_jax.vtab', f'--init_from={tiny_run}',
             f'--workdir={workdir}', f'--data_dir={tiny_tfds}',
             '--tasks=smallnorb_elev,smallnorb_azi',
             '--steps=6', '--warmup_steps=1', '--batch_size=16', '--image_size=16',
             '--lr=0.03', '--config.log_every_steps=3', '--config.input_workers=2']
  first = subprocess.run(command, env=env(2), capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  results = json.loads((workdir / 'vtab_results.json').read_text())
  assert set(results['tasks']) == {'smallnorb_azi', 'smallnorb_elev'}
  for task in ('smallnorb_azi', 'smallnorb_elev'):
    rows = [json.loads(line) for line in (workdir / task / 'metrics.jsonl').open()]
    final = [r for r in rows if r['step'] == 6 and 'eval/accuracy' in r]
    chex.assert_equal(len(final), 1)
    assert results['tasks'][task] == final[0]['eval/accuracy']
    config = json.loads((workdir / task / 'config.json').read_text())
    assert config['dataset']['name'] == f'vtab/{task}'
    assert config['dataset']['train_split'] == 'train800val200'
    assert (config['optimizer']['name'], config['schedule']['base_lr']) == ('sgd', 0.03)
  rows = [json.loads(line) for line in (workdir / 'smallnorb_azi' / 'metrics.jsonl').open()]
  assert [r['eval/examples'] for r in rows if 'eval/examples' in r] == [200]  # test[50%:].
  structured = results['groups']['structured']
  assert structured['tasks'] == 2 and structured['of'] == 8
  np.testing.assert_allclose(structured['mean'], np.mean(list(results['tasks'].values())))
  assert results['groups']['natural']['mean'] is None
  np.testing.assert_allclose(results['mean'], structured['mean'])
  assert '| smallnorb_azi | structured |' in first.stdout
  assert '| **structured** mean (2 of 8 tasks) |' in first.stdout
  assert '| **VTAB** mean (2 of 19 tasks) |' in first.stdout

  steps_before = sorted(p.name for p in (workdir / 'smallnorb_azi' / 'checkpoints').iterdir())
  again = subprocess.run(command, env=env(2), capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'smallnorb_azi: finished earlier' in again.stdout
  assert 'smallnorb_elev: finished earlier' in again.stdout
  assert 'fine-tuning' not in again.stdout
  assert sorted(p.name for p in (workdir / 'smallnorb_azi' / 'checkpoints').iterdir()) == \
      steps_before
  assert json.loads((workdir / 'vtab_results.json').read_text())['tasks'] == results['tasks']

  settings = json.loads((workdir / 'smallnorb_azi' / vtab.RESULT_FILE).read_text())['settings']
  with pytest.raises(errors.ConfigError, match=r'finished with other settings \(lr differ\)'):
    vtab.run(vtab_tasks.select('smallnorb_azi'), str(workdir), {**settings, 'lr': 0.01})
