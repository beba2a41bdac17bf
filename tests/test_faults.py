"""Faults injected as they happen to users: damaged checkpoints, kill -9, SIGTERM, bad flags,
divergence, two runs on one workdir, a changed config on resume, a read-only file system.

Every case ends in a correct continuation (bitwise that of an uninterrupted run)
or in one line, ``error: ...``, naming the problem and the fix. The damage cases
share the workdir of the ``tiny_run`` fixture (10 steps, checkpoints 5 and 10),
copied per case; ``benchmarks.faults`` is the long version (kill -9 at
random steps, N times). Each bad config is in tests/test_plan.py (``validate``),
each bad converter input in tests/test_convert.py.
"""

import argparse
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import chex
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from vit_jax import checkpoints, evaluation, main
from vit_jax.base import errors
from vit_jax.checkpoints.run import lock, workdir
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.tools import export, predict
from vit_jax.training import divergence

from runs import (
  QUICKSTART,
  ROOT,
  TINY_RUN,
  abstract_state,
  env,
  fill,
  local_launch_command,
  main_command,
  read_metrics,
  restore_state,
  tiny_config,
)


def overwrite_chunk_bytes(step_dir):
  """Overwrites 8 bytes in the middle of an array chunk stored in a data file.

  OCDBT checksums its B-tree nodes, which hold the small values; larger chunks are
  stored apart (zstd frames, raw when the values do not compress), unchecked: the
  damage TensorStore reads without an error.
  """
  import tensorstore as ts

  kvstore = ts.KvStore.open(f'file://{step_dir / "default"}/').result()
  root = ts.ocdbt.dump(kvstore).result()['versions'][0]['root']['location']
  entry = next(e for e in ts.ocdbt.dump(kvstore, root).result()['entries']
               if 'indirect_value' in e)
  # 'value:ocdbt.process_0/:d/FILE:OFFSET:LENGTH'
  directory, name, offset, length = entry['indirect_value'][len('value:'):].split(':')
  path = step_dir / 'default' / directory / name
  data, at = path.read_bytes(), int(offset) + int(length) // 2
  path.write_bytes(data[:at] + bytes(255 - b for b in data[at:at + 8]) + data[at + 8:])


