"""`python -m vit_jax.vtab` and its data (vit_jax.data.vtab_prepare): tiny runs on tiny TFDS
datasets written here under the real datasets' names and versions, the check before a run,
prepare."""

import json
import pathlib
import shutil
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from vit_jax import vtab
from vit_jax.base import errors
from vit_jax.data import vtab as vtab_tasks
from vit_jax.data import vtab_prepare

from runs import env

HUB = pathlib.Path(__file__).parent / 'data' / 'hub'


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


def test_every_tasks_config_is_validated_before_the_first_task_trains(tiny_run, tiny_tfds,
                                                                     tmp_path):
  """smallnorb_elev's folder holds another run (the tiny run): refused in one line naming it,
  before smallnorb_azi (first in the table, nothing wrong) trains."""
  shutil.copytree(tiny_run, tmp_path / 'vtab' / 'smallnorb_elev')
  settings = dict(init_from=str(tiny_run), data_dir=tiny_tfds, lr=0.03, steps=6,
                  warmup_steps=1, batch_size=16, image_size=16, momentum=0.9, seed=0,
                  train_split='train800val200', eval_split='test')
  with pytest.raises(errors.ConfigError, match=(
      rf'^{tmp_path}/vtab/smallnorb_elev: A resume is the same run, but config.dataset.name='
      r"'vtab/smallnorb_elev' \('digits'\), .* and 6 more fields: .* \(checked before the "
      r"first task's run\)$")):
    vtab.run(vtab_tasks.select('smallnorb_azi,smallnorb_elev'), str(tmp_path / 'vtab'),
             settings)
  assert not (tmp_path / 'vtab' / 'smallnorb_azi').exists()


def test_init_from_takes_any_source_a_timm_folder(tiny_tfds, tmp_path):
  """--init_from of a timm folder, as config.init_from takes it: the task's model is the
  folder's architecture (its config.json), validated as the run validates it, and its
  weights load into that model."""
  from vit_jax import main
  from vit_jax.checkpoints import formats
  from vit_jax.checkpoints.formats import fit
  from vit_jax.checkpoints.run import workdir as workdir_lib

  timm = str(HUB / 'timm_augreg')
  settings = dict(init_from=timm, data_dir=tiny_tfds, lr=0.03, steps=6, warmup_steps=1,
                  batch_size=16, image_size=16, momentum=0.9, seed=0,
                  train_split='train800val200', eval_split='test')
  config = vtab.validate(vtab.task_config(vtab_tasks.select('smallnorb_azi')[0],
                                          vtab.model_fields(timm), settings),
                         str(tmp_path / 'smallnorb_azi'))
  plan, _ = main.prepare(config)
  source = formats.load(timm).model
  assert fit.model_options(plan.model) == fit.model_options(
      source.clone(image_size=16, num_classes=18))
  init = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), jax.eval_shape(
      plan.model.init, jax.random.key(0), np.zeros((1, 16, 16, 3), np.float32))['params'])
  params = workdir_lib.init_params_from(timm, init, plan.model)
  chex.assert_trees_all_equal_shapes(params, init)


# ---------------------------------------------------------------------------
# Preparing the data: TFDS's own builders, the network and the manual downloads stood in for.


def test_a_run_names_every_missing_task_in_one_line_before_anything_starts(tiny_tfds, tmp_path):
  with pytest.raises(errors.MissingFileError) as raised:
    vtab_prepare.check(vtab_tasks.select('structured'), tiny_tfds, 'structured')
  message = str(raised.value)
  assert '6 of the 8 tasks have no prepared TFDS dataset' in message
  for name in ('clevr_count', 'clevr_dist', 'dmlab', 'kitti_dist', 'dsprites_loc',
               'dsprites_ori'):
    assert name in message
  assert 'smallnorb' not in message.split('Prepare')[0]
  assert f'python -m vit_jax.vtab prepare --data_dir={tiny_tfds} --tasks=clevr_count,' in message
  vtab_prepare.check(vtab_tasks.select('smallnorb_azi,smallnorb_elev'), tiny_tfds)
  with pytest.raises(errors.MissingFileError, match=r'19 of the 19 tasks .* \(the folder does '
                     r'not exist\).*--tasks=all; diabetic_retinopathy_detection, '
                     r'oxford_iiit_pet, resisc45 need a manual download'):
    vtab_prepare.check(vtab_tasks.TASKS, str(tmp_path / 'nowhere'), 'all')


