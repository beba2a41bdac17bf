"""Faults injected as they happen to users: damaged checkpoints, kill -9, SIGTERM, bad flags.

Every case ends in a correct continuation (bitwise that of an uninterrupted run)
or in one line, ``error: ...``, naming the problem and the fix. The damage cases
share the workdir of the ``tiny_run`` fixture (10 steps, checkpoints 5 and 10),
copied per case; ``benchmarks.faults`` is the long version (kill -9 at
random steps, N times). Each bad config is in tests/test_plan.py (``validate``),
each bad converter input in tests/test_convert.py.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import chex
import jax
import pytest

from vit_jax.base import errors
from vit_jax.checkpoints import manager as manager_lib
from vit_jax.checkpoints import workdir
from vit_jax.tools import export

from runs import (
  QUICKSTART,
  ROOT,
  TINY_RUN,
  abstract_state,
  env,
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


def test_with_no_good_checkpoint_left_one_error_lists_each_step(tiny_run, reference, tmp_path):
  run = copy_run(tiny_run, tmp_path)
  damage(run / 'checkpoints' / '10', 'item folder removed')
  damage(run / 'checkpoints' / '5', 'bytes overwritten')
  manager = manager_lib.make_manager(str(run), every_steps=5, keep=5)
  with pytest.raises(errors.CheckpointError,
                     match=r'No checkpoint in .*checkpoints can be restored: step 10: KeyError: .*'
                           r'Item "default" was not found.*; step 5: 1 of its arrays differ .* '
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


def run_main(workdir, overrides=TINY_RUN, devices=8):
  return subprocess.run(main_command(workdir, **overrides), cwd=ROOT, env=env(devices),
                        capture_output=True, text=True, timeout=600)


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
  # A run of 5 steps: once resumed, only the evaluation is left (no train step to compile).
  launch = subprocess.run(
      local_launch_command(run, **{**TINY_RUN, 'total_steps': 5, 'schedule.warmup_steps': 1}),
      cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
  assert launch.returncode == 0, launch.stderr[-3000:]
  for i in range(2):
    log = (run / 'logs' / f'process_{i}.log').read_text()
    assert 'The checkpoint at step 10' in log and 'differ from the checksums' in log
    assert f'Resumed from {run / "checkpoints"} at step 5.' in log
    assert 'is already complete (step 5)' in log
  assert sorted(os.listdir(run / 'checkpoints' / 'bad')) == ['10']  # Moved once.
  assert workdir.steps(run) == [5]


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
@pytest.mark.parametrize('kind', ['truncated', 'emptied', 'removed'])
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


@pytest.fixture
def small_disk(tmp_path):
  """A 4 MiB tmpfs mounted at tmp_path/disk (skips where mounting is not permitted)."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  mount = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(disk)],
                         capture_output=True, text=True)
  if mount.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {mount.stderr.strip()}')
  yield disk
  subprocess.run(['umount', str(disk)], check=True)


@pytest.mark.slow
def test_a_full_disk_stops_the_run_at_once_in_one_line_and_keeps_the_checkpoints(small_disk):
  run = small_disk / 'run'
  done = subprocess.run(
      # A checkpoint every 50 steps: the write of one ends long before the next is due;
      # 250 steps, so that the one that fails (the second or third) is not the last.
      main_command(run, **{**TINY_RUN, 'total_steps': 250, 'checkpoint_every_steps': 50,
                           'log_every_steps': 1}), cwd=ROOT,
      env=env(), capture_output=True, text=True, timeout=900)
  assert done.returncode == errors.SAVE_FAILED_STATUS, done.stderr[-3000:]
  lines = [line for line in done.stderr.splitlines() if line.startswith('error:')]
  assert len(lines) == 1, done.stderr[-3000:]
  # No traceback, no error logged by Orbax's threads: the one line says it all.
  logged_errors = [line for line in done.stderr.splitlines() if re.match(r'E\d{4} ', line)]
  assert 'Traceback' not in done.stderr and not logged_errors, logged_errors[:3]
  kept = workdir.steps(run)
  assert kept and kept == list(range(50, 50 * len(kept) + 1, 50))
  failed = kept[-1] + 50
  assert lines[0].startswith(
      f'error: Saving the checkpoint at step {failed} in {run / "checkpoints"} failed: the disk '
      f'is full (No space left on device, writing {run / "checkpoints"}/{failed}.orbax-'
      'checkpoint-tmp/'), lines[0]
  assert lines[0].endswith(
      f'The checkpoints before it are intact (steps {", ".join(map(str, kept))}): free space '
      'there (or lower config.keep_checkpoints), then run the same command again to resume '
      f'from step {kept[-1]}.')
  # At once: before the next save was due (it was reported there before, or at the end).
  steps = [m['step'] for m in read_metrics(run) if 'train/loss' in m]
  assert failed <= steps[-1] < failed + 50, steps
  config = tiny_config(**{**TINY_RUN, 'total_steps': 250})
  for step in kept:  # Each restores, verified against its checksums.
    assert int(restore_state(run, config, step).step) == step


@pytest.mark.slow
def test_a_failed_save_outside_the_loop_is_the_same_one_error(tiny_run, small_disk):
  """The manager itself: a forced save that cannot be written, then the clean-up."""
  manager = manager_lib.make_manager(str(small_disk), every_steps=1, keep=1)
  (small_disk / 'filler').write_bytes(b'\0' * ((4 << 20) - (64 << 10)))  # Nearly full already.
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
