"""Tests of vit_jax.base.paths: files named by URI go through epath's gfile backend, not the os;
the command lines' paths are checked with the standard library, creating nothing.

``ram://`` is TensorFlow's in-memory filesystem: a real non-local filesystem that
``os.path`` and ``open`` cannot see, read and written through the same gfile layer as
``gs://`` (this machine has no network). ``s3://`` has no gfile filesystem in this
TensorFlow: a real backend failure, as an unreachable bucket is.
"""

import os
import subprocess
import sys
import uuid

import pytest
from etils import epath
from etils.epath import backend as epath_backend

from vit_jax.base import errors, paths


def ram_dir() -> epath.Path:
  """A fresh directory on ram:// (the filesystem is shared by the whole test process)."""
  return paths.path(f'ram://{uuid.uuid4().hex}')


def test_ram_paths_are_gfile_paths_the_os_cannot_see():
  root = ram_dir()
  file = root / 'sub' / 'a.bin'
  assert isinstance(file, paths.RamPath) and str(file) == f'{root}/sub/a.bin'
  assert str(file.parent.parent) == str(root) and file.name == 'a.bin'
  assert not paths.exists(file) and not paths.is_file(file)
  file.parent.mkdir(parents=True, exist_ok=True)
  file.write_bytes(b'\x00\x01')
  assert paths.exists(file) and paths.exists(str(file.parent))
  assert paths.is_file(file) and paths.is_dir(file.parent) and not paths.is_file(file.parent)
  assert paths.read_bytes(str(file)) == b'\x00\x01'
  assert paths.is_remote(file) and paths.is_remote('gs://vit_models/x')
  assert not paths.is_remote('/tmp/x') and not paths.is_remote('file:///tmp/x')
  # What os.path would answer: a check through it refuses every remote file.
  assert not os.path.exists(str(file)) and not os.path.exists(f'{root}/sub')


def test_gs_goes_to_tensorflows_gfile():
  # epath picks tf.io.gfile for gs:// when TensorFlow is installed (it is a dependency):
  # no gcsfs needed. ram:// goes the same way.
  assert paths.path('gs://vit_models/imagenet21k/ViT-B_16.npz')._backend is (
      epath_backend.tf_backend)
  assert ram_dir()._backend is epath_backend.tf_backend
  assert paths.path('/tmp/x')._backend is epath_backend.os_backend


def test_file_uris_are_local_paths(tmp_path):
  (tmp_path / 'f.txt').write_text('x')
  uri = (tmp_path / 'f.txt').as_uri()
  assert uri.startswith('file:///')
  assert str(paths.path(uri)) == str(tmp_path / 'f.txt') and paths.is_file(uri)
  with pytest.raises(errors.ConfigError, match='not an absolute file:// URI'):
    paths.path('file://relative/f.txt')


def test_missing_and_unreachable_files_are_user_errors():
  missing = f'{ram_dir()}/missing.npz'
  with pytest.raises(errors.MissingFileError, match=f'cannot read image {missing}: no such file'):
    paths.read_bytes(missing, 'image')
  # No s3 filesystem in this TensorFlow: the backend's own error, as one user error.
  for check in (paths.exists, paths.is_file, paths.is_dir):
    with pytest.raises(errors.MissingFileError,
                       match=r"^cannot read s3://bucket/x\.npz: .*'s3' not implemented"):
      check('s3://bucket/x.npz')
  assert not paths.filesystem_error(ValueError('a bug, not the filesystem'))


@pytest.mark.slow
def test_a_missing_filesystem_backend_is_a_user_error():
  # Without TensorFlow's gfile (EPATH_USE_TF=false: what a user without TensorFlow gets),
  # epath reads gs:// with fsspec, which needs gcsfs (not installed here).
  code = ('from vit_jax.base import errors, paths\n'
          'try:\n  paths.is_file("gs://vit_models/imagenet21k/ViT-B_16.npz")\n'
          'except errors.MissingFileError as e:\n  print(e)\n')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env={**os.environ, 'EPATH_USE_TF': 'false'}, timeout=60)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith('cannot read gs://vit_models/imagenet21k/ViT-B_16.npz: no '
                                  'filesystem for it is installed'), result.stdout
  assert 'pip install gcsfs' in result.stdout


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


def test_path_flags_and_fields_expand_home_and_variables(monkeypatch, tmp_path):
  """A shell leaves ~ and $VAR in --flag=~/x: the path flags and the path fields of a config
  expand them themselves; a bucket's own text is kept."""
  from absl import flags

  from vit_jax.config import cli as config_cli

  monkeypatch.setenv('HOME', str(tmp_path))
  monkeypatch.setenv('VIT_JAX_DATA', str(tmp_path / 'data'))
  assert paths.expand('~/runs/q') == f'{tmp_path}/runs/q'
  assert paths.expand('$VIT_JAX_DATA/x') == paths.expand('${VIT_JAX_DATA}/x') == \
      f'{tmp_path}/data/x'
  assert paths.expand('gs://b/~x') == 'gs://b/~x'
  assert paths.expand('') == '' and paths.expand(None) is None
  values = flags.FlagValues()
  flag = paths.DEFINE_path('workdir', None, 'A folder.', flag_values=values)
  values(['prog', '--workdir=~/w'])
  assert flag.value == f'{tmp_path}/w'
  config = config_cli.load(str(paths.path(__file__).parents[1] / 'configs' / 'quickstart.py'),
                           [('dataset.data_dir', '~/d'), ('init_from', '$VIT_JAX_DATA/r.npz'),
                            ('dataset.name', '~not_a_path')])
  assert (config.dataset.data_dir, config.init_from) == (f'{tmp_path}/d',
                                                          f'{tmp_path}/data/r.npz')
  assert config.dataset.name == '~not_a_path'


def test_paths_typed_anywhere_are_made_absolute_from_the_current_folder(monkeypatch, tmp_path):
  """A relative path names the same file wherever it is read later (Orbax refuses relative
  paths; config.json is read by commands run from elsewhere): the path flags, the argparse
  tools' paths and every path field of a config (overridden or from the recipe, an
  evaluator's too) are made absolute once, from the folder the command runs in. URIs stay."""
  from absl import flags

  from vit_jax import config as config_lib
  from vit_jax.config import cli as config_cli

  monkeypatch.chdir(tmp_path)
  assert paths.expand('runs/q') == paths.expand('./runs/q/') == f'{tmp_path}/runs/q'
  for uri in ('hf-hub:timm/vit_tiny', 'gs://b/runs/q', 'ram://x', 'file:///data/x'):
    assert paths.expand(uri) == uri
  assert os.fspath(paths.absolute('runs/q')) == f'{tmp_path}/runs/q'
  assert paths.absolute('gs://b/q') == epath.Path('gs://b/q')
  values = flags.FlagValues()
  flag = paths.DEFINE_path('workdir', None, 'A folder.', flag_values=values)
  values(['prog', '--workdir=runs/q'])
  assert flag.value == f'{tmp_path}/runs/q'
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'recipe.py').write_text(
      'def get_config():\n'
      "  return {'dataset': {'data_dir': 'data'}, 'evals': {'real': {'type': 'real', "
      "'data_dir': 'real'}}}\n")
  config = config_cli.load('configs/recipe.py', [('init_from', 'pre/run')])
  assert (config.dataset.data_dir, config.evals.real.data_dir, config.init_from) == (
      f'{tmp_path}/data', f'{tmp_path}/real', f'{tmp_path}/pre/run')
  assert config_lib.complete({'init_from': 'hf-hub:timm/vit_tiny'}).init_from == \
      'hf-hub:timm/vit_tiny'