def test_a_damaged_dataset_info_is_refused_by_the_check_in_one_line(tiny_tfds, tmp_path):
  """Garbage in a prepared folder's dataset_info.json (a crash mid-write, a damaged disk),
  which TFDS would crash on in protobuf: the check before a run names it and the fix."""
  import shutil

  shutil.copytree(f'{tiny_tfds}/smallnorb', tmp_path / 'smallnorb')
  info = tmp_path / 'smallnorb' / '2.0.0' / 'dataset_info.json'
  for garbage in [bytes(range(256)) * 4, info.read_bytes()[:100], b'[]']:
    info.write_bytes(garbage)
    with pytest.raises(errors.MissingFileError) as raised:
      vtab_prepare.check(vtab_tasks.select('smallnorb_azi'), str(tmp_path))
    assert str(raised.value).startswith(
        f'VTAB data: wrong data for smallnorb_azi ({info} is damaged, not TFDS\'s JSON: remove '
        f'{info.parent} and prepare it again).')
    assert '\n' not in str(raised.value)


def _resisc45_stand_in(folder, classes=('airplane', 'beach'), per_class=3):
  """The extracted NWPU-RESISC45 archive's layout, a few 256x256 JPEGs a class."""
  from PIL import Image

  for c, name in enumerate(classes):
    (folder / 'NWPU-RESISC45' / name).mkdir(parents=True)
    for i in range(per_class):
      Image.fromarray(np.full((256, 256, 3), 40 * c + i, np.uint8)).save(
          folder / 'NWPU-RESISC45' / name / f'{name}_{i + 1:03d}.jpg')


@pytest.fixture
def no_network(monkeypatch):
  """Downloads through a proxy at a closed port of this machine: refused at once, as on a
  machine without network (nothing leaves it)."""
  import socket

  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  for name in ('HTTPS_PROXY', 'HTTP_PROXY', 'https_proxy', 'http_proxy'):
    monkeypatch.setenv(name, f'http://127.0.0.1:{port}')
  for name in ('NO_PROXY', 'no_proxy'):
    monkeypatch.delenv(name, raising=False)


def test_prepare_builds_what_it_can_and_names_the_manual_downloads(tiny_tfds, tmp_path,
                                                                   no_network):
  """resisc45 from its manual download (placed here) by TFDS's own builder; dSprites' file
  placed by hand is not the right one (its checksum); diabetic_retinopathy and
  oxford_iiit_pet 3.x are named with what to place where; smallNORB, prepared earlier, is
  kept."""
  import io
  import shutil

  data_dir = tmp_path / 'tfds'
  shutil.copytree(f'{tiny_tfds}/smallnorb', data_dir / 'smallnorb')
  manual = data_dir / 'downloads' / 'manual'
  _resisc45_stand_in(manual / 'resisc45')
  (manual / 'dsprites').mkdir()
  (manual / 'dsprites' / 'dsprites_ndarray_co1sh3sc6or40x32y32_64x64.hdf5').write_text('no')
  out = io.StringIO()
  tasks = vtab_tasks.select('resisc45,diabetic_retinopathy,oxford_iiit_pet,dsprites_loc,'
                            'smallnorb_azi,smallnorb_elev')
  with pytest.raises(errors.UserError) as raised:
    vtab_prepare.prepare(tasks, str(data_dir), out=out)
  text = out.getvalue()
  rows = {cells[0]: cells for line in text.splitlines() if line.startswith('| ')
          for cells in [[c.strip() for c in line.strip('|').split('|')]] if ':' in cells[0]}
  # resisc45: built by TFDS's builder from the manual folder, every image read.
  assert rows['resisc45:3.*.*'][2] == 'prepared'
  prepared = vtab_prepare.prepared_dir(str(data_dir), 'resisc45:3.*.*')
  assert prepared.endswith('resisc45/3.0.0')
  assert vtab_prepare.split_sizes(prepared) == {'train': 6}
  import tensorflow_datasets as tfds
  built = tfds.builder('resisc45:3.0.0', data_dir=str(data_dir))
  labels = sorted(int(e['label']) for e in built.as_data_source(split='train'))
  names = built.info.features['label'].names
  assert [names[i] for i in labels] == ['airplane'] * 3 + ['beach'] * 3
  # dSprites: the file placed by hand checked, the failure named, the others went on.
  assert rows['dsprites:2.*.*'][2] == 'failed'
  assert 'dsprites: failed in ' not in text and 'NonMatchingChecksumError' in text
  # The manual ones: exactly what to place where.
  assert rows['diabetic_retinopathy_detection/btgraham-300:3.*.*'][2] == 'manual'
  dr = manual / 'diabetic_retinopathy_detection'
  assert f'then unpack train.zip into {dr}/train/' in text and f'{dr}/trainLabels.csv' in text
  assert rows['oxford_iiit_pet:3.*.*'][2] == 'manual'
  assert 'builds only oxford_iiit_pet 4.0.0' in text
  assert f'tensorflow-datasets 4.8 or older into {data_dir}/' in text
  # smallNORB: one dataset for two tasks, kept as it was.
  assert rows['smallnorb:2.*.*'][1] == 'smallnorb_azi, smallnorb_elev'
  assert rows['smallnorb:2.*.*'][2] == 'prepared earlier'
  assert rows['smallnorb:2.*.*'][4].endswith('KiB')  # Measured on disk.
  assert rows['resisc45:3.*.*'][3] == 'by hand' and rows['dsprites:2.*.*'][3] == '26.7 MiB'
  # One line names every task that cannot run yet, and why.
  message = str(raised.value)
  assert 'resisc45 (6 training examples, not the 31,500' in message
  for name in ('diabetic_retinopathy (manual)', 'oxford_iiit_pet (manual)',
               'dsprites_loc (failed)'):
    assert name in message
  assert 'smallnorb' not in message


