"""vit_jax.data.vtab: VTAB-1k's task table, every task's splits, and the label functions on
hand-made examples."""

import chex
import numpy as np
import pytest

from vit_jax.base import errors
from vit_jax.data import vtab as vtab_tasks


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


# Every task's four splits, worked by hand from google-research/task_adaptation's
# task_adaptation/data/*.py: 'validation' datasets take train[:800] and validation[:200];
# the others cut val200 at their TRAIN_SPLIT_PERCENT of the training split
# (percent * count // 100): caltech, cifar, svhn, clevr 90; pets 80; eurosat, resisc45 60 (test
# after 60 + 20); dsprites 80 (test after 80 + 10); smallnorb val200 = test[:200], test =
# test[50%:]; clevr's test is its validation split.
def _share(train, test):
  return {'train800': 'train[:800]', 'val200': f'train[{train}:{train + 200}]',
          'train800val200': f'train[:800]+train[{train}:{train + 200}]', 'test': test}


_VALIDATION = {'train800': 'train[:800]', 'val200': 'validation[:200]',
               'train800val200': 'train[:800]+validation[:200]', 'test': 'test'}
TASK_ADAPTATION_SPLITS = {
    'caltech101': _share(2754, 'test'),  # 90% of 3,060.
    'cifar100': _share(45000, 'test'),
    'dtd': _VALIDATION,
    'oxford_flowers102': _VALIDATION,
    'oxford_iiit_pet': _share(2944, 'test'),  # 80% of 3,680.
    'sun397': _VALIDATION,
    'svhn': _share(65931, 'test'),  # 90% of 73,257, rounded down.
    'patch_camelyon': _VALIDATION,
    'eurosat': _share(16200, 'train[21600:]'),  # 60% and 60 + 20% of 27,000.
    'resisc45': _share(18900, 'train[25200:]'),  # Of 31,500.
    'diabetic_retinopathy': _VALIDATION,
    'clevr_count': _share(63000, 'validation'),
    'clevr_dist': _share(63000, 'validation'),
    'dmlab': _VALIDATION,
    'kitti_dist': _VALIDATION,
    'dsprites_loc': _share(589824, 'train[663552:]'),  # 80% and 80 + 10% of 737,280.
    'dsprites_ori': _share(589824, 'train[663552:]'),
    'smallnorb_azi': {'train800': 'train[:800]', 'val200': 'test[:200]',
                      'train800val200': 'train[:800]+test[:200]', 'test': 'test[50%:]'},
    'smallnorb_elev': {'train800': 'train[:800]', 'val200': 'test[:200]',
                       'train800val200': 'train[:800]+test[:200]', 'test': 'test[50%:]'},
}
# The splits' sizes in the versions task_adaptation names (TFDS's catalog).
SPLIT_SIZES = {
    'caltech101': {'train': 3060, 'test': 6084},
    'cifar100': {'train': 50_000, 'test': 10_000},
    'dtd': {'train': 1880, 'validation': 1880, 'test': 1880},
    'oxford_flowers102': {'train': 1020, 'validation': 1020, 'test': 6149},
    'oxford_iiit_pet': {'train': 3680, 'test': 3669},
    'sun397': {'train': 76_128, 'validation': 10_875, 'test': 21_750},
    'svhn_cropped': {'train': 73_257, 'test': 26_032, 'extra': 531_131},
    'patch_camelyon': {'train': 262_144, 'validation': 32_768, 'test': 32_768},
    'eurosat': {'train': 27_000},
    'resisc45': {'train': 31_500},
    'diabetic_retinopathy_detection': {'train': 35_126, 'validation': 10_906, 'test': 42_670},
    'clevr': {'train': 70_000, 'validation': 15_000, 'test': 15_000},
    'dmlab': {'train': 65_550, 'validation': 22_628, 'test': 22_735},
    'kitti': {'train': 6347, 'validation': 423, 'test': 711},
    'dsprites': {'train': 737_280},
    'smallnorb': {'train': 24_300, 'test': 24_300},
}


@pytest.mark.parametrize('task', vtab_tasks.TASKS, ids=lambda t: t.name)
def test_every_tasks_splits_are_task_adaptations_sized_and_disjoint(task):
  """The four split strings of all 19 tasks; read by TFDS's own split parser at the
  published sizes: 800, 200 and 1,000 examples, val200 and test outside train800 (and
  test outside val200), every range inside its split."""
  import types

  import tensorflow_datasets as tfds

  splits = task.splits()
  assert splits == TASK_ADAPTATION_SPLITS[task.name]
  sizes = SPLIT_SIZES[vtab_tasks.BY_NAME[task.name].tfds_name.split(':')[0].split('/')[0]]
  if task.layout == 'share':
    assert task.train_examples == sizes['train']
  infos = {name: types.SimpleNamespace(num_examples=n) for name, n in sizes.items()}

  def ranges(key):
    out = set()
    for part in tfds.core.ReadInstruction.from_spec(splits[key]).to_absolute(infos):
      n = sizes[part.splitname]
      start, stop = part.from_ or 0, n if part.to is None else part.to
      assert 0 <= start < stop <= n, (key, part)
      out |= {(part.splitname, i) for i in range(start, stop)}
    return out

  got = {key: ranges(key) for key in vtab_tasks.SPLIT_KEYS}
  assert [len(got[k]) for k in ('train800', 'val200', 'train800val200')] == [800, 200, 1000]
  assert not got['train800'] & got['val200']
  assert got['train800val200'] == got['train800'] | got['val200']
  assert not got['test'] & got['train800val200']


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
