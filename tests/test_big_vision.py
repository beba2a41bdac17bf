"""vit_jax.checkpoints.formats.big_vision: tensorstore checkpoints written by big_vision's own
trainer code (tests/data/hub/make_big_vision_fixture.py), read back with big_vision's logits."""

import pathlib
import shutil

import chex
import jax
import numpy as np
import pytest

from vit_jax.base import errors
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import big_vision, layout

HUB = pathlib.Path(__file__).resolve().parent / 'data' / 'hub'


@pytest.fixture(scope='module')
def reference():
  return np.load(HUB / 'bv_logits.npz')


@pytest.mark.parametrize('name, pool', [('bv_tok', None), ('bv_gap_scan', 'gap')])
def test_tensorstore_checkpoints_give_big_vision_logits(name, pool, reference):
  # big_vision records neither the input size (16x24: a 4x6 grid) nor, for 'gap', the pool.
  loaded = formats.load(str(HUB / name), pool=pool, image_size=(16, 24), source_grid=(4, 6))
  assert loaded.model.pool == ('token' if name == 'bv_tok' else 'gap')
  logits = jax.jit(loaded.model.apply)({'params': loaded.params}, reference['images'])
  want = reference[f'{name}/logits']
  assert np.abs(np.asarray(logits) - want).max() / np.abs(want).max() <= 1e-5


def test_only_the_parameters_are_read_in_the_release_layout():
  flat = big_vision.read_params(HUB / 'bv_gap_scan')
  assert all(not k.startswith(('opt/', 'chrono/', 'params/')) for k in flat)
  # The scanned blocks unstacked; big_vision's posemb without a class row (no class token).
  chex.assert_shape(flat['Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel'], (16, 32))
  chex.assert_shape(flat[layout.POSEMB_KEY], (1, 24, 16))
  tok = big_vision.read_params(HUB / 'bv_tok')
  chex.assert_shape(tok[layout.POSEMB_KEY], (1, 25, 16))  # A zero row for the class token.
  chex.assert_trees_all_equal(tok[layout.POSEMB_KEY][0, 0], np.zeros(16, np.float32))


def test_workdir_prefix_and_step_folder_name_the_same_checkpoint(tmp_path):
  workdir = tmp_path / 'bv'
  shutil.copytree(HUB / 'bv_tok', workdir)
  step = workdir / 'checkpoint.bv-000000003'
  for path in (workdir, workdir / 'checkpoint.bv', step):
    assert big_vision.step_folder(path) == str(step)
  assert big_vision.step_folder(workdir, step=3) == str(step)
  with pytest.raises(errors.MissingFileError, match='checkpoint.bv-000000002 is missing'):
    big_vision.step_folder(workdir, step=2)
  assert big_vision.step_folder(tmp_path) is None
  chex.assert_trees_all_equal(big_vision.read_params(step), big_vision.read_params(workdir))


def test_a_classifier_of_unknown_pooling_is_refused_in_one_line():
  with pytest.raises(errors.CheckpointMismatchError) as e:
    formats.load(str(HUB / 'bv_gap_scan'), image_size=(16, 24), source_grid=(4, 6))
  assert "pool type 'gap', '0' or 'none'" in str(e.value) and '\n' not in str(e.value)


def test_a_partial_copy_is_refused_not_read_as_zeros(tmp_path):
  """Zarr reads a missing chunk as zeros: a checkpoint copied but for one chunk would load,
  wrong. Every chunk each params~ .zarray describes must be there; a fill value lets
  tensorstore leave a chunk equal to it unwritten, so such an array is not held to that."""
  copy = shutil.copytree(HUB / 'bv_tok', tmp_path / 'bv')
  array = copy / 'checkpoint.bv-000000003' / 'params~Transformer~encoder_norm~scale'
  (array / '0').unlink()
  with pytest.raises(errors.CheckpointError, match=r'encoder_norm~scale: its chunk 0 is missing'):
    big_vision.read_params(copy)
  zarray = array / '.zarray'
  zarray.write_text(zarray.read_text().replace('"fill_value":null', '"fill_value":0'))
  assert (big_vision.read_params(copy)['Transformer/encoder_norm/scale'] == 0).all()