def damage(step_dir, kind):
  """Damages a checkpoint as a disk or a person would."""
  largest = max((step_dir / 'default' / 'd').iterdir(), key=lambda p: p.stat().st_size)
  if kind == 'truncated':
    largest.write_bytes(largest.read_bytes()[:largest.stat().st_size // 2])
  elif kind == 'emptied':
    largest.write_bytes(b'')
  elif kind == 'bytes overwritten':
    overwrite_chunk_bytes(step_dir)
  elif kind == 'manifest removed':
    (step_dir / 'default' / 'manifest.ocdbt').unlink()
  elif kind == '_METADATA removed':
    (step_dir / 'default' / '_METADATA').unlink()
  elif kind == '_CHECKPOINT_METADATA removed':
    (step_dir / '_CHECKPOINT_METADATA').unlink()
  elif kind == 'item folder removed':
    shutil.rmtree(step_dir / 'default')
  else:
    raise ValueError(kind)


KINDS = ['truncated', 'emptied', 'bytes overwritten', 'manifest removed', '_METADATA removed',
         '_CHECKPOINT_METADATA removed', 'item folder removed']


@pytest.fixture(scope='module')
def reference(tiny_run):
  """The tiny run's config, the target of its restores, and its step-5 and step-10 states."""
  config = tiny_config(**TINY_RUN)
  return dict(config=config, abstract=abstract_state(config),
              step5=jax.device_get(restore_state(tiny_run, config, 5)),
              step10=jax.device_get(restore_state(tiny_run, config, 10)))


def copy_run(tiny_run, tmp_path):
  shutil.copytree(tiny_run, tmp_path / 'run')
  return tmp_path / 'run'


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_a_damaged_checkpoint_is_moved_aside_and_the_one_before_restored(
    tiny_run, reference, tmp_path, kind, caplog):
  run = copy_run(tiny_run, tmp_path)
  damage(run / 'checkpoints' / '10', kind)
  manager = manager_lib.make_manager(str(run), every_steps=5, keep=5)
  try:
    state = manager_lib.resume(manager, reference['abstract'])
    assert manager.all_steps() == [5]
  finally:
    manager.close()
  chex.assert_trees_all_equal(jax.device_get(state), reference['step5'])
  assert workdir.steps(run) == [5] and (run / 'checkpoints' / 'bad' / '10').is_dir()
  assert f'The checkpoint at step 10 in {run / "checkpoints"} is damaged (' in caplog.text
  assert 'Resuming from step 5, the newest good checkpoint.' in caplog.text
  if kind in ('_METADATA removed', 'item folder removed'):  # The file named, not Orbax's repr.
    missing = 'file' if kind == '_METADATA removed' else 'folder'
    name = 'default/_METADATA' if kind == '_METADATA removed' else 'default'
    assert f'its {missing} {run / "checkpoints" / "10" / name} is missing' in caplog.text
    assert 'Metadata file (named' not in caplog.text and 'KeyError' not in caplog.text
  if kind == 'bytes overwritten':  # TensorStore reads it without an error: the checksums tell.
    assert 'of its arrays differ from the checksums recorded when it was written' in caplog.text


@pytest.mark.slow
def test_export_and_fine_tuning_verify_the_checkpoint(tiny_run, reference, tmp_path):
  run = copy_run(tiny_run, tmp_path)
  # The record and the parameters disagree (here the record was changed: the tiny
  # model's parameters are small enough to be in OCDBT's checksummed nodes).
  metadata = run / 'checkpoints' / '10' / manager_lib.STEP_METADATA
  record = json.loads(metadata.read_text())
  record['custom_metadata'][manager_lib.ARRAYS]['params/head/kernel']['checksum'] = '0' * 16
  metadata.write_text(json.dumps(record))
  message = (r'The checkpoint at step 10 in .*run is damaged: 1 of its arrays differ from the '
             r'checksums recorded when it was written \(params/head/kernel\). Use another step '
             r'\(it has \[5\]\), or train again.')
  with pytest.raises(errors.CheckpointError, match=message):
    export.export(str(run), str(tmp_path / 'model.npz'))
  model = workdir.model_from_config(workdir.load_config(run))
  with pytest.raises(errors.CheckpointError, match=message):
    workdir.init_params_from(str(run), reference['step10'].params, model)
  assert not (tmp_path / 'model.npz').exists()
  export.export(str(run), str(tmp_path / 'model.npz'), step=5)  # The good one.


def test_an_unrecorded_checkpoint_is_said_to_be_unverified_once(tiny_run, tmp_path, caplog):
  """An older vit_jax's checkpoint (no checksums) read twice by one command (export
  --evaluate, evaluate): one warning."""
  run = copy_run(tiny_run, tmp_path)
  metadata = run / 'checkpoints' / '10' / manager_lib.STEP_METADATA
  record = json.loads(metadata.read_text())
  del record['custom_metadata'][manager_lib.ARRAYS]
  metadata.write_text(json.dumps(record))
  with caplog.at_level(logging.WARNING):
    for _ in range(2):
      workdir.restore_params(run)
  assert caplog.text.count('has no checksums (written by an older vit_jax): restored '
                           'unverified.') == 1


def test_with_no_good_checkpoint_left_one_error_lists_each_step(tiny_run, reference, tmp_path):
  run = copy_run(tiny_run, tmp_path)
  damage(run / 'checkpoints' / '10', 'item folder removed')
  damage(run / 'checkpoints' / '5', 'bytes overwritten')
  manager = manager_lib.make_manager(str(run), every_steps=5, keep=5)
  with pytest.raises(errors.CheckpointError,
                     match=r'No checkpoint in .*checkpoints can be restored: step 10: its '
                           r'folder .*checkpoints/10/default is missing; step 5: 1 of its arrays '
                           r'differ .* '
                           r'They are in .*checkpoints/bad. Train from the start'):
    manager_lib.resume(manager, reference['abstract'])
  manager.close()
  assert sorted(os.listdir(run / 'checkpoints' / 'bad')) == ['10', '5']


@pytest.mark.slow
def test_another_models_checkpoint_stops_the_run_and_moves_nothing(tiny_run, tmp_path):
  run = copy_run(tiny_run, tmp_path)
  other = tiny_config(**{**TINY_RUN, 'model.hidden_size': 64})
  manager = manager_lib.make_manager(str(run), every_steps=5, keep=5)
  with pytest.raises(errors.CheckpointMismatchError,
                     match=r'step 10 in .* holds another model or optimizer than this config '
                           r'makes \(\d+ arrays differ; .*: saved float32\[32\], this config '
                           r'float32\[64\].*\). Resume with the config it was trained with'):
    manager_lib.resume(manager, abstract_state(other))
  manager.close()
  assert workdir.steps(run) == [5, 10] and not (run / 'checkpoints' / 'bad').exists()


# ---------------------------------------------------------------------------
# A run named by a relative path, from the folder it is in: read, resumed and saved where it
# is (Orbax refuses relative paths), and a refusal of Orbax's never taken for damage.


def test_a_run_named_relatively_is_read_resumed_and_saved_where_it_is(
    tiny_run, reference, tmp_path, monkeypatch):
  """The tiny run, saved under an absolute path, named `run` from its folder: what
  checkpoints.load (what `evaluate` and `predict` read too: tests/test_inspect.py names its
  run relatively), `export` and a resume read it whole, and a save goes
  next to the others. Nothing is moved to bad/."""
  copy_run(tiny_run, tmp_path)
  monkeypatch.chdir(tmp_path)
  chex.assert_trees_all_equal(checkpoints.load('run').params, reference['step10'].params)
  assert export.export('run', 'model.npz') == 10 and (tmp_path / 'model.npz').is_file()
  manager = manager_lib.make_manager('run', every_steps=5, keep=5)
  try:
    state = manager_lib.resume(manager, reference['abstract'])
    assert manager_lib.save(manager, 11, state, force=True)
    manager.wait_until_finished()
  finally:
    manager.close()
  chex.assert_trees_all_equal(jax.device_get(state), reference['step10'])
  assert workdir.steps('run') == [5, 10, 11] and not (tmp_path / 'run/checkpoints/bad').exists()
  chex.assert_trees_all_equal(workdir.restore_params('run', 11)[0], reference['step10'].params)


def test_a_refusal_of_orbaxs_at_restore_is_one_error_and_moves_nothing(
    tiny_run, reference, tmp_path, monkeypatch):
  """Orbax refuses a manager made with a relative folder (make_manager makes it absolute):
  a refusal that says nothing of the files, so every checkpoint stays where it is."""
  copy_run(tiny_run, tmp_path)
  monkeypatch.chdir(tmp_path)
  manager = manager_lib.Manager(epath.Path('run/checkpoints'),
                                item_handlers=ocp.StandardCheckpointHandler())
  try:
    with pytest.raises(errors.CheckpointError) as raised:
      manager_lib.resume(manager, reference['abstract'])
  finally:
    manager.close()
  message = str(raised.value)
  assert message.startswith('The checkpoint at step 10 in run/checkpoints cannot be restored: '
                            'ValueError: Checkpoint path should be absolute.'), message
  assert message.endswith('so it is left where it is: the error is the checkpoint library\'s '
                          '(Orbax). Fix what it names, then run the command again.'), message
  assert '\n' not in message and len(message) < 600
  assert workdir.steps('run') == [5, 10] and not (tmp_path / 'run/checkpoints/bad').exists()


def run_main(workdir, overrides=TINY_RUN, devices=8):
  """`python -m vit_jax.main` on ``workdir``, named relatively from its parent folder as a
  user there would (vit_jax imported from this checkout, whatever the folder)."""
  return subprocess.run(main_command(workdir.name, **overrides), cwd=workdir.parent,
                        env={**env(devices), 'PYTHONPATH': str(ROOT)}, capture_output=True,
                        text=True, timeout=600)


@pytest.mark.slow
def test_a_silently_damaged_latest_checkpoint_resumes_bitwise(tiny_run, reference, tmp_path):
  """As the issue found it: 8 bytes overwritten in a data file; the run starts again."""
  run = copy_run(tiny_run, tmp_path)
  damage(run / 'checkpoints' / '10', 'bytes overwritten')
  done = run_main(run)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Traceback' not in done.stderr and 'Event loop is closed' not in done.stderr
  assert 'The checkpoint at step 10' in done.stderr and 'differ from the checksums' in done.stderr
  assert f'Resumed from {run / "checkpoints"} at step 5.' in done.stderr
  chex.assert_trees_all_equal(jax.device_get(restore_state(run, reference['config'])),
                              reference['step10'])
  losses = [(m['step'], m['train/loss']) for m in read_metrics(run) if 'train/loss' in m]
  assert losses[-1][0] == 10 and losses[-1] == losses[1]  # Step 10 again, the same loss.


class Log:
  """A process's stderr, read as it comes."""

  def __init__(self, process):
    self.text = ''
    self.thread = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
    self.thread.start()

  def _read(self, stream):
    for line in stream:
      self.text += line

  def wait_for(self, process, condition, timeout=300):
    start = time.time()
    while not condition():
      assert process.poll() is None, f'the run ended early: {self.text[-2000:]}'
      assert time.time() - start < timeout, self.text[-2000:]
      time.sleep(0.001)


@pytest.mark.slow
def test_sigterm_before_the_first_step_and_kill_9_during_a_save(tiny_run, reference, tmp_path):
  run = tmp_path / 'run'
  # SIGTERM once jax is up, before any step: it stops, saving at step 1 if its handler
  # was already installed, or at once (nothing saved yet) if not.
  process = subprocess.Popen(main_command(run, **TINY_RUN), cwd=ROOT, env=env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  log = Log(process)
  log.wait_for(process, lambda: 'Process 0 of 1' in log.text)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=300) in (errors.PREEMPTED_STATUS, -signal.SIGTERM)
  log.thread.join()
  assert 'Traceback' not in log.text
  assert workdir.steps(run) == ([1] if process.returncode == errors.PREEMPTED_STATUS else [])
  # Restarted, then killed while Orbax writes a checkpoint (its temporary folder exists).
  process = subprocess.Popen(main_command(run, **TINY_RUN), cwd=ROOT, env=env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  log = Log(process)
  saving = lambda: any('tmp' in p for p in os.listdir(run / 'checkpoints'))  # noqa: E731
  log.wait_for(process, lambda: (run / 'checkpoints').is_dir() and saving())
  process.kill()
  process.wait()
  # Restarted again: to the end, as if nothing had happened.
  done = run_main(run)
  assert done.returncode == 0, done.stderr[-3000:]
  assert workdir.steps(run)[-1] == 10 and not (run / 'checkpoints' / 'bad').exists()
  chex.assert_trees_all_equal(jax.device_get(restore_state(run, reference['config'])),
                              reference['step10'])


@pytest.mark.slow
@pytest.mark.parametrize('flag, message', [
    ('--config.no_such_key=3', 'error: config.no_such_key is not a config field. The fields '
                               'of config: batch_size, '),
    ('--config.schedule.base_lr=-0.003', 'error: config.schedule.base_lr=-0.003 must be '
                                         'positive (e.g. 1e-3)'),
    ('--config.model.image_size=(16,24)', "error: config.dataset.pp_train='to_rgb|resize(16)|"
                                          "pad_crop(2)|value_range(-1, 1)' makes 16x16x3 "),
    ('--config.batch_size=None', 'error: config.batch_size=None cannot be None.'),
    ('--config.log_every_steps=0', 'error: config.log_every_steps=0 must be >= 1'),
    ('--cpu_devices=-1', 'error: --cpu_devices=-1 must be a number of devices >= 1'),
    ('--cpu_devices=0', 'error: --cpu_devices=0 must be a number of devices >= 1'),
    ('--peer_timeout=0', 'error: --peer_timeout=0.0 must be a number of seconds > 0'),
])
def test_a_bad_flag_is_one_line_without_a_traceback(tmp_path, flag, message):
  done = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', f'--config={QUICKSTART}', f'--workdir={tmp_path}',
       flag], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == errors.EXIT_STATUS, done.stderr[-3000:]
  errors_printed = [line for line in done.stderr.splitlines() if line.startswith('error:')]
  assert len(errors_printed) == 1 and errors_printed[0].startswith(message)
  assert 'Traceback' not in done.stderr


@pytest.mark.slow
def test_two_processes_agree_on_the_checkpoint_they_fall_back_to(tiny_run, tmp_path):
  """launch/local.sh's 2 processes x 4 devices both find the damage and resume at step 5."""
  run = copy_run(tiny_run, tmp_path)
  damage(run / 'checkpoints' / '10', 'bytes overwritten')
  launch = subprocess.run(local_launch_command(run, **TINY_RUN), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=900)
  assert launch.returncode == 0, launch.stderr[-3000:]
  for i in range(2):
    log = (run / 'logs' / f'process_{i}.log').read_text()
    assert 'The checkpoint at step 10' in log and 'differ from the checksums' in log
    assert f'Resumed from {run / "checkpoints"} at step 5.' in log
  assert sorted(os.listdir(run / 'checkpoints' / 'bad')) == ['10']  # Moved once.
  assert workdir.steps(run) == [5, 10]  # Trained to the end again.


# ---------------------------------------------------------------------------
# Every file of a checkpoint whose arrays are in OCDBT's data files, damaged in turn.

# The smallest width at which every weight matrix of the tiny run (8 devices, the state
# split over them) is stored in the data files, `default/ocdbt.process_0/d/*`: Orbax keeps a
# chunk inline in the B-tree when it compresses to at most 1 KiB (max_inline_value_bytes),
# so at width 32 (tiny_run) only a few Adam moments leave the tree.
DATA_FILE_RUN = {**TINY_RUN, 'model.hidden_size': 48, 'model.mlp_dim': 96}


def chunk_files(step_dir):
  """{data file: number of array chunks it holds} of a checkpoint, and the keys inline."""
  import tensorstore as ts

  kvstore = ts.KvStore.open(f'file://{step_dir / "default"}/').result()
  root = ts.ocdbt.dump(kvstore).result()['versions'][-1]['root']['location']
  files, inline = {}, []
  for entry in ts.ocdbt.dump(kvstore, root).result()['entries']:
    key = entry['key'].decode()
    if 'indirect_value' in entry:
      prefix, name = entry['indirect_value'][len('value:'):].split(':')[:2]
      path = step_dir / 'default' / prefix / name
      files[path] = files.get(path, 0) + 1
    else:
      inline.append(key)
  return files, inline


@pytest.fixture(scope='module')
def data_file_run(tmp_path_factory):
  """A run of DATA_FILE_RUN (checkpoints 5 and 10), with its two states as references."""
  from vit_jax import main

  run = tmp_path_factory.mktemp('data_file_run')
  config = tiny_config(**DATA_FILE_RUN)
  main.train_and_evaluate(config, str(run))
  return dict(run=run, config=config, abstract=abstract_state(config),
              step5=jax.device_get(restore_state(run, config, 5)),
              step10=jax.device_get(restore_state(run, config, 10)))


@pytest.mark.slow
def test_the_data_file_run_stores_its_weight_matrices_in_the_data_files(data_file_run):
  files, inline = chunk_files(data_file_run['run'] / 'checkpoints' / '10')
  assert files and all(f.parent.name == 'd' and f.parent.parent.name == 'ocdbt.process_0'
                       for f in files)
  kernels = [k for k in inline if k.startswith('params.Transformer') and 'kernel/' in k
             and not k.endswith('/.zarray')]  # A chunk of a weight matrix, not its metadata.
  assert not kernels, kernels[:3]


def damage_file(path, kind):
  if kind == 'truncated':
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  elif kind == 'emptied':
    path.write_bytes(b'')
  elif kind == 'removed':
    path.unlink()
  else:
    raise ValueError(kind)


@pytest.mark.slow
# Emptied behaves as truncated to nothing: results/RESULTS.md's matrix has it too (run with
# 'emptied' added here); the suite runs the other two.
@pytest.mark.parametrize('kind', ['truncated', 'removed'])
def test_each_file_of_a_checkpoint_damaged_falls_back_or_restores_verified(
    data_file_run, tmp_path, kind):
  """Each file under checkpoints/10, damaged alone: step 10 restores bitwise (the file was
  not needed: commit markers, the sharding record, a superseded tree node) or it is moved
  to bad/ and step 5 restores bitwise. Never an exception, never other values."""
  source = data_file_run['run'] / 'checkpoints' / '10'
  names = sorted(p.relative_to(source) for p in source.rglob('*') if p.is_file())
  holding = {p.relative_to(source) for p in chunk_files(source)[0]}
  assert len(names) > 15 and holding <= set(names)
  fell_back = []
  for name in names:
    run = tmp_path / 'run'
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(data_file_run['run'] / 'checkpoints', run / 'checkpoints')
    damage_file(run / 'checkpoints' / '10' / name, kind)
    manager = manager_lib.make_manager(str(run), every_steps=5, keep=5)
    try:
      state = jax.device_get(manager_lib.resume(manager, data_file_run['abstract']))
    finally:
      manager.close()
    step = int(state.step)
    chex.assert_trees_all_equal(state, data_file_run[f'step{step}'])
    assert workdir.steps(run) == ([5] if step == 5 else [5, 10]), name
    assert (run / 'checkpoints' / 'bad' / '10').is_dir() == (step == 5), name
    if step == 5:
      fell_back.append(name)
  # Every data file that holds chunks is read, so damaging it always falls back (a half
  # truncated one only where a chunk lies in its second half).
  if kind != 'truncated':
    assert holding <= set(fell_back), holding - set(fell_back)
  # The files without chunks that every restore reads fall back too, whatever the kind.
  read_always = {Path('default/manifest.ocdbt'), Path('default/_METADATA'),
                 Path('_CHECKPOINT_METADATA')}
  assert read_always <= set(fell_back) - holding, read_always - set(fell_back)


@pytest.mark.slow
def test_with_every_step_damaged_one_error_names_each_step_and_file(data_file_run, tmp_path):
  run = tmp_path / 'run'
  shutil.copytree(data_file_run['run'] / 'checkpoints', run / 'checkpoints')
  damaged = {}
  for step in (5, 10):
    files = chunk_files(run / 'checkpoints' / str(step))[0]
    damaged[step] = max(files, key=files.get)  # The data file with the most chunks.
    damage_file(damaged[step], 'emptied')
  manager = manager_lib.make_manager(str(run), every_steps=5, keep=5)
  try:
    with pytest.raises(errors.CheckpointError) as raised:
      manager_lib.resume(manager, data_file_run['abstract'])
  finally:
    manager.close()
  message = str(raised.value)
  for step in (10, 5):
    # Moved to bad/ first, so the file is named where it was when it was read.
    assert (f'step {step}: ValueError: OUT_OF_RANGE: Error reading' in message
            and f'(the chunk is in {damaged[step]})' in message), message
  assert message.endswith('Train from the start in a new workdir (or fine-tune from a release '
                          'file with config.init_from).')
  assert '\n' not in message and 'tensorstore_spec' not in message and len(message) < 2000


@pytest.mark.slow
def test_a_damaged_data_file_in_a_real_run_falls_back_and_ends_bitwise(data_file_run,
                                                                       tmp_path):
  """`python -m vit_jax.main` on a workdir whose newest checkpoint lost a data file."""
  run = copy_run(data_file_run['run'], tmp_path)
  files = chunk_files(run / 'checkpoints' / '10')[0]
  damage_file(max(files, key=files.get), 'truncated')
  done = run_main(run, DATA_FILE_RUN)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Traceback' not in done.stderr and 'Event loop is closed' not in done.stderr
  assert 'The checkpoint at step 10' in done.stderr and 'OUT_OF_RANGE' in done.stderr
  assert f'Resumed from {run / "checkpoints"} at step 5.' in done.stderr
  chex.assert_trees_all_equal(jax.device_get(restore_state(run, data_file_run['config'])),
                              data_file_run['step10'])


# ---------------------------------------------------------------------------
# A save that fails: a real full disk (a tmpfs of 4 MiB; the tiny run's checkpoints take
# 1.5 MiB each, with its logs the second or third does not fit).


@pytest.mark.slow
def test_a_full_disk_stops_the_run_at_once_in_one_line_and_keeps_the_checkpoints(small_disk,
                                                                                  tmp_path):
  """The disk fills up once the checkpoint at step 50 is complete (a checkpoint's size on disk
  varies with how Orbax's writes interleave, so the disk is filled, not sized to fit one)."""
  run = small_disk / 'run'
  log = tmp_path / 'stderr.txt'  # Off the small disk.
  with log.open('w') as stderr:
    process = subprocess.Popen(
        # A checkpoint every 50 steps: the write of one ends long before the next is due.
        main_command(run, **{**TINY_RUN, 'total_steps': 250, 'checkpoint_every_steps': 50,
                             'log_every_steps': 1}), cwd=ROOT,
        env=env(), stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 600
    while not workdir.steps(run) and process.poll() is None and time.monotonic() < deadline:
      time.sleep(0.02)
    assert workdir.steps(run) == [50], log.read_text()[-3000:]
    fill(small_disk)
    process.wait(timeout=600)
  done = subprocess.CompletedProcess(process.args, process.returncode, '', log.read_text())
  assert done.returncode == errors.SAVE_FAILED_STATUS, done.stderr[-3000:]
  lines = [line for line in done.stderr.splitlines() if line.startswith('error:')]
  assert len(lines) == 1, done.stderr[-3000:]
  # No traceback, no error logged by Orbax's threads: the one line says it all.
  logged_errors = [line for line in done.stderr.splitlines() if re.match(r'E\d{4} ', line)]
  assert 'Traceback' not in done.stderr and not logged_errors, logged_errors[:3]
  kept = workdir.steps(run)
  assert kept == [50]
  # The save at step 100 fills the disk; it, or the metrics written while it is written, fails
  # first. The file is named where the OS's error names one (not a folder it failed to make).
  ckpts = re.escape(str(run / 'checkpoints'))
  assert re.fullmatch(
      rf'error: (Saving the checkpoint at step 100 in {ckpts}|Writing the metrics at step '
      rf'(\d+) in {re.escape(str(run))}) failed: the disk is full \(No space left on device'
      rf'(, writing {re.escape(str(run))}/[^)]*)?\)\. The checkpoints (before it )?are intact '
      r'\(steps 50\): free space there \(or lower config.keep_checkpoints\), then run the same '
      r'command again to resume from step 50\.', lines[0]), lines[0]
  # At once: before the next save was due (it was reported there before, or at the end).
  steps = [m['step'] for m in read_metrics(run) if 'train/loss' in m]
  assert 100 <= steps[-1] < 150, steps
  config = tiny_config(**{**TINY_RUN, 'total_steps': 250})
  for step in kept:  # Each restores, verified against its checksums.
    assert int(restore_state(run, config, step).step) == step


@pytest.mark.slow
def test_a_failed_save_outside_the_loop_is_the_same_one_error(tiny_run, small_disk):
  """The manager itself: a forced save that cannot be written, then the clean-up."""
  manager = manager_lib.make_manager(str(small_disk), every_steps=1, keep=1)
  fill(small_disk)
  config = tiny_config(**TINY_RUN)
  state = restore_state(tiny_run, config, 10)
  with pytest.raises(errors.CheckpointSaveError,
                     match=r'Saving the checkpoint at step 10 in .* failed: the disk is full \(No '
                           r'space left on device, writing .*\)\. No checkpoint was written before '
                           r'it: free space there'):
    manager_lib.save(manager, 10, state, force=True)
    manager.wait_until_finished()
  manager.close()  # Quiet: the failure was reported.
  assert workdir.steps(small_disk) == []


@pytest.mark.parametrize('format, out', [('npz', 'model.npz'), ('timm', 'timm')])
def test_an_export_to_a_full_disk_is_one_error_and_leaves_nothing(tiny_run, small_disk, format,
                                                                   out):
  """A real full disk (the tiny run's export takes ~80 KiB; 8 KiB are left): one error naming
  the cause and the path, and nothing on the disk but what was there (before: a truncated
  model.safetensors, or a hidden .model.npz.tmp-PID, and a traceback)."""
  fill(small_disk, leave=8 << 10)
  target = small_disk / out
  with pytest.raises(errors.WriteError) as raised:
    export.export(str(tiny_run), str(target), format=format)
  assert str(raised.value) == (
      f'Writing {target} failed: the disk is full (No space left on device). Nothing was '
      'written there: free space there, then run the same command again.')
  assert raised.value.exit_status == errors.SAVE_FAILED_STATUS
  assert os.listdir(small_disk) == ['filler']


@pytest.mark.slow
def test_the_export_command_on_a_full_disk_says_one_line(tiny_run, small_disk):
  fill(small_disk, leave=8 << 10)
  done = subprocess.run([sys.executable, '-m', 'vit_jax.tools.export', f'--workdir={tiny_run}',
                         '--format=timm', f'--out={small_disk / "timm"}'], cwd=ROOT, env=env(),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == errors.SAVE_FAILED_STATUS, done.stderr[-3000:]
  assert done.stderr.splitlines() == [  # The one line, nothing else.
      f'error: Writing {small_disk / "timm"} failed: the disk is full (No space left on '
      'device). Nothing was written there: free space there, then run the same command again.']
  assert os.listdir(small_disk) == ['filler']


# ---------------------------------------------------------------------------
# Divergence: a bad batch (its labels NaN, through the loader's test hook) at a known step.

# The tiny run without its evaluation (not what these tests check), every step logged.
NO_EVAL = {**TINY_RUN, 'evals.eval': None, 'log_every_steps': 1}


def one_error_line(stderr):
  lines = [line for line in stderr.splitlines() if line.startswith('error:')]
  assert len(lines) == 1 and 'Traceback' not in stderr, stderr[-3000:]
  return lines[0]


@pytest.mark.slow
def test_divergence_stops_in_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
  """The default, config.on_divergence='stop': the batch at data position 6 (step 7) has
  NaN labels; keep_checkpoints=1 keeps the last good checkpoint, step 5; nothing after it is
  saved; one line, exit status 65; the checkpoint is evaluable."""
  run = tmp_path / 'run'
  done = subprocess.run(main_command(run, **{**NO_EVAL, 'keep_checkpoints': 1}), cwd=ROOT,
                        env={**env(), divergence.NAN_BATCHES: '6'}, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == errors.DIVERGED_STATUS == 65, done.stderr[-3000:]
  line = one_error_line(done.stderr)
  assert line == (
      'error: The training diverged at step 7: non-finite loss nan and gradient norm nan. '
      f'Nothing after step 5 was saved: the last good checkpoint is {run}/checkpoints/5 '
      f'(python -m vit_jax.evaluate --workdir={run} --step=5). Lower the learning rate '
      '(config.schedule.base_lr) or clip the gradients, or run the same command with '
      "--config.on_divergence=rewind to skip the spike's batches."), line
  assert done.stderr.rstrip().endswith(line)  # Nothing after it.
  assert workdir.steps(run) == [5]
  assert [m['step'] for m in read_metrics(run)] == [1, 2, 3, 4, 5, 6]  # No NaN row.
  params, step = workdir.restore_params(run)  # Refused if it were not finite.
  assert step == 5 and all(np.isfinite(x).all() for x in jax.tree.leaves(params))


@pytest.mark.slow
def test_rewind_trains_through_a_spike_and_a_kill_9_mid_rewind_resumes_bitwise(
    tmp_path, monkeypatch, caplog):
  """config.on_divergence='rewind': the spike at step 12 (data position 11) is caught at
  once (logged every step), the run restores step 10 and skips 3 batches (positions 10-12),
  recorded in rewinds.json, and ends at step 20. The same run killed with kill -9 as soon as
  the rewind is recorded, then started again, ends bitwise equal, every logged loss too."""
  caplog.set_level(logging.INFO)
  overrides = {**NO_EVAL, 'total_steps': 20, 'checkpoint_every_steps': 10,
               'keep_checkpoints': 1, 'on_divergence': 'rewind', 'rewind_skip_batches': 3}
  config = tiny_config(**overrides)
  run = tmp_path / 'run'
  # The run to kill starts first: it starts up while the reference trains here.
  process = subprocess.Popen(main_command(run, **overrides), cwd=ROOT,
                             env={**env(), divergence.NAN_BATCHES: '11'},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  def kill_once_the_rewind_is_recorded():
    while not (run / divergence.REWINDS_FILE).exists() and process.poll() is None:
      time.sleep(0.002)
    process.kill()

  killer = threading.Thread(target=kill_once_the_rewind_is_recorded, daemon=True)
  killer.start()
  monkeypatch.setenv(divergence.NAN_BATCHES, '11')
  main.train_and_evaluate(config, str(tmp_path / 'reference'))
  rewinds = [{'at_step': 12, 'to_step': 10, 'data_offset': 3}]
  assert json.loads((tmp_path / 'reference' / divergence.REWINDS_FILE).read_text()) == rewinds
  assert ('The training diverged at step 12: non-finite loss nan and gradient norm nan. '
          'Rewinding to the checkpoint at step 10 and skipping 3 batches (rewind 1 of at most '
          '3, recorded in') in caplog.text
  reference = read_metrics(tmp_path / 'reference')
  assert [m['step'] for m in reference] == list(range(1, 21))  # The spike's rows are gone.
  assert all(np.isfinite(m['train/loss']) for m in reference)

  killer.join(timeout=600)
  assert process.wait() == -signal.SIGKILL
  assert workdir.steps(run) == [10]  # Killed in the rewind: before the next save.
  monkeypatch.delenv(divergence.NAN_BATCHES)  # Now only the record can move the stream on.
  main.train_and_evaluate(config, str(run))  # Restarted.
  assert 'Data offset 3: 1 rewinds recorded' in caplog.text
  assert json.loads((run / divergence.REWINDS_FILE).read_text()) == rewinds
  chex.assert_trees_all_equal(restore_state(run, config),
                              restore_state(tmp_path / 'reference', config))
  losses = {m['step']: m['train/loss'] for m in read_metrics(run)}
  assert losses == {m['step']: m['train/loss'] for m in reference}


def test_save_refuses_a_non_finite_state_and_the_last_good_one_is_never_rotated_out(
    tiny_run, reference, tmp_path):
  """The manager on its own: a NaN state is refused (nothing written), or, saved as asked,
  recorded as not finite; with keep_checkpoints=2, two of them rotate step 5 out but never
  step 10, the newest good one; a resume moves them aside and restores step 10."""
  run = copy_run(tiny_run, tmp_path)
  state = restore_state(run, reference['config'], 10)
  nan_state = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
  manager = manager_lib.make_manager(str(run), every_steps=1, keep=2)
  try:
    with pytest.raises(manager_lib.NonFiniteState, match=r'the state at step 11 is not finite '
                                                         r'\(params/'):
      manager_lib.save(manager, 11, nan_state, force=True)
    for step in (11, 12):
      manager_lib.save(manager, step, nan_state, force=True, allow_nonfinite=True)
      manager.wait_until_finished()
  finally:
    manager.close()
  assert workdir.steps(run) == [10, 11, 12]
  assert workdir.newest_good_step(run) == 10
  # An older vit_jax's record says nothing of finiteness: step 11's is found on reading it.
  metadata = run / 'checkpoints' / '11' / manager_lib.STEP_METADATA
  record = json.loads(metadata.read_text())
  for array in record['custom_metadata'][manager_lib.ARRAYS].values():
    del array['finite']
  metadata.write_text(json.dumps(record))
  manager = manager_lib.make_manager(str(run), every_steps=1, keep=2)
  try:
    resumed = manager_lib.resume(manager, reference['abstract'])
  finally:
    manager.close()
  chex.assert_trees_all_equal(jax.device_get(resumed), reference['step10'])
  assert workdir.steps(run) == [10]
  assert sorted(os.listdir(run / 'checkpoints' / manager_lib.NONFINITE)) == ['11', '12']


@pytest.mark.slow
def test_the_tools_refuse_a_non_finite_checkpoint_naming_the_newest_good_one(
    tiny_run, reference, tmp_path, caplog):
  """evaluate (a real process: before, `loss nan` and exit status 0), export, predict,
  fewshot and a fine-tune's init_from: one line naming step 10; --allow_nonfinite reads it
  with a warning."""
  run = copy_run(tiny_run, tmp_path)
  state = restore_state(run, reference['config'], 10)
  manager = manager_lib.make_manager(str(run), every_steps=1, keep=5)
  manager_lib.save(manager, 12, state.replace(params=jax.tree.map(lambda x: x * np.nan,
                                                                    state.params)),
                   force=True, allow_nonfinite=True)
  manager.close()
  done = subprocess.run([sys.executable, '-m', 'vit_jax.evaluate', f'--workdir={run}'],
                        cwd=ROOT, env=env(devices=1), capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == errors.EXIT_STATUS, done.stderr[-3000:]
  message = (f'The checkpoint at step 12 in {run} is not finite (40 arrays hold NaN or '
             'infinity, e.g. params/Transformer/encoder_norm/bias: its run diverged). The newest '
             'good one is step 10: use --step=10, or pass --allow_nonfinite to read it anyway.')
  assert one_error_line(done.stderr) == f'error: {message}'
  with pytest.raises(errors.NonFiniteCheckpointError, match=re.escape(message)):
    export.export(str(run), str(tmp_path / 'model.npz'))
  args = argparse.Namespace(workdir=str(run), step=None, ema=False, allow_nonfinite=False,
                            model=None, image_size=None, pool=None, pp=None, class_names=None,
                            activation='auto')
  with pytest.raises(errors.NonFiniteCheckpointError, match=re.escape(message)):
    predict.load_source(args)
  with pytest.raises(errors.NonFiniteCheckpointError, match=re.escape(message)):
    evaluation.load_features(str(run), None)  # vit_jax.fewshot's.
  model = workdir.model_from_config(workdir.load_config(run))
  with pytest.raises(errors.NonFiniteCheckpointError, match=r'use config\.init_step=10\.$'):
    workdir.init_params_from(str(run), reference['step10'].params, model)
  assert not (tmp_path / 'model.npz').exists()
  export.export(str(run), str(tmp_path / 'model.npz'), allow_nonfinite=True)
  assert 'read as asked (--allow_nonfinite)' in caplog.text
  args.allow_nonfinite = True
  assert predict.load_source(args).loaded.source == f'{run} (step 12)'


# ---------------------------------------------------------------------------
# One run per workdir: two real processes on one workdir, a killed holder, a lock on a
# shared filesystem whose holder is on another host.


@pytest.mark.slow
def test_a_second_run_on_a_workdir_exits_in_one_line_and_a_killed_holders_lock_is_taken(
    tmp_path):
  """Two runs started together: one takes the workdir, the other stops at once writing
  nothing there; a third started while the first runs, the same. The first killed with
  kill -9: its lock is left, and the next run takes it over with a warning."""
  run = tmp_path / 'run'
  command = main_command(run, **{**NO_EVAL, 'total_steps': 100_000})  # Runs until killed.

  def start():
    return subprocess.Popen(command, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

  def refused(process, holder):
    assert process.wait(timeout=300) == errors.EXIT_STATUS
    line = one_error_line(process.stderr.read())
    assert line.startswith(f'error: {run} is in use by another run (PID {holder.pid} on '
                           f'{socket.gethostname()}, started '), line
    assert line.endswith('one run per workdir. Wait for it to end or stop it, or use another '
                         f'--workdir; if that run is gone, remove {run / lock.LOCK_FILE}.')

  first, second = start(), start()
  while first.poll() is None and second.poll() is None:
    time.sleep(0.05)
  holder, loser = (first, second) if first.poll() is None else (second, first)
  refused(loser, holder)
  refused(start(), holder)  # Started while the holder runs.
  assert holder.poll() is None
  assert 'is in use' not in (run / 'log.txt').read_text()  # The refused wrote nothing there.
  holder.kill()
  holder.wait()
  assert json.loads((run / lock.LOCK_FILE).read_text())['pid'] == holder.pid
  taker = start()
  log = Log(taker)
  log.wait_for(taker, lambda: 'taking it over' in log.text)
  assert (f'warning: {run / lock.LOCK_FILE} was left by a run that is gone (PID {holder.pid} '
          f'on {socket.gethostname()}, started ') in log.text
  assert f'PID {holder.pid} is not running on this host): taking it over.' in log.text
  log.wait_for(taker, lambda: 'Process 0 of 1' in log.text)  # It goes on.
  assert json.loads((run / lock.LOCK_FILE).read_text())['pid'] == taker.pid
  taker.kill()
  taker.wait()


def test_a_lock_from_another_host_is_kept_while_its_heartbeat_is_fresh(tmp_path, caplog):
  """A workdir on a shared filesystem that does not share flock (or an object store): the
  record alone decides. A fresh heartbeat of another host: refused; a stale one, or a
  PID gone on this host: taken over with a warning. Released: emptied, not removed."""
  path = tmp_path / lock.LOCK_FILE

  def record(**fields):
    now = time.time()
    path.write_text(json.dumps({'host': 'elsewhere', 'pid': 4242, 'started': now - 3600,
                                'heartbeat': now, **fields}))

  record()
  with pytest.raises(errors.WorkdirInUseError, match=r'is in use by another run \(PID 4242 on '
                                                     r'elsewhere, started .*, heartbeat 0s ago; '
                                                     r'running, by its record\)'):
    lock.WorkdirLock(tmp_path).acquire()
  record(heartbeat=time.time() - lock.STALE_S - 5)
  with lock.hold(tmp_path):
    assert 'PID 4242 on elsewhere' in caplog.text
    assert re.search(r'its heartbeat is 60\ds old \(> 600s\)\): taking it over', caplog.text)
    with lock.hold(tmp_path):  # Re-entrant: vit_jax.main holds it, then train_and_evaluate.
      assert json.loads(path.read_text())['pid'] == os.getpid()
  assert path.read_text() == ''
  finished = subprocess.Popen(['true'])  # A PID that has exited, on this host.
  finished.wait()
  record(host=socket.gethostname(), pid=finished.pid)
  with lock.hold(tmp_path):
    assert f'PID {finished.pid} is not running on this host' in caplog.text


def test_a_lock_holding_garbage_is_taken_over_only_where_its_flock_says_no_run_holds_it(
    tmp_path, caplog):
  """Garbage in run.lock (random bytes: a damaged disk; NULs or a record cut short: a crash
  mid-write; a record of the wrong types) is no proof of a holder. Its flock free: taken over
  with a warning. Its flock held: refused in one line. No flock to ask (an object store):
  refused in one line naming the file to remove."""
  path = tmp_path / lock.LOCK_FILE
  damaged = bytes(range(256)) * 4
  path.write_bytes(damaged)
  other = os.open(path, os.O_RDONLY)  # Another run's hold on the file.
  fcntl.flock(other, fcntl.LOCK_EX)
  with pytest.raises(errors.WorkdirInUseError,
                     match=f'in use by another run \\(a process whose record in {path} is '
                           'unreadable; it is locked\\)'):
    lock.WorkdirLock(tmp_path).acquire()
  os.close(other)
  unasked = lock.WorkdirLock(tmp_path)
  unasked.local = False  # As for gs://: the record alone decides.
  with pytest.raises(errors.WorkdirInUseError,
                     match=f'{path} holds no readable record \\(1024 bytes: a crash mid-write '
                           f'or a damaged disk\\).* remove {path}; else use another'):
    unasked.acquire()
  assert path.read_bytes() == damaged  # Refused: left as it was.
  for garbage in [damaged, b'\0' * 1024, b'{"host": "h", "pid": 42, "sta',
                  b'{"host": 1, "pid": "x", "started": 0, "heartbeat": 0}']:
    path.write_bytes(garbage)
    with lock.hold(tmp_path):
      assert json.loads(path.read_text())['pid'] == os.getpid()
      assert (f'{path} holds no readable record ({len(garbage)} bytes: a crash mid-write or a '
              'damaged disk) and no run holds its flock: taking it over.') in caplog.text
    assert path.read_text() == ''


def test_check_free_refuses_a_held_workdir_before_jax_and_writes_nothing(tmp_path):
  """What vit_jax.main asks before it starts jax: a held lock (flock), or a live holder by its
  record (another host), refused as ``hold`` refuses them; nothing created or written."""
  lock.check_free(tmp_path / 'new')
  assert not (tmp_path / 'new').exists()
  path = tmp_path / lock.LOCK_FILE
  with lock.hold(tmp_path):
    record = path.read_bytes()
    with pytest.raises(errors.WorkdirInUseError, match=f'^{tmp_path} is in use by another run '
                       f'\\(PID {os.getpid()} on .*; it is locked\\)'):
      lock.check_free(tmp_path)
    assert path.read_bytes() == record
  lock.check_free(tmp_path)  # Released.
  path.write_text(json.dumps({'host': 'elsewhere', 'pid': 4242, 'started': time.time(),
                              'heartbeat': time.time()}))
  with pytest.raises(errors.WorkdirInUseError, match='elsewhere.*; running, by its record'):
    lock.check_free(tmp_path)


# ---------------------------------------------------------------------------
# A resume is the same run.


def test_a_resume_that_changes_the_trajectory_is_refused_in_one_line(tiny_run, tmp_path):
  """A new batch size, a new total_steps (shorter, or longer as a recomputed schedule):
  refused before anything starts, config.json untouched. What does not change the
  trajectory may change: the run (complete) evaluates again."""
  run = copy_run(tiny_run, tmp_path)
  recorded = (run / 'config.json').read_bytes()
  new_run = f'To start a new run from it instead: --workdir=NEW_WORKDIR --config.init_from={run}'
  for changes, what in [
      ({'batch_size': 32}, 'config.batch_size=32 (64)'),
      ({'total_steps': 6}, 'config.total_steps=6 (10)'),
      ({'total_steps': 20, 'schedule.base_lr': 1e-2},
       'config.total_steps=20 (10), config.schedule.base_lr=0.01 (0.003)'),
  ]:
    with pytest.raises(errors.ConfigError) as refused:
      main.train_and_evaluate(tiny_config(**{**TINY_RUN, **changes}), str(run))
    message = str(refused.value)
    assert message.startswith(f'A resume is the same run, but {what}: the run in {run} was '
                              'trained with the values in brackets (its config.json). Resume '
                              'with them.'), message
    assert message.endswith(new_run + ' (its parameters, a fresh optimizer and schedule).')
    assert ('add a named phase' in message) == ('total_steps' in changes) and '\n' not in message
  assert (run / 'config.json').read_bytes() == recorded
  result = main.train_and_evaluate(tiny_config(**{
      **TINY_RUN, 'log_every_steps': 1, 'keep_checkpoints': 1, 'input_workers': 2,
      'dataset.pp_eval': 'to_rgb|resize(16)|value_range(-1, 1)', 'eval_batch_size': 8}),
      str(run))
  assert result['eval/examples'] == 359
  assert (run / 'config.json').read_bytes() == recorded  # It trained nothing.


@pytest.mark.slow
def test_a_finished_run_trains_further_only_as_a_named_phase(tiny_run, tmp_path):
  """The tiny run (10 steps, cosine to 0) given a phase to step 14 at a constant 1e-4: steps
  11-14 train at 1e-4, the steps before keep their rates; config.json records the phase,
  and a phase taken away again is refused."""
  run = copy_run(tiny_run, tmp_path)
  before = read_metrics(run)
  phase = {'name': 'longer', 'total_steps': 14, 'base_lr': 1e-4, 'decay': 'constant'}
  config = tiny_config(**{**TINY_RUN, 'schedule.phases': (phase,), 'log_every_steps': 1})
  main.train_and_evaluate(config, str(run))
  after = read_metrics(run)
  assert after[:len(before)] == before
  rates = {m['step']: m['train/learning_rate'] for m in after if 'train/learning_rate' in m}
  assert [rates[s] for s in range(11, 15)] == [pytest.approx(1e-4)] * 4
  assert rates[10] == next(m['train/learning_rate'] for m in before if m['step'] == 10)
  assert workdir.steps(run)[-1] == 14 and workdir.load_config(run).schedule.phases == (phase,)
  with pytest.raises(errors.ConfigError, match=r'phases may only be added after the recorded '
                                               r'ones'):
    main.train_and_evaluate(tiny_config(**TINY_RUN), str(run))


# ---------------------------------------------------------------------------
# A save that fails on a file system remounted read-only: one line, nothing after it.


@pytest.fixture
def read_only_later(tmp_path):
  """tmp_path/run/checkpoints as a bind mount of itself, remounted read-only by calling the
  fixture (skips where mounting is not permitted)."""
  checkpoints = tmp_path / 'run' / 'checkpoints'
  checkpoints.mkdir(parents=True)
  mount = subprocess.run(['mount', '--bind', str(checkpoints), str(checkpoints)],
                         capture_output=True, text=True)
  if mount.returncode:
    pytest.skip(f'cannot bind-mount here: {mount.stderr.strip()}')
  yield lambda: subprocess.run(['mount', '-o', 'remount,bind,ro', str(checkpoints)],
                               check=True)
  subprocess.run(['umount', str(checkpoints)], check=True)


@pytest.mark.slow
def test_a_save_on_a_read_only_remount_is_one_line_and_nothing_after_it(tmp_path,
                                                                         read_only_later):
  run = tmp_path / 'run'
  overrides = {**NO_EVAL, 'total_steps': 60, 'checkpoint_every_steps': 20}
  process = subprocess.Popen(main_command(run, **overrides), cwd=ROOT, env=env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  log = Log(process)
  log.wait_for(process, lambda: workdir.steps(run) == [20])
  read_only_later()
  assert process.wait(timeout=300) == errors.SAVE_FAILED_STATUS
  log.thread.join()
  line = one_error_line(log.text)
  assert re.fullmatch(
      rf'error: Saving the checkpoint at step 40 in {run}/checkpoints failed: the file '
      r'system is read-only \(Read-only file system.*\)\. The checkpoints before it are intact '
      r'\(steps 20\): use a writable workdir, then run the same command again to resume from '
      r'step 20\.', line), line
  assert log.text.rstrip().endswith(line), log.text[-2000:]  # Not a warning after it.