def test_prepare_without_network_says_so_at_once_and_names_the_files_to_place(tmp_path,
                                                                             no_network):
  """No network: said on the first dataset to download, in seconds (TFDS's retries took 206 s
  for dSprites alone), with the folder and the file names to place by hand; the other
  datasets are not tried either."""
  import io
  import time

  out = io.StringIO()
  start = time.monotonic()
  with pytest.raises(errors.UserError, match=r'svhn \(no network\), dsprites_loc \(no network'):
    vtab_prepare.prepare(vtab_tasks.select('dsprites_loc,svhn'), str(tmp_path), out=out)
  assert time.monotonic() - start < 30
  text = out.getvalue()
  manual = tmp_path / 'downloads' / 'manual'
  assert text.startswith(
      'svhn_cropped:3.*.* (svhn): ...\n'
      'No network (ufldl.stanford.edu cannot be reached: ProxyError: [Errno 111] Connection '
      f'refused): the downloads are not tried. Place each dataset\'s files in {manual}/NAME '
      '(named below), or run this where there is network.\n'
      'svhn_cropped:3.*.*: no network in 0 s: place extra_32x32.mat (from http://ufldl.stanford'
      '.edu/housenumbers/extra_32x32.mat); test_32x32.mat (from ')
  assert f'train_32x32.mat) in {manual}/svhn_cropped\n' in text
  assert ('dsprites:2.*.*: no network in 0 s: place dsprites_ndarray_co1sh3sc6or40x32y32_64x64'
          f'.hdf5 (from https://github.com/deepmind/dsprites-dataset/blob/master/dsprites_ndarray'
          f'_co1sh3sc6or40x32y32_64x64.hdf5?raw=true) in {manual}/dsprites\n') in text
  assert text.count('No network') == 1


def test_an_install_without_tfds_is_told_which_extra_to_add(monkeypatch):
  import importlib.util

  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == 'importlib_resources' else real(name, *a))
  vtab_prepare.require_tfds('vit_jax.vtab')
  with pytest.raises(errors.ConfigError, match=r'vit_jax.vtab prepare reads TFDS datasets, and '
                     r'this install lacks importlib_resources: pip install -e "\.\[tf\]"'):
    vtab_prepare.require_tfds('vit_jax.vtab prepare', ('tensorflow_datasets',
                                                       'importlib_resources'))
