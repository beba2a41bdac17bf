"""vit_jax.paths: the command lines' paths checked with the standard library, creating nothing."""

import os
import sys

import pytest

from vit_jax import errors, paths


def test_an_output_folder_is_checked_and_not_created(tmp_path):
  target = tmp_path / 'a' / 'b'
  assert paths.output_dir(str(target)) == str(target)
  assert not (tmp_path / 'a').exists() and os.listdir(tmp_path) == []  # No file left either.
  (tmp_path / 'f').write_text('')
  with pytest.raises(errors.PathError, match='is a file, not a folder'):
    paths.output_dir(str(tmp_path / 'f'))
  with pytest.raises(errors.PathError, match=f'cannot be created: {tmp_path / "f"} is a file'):
    paths.output_dir(str(tmp_path / 'f' / 'sub'))
  with pytest.raises(errors.PathError, match='is a folder: name the file'):
    paths.output_path(str(tmp_path), 'out')
  with pytest.raises(errors.ConfigError, match='--workdir is required'):
    paths.output_dir(None)


@pytest.mark.skipif(sys.platform != 'linux' or os.geteuid() == 0,
                    reason='permission bits bind a non-root user on Linux')
def test_a_folder_without_write_permission_is_refused(tmp_path):
  locked = tmp_path / 'locked'
  locked.mkdir(mode=0o555)
  with pytest.raises(errors.PathError, match='cannot be written'):
    paths.output_dir(str(locked / 'run'))


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')
def test_a_place_where_nothing_can_be_written_is_refused_also_for_root():
  with pytest.raises(errors.PathError, match='cannot be written'):
    paths.output_dir('/proc/vit_jax_test/run')


def test_remote_paths_are_left_to_the_file_system_layer():
  assert paths.output_dir('gs://bucket/run') == 'gs://bucket/run'
  assert paths.input_path('gs://bucket/ViT-B_16.npz', 'npz') == 'gs://bucket/ViT-B_16.npz'


def test_inputs_must_exist(tmp_path):
  (tmp_path / 'a.png').write_text('')
  here, gone = str(tmp_path / 'a.png'), str(tmp_path / 'b.png')
  with pytest.raises(errors.MissingFileError, match=f'--npz={gone} does not exist'):
    paths.input_path(gone, 'npz')
  with pytest.raises(errors.MissingFileError, match=f'{gone} does not exist'):
    paths.input_files([here, gone])
  assert paths.input_files([here, gone], every=False) == [here, gone]  # One is there.
  with pytest.raises(errors.MissingFileError, match='is not the workdir of a vit_jax.main run'):
    paths.run_dir(str(tmp_path))
  (tmp_path / 'checkpoints').mkdir()
  assert paths.run_dir(str(tmp_path)) == str(tmp_path)
